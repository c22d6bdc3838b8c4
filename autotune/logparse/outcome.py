"""How a server run ended, and the log lines that prove it.

The exit code is never evidence: SGLang SIGKILLs its own process tree on a crash (and, up to
0.5.9, on a clean stop). The outcome comes from the log, plus the few facts only the harness
knows (it stopped the server, a phase ran out of time, the log stalled, the process is gone).
Precedence: a failure line beats everything; whether the server was serving when it came (after
"fired up", or after batch lines, serving-only lines or serving-loop frames) decides startup vs
runtime; without a failure line the harness's facts decide. Every "out of memory" line is an OOM
(`logparse.lines.OOM_KINDS`); a SIGKILLed scheduler (exit code -9) is the host's OOM killer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from autotune.logparse.lines import FAILURE_KINDS, OOM_KINDS, SERVING_KINDS, Batch, Event, Kind


class Outcome(StrEnum):
    """How a trial ended: what the server's log and the harness show, plus the endings the
    harness itself decides (`harness_error`, `interrupted`, `stale`, `skipped`). Every rule that
    depends on an ending asks the member, so the sets are defined once, here."""

    READY = "ready"
    OK = "ok"
    """The server survived the whole workload (a trial's ending; the log alone says `ready`)."""
    STARTUP_OOM = "startup_oom"
    STARTUP_ERROR = "startup_error"
    RUNTIME_OOM = "runtime_oom"
    CRASH = "crash"
    HANG = "hang"
    TIMEOUT = "timeout"
    STOPPED = "stopped"
    UNKNOWN = "unknown"
    HARNESS_ERROR = "harness_error"
    INTERRUPTED = "interrupted"
    STALE = "stale"
    SKIPPED = "skipped"
    KILLED = "killed"
    """Ended from outside: a signal autotune did not send and the host's OOM killer did not
    send (someone's `kill`, a stray SIGTERM). Not the parameters' result."""
    MACHINE_ERROR = "machine_error"
    """The host failed the server: its disk full, its port taken by another process, a driver
    or NCCL fault of the machine. Not the parameters' result."""
    DISTURBED = "disturbed"
    """autotune itself was paused (SIGSTOP, a suspended laptop, a VM migration) long enough
    that what it measured is not the server's; not the parameters' result."""

    @classmethod
    def of(cls, value: object) -> Outcome:
        """A stored outcome read back; anything unrecognised is `unknown`."""
        try:
            return cls(str(value))
        except ValueError:
            return cls.UNKNOWN

    @property
    def is_oom(self) -> bool:
        return self in (Outcome.STARTUP_OOM, Outcome.RUNTIME_OOM)

    @property
    def fails_at_startup(self) -> bool:
        """The parameters kept the server from starting."""
        return self in (Outcome.STARTUP_OOM, Outcome.STARTUP_ERROR)

    @property
    def fails_at_runtime(self) -> bool:
        """The parameters let the server start, then it died serving."""
        return self in (Outcome.RUNTIME_OOM, Outcome.CRASH)

    @property
    def is_parameter_result(self) -> bool:
        """The parameters caused this ending: a finished, infeasible trial to learn from."""
        return self.fails_at_startup or self.fails_at_runtime

    @property
    def is_crash(self) -> bool:
        """A parameter failure that was not an OOM."""
        return self.is_parameter_result and not self.is_oom

    @property
    def requeued(self) -> bool:
        """Endings whose point runs again: autotune, the machine or someone outside cut the trial
        short, so it says nothing about the parameters."""
        return self in (
            Outcome.HARNESS_ERROR,
            Outcome.INTERRUPTED,
            Outcome.STALE,
            Outcome.KILLED,
            Outcome.MACHINE_ERROR,
            Outcome.DISTURBED,
        )

    @property
    def counted(self) -> bool:
        """Whether a failed trial with this ending counts toward the budget: endings autotune cut
        short or the machine failed run their point again, and skipped ones never launched."""
        return not self.requeued and self is not Outcome.SKIPPED

    @property
    def machine_suspect(self) -> bool:
        """Endings that, repeated, mean the machine or the study file is broken, not the
        parameters."""
        return self in (
            Outcome.HARNESS_ERROR,
            Outcome.STARTUP_ERROR,
            Outcome.HANG,
            Outcome.TIMEOUT,
            Outcome.UNKNOWN,
            Outcome.KILLED,
            Outcome.MACHINE_ERROR,
            Outcome.DISTURBED,
        )


@dataclass(frozen=True)
class Verdict:
    """An outcome, a short cause (`no_kv_room`, `torch_oom`, `phase_timeout:weight_load`, …)
    and the log lines that show it, the deciding line first (empty only when the log shows
    nothing, e.g. a timeout)."""

    outcome: Outcome
    cause: str = ""
    evidence: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        return {"outcome": str(self.outcome), "cause": self.cause, "evidence": list(self.evidence)}


@dataclass(frozen=True)
class RunFacts:
    """What the harness knows besides the log. `stop_line` is the number of log lines written when
    autotune began stopping the server; failure lines after it are the stop's own noise."""

    exited: bool = False
    stopped_by_us: bool = False
    stop_line: int | None = None
    timed_out: str = ""  # phase that ran past its limit, "" if none
    stalled: str = ""  # phase in which the log stopped moving, "" if none
    unhealthy: str = ""  # why the live checks judged a ready server dead, "" if not
    lost: str = ""  # which server process vanished while the main process lives, "" if none
    notes: tuple[str, ...] = field(default_factory=tuple)
    exit_code: int | None = None
    """The main process's return code as `subprocess` gives it (negative: the signal that ended
    it), None while it runs or when unknown."""
    sender: str = ""
    """Who sent the signal that ended it, where the harness can know: `autotune` (our stop),
    `oom_killer` (the kernel's, from its log or the cgroup's events), `outside` (neither), or
    "" when unknown or no signal ended it."""
    host: tuple[str, ...] = field(default_factory=tuple)
    """What the host showed when the server died: a full disk, its port held by another
    process; each one line, for the verdict's evidence."""


_OOM_KINDS = OOM_KINDS | {Kind.NCCL_ERROR}
_STARTUP_MEMORY_KINDS = frozenset({Kind.NO_KV_ROOM, Kind.POOL_TOO_SMALL, Kind.HOST_MEMORY})
# The most specific cause wins when several failure lines appear (a traceback ends in an
# `…Error:` line after the `Scheduler hit an exception` line that announced it).
_PRIORITY = (
    Kind.NO_KV_ROOM,
    Kind.POOL_TOO_SMALL,
    Kind.HOST_MEMORY,
    Kind.GRAPH_CAPTURE_FAILED,
    Kind.TORCH_OOM,
    Kind.CUDA_ERROR_OOM,
    Kind.TRITON_OOM,
    Kind.PREFILL_OOM,
    Kind.DECODE_OOM,
    Kind.ALLOC_OOM,
    Kind.REQ_SLOTS_OOM,
    Kind.OOM,
    Kind.NCCL_ERROR,
    Kind.WATCHDOG_TIMEOUT,
    Kind.HICACHE_TOO_SMALL,
    Kind.WARMUP_FAILED,
    Kind.RANK_DEAD,
    Kind.SUBPROCESS_CRASHED,
    Kind.ERROR,
    Kind.SCHEDULER_EXCEPTION,
    Kind.SIGQUIT,
)
_RANK = {kind: i for i, kind in enumerate(_PRIORITY)}
_MAX_EVIDENCE = 8
SIGKILL = -9.0


def _is_memory(event: Event, failures: Sequence[Event]) -> bool:
    if event.kind in _OOM_KINDS or event.kind in _STARTUP_MEMORY_KINDS:
        return True
    if event.kind is Kind.GRAPH_CAPTURE_FAILED:
        return "out of memory" in event.text or any(e.kind in _OOM_KINDS for e in failures)
    return False


def _host_oom_killed(deciding: Event, events: Sequence[Event]) -> bool:
    """A process SIGKILLed: the kernel's OOM killer, a host-memory failure.

    0.5.18+ says so itself (`Rank i scheduler died during initialization (exit code: -9). If
    exit code is -9 (SIGKILL), a common cause is the OS OOM killer.`; after startup the
    subprocess watchdog's `Subprocess scheduler_i (pid=…) crashed with exit code -9.`). 0.5.9
    printed `Rank i scheduler is dead.` and the code on the next line; there a -9 counts only
    after the scheduler summary line, i.e. while the ranks pin their host cache."""
    if deciding.kind is Kind.SUBPROCESS_CRASHED:
        return deciding.values.get("code") == SIGKILL
    if deciding.kind is not Kind.RANK_DEAD:
        return False
    if "code" in deciding.values:
        return deciding.values["code"] == SIGKILL
    summary = next((e for e in events if e.kind is Kind.SCHEDULER_SUMMARY), None)
    killed = any(e.kind is Kind.EXIT_CODE and e.values.get("code") == SIGKILL for e in events)
    return killed and summary is not None and summary.line_no < deciding.line_no


def _serving(deciding: Event, events: Sequence[Event], batches: Sequence[Batch]) -> bool:
    """Whether the server was serving when `deciding` was printed, shown by the log itself: the
    line is one only a serving scheduler prints (`Prefill out of memory`, the subprocess
    watchdog, …), a Prefill/Decode batch line or a retraction came before it, or a traceback
    frame of the serving loop or forward pass sits before it or in the traceback that follows
    it (up to the next line with a prefix)."""
    if deciding.kind in SERVING_KINDS:
        return True
    first = next(iter(batches), None)  # batches come in line order (a list, tuple or deque)
    if first is not None and first.line_no < deciding.line_no:
        return True
    after = False
    for e in events:
        if e.line_no < deciding.line_no:
            if e.kind in SERVING_KINDS:
                return True
        elif e.line_no > deciding.line_no:
            if e.time is not None and e.kind is not Kind.SERVING_FRAME:
                break  # the next prefixed line ends the traceback
            after = after or e.kind is Kind.SERVING_FRAME
    return after


def _evidence(deciding: Event, failures: Sequence[Event]) -> tuple[str, ...]:
    """The deciding line first, then the other failure lines in log order."""
    others = sorted((e for e in failures if e is not deciding), key=lambda e: e.line_no)
    return tuple(e.text.strip() for e in [deciding, *others][:_MAX_EVIDENCE])


def classify(
    events: Sequence[Event], facts: RunFacts | None = None, batches: Sequence[Batch] = ()
) -> Verdict:
    """The outcome of a run from its log events and batch lines (`logparse`) and the harness's
    facts.

    A failure is a runtime one when it comes after "fired up", or when the log shows the server
    was serving (`_serving`: batch lines, serving-only lines, serving-loop frames) — a log
    excerpt may not hold the ready line. With no facts (a log file read after the fact) the log
    alone decides: a ready log without a failure is `ready`, or `stopped` if it shows SIGTERM; a
    log that neither became ready nor failed is `unknown`.
    """
    facts = facts or RunFacts()
    ready = next((e for e in events if e.kind is Kind.READY), None)
    failures = [
        e
        for e in events
        if e.kind in FAILURE_KINDS
        and (facts.stop_line is None or e.line_no <= facts.stop_line or e.kind in _OOM_KINDS)
    ]
    # A bare `…Error:` line can be a handled request error; it proves a failure only next to a
    # stronger line or a process that is gone.
    if not facts.exited and all(e.kind is Kind.ERROR for e in failures):
        failures = []
    if failures:
        deciding = min(failures, key=lambda e: (_RANK.get(e.kind, len(_RANK)), e.line_no))
        evidence = _evidence(deciding, failures)
        if deciding.kind is Kind.WATCHDOG_TIMEOUT:
            return Verdict(Outcome.HANG, "watchdog_timeout", evidence)
        after_ready = ready is not None and deciding.line_no > ready.line_no
        serving = after_ready or _serving(deciding, events, batches)
        if _host_oom_killed(deciding, events):
            outcome = Outcome.RUNTIME_OOM if serving else Outcome.STARTUP_OOM
            return Verdict(outcome, "host_oom_killer", evidence)
        memory = _is_memory(deciding, failures)
        if serving:
            outcome = Outcome.RUNTIME_OOM if memory else Outcome.CRASH
        else:
            outcome = Outcome.STARTUP_OOM if memory else Outcome.STARTUP_ERROR
        return Verdict(outcome, str(deciding.kind), evidence)
    return _without_failure_lines(events, ready, facts)


def _without_failure_lines(
    events: Sequence[Event], ready: Event | None, facts: RunFacts
) -> Verdict:
    ready_text = (ready.text.strip(),) if ready else ()
    if facts.timed_out:
        return Verdict(Outcome.TIMEOUT, f"phase_timeout:{facts.timed_out}", facts.notes)
    if facts.stalled:
        return Verdict(Outcome.HANG, f"stall:{facts.stalled}", facts.notes)
    if facts.lost:
        return Verdict(Outcome.CRASH, "process_lost", (facts.lost, *ready_text, *facts.notes))
    if facts.unhealthy:
        return Verdict(Outcome.HANG, "unhealthy", (facts.unhealthy, *ready_text, *facts.notes))
    if facts.stopped_by_us:
        return Verdict(Outcome.STOPPED, "stopped", ready_text)
    if facts.exited:
        cause = "exited_after_ready" if ready else "exited_during_startup"
        outcome = Outcome.CRASH if ready else Outcome.STARTUP_ERROR
        return Verdict(outcome, cause, ready_text + facts.notes)
    sigterm = next((e for e in events if e.kind is Kind.SIGTERM_RECEIVED), None)
    if sigterm is not None:
        return Verdict(Outcome.STOPPED, "sigterm", (sigterm.text.strip(),))
    if ready is not None:
        return Verdict(Outcome.READY, "ready", ready_text)
    return Verdict(Outcome.UNKNOWN, "no_ready_line")
