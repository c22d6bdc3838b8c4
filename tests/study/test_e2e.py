"""`autotune run` end to end through the simulator: real processes, real HTTP on 127.0.0.1.

Every process these tests start carries the test's temporary folder in its command line (the
study file path or the simulator's GPU-state folder), so the `no_leftovers` fixture
(tests/conftest.py) can find any survivor, kill it and fail the test.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tests import simstudy
from tests.simstudy import sim_study, wait_ready

pytestmark = pytest.mark.e2e


def _study(folder: Path, duration: float = 1.0, step: float = 0.03) -> Path:
    """The study file; `step` 0.03 gives the points 0.88, 0.91, 0.94 and 0.06 gives 0.88, 0.94."""
    path = folder / "e2e.toml"
    path.write_text(sim_study(step=step, duration=duration, headroom_gib=None))
    return path


def _trials(folder: Path) -> list[optuna.trial.FrozenTrial]:
    url = f"sqlite:///{folder / 'results' / 'e2e' / 'study.db'}"
    return optuna.load_study(study_name="e2e", storage=url).get_trials()


def _wait_for_running_trial(folder: Path, proc: subprocess.Popen[str], number: int) -> None:
    """Until trial `number`'s server is serving (its log says it is ready)."""
    log = folder / "results" / "e2e" / "trials" / f"{number:04d}" / "server.log"
    if not wait_ready(log, proc):
        raise AssertionError(f"trial {number} never became ready (autotune rc {proc.poll()})")


@contextmanager
def _serving_trial_0(folder: Path) -> Iterator[subprocess.Popen[str]]:
    """`autotune run` on a study of 20 s trials, from when trial 0 serves; on the way out it is
    killed if it still runs, waited for, and its output closed."""
    _study(folder, duration=20.0, step=0.06)
    proc = simstudy.start(folder / "e2e.toml", "run")
    try:
        _wait_for_running_trial(folder, proc, 0)
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        assert proc.stdout is not None
        proc.stdout.close()


def test_study_runs_to_the_end(no_leftovers: Path) -> None:
    folder = no_leftovers
    _study(folder)
    done = simstudy.run(folder / "e2e.toml", "run")
    assert done.returncode == 0, done.stdout + done.stderr
    trials = _trials(folder)
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 3
    assert [t.params["mem_fraction_static"] for t in trials] == [0.88, 0.91, 0.94]
    base = trials[0]
    assert base.user_attrs["outcome"] == "ok" and all(v <= 0 for v in base.constraints.values())
    assert base.user_attrs["capacity_tokens"] > 150_000
    assert any(t.user_attrs["outcome"] in ("startup_oom", "runtime_oom") for t in trials)
    oom = next(t for t in trials if t.user_attrs["outcome"].endswith("oom"))
    assert oom.constraints["oom"] > 0
    record = json.loads((folder / "results/e2e/trials/0000/trial.json").read_text())
    assert record["ledger"]["max_total_num_tokens"] == base.user_attrs["capacity_tokens"]
    assert record["workload"]["overall"]["completed"] > 0
    assert record["autotune_version"] and record["host"] and record["sglang_version"]
    assert "fired up and ready" in Path(record["log_path"]).read_text()
    written = {p.relative_to(folder).parts[0] for p in folder.rglob("*")}
    assert written == {"e2e.toml", "results"}


def test_no_trial_starts_that_would_end_after_the_timeout(no_leftovers: Path) -> None:
    """`--timeout 12` with trials of 5 to 10 s (a 3 s steady phase): once the first trial has
    ended, a second would end past the deadline, so none starts and the summary says why (a
    first trial slower than the deadline ends the run at the deadline itself)."""
    folder = no_leftovers
    _study(folder, duration=3.0)
    done = simstudy.run(folder / "e2e.toml", "run", "--timeout", "12")
    assert done.returncode == 0, done.stdout + done.stderr
    launched = [t for t in _trials(folder) if t.state != TrialState.WAITING]
    assert len(launched) == 1, done.stdout
    assert (
        "finished (timeout: the next trial would end after it (a trial takes about" in done.stdout
        or "finished (timeout)" in done.stdout
    ), done.stdout


def test_sigkill_mid_trial_then_resume(no_leftovers: Path) -> None:
    folder = no_leftovers
    with _serving_trial_0(folder) as proc:
        proc.kill()
    assert simstudy.leftovers(folder), "the killed run should have left its server behind"
    _study(folder, duration=1.0, step=0.06)
    done = simstudy.run(folder / "e2e.toml", "run")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "recovered trials [0]" in done.stdout
    trials = _trials(folder)
    assert trials[0].state == TrialState.FAIL and trials[0].user_attrs["outcome"] == "stale"
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    values = sorted(t.params["mem_fraction_static"] for t in complete)
    assert values == [0.88, 0.94]  # nothing lost, nothing run twice
    assert len(trials) == 3


def test_ctrl_c_stops_the_server_and_exits_130(no_leftovers: Path) -> None:
    folder = no_leftovers
    with _serving_trial_0(folder) as proc:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    assert "interrupted" in out
    assert not simstudy.leftovers(folder)
    trial = _trials(folder)[0]
    assert trial.state == TrialState.FAIL and trial.user_attrs["outcome"] == "interrupted"
    assert (
        json.loads((folder / "results/e2e/trials/0000/trial.json").read_text())["state"]
        == "interrupted"
    )
