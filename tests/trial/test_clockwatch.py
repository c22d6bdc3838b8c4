"""The clock watch with injected clocks: what counts as a pause (a stop, a suspend), what does not
(a late wake, a busy autotune, a lone SIGCONT), and what `run_trial` records for a trial that
autotune was paused through."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from autotune.config.schema import Limits
from autotune.logparse.outcome import Outcome
from autotune.trial.clockwatch import ClockWatch
from autotune.trial.plan import TrialPlan
from autotune.trial.run import run_trial
from autotune.trial.seam import Load, Startup, Stop
from tests.study.fakes import Behaviour, FakeLauncher, FakeRun, kimi_like


@dataclass
class Clocks:
    """CLOCK_MONOTONIC, CLOCK_BOOTTIME and the process's CPU time, moved by hand."""

    mono: float = 100.0
    boot: float = 200.0
    cpu: float = 5.0

    def run(self, seconds: float, cpu: float = 0.0) -> None:
        """`seconds` pass with autotune running (or stopped: both clocks move), `cpu` used."""
        self.mono += seconds
        self.boot += seconds
        self.cpu += cpu

    def suspend(self, seconds: float) -> None:
        """The machine sleeps: only CLOCK_BOOTTIME moves."""
        self.boot += seconds

    def watch(self) -> ClockWatch:
        return ClockWatch(
            tick_s=0.25,
            monotonic=lambda: self.mono,
            boot=lambda: self.boot,
            cpu=lambda: self.cpu,
        )


def test_ticks_on_time_are_no_pause() -> None:
    clocks = Clocks()
    watch = clocks.watch()
    for _ in range(20):
        clocks.run(0.25, cpu=0.1)
        assert watch.look() is None
    clocks.run(0.25 + 0.9)  # a wake 0.9 s late: the scheduler's, not a pause
    assert watch.look() is None
    assert watch.pauses == () and watch.disturbance(0.0) == ""


def test_a_stop_is_a_pause_on_both_clocks() -> None:
    clocks = Clocks()
    watch = clocks.watch()
    watch.phase = "workload"
    clocks.run(20.25, cpu=0.05)  # SIGSTOP for 20 s: both clocks move, no CPU is used
    pause = watch.look()
    assert pause is not None
    assert pause.seconds == pytest.approx(19.95) and pause.phase == "workload"
    assert not pause.suspended
    assert watch.paused_s() == pytest.approx(19.95)
    assert watch.disturbance(2.0) == "autotune was paused 19.9 s during workload"
    assert watch.disturbance(20.0) == ""  # within the limit


def test_a_busy_autotune_is_not_paused() -> None:
    """One long call holding the interpreter keeps the thread from looking, and burns the CPU
    time it keeps it for."""
    clocks = Clocks()
    watch = clocks.watch()
    clocks.run(5.25, cpu=5.1)
    assert watch.look() is None
    assert watch.disturbance(0.0) == ""


def test_a_suspend_moves_only_boottime() -> None:
    clocks = Clocks()
    watch = clocks.watch()
    watch.phase = "startup"
    clocks.run(0.25)
    clocks.suspend(600.0)
    pause = watch.look()
    assert pause is not None and pause.suspended and pause.seconds == pytest.approx(600.0)
    assert watch.disturbance(2.0) == (
        "autotune was paused 600.0 s during startup (the machine was suspended: CLOCK_BOOTTIME "
        "moved, CLOCK_MONOTONIC did not)"
    )


def test_sigcont_explains_a_pause_and_alone_is_none() -> None:
    clocks = Clocks()
    watch = clocks.watch()
    watch.phase = "workload"
    watch.sigcont()  # the kernel sends one with every hang-up: no jump, no pause
    clocks.run(0.25)
    assert watch.look() is None and watch.disturbance(0.0) == ""
    clocks.run(30.0)  # far from that SIGCONT
    clocks.run(8.25)
    watch.look()
    assert watch.disturbance(2.0) == "autotune was paused 38.0 s during workload"
    watch.sigcont()  # the one that ended this stop, handled as the thread woke
    assert watch.disturbance(2.0) == "autotune was paused 38.0 s during workload (SIGCONT received)"


def test_pauses_add_up_across_phases_and_the_teardown_does_not_count() -> None:
    clocks = Clocks()
    watch = clocks.watch()
    for phase, seconds in (("startup", 1.5), ("workload", 1.25), ("teardown", 60.0)):
        watch.phase = phase
        clocks.run(seconds + 0.25)
        assert watch.look() is not None
    assert watch.paused_s() == pytest.approx(2.75)
    assert watch.disturbance(2.0) == (
        "autotune was paused 2.8 s in all (2 pauses: 1.5 s during startup, 1.2 s during workload)"
    )
    assert watch.disturbance(3.0) == ""  # the 60 s in the teardown measured nothing


def test_the_sigcont_handler_is_installed_while_the_watch_runs() -> None:
    before = signal.getsignal(signal.SIGCONT)
    with ClockWatch() as watch:
        os.kill(os.getpid(), signal.SIGCONT)
        deadline = time.monotonic() + 5
        while not watch._sigconts and time.monotonic() < deadline:
            time.sleep(0.01)
        assert watch._sigconts, "the SIGCONT handler never ran"
    assert signal.getsignal(signal.SIGCONT) == before


# ------------------------------------------------------------------------------------------------
# run_trial: the hook
# ------------------------------------------------------------------------------------------------


def _plan(tmp_path: Path, pause_s: float = 2.0) -> TrialPlan:
    return TrialPlan(
        number=0,
        params={"mem_fraction_static": 0.88},
        argv=("python", "-m", "autotune.sim"),
        env={},
        host="127.0.0.1",
        port=31000,
        trial_dir=tmp_path / "trials" / "0000",
        limits=Limits(pause_s=pause_s),
        backend="sim",
    )


@dataclass
class _PausedRun(FakeRun):
    """A fake server during whose `phase` autotune is paused (`pause` moves the clocks)."""

    phase: str = "workload"
    pause: Callable[[], None] = lambda: None

    def wait_ready(self) -> Startup:
        if self.phase == "startup":
            self.pause()
        return super().wait_ready()

    def drive(self, ledger: Mapping[str, object]) -> Load:
        if self.phase == "workload":
            self.pause()
        return super().drive(ledger)

    def stop(self) -> Stop:
        if self.phase == "teardown":
            self.pause()
        return super().stop()


def _trial(  # type: ignore[no-untyped-def]
    tmp_path: Path,
    phase: str,
    seconds: float,
    *,
    behaviour: Behaviour = kimi_like,
    interrupt: bool = False,
    clock: Callable[[], float] | None = None,
):
    """One trial on the fake server, autotune paused `seconds` during its `phase` (then, with
    `interrupt`, stopped by Ctrl-C); `clock` is the trial's, a tick a call unless given."""
    clocks = Clocks()
    watch = clocks.watch()

    def pause() -> None:
        clocks.run(seconds + 0.25)
        watch.look()
        if interrupt:
            raise KeyboardInterrupt

    class Launcher(FakeLauncher):
        def launch(self, plan: TrialPlan) -> FakeRun:
            run = super().launch(plan)
            return _PausedRun(run.script, run.log, phase=phase, pause=pause)

    ticks = iter(range(1000))
    return run_trial(
        _plan(tmp_path), Launcher(behaviour=behaviour), clock=clock or (lambda: float(next(ticks))),
        phase=lambda _: None, watch=watch,
    )  # fmt: skip


def test_a_trial_paused_in_its_workload_is_disturbed_and_runs_again(tmp_path: Path) -> None:
    record = _trial(tmp_path, "workload", 20.3)
    assert (record.state, record.outcome) == ("fail", "disturbed")
    assert Outcome.of(record.outcome).requeued and record.measured() is None
    assert record.reason == (
        "autotune was paused 20.3 s during workload; the measurement is not the server's "
        "(it measured ok, 988 tok/s)"
    )
    assert record.capacity_tokens > 0  # the pool the log showed is kept in the record


def test_a_watchdog_verdict_during_a_pause_is_not_the_server_s(tmp_path: Path) -> None:
    """The phase limit ran out while autotune was stopped: disturbed, the verdict kept in the
    reason."""

    def timed_out(plan: TrialPlan):  # type: ignore[no-untyped-def]
        from tests.study.fakes import Script

        ready = kimi_like(plan).startup
        load = Load("timeout", "workload", ("workload ran past server.limits.workload_s",))
        return Script(ready, load)

    record = _trial(tmp_path, "workload", 60.0, behaviour=timed_out, clock=time.monotonic)
    assert (record.state, record.outcome) == ("fail", "disturbed")
    assert record.reason.startswith("autotune was paused 60.0 s during workload;")
    assert "(it measured timeout (workload): workload ran past" in record.reason


def test_a_short_pause_or_one_in_the_teardown_changes_nothing(tmp_path: Path) -> None:
    assert _trial(tmp_path / "a", "workload", 1.5).outcome == "ok"
    assert _trial(tmp_path / "b", "teardown", 60.0).outcome == "ok"
    startup = _trial(tmp_path / "c", "startup", 5.0)
    assert startup.outcome == "disturbed" and "during startup" in startup.reason


def test_an_interrupted_trial_stays_interrupted(tmp_path: Path) -> None:
    record = _trial(tmp_path, "startup", 30.0)
    assert record.outcome == "disturbed"

    record = _trial(tmp_path / "i", "workload", 30.0, interrupt=True, clock=time.monotonic)
    assert (record.state, record.outcome) == ("interrupted", "interrupted")
