"""Small pieces behind the fault matrix: scrubbing a key from a log, the disk and host checks,
and the audit that finds lost trials."""

from __future__ import annotations

import os
import random
import sqlite3
import stat
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.masking import StreamMask, redact, redact_text, scrub_file
from autotune.server.hostcheck import machine_ram_gb, results_disk_problem
from autotune.server.logtail import LogTail
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


def test_tail_follows_a_truncation_even_once_the_file_grew_past_the_old_offset(
    tmp_path: Path,
) -> None:
    log = tmp_path / "server.log"
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    tail = LogTail(log)
    os.write(fd, b"".join(b"[old] line %d\n" % i for i in range(10)))
    assert len(tail.read()) == 10
    os.truncate(log, 0)  # copytruncate, then more written than was there before
    os.write(fd, b"".join(b"[new] line %d of the new file\n" % i for i in range(10)))
    lines = tail.read()
    assert lines[0] == "[new] line 0 of the new file" and len(lines) == 10, lines
    assert "truncated while the server ran (copytruncate)" in tail.notes[0]
    os.truncate(log, 0)
    os.write(fd, b"[short]\n")
    assert tail.read() == ["[short]"]
    os.close(fd)
    tail.close()


def test_tail_keeps_reading_a_deleted_log_and_writes_it_back(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    tail = LogTail(log)
    os.write(fd, b"one\n")
    log.unlink()
    os.write(fd, b"two\n")
    assert tail.read() == ["one", "two"]
    os.close(fd)
    tail.keep()
    tail.close()
    assert log.read_bytes() == b"one\ntwo\n" and stat.S_IMODE(log.stat().st_mode) == 0o600
    assert "deleted while the server ran; written back" in tail.notes[0]


def test_stream_mask_masks_a_secret_cut_anywhere() -> None:
    key = b"sk-unit-0123456789abcdef"
    text = b"server_args=ServerArgs(api_key='" + key + b"')\nsk-unit-01 is no key\n" + key * 2
    rng = random.Random(0)
    for _ in range(500):
        mask, out, at = StreamMask([key]), b"", 0
        while at < len(text):
            step = rng.randint(1, 9)
            out += mask.feed(text[at : at + step])
            at += step
        assert out + mask.end() == text.replace(key, b"***")


def test_scrubbed_log_stays_owner_only(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(b"api_key='sk-9'\n")
    os.chmod(log, 0o600)
    assert scrub_file(log, "sk-9") == 1
    assert stat.S_IMODE(log.stat().st_mode) == 0o600


def test_a_trial_the_storage_never_takes_back_is_reported_not_hidden(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the patience, `_fail_patiently` gives up (False: the runner stops with one line and
    the next run marks the trial stale); once the lock is gone it records harness_error."""
    from autotune.study import loop, runner

    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="u", storage=url)
    study.enqueue_trial({"x": 1.0})
    trial = study.ask()
    trial.suggest_float("x", 0.0, 2.0)
    monkeypatch.setattr(loop, "STORAGE_PATIENCE_S", 0.5)
    holder = sqlite3.connect(tmp_path / "study.db", timeout=30)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        assert not runner._fail_patiently(study, trial, "storage failed", None)
    finally:
        holder.rollback()
        holder.close()
    assert runner._fail_patiently(study, trial, "storage failed", None)
    [failed, queued] = study.get_trials()
    assert (failed.state, failed.user_attrs["outcome"]) == (TrialState.FAIL, "harness_error")
    assert queued.state == TrialState.WAITING
