"""One trial end to end: launch → ready → ledger → workload → metrics → teardown → a record.

The control flow here runs over the seam `trial.seam` (`Launcher` / `ServerRun`), so it is
tested with fakes; `trial.live.LiveLauncher` implements the seam for real. What the ending means
is decided by `trial.judge`; here the teardown is made to happen whatever came before it: the
operator's Ctrl-C (or SIGTERM, or a hang-up: `trial.signals`) stops the server cleanly, a second
signal cannot cut the teardown short, and autotune's own clock is watched through the trial
(`trial.clockwatch`).

`run_shared` runs further workloads on the same launch after the trial's own (`autotune
confirm`'s worst cases after its soak): the server is brought to rest before each (`SharedRun.
rest`: cache flushed, free memory settled), each gets its own record, and the first that leaves
the server dead or not at rest ends the sharing; the caller runs the rest on a fresh launch.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

from autotune.config.workload import WorkloadSpec
from autotune.errors import HarnessError
from autotune.logparse.outcome import signal_name
from autotune.trial import signals
from autotune.trial.clockwatch import ClockWatch
from autotune.trial.judge import BY_OPERATOR, blank_record, disturbed, judge
from autotune.trial.plan import TrialPlan
from autotune.trial.seam import Launcher, Load, ServerRun, SharedRun, Startup, Stop
from autotune.trial.signals import STOP_SIGNALS
from autotune.trial.trialfile import TrialRecord, private_dir

FATAL_TEARDOWN = "teardown"
INTERRUPT = "interrupted"
"""`fatal` value of a finished trial during whose teardown the operator asked to stop."""

Phase = Callable[[str], None]


def _stop_if_signalled() -> None:
    """Raise the stop a signal asked for where its handler's exception was lost: Python drops an
    exception raised inside a garbage collector's callback ("Exception ignored in …"), so a
    Ctrl-C landing there was noted (`signals.received`) and never stopped anything."""
    if signals.first_received() is not None:
        raise KeyboardInterrupt


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
    return run_shared(plan, launcher, _nothing_more, clock=clock, phase=phase, watch=watch).first


@dataclass(frozen=True)
class FollowUp:
    """A further workload on a launch, after its own: `name` (its phase, `case NAME`), the plan
    its record is kept under (its own number and folder; the launch's command line, port and
    log) and the workload with its time limit."""

    name: str
    plan: TrialPlan
    workload: WorkloadSpec
    limit_s: float


FollowUps = Callable[[Mapping[str, object]], Sequence[FollowUp]]
"""The follow-ups of a launch, planned from its start's ledger once it serves."""


@dataclass(frozen=True)
class Shared:
    """One launch's records: its own workload's (`first`), then each follow-up's that ran, in
    order (`then`); `unrun` is how many planned follow-ups did not run on it, and `why` why the
    sharing ended early ("" when every follow-up ran)."""

    first: TrialRecord
    then: tuple[TrialRecord, ...] = ()
    unrun: int = 0
    why: str = ""


def _nothing_more(ledger: Mapping[str, object]) -> Sequence[FollowUp]:
    return ()


@dataclass
class _Ran:
    """What one follow-up's workload did on the shared server."""

    follow: FollowUp
    load: Load | None = None
    interrupted: bool = False
    harness_error: str = ""
    seconds: float = 0.0

    @property
    def left_server_serving(self) -> bool:
        return self.load is not None and self.load.outcome == "ready"


def run_shared(
    plan: TrialPlan,
    launcher: Launcher,
    then: FollowUps,
    *,
    clock: Callable[[], float],
    phase: Phase,
    watch: ClockWatch | None = None,
) -> Shared:
    """`run_trial`, and after its workload, on the same server (no restart), each follow-up
    `then` plans from the start's ledger: the server brought to rest first (`SharedRun.rest`),
    so a follow-up's peak is its own. The sharing ends at the first follow-up that leaves the
    server dead (out of memory, a crash, a signal), cut short (the operator, a harness error) or
    not at rest, and at a launcher whose servers cannot share; the teardown's facts (exit code,
    who sent the signal) belong to the last workload that ran. A pause of autotune disturbs only
    the workloads it fell in (and all of them when it fell in the launch or startup)."""
    with watch or ClockWatch() as seen:
        first, ran, unrun, why = _run_trial(
            plan, launcher, then, clock=clock, phase=seen.following(phase)
        )
    limit = plan.limits.pause_s
    return Shared(
        first=disturbed(first, seen, limit),
        then=tuple(
            disturbed(record, seen, limit, ("launch", "startup", _phase_of(f))) for f, record in ran
        ),
        unrun=unrun,
        why=why,
    )


def _phase_of(follow: FollowUp) -> str:
    return f"case {follow.name}"


def _run_trial(
    plan: TrialPlan,
    launcher: Launcher,
    then: FollowUps,
    *,
    clock: Callable[[], float],
    phase: Phase,
) -> tuple[TrialRecord, list[tuple[FollowUp, TrialRecord]], int, str]:
    private_dir(plan.trial_dir)
    phases: dict[str, float] = {}
    startup: Startup | None = None
    load: Load | None = None
    stop: Stop | None = None
    harness_error = ""
    interrupted = False
    ran: list[_Ran] = []
    planned: Sequence[FollowUp] = ()
    why = ""
    t0 = clock()
    phase("launch")
    try:
        server = launcher.launch(plan)
    except (HarnessError, OSError) as exc:
        failed = blank_record(plan, "fail", "harness_error", f"launch failed: {exc}", phases=phases)
        return failed, [], 0, ""
    except KeyboardInterrupt:
        cut = blank_record(plan, "interrupted", "interrupted", BY_OPERATOR, phases=phases)
        return cut, [], 0, ""
    phases["launch"] = clock() - t0
    try:
        try:
            phase("startup")
            startup = server.wait_ready()
            phases["startup"] = startup.seconds
            if startup.outcome == "ready":
                _stop_if_signalled()
                phase("workload")
                load = server.drive(startup.ledger)
                phases["workload"] = load.seconds
                _stop_if_signalled()
                if load.outcome == "ready":
                    planned = then(startup.ledger)
        except KeyboardInterrupt:
            interrupted = True
        except (HarnessError, OSError) as exc:
            harness_error = str(exc)
        phases["total"] = clock() - t0
        if planned:
            why = _follow(server, startup, planned, ran, clock=clock, phase=phase)
    except KeyboardInterrupt:
        why = BY_OPERATOR
        if ran and ran[-1].load is None:
            ran[-1].interrupted = True
    finally:
        phase("teardown")
        with _signals_deferred() as pending:
            stop = server.stop()
    records = [(r.follow, _judge_follow(r, startup, plan)) for r in ran]
    record = judge(plan, startup, load, interrupted, harness_error, phases)
    if not records:
        record = replace(record, phases={**phases, "teardown": stop.seconds,
                                         "total": clock() - t0})  # fmt: skip
        return _torn_down(record, stop, pending), [], len(planned), why
    follow, last = records[-1]
    last = replace(last, phases={**last.phases, "teardown": stop.seconds})
    records[-1] = (follow, _torn_down(last, stop, pending))
    return record, records, len(planned) - len(records), why


def _torn_down(record: TrialRecord, stop: Stop, pending: list[int]) -> TrialRecord:
    """The record with the teardown's facts (of the launch's last workload)."""
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
        return replace(record, fatal=f"{FATAL_TEARDOWN}: {stop.reason}")
    if pending and record.state != "interrupted":
        return replace(record, fatal=INTERRUPT)
    return record


def _follow(
    server: ServerRun,
    startup: Startup | None,
    planned: Sequence[FollowUp],
    ran: list[_Ran],
    *,
    clock: Callable[[], float],
    phase: Phase,
) -> str:
    """Each follow-up in turn on the served `server`, each after a rest; why the sharing ended
    before the last ("" when all ran). The operator's stop ends it with that follow-up
    interrupted; a harness error ends it with that follow-up's record saying so."""
    if startup is None:
        return ""
    if not isinstance(server, SharedRun):
        return "this launcher's servers serve one workload each"
    for follow in planned:
        if ran and not ran[-1].left_server_serving:
            last = ran[-1]
            ending = last.load.outcome if last.load is not None else "cut short"
            return f"the server did not serve through {last.follow.name} ({ending})"
        after = ran[-1].follow.name if ran else "the launch's own workload"
        try:
            unrested = server.rest()
        except KeyboardInterrupt:
            ran.append(_Ran(follow, interrupted=True))
            return BY_OPERATOR
        except (HarnessError, OSError) as exc:
            unrested = str(exc)
        if unrested:
            return f"the server did not come to rest after {after}: {unrested}"
        phase(_phase_of(follow))
        t0 = clock()
        done = _Ran(follow)
        ran.append(done)
        try:
            done.load = server.drive_workload(startup.ledger, follow.workload, follow.limit_s)
        except KeyboardInterrupt:
            done.interrupted = True
        except (HarnessError, OSError) as exc:
            done.harness_error = str(exc)
        done.seconds = clock() - t0
        if done.interrupted or done.harness_error:
            return done.harness_error or BY_OPERATOR
    return ""


def _judge_follow(ran: _Ran, startup: Startup | None, launch: TrialPlan) -> TrialRecord:
    """A follow-up's record: judged like a trial of its own plan on the launch's start, its log
    the launch's (`launch.log_path`)."""
    phases = {"workload": ran.seconds, "total": ran.seconds}
    record = judge(ran.follow.plan, startup, ran.load, ran.interrupted, ran.harness_error, phases)
    return replace(record, log_path=str(launch.log_path))


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
