"""Small pieces behind the fault matrix: scrubbing a key from a log, the disk and host checks,
and the audit that finds lost trials."""

from __future__ import annotations

from pathlib import Path

import optuna
from optuna.trial import TrialState

from autotune.masking import redact, redact_text, scrub_file
from autotune.server.hostcheck import machine_ram_gb, results_disk_problem
from autotune.testing import audit


def test_scrub_masks_every_occurrence_and_leaves_clean_files_alone(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(b"a\nserver_args=ServerArgs(api_key='sk-1', x='sk-1')\nb sk-1\n")
    assert scrub_file(log, "sk-1") == 3
    assert log.read_bytes() == b"a\nserver_args=ServerArgs(api_key='***', x='***')\nb ***\n"
    before = log.stat().st_mtime_ns
    assert scrub_file(log, "sk-1") == 0 and log.stat().st_mtime_ns == before
    assert scrub_file(tmp_path / "none.log", "sk-1") == 0


def test_results_disk_problem_names_the_free_space(tmp_path: Path) -> None:
    assert results_disk_problem(tmp_path, min_free=1) == ""
    problem = results_disk_problem(tmp_path, min_free=1 << 62)
    assert problem.startswith("the results disk is full:") and str(tmp_path) in problem
    assert "cannot be read" in results_disk_problem(tmp_path / "missing")


def test_machine_ram_from_meminfo(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       2097152 kB\nMemFree: 1 kB\n")
    assert machine_ram_gb(meminfo) == 2097152 * 1024 / 1e9
    assert machine_ram_gb(tmp_path / "none") is None


def test_redaction_of_urls_and_messages() -> None:
    url = "postgresql+psycopg2://me:s3cret@db:5432/x"
    assert redact(url) == "postgresql+psycopg2://me:***@db:5432/x"
    assert redact_text("auth failed for s3cret", url) == "auth failed for ***"
    assert redact_text("no password here", "sqlite:///x.db") == "no password here"


def test_audit_finds_running_and_unrecorded_trials(tmp_path: Path) -> None:
    study = optuna.create_study(directions=["maximize"])
    running = study.ask()
    done = study.ask()
    done.set_user_attr("outcome", "ok")
    done.set_user_attr("record", {"outcome": "ok"})
    study.tell(done, [1.0])
    problems = audit.problems(study.get_trials(), tmp_path)
    assert f"trial {running.number} is still RUNNING in the storage" in problems
    assert any(f"trial {done.number}:" in p and "unreadable" in p for p in problems)
    study.tell(running, state=TrialState.FAIL)
    trial_dir = tmp_path / "trials" / f"{done.number:04d}"
    trial_dir.mkdir(parents=True)
    (trial_dir / "trial.json").write_text('{"outcome": "crash", "state": "complete"}')
    problems = audit.problems(study.get_trials(), tmp_path)
    assert any("trial.json says 'crash', the storage 'ok'" in p for p in problems)
    assert any(f"trial {running.number} is FAIL without an outcome" in p for p in problems)
