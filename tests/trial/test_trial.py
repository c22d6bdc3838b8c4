"""One trial's ending decides its record: parameters' fault → complete and infeasible; the
machine's fault → failed with a reason; Ctrl-C → the server is stopped and the trial interrupted."""

from __future__ import annotations

import dataclasses
import json
import signal
from pathlib import Path

import pytest

from autotune.config.schema import Limits
from autotune.trial import signals
from autotune.trial.plan import TrialPlan
from autotune.trial.run import run_trial
from autotune.trial.seam import Load, Startup, Stop
from autotune.trial.trialfile import write_record
from tests.study.fakes import FakeLauncher, Script, kimi_like


def _plan(tmp_path: Path, f: float = 0.88) -> TrialPlan:
    return TrialPlan(
        number=3,
        params={"mem_fraction_static": f},
        argv=("python", "-m", "autotune.sim", "--mem-fraction-static", str(f)),
        env={},
        host="127.0.0.1",
        port=31000,
        trial_dir=tmp_path / "trials" / "0003",
        limits=Limits(),
        backend="sim",
    )


def _run(tmp_path: Path, launcher: FakeLauncher, f: float = 0.88):  # type: ignore[no-untyped-def]
    phases: list[str] = []
    ticks = iter(range(1000))
    record = run_trial(
        _plan(tmp_path, f), launcher, clock=lambda: float(next(ticks)), phase=phases.append
    )
    return record, phases


def test_good_trial_is_complete_and_measured(tmp_path: Path) -> None:
    launcher = FakeLauncher()
    record, phases = _run(tmp_path, launcher)
    assert phases == ["launch", "startup", "workload", "teardown"]
    assert launcher.log == ["launch", "wait_ready", "drive", "stop"]
    assert record.state == "complete" and record.outcome == "ok"
    assert record.capacity_tokens == 159_294
    assert record.headroom_gib == pytest.approx(94.04 * 0.12 - 6.5)
    assert record.sglang_version == "0.5.9" and record.autotune_version
    assert record.log_path.endswith("trials/0003/server.log")
    m = record.measured()
    assert m is not None and not m.oom and not m.crashed


def test_startup_oom_is_complete_with_oom(tmp_path: Path) -> None:
    launcher = FakeLauncher()
    record, phases = _run(tmp_path, launcher, 0.94)
    assert "workload" not in phases and launcher.log[-1] == "stop"
    assert record.state == "complete" and record.outcome == "startup_oom"
    assert record.capacity_tokens == 0 and "CUDA out of memory" in record.reason
    assert record.measured().oom  # type: ignore[union-attr]


def test_runtime_oom_keeps_measured_capacity(tmp_path: Path) -> None:
    record, _ = _run(tmp_path, FakeLauncher(), 0.93)
    assert record.state == "complete" and record.outcome == "runtime_oom"
    assert record.capacity_tokens > 159_294


@pytest.mark.parametrize("outcome", ["hang", "timeout", "unknown"])
def test_startup_hang_or_timeout_is_a_failed_trial(tmp_path: Path, outcome: str) -> None:
    launcher = FakeLauncher(lambda p: Script(Startup(outcome, "stall:weight_load")))
    record, _ = _run(tmp_path, launcher)
    assert record.state == "fail" and record.outcome == outcome
    assert "stall:weight_load" in record.reason and record.measured() is None
    assert launcher.log[-1] == "stop"


def test_crash_under_load_is_complete_and_crashed(tmp_path: Path) -> None:
    def crash(plan: TrialPlan) -> Script:
        s = kimi_like(plan)
        return dataclasses.replace(s, load=Load("crash", "scheduler_exception", ("boom",)))

    record, _ = _run(tmp_path, FakeLauncher(crash))
    assert record.state == "complete" and record.outcome == "crash"
    assert record.measured().crashed  # type: ignore[union-attr]


def test_launch_error_is_a_failed_trial(tmp_path: Path) -> None:
    launcher = FakeLauncher(lambda p: Script(Startup("ready"), launch_error="port 31000 is taken"))
    record, _ = _run(tmp_path, launcher)
    assert record.state == "fail" and record.outcome == "harness_error"
    assert "port 31000 is taken" in record.reason


def test_harness_error_during_load_fails_and_still_stops(tmp_path: Path) -> None:
    launcher = FakeLauncher(lambda p: dataclasses.replace(kimi_like(p), interrupt_in="harness"))
    record, _ = _run(tmp_path, launcher)
    assert record.state == "fail" and "GPU probe failed" in record.reason
    assert launcher.log[-1] == "stop"


@pytest.mark.parametrize("where", ["startup", "workload"])
def test_ctrl_c_stops_the_server_and_marks_interrupted(tmp_path: Path, where: str) -> None:
    launcher = FakeLauncher(lambda p: dataclasses.replace(kimi_like(p), interrupt_in=where))
    record, _ = _run(tmp_path, launcher)
    assert launcher.log[-1] == "stop"
    assert record.state == "interrupted" and record.outcome == "interrupted"


def test_a_ctrl_c_whose_exception_was_lost_still_stops_the_trial(tmp_path: Path) -> None:
    """The handler notes the signal and raises; where that raise lands in a garbage collector's
    callback, Python drops it ("Exception ignored in …"). The trial stops at its next step all
    the same: the server is stopped and the trial interrupted, no workload driven."""
    launcher = FakeLauncher()
    signals.received(signal.SIGINT)  # noted, its KeyboardInterrupt lost
    try:
        record, _ = _run(tmp_path, launcher)
    finally:
        signals.forget()
    assert launcher.log == ["launch", "wait_ready", "stop"]
    assert record.state == "interrupted" and record.outcome == "interrupted"
    assert "workload" not in record.phases


def test_unclean_teardown_is_fatal(tmp_path: Path) -> None:
    launcher = FakeLauncher(
        lambda p: dataclasses.replace(kimi_like(p), stop=Stop(False, "GPU memory not released"))
    )
    record, _ = _run(tmp_path, launcher)
    assert record.state == "complete" and record.fatal.startswith("teardown")
    assert "GPU memory not released" in record.result().fatal


def test_record_is_written_as_json(tmp_path: Path) -> None:
    record, _ = _run(tmp_path, FakeLauncher())
    path = write_record(record, tmp_path / "trials" / "0003")
    data = json.loads(path.read_text())
    assert data["number"] == 3 and data["outcome"] == "ok"
    assert data["ledger"]["max_total_num_tokens"] == 159_294
    assert data["params"] == {"mem_fraction_static": 0.88}
    assert set(data["phases"]) == {"launch", "startup", "workload", "teardown", "total"}
    assert not list(path.parent.glob("*.tmp"))


def test_unwritable_record_is_a_harness_error(tmp_path: Path) -> None:
    from autotune.errors import HarnessError

    record, _ = _run(tmp_path, FakeLauncher())
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(HarnessError, match="cannot write"):
        write_record(record, blocker / "0003")


def test_ctrl_c_during_teardown_waits_for_it_and_then_stops_the_run(tmp_path: Path) -> None:
    import os
    import signal

    from autotune.trial.run import INTERRUPT

    class SignalledStop(FakeLauncher):
        def launch(self, plan: TrialPlan):  # type: ignore[no-untyped-def]
            run = super().launch(plan)
            inner = run.stop

            def stop() -> Stop:
                os.kill(os.getpid(), signal.SIGINT)  # the operator presses Ctrl-C right now
                return inner()

            run.stop = stop  # type: ignore[method-assign]
            return run

    launcher = SignalledStop()
    record, _ = _run(tmp_path, launcher)
    assert launcher.log[-1] == "stop"  # the teardown ran to its end
    assert record.state == "complete" and record.outcome == "ok"  # the measurement stands
    assert record.result().fatal == INTERRUPT  # and the run stops after recording it
