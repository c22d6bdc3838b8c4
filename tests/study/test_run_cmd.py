"""`autotune run` and `status` in-process over the fake launcher: records, resume, summary lines."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.config.studyfile import load_study
from autotune.review.status import render
from autotune.study.runner import run
from autotune.study.storage import Worker, default_storage_url
from tests.study.conftest import VALID
from tests.study.fakes import FakeLauncher

GRID = (
    VALID.replace("max_running_requests = { choices = [32, 48, 64] }", "max_running_requests = 48")
    .replace("hicache_size = { choices = [0, 48] }", "hicache_size = 48")
    .replace('name = "tpe"', 'name = "grid"')
    .replace("n_trials = 5", "n_trials = 20")
)


def _run(
    study_file: Callable[[str], Path],
    tmp_path: Path,
    text: str = GRID,
    orphans: tuple[str, ...] = (),
) -> tuple[int, str, FakeLauncher]:
    cfg = load_study(study_file(text), name="t")
    folder = tmp_path / "results" / "t"
    folder.mkdir(parents=True, exist_ok=True)
    out = io.StringIO()
    launcher = FakeLauncher(orphans=list(orphans))
    code = run(cfg, folder, default_storage_url(folder), launcher, out)
    return code, out.getvalue(), launcher


def test_grid_study_runs_to_the_end(study_file: Callable[[str], Path], tmp_path: Path) -> None:
    code, out, launcher = _run(study_file, tmp_path)
    assert code == 0
    folder = tmp_path / "results" / "t"
    records = sorted(folder.glob("trials/*/trial.json"))
    assert len(records) == 8 and len(launcher.plans) == 8
    first = json.loads(records[0].read_text())
    assert first["params"]["mem_fraction_static"] == 0.88 and first["outcome"] == "ok"
    outcomes = [json.loads(r.read_text())["outcome"] for r in records]
    assert outcomes.count("startup_oom") == 1
    assert "finished (grid done): 8 trials, 1 OOM, best feasible capacity" in out
    assert "trial 1/20 (#0) mem_fraction_static=0.88" in out
    assert "[infeasible]" in out and "[feasible]" in out
    assert sorted(p.name for p in folder.iterdir()) == ["study.db", "trials"]


def test_rerun_resumes_without_duplicates(
    study_file: Callable[[str], Path], tmp_path: Path
) -> None:
    text = GRID.replace("n_trials = 20", "n_trials = 3")
    _run(study_file, tmp_path, text)
    code, out, launcher = _run(study_file, tmp_path, text.replace("n_trials = 3", "n_trials = 20"))
    assert code == 0 and "3/20 trials done" in out and len(launcher.plans) == 5
    study = optuna.load_study(
        study_name="t", storage=default_storage_url(tmp_path / "results" / "t")
    )
    values = [t.params["mem_fraction_static"] for t in study.get_trials()]
    assert len(values) == 8 and len(set(values)) == 8


def test_killed_run_is_recovered(study_file: Callable[[str], Path], tmp_path: Path) -> None:
    text = GRID.replace("n_trials = 20", "n_trials = 2")
    _run(study_file, tmp_path, text)
    study = optuna.load_study(
        study_name="t", storage=default_storage_url(tmp_path / "results" / "t")
    )
    stale = study.ask()
    stale.suggest_float("mem_fraction_static", 0.8, 0.94, step=0.02)
    stale.set_user_attr("worker", {"host": Worker.current().host, "pid": 999999, "start_ticks": 5})
    more = text.replace("n_trials = 2", "n_trials = 4")
    code, out, launcher = _run(study_file, tmp_path, more, ("pid 4242 (port 31000): stopped",))
    assert code == 0 and "recovered trials [2]" in out
    assert launcher.orphan_sweeps == 1
    assert "pid 4242 (port 31000): stopped" in out
    trials = study.get_trials()
    assert trials[2].state == TrialState.FAIL and trials[2].user_attrs["outcome"] == "stale"
    assert sum(t.state == TrialState.COMPLETE for t in trials) == 4


def test_status_table(study_file: Callable[[str], Path], tmp_path: Path) -> None:
    _run(study_file, tmp_path, GRID.replace("n_trials = 20", "n_trials = 3"))
    study = optuna.load_study(
        study_name="t", storage=default_storage_url(tmp_path / "results" / "t")
    )
    text = render("t", "sqlite:///x", study.get_trials())
    lines = text.splitlines()
    assert lines[0].startswith(
        "study t (sqlite:///x): 3 trials finished, 0 OOM, best feasible capacity"
    )
    assert lines[1].split()[:4] == ["#", "state", "outcome", "mem_fraction_static"]
    assert lines[2].split()[:4] == ["0", "done", "ok", "0.88"]
    assert lines[2].endswith("yes")
    assert len(lines) == 2 + 3 + 5  # summary, header, 3 done, 5 queued grid points
    assert lines[-1].split()[1] == "queued"


def test_status_command(
    study_file: Callable[[str], Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from autotune.cli.main import main

    _run(study_file, tmp_path, GRID.replace("n_trials = 20", "n_trials = 2"))
    monkeypatch.chdir(tmp_path)
    assert main(["status", "--study", "t"]) == 0
    out = capsys.readouterr().out
    assert "2 trials finished" in out
    assert main(["status", "--study", "nothere"]) == 2
    assert "nothere" in capsys.readouterr().err


def test_sampler_done_ends_the_study_without_a_launch(
    study_file: Callable[[str], Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import autotune.study.loop

    calls = {"n": 0}

    def done(study: optuna.Study) -> str:
        calls["n"] += 1
        return "nothing left" if calls["n"] == 3 else ""

    monkeypatch.setattr(autotune.study.loop, "nothing_left", done)
    code, out, launcher = _run(study_file, tmp_path, VALID.replace("n_trials = 5", "n_trials = 9"))
    assert code == 0 and len(launcher.plans) == 2
    assert "finished (search done: nothing left): 2 trials" in out
    study = optuna.load_study(
        study_name="t", storage=default_storage_url(tmp_path / "results" / "t")
    )
    assert [t.state for t in study.get_trials()] == [TrialState.COMPLETE] * 2  # no trial left
    assert study.user_attrs["search_done"] == {
        "reason": "nothing left",
        "trials": 2,
        "last_trial": 1,
    }


def test_one_run_per_results_folder(tmp_path: Path) -> None:
    from autotune.errors import UsageError
    from autotune.study.runner import study_lock

    with (
        study_lock(tmp_path),
        pytest.raises(UsageError, match=r"in use by a running autotune \(pid \d+\)"),
        study_lock(tmp_path),
    ):
        pass
    with study_lock(tmp_path):  # released at the end of the run
        pass
