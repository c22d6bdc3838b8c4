"""Fault matrix, server rows: each fault injected into the simulator under `autotune run`.

Every test runs the real command in its own session with a foreign `sleep` alongside, then
checks what the study recorded, that storage and results folder agree (no lost trial), and
(through the `world` fixture) that no process is left and the foreign one still runs.
"""

from __future__ import annotations

import json
import re

import pytest
from optuna.trial import TrialState

from tests.reliability.helpers import EAGLE, STRESS, World

pytestmark = pytest.mark.e2e


def _only_trial(world: World, state: TrialState, outcome: str) -> dict[str, object]:
    trial, *queued = world.trials()
    assert all(t.state == TrialState.WAITING for t in queued)  # grid points not yet run
    assert (trial.state, trial.user_attrs["outcome"]) == (state, outcome), trial.user_attrs
    assert world.problems() == []
    record = json.loads((world.study_dir / "trials/0000/trial.json").read_text())
    assert isinstance(record, dict)
    return record


def test_hang_in_weight_load(world: World) -> None:
    world.foreign_sleep()
    world.study(flags='sim-fault = "hang-weight-load"')
    done = world.run()
    assert done.rc == 0, done.err
    record = _only_trial(world, TrialState.FAIL, "hang")
    assert "weight_load" in str(record["reason"])


@pytest.mark.parametrize("fault", ["health-empty", "health-fail"])
def test_broken_health_while_serving_works(world: World, fault: str) -> None:
    world.foreign_sleep()
    world.study(flags=f'sim-fault = "{fault}"', duration=1.0)
    done = world.run()
    assert done.rc == 0, done.err
    record = _only_trial(world, TrialState.COMPLETE, "ok")
    workload = record["workload"]
    assert isinstance(workload, dict)
    assert workload["overall"]["completed"] > 0 and workload["overall"]["failed"] == 0


def test_non_oom_crash_mid_load(world: World) -> None:
    world.foreign_sleep()
    world.study(flags='sim-fault = "crash-mid-load"')
    done = world.run()
    assert done.rc == 0, done.err
    record = _only_trial(world, TrialState.COMPLETE, "startup_error")
    assert world.trials()[0].constraints["crash"] > 0
    assert "Scheduler hit an exception" in str(record["evidence"])


def test_oom_at_startup(world: World) -> None:
    world.foreign_sleep()
    world.study(baseline=0.97)
    done = world.run()
    assert done.rc == 0, done.err
    record = _only_trial(world, TrialState.COMPLETE, "startup_oom")
    assert "out of memory" in str(record["evidence"]).lower()
    assert world.trials()[0].constraints["oom"] > 0


def test_oom_under_load(world: World) -> None:
    world.foreign_sleep()
    world.study(phases=STRESS, baseline=0.93, flags=EAGLE)
    done = world.run()
    assert done.rc == 0, done.err
    record = _only_trial(world, TrialState.COMPLETE, "runtime_oom")
    assert "CUDA out of memory" in str(record["evidence"])
    assert record["capacity_tokens"] > 0  # the capacity it measured is kept


def test_server_ignoring_sigterm_is_killed(world: World) -> None:
    world.foreign_sleep()
    world.study(flags='sim-fault = "ignore-sigterm"')
    done = world.run()
    assert done.rc == 0, done.err
    record = _only_trial(world, TrialState.COMPLETE, "ok")
    assert record["phases"]["teardown"] >= 1.5  # the whole grace, then SIGKILL


def test_gpu_memory_held_briefly_is_waited_out(world: World) -> None:
    world.foreign_sleep()
    world.study(flags='sim-fault = "hold-gpu=1.5"', release_s=10, n_trials=2)
    done = world.run()
    assert done.rc == 0, done.err
    first, second, *queued = world.trials()
    assert (first.state, first.user_attrs["outcome"]) == (TrialState.COMPLETE, "ok")
    record = json.loads((world.study_dir / "trials/0000/trial.json").read_text())
    assert record["phases"]["teardown"] >= 1.4  # its memory was waited for
    # The next launch was not refused: its trial ran and has its own record.
    assert second.state == TrialState.COMPLETE, second.user_attrs
    assert (world.study_dir / "trials/0001/trial.json").exists()
    assert all(t.state == TrialState.WAITING for t in queued)
    assert world.problems() == []


def test_gpu_memory_never_released_stops_the_run_clearly(world: World) -> None:
    world.foreign_sleep()
    world.study(flags='sim-fault = "hold-gpu=60"', release_s=1, n_trials=2)
    done = world.run()
    assert done.rc == 1, done.out + done.err
    assert "trial 0: teardown" in done.err and "stopping the study" in done.err
    assert "more in use than before the launch" in done.err
    # The line names the holder and the budget it was given.
    assert re.search(r"pid \d+ \(main process, exited\) holds [\d.]+ GiB on GPUs 0-7", done.err)
    assert "past the teardown budget (stop_grace_s + release_s = 2.5 s)" in done.err
    assert done.err.count("\n") == 1
    [trial, *queued] = world.trials()
    assert trial.state == TrialState.COMPLETE and trial.user_attrs["outcome"] == "ok"
    assert all(t.state == TrialState.WAITING for t in queued)  # nothing launched after it
    assert world.problems() == []
