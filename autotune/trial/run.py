"""One trial end to end: launch → ready → ledger → workload → metrics → teardown → a record.

The control flow here runs over the seam `trial.seam` (`Launcher` / `ServerRun`), so it is
tested with fakes; `trial.live.LiveLauncher` implements the seam for real. What the ending means
is decided by `trial.judge`; here the teardown is made to happen whatever came before it: the
operator's Ctrl-C (or SIGTERM, or a hang-up: `trial.signals`) stops the server cleanly, a second
signal cannot cut the teardown short, and autotune's own clock is watched through the trial
(`trial.clockwatch`).
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace

from autotune.errors import HarnessError
from autotune.logparse.outcome import signal_name
from autotune.trial import signals
from autotune.trial.clockwatch import ClockWatch
from autotune.trial.judge import BY_OPERATOR, blank_record, disturbed, judge
from autotune.trial.plan import TrialPlan
from autotune.trial.seam import Launcher, Load, Startup, Stop
from autotune.trial.signals import STOP_SIGNALS
from autotune.trial.trialfile import TrialRecord, private_dir

FATAL_TEARDOWN = "teardown"
INTERRUPT = "interrupted"
"""`fatal` value of a finished trial during whose teardown the operator asked to stop."""

Phase = Callable[[str], None]


def run_trial(
    plan: TrialPlan,
    launcher: Launcher,
    *,
    clock: Callable[[], float],
    phase: Phase,
    watch: ClockWatch | None = None,
) -> TrialRecord:
    """Run one trial; never raises for what the server or the machine did. autotune's own clock
    is watched meanwhile (`watch`, a `ClockWatch` by default): a trial it was paused through is
    `disturbed` (`trial.judge.disturbed`)."""
    with watch or ClockWatch() as seen:
        record = _run_trial(plan, launcher, clock=clock, phase=seen.following(phase))
    return disturbed(record, seen, plan.limits.pause_s)


def _run_trial(
    plan: TrialPlan, launcher: Launcher, *, clock: Callable[[], float], phase: Phase
) -> TrialRecord:
    private_dir(plan.trial_dir)
    phases: dict[str, float] = {}
    startup: Startup | None = None
    load: Load | None = None
    stop: Stop | None = None
    harness_error = ""
    interrupted = False
    t0 = clock()
    phase("launch")
    try:
        server = launcher.launch(plan)
    except (HarnessError, OSError) as exc:
        return blank_record(plan, "fail", "harness_error", f"launch failed: {exc}", phases=phases)
    except KeyboardInterrupt:
        return blank_record(plan, "interrupted", "interrupted", BY_OPERATOR, phases=phases)
    phases["launch"] = clock() - t0
    try:
        phase("startup")
        startup = server.wait_ready()
        phases["startup"] = startup.seconds
        if startup.outcome == "ready":
            phase("workload")
            load = server.drive(startup.ledger)
            phases["workload"] = load.seconds
    except KeyboardInterrupt:
        interrupted = True
    except (HarnessError, OSError) as exc:
        harness_error = str(exc)
    finally:
        phase("teardown")
        with _signals_deferred() as pending:
            stop = server.stop()
        phases["teardown"] = stop.seconds
    phases["total"] = clock() - t0
    record = judge(plan, startup, load, interrupted, harness_error, phases)
    record = replace(
        record,
        teardown=stop.waited,
        log_notes=stop.log_notes,
        exit_code=stop.exit_code,
        exit_signal=signal_name(stop.exit_code),
        sender=stop.sender,
        host_state=stop.host,
    )
    if not stop.clean:
        record = replace(record, fatal=f"{FATAL_TEARDOWN}: {stop.reason}")
    elif pending and record.state != "interrupted":
        record = replace(record, fatal=INTERRUPT)
    return record


@contextmanager
def _signals_deferred() -> Iterator[list[int]]:
    """Hold the stop signals while the server is being stopped; the list says if any came."""
    pending: list[int] = []

    def hold(signum: int, frame: object) -> None:
        pending.append(signum)
        signals.received(signum)

    try:
        previous = {
            s: signal.signal(s, hold)
            for s in STOP_SIGNALS
            if signal.getsignal(s) is not signal.SIG_IGN
        }
    except ValueError:  # not the main thread: nothing to defer
        yield pending
        return
    try:
        yield pending
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
