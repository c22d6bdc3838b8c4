"""How a server run ended, and the log lines that prove it.

The outcome comes from the log, the exit status with who sent the signal that ended it, and the
few other facts only the harness knows (it stopped the server, a phase ran out of time, the log
stalled, a process is gone, the host's disk or port). A death is classed from the first of these
that speaks (`classify`):

1. **The signal and its sender** (`RunFacts.exit_code`, `RunFacts.sender`). The host's OOM
   killer (`oom_killer`) is a host-memory failure, a parameter result: `runtime_oom` or
   `startup_oom`, cause `host_oom_killer`. A signal from `outside` (neither autotune nor the
   OOM killer) is `killed`, cause `signal:SIGKILL` (…), unless the log holds a failure line:
   SGLang SIGKILLs its own tree when a scheduler fails (`utils` `kill_process_tree`, called by
   `engine.py`'s launch-phase and `tokenizer_manager.py`'s running-phase SIGQUIT handlers), so
   a -9 after a failure line is that line's verdict. A signal from `autotune` is our stop. A
   rank that died of SIGKILL (`Subprocess scheduler_3 … crashed with exit code -9`) is the OOM
   killer's, as SGLang's own message suggests, unless the harness watched the kernel and its
   OOM killer killed nothing meanwhile (`RunFacts.oom_ruled_out`): then `killed` from outside.
2. **The log's own failure lines** (`logparse.events.FAILURE_KINDS`; the most specific wins,
   `_PRIORITY`, so a traceback's exception line beats the `Scheduler hit an exception` that
   announced it and any line before it). A machine fault (`logparse.events.MACHINE_KINDS`: port
   taken, disk full, GPU or driver fault, the host's limits, NCCL's system and network errors)
   is `machine_error`; a memory line is an OOM; anything else a crash (`startup_error` before the
   server served). Whether the server was serving when it came (after "fired up", batch lines,
   serving-only lines or serving-loop frames) decides startup vs runtime. Failure lines after
   autotune began its stop (`RunFacts.stop_line`), or after a SIGTERM from outside, are the
   shutdown's noise, except OOMs. A bare `…Error:` line (it may be a handled request error)
   counts only for a process that ended by itself, not one a signal ended (ours or one from
   outside). Then a **SIGTERM from outside**: SGLang logged `SIGTERM
   received` before autotune began any stop and the sender is not autotune (SGLang then drains
   and requests fail with 503) — `killed`, cause `signal:SIGTERM`.
3. **The host's state** (`RunFacts.host`, e.g. `disk full: 0 B free on /x`): with no stronger
   evidence, a run that died, hung or timed out on a broken host is `machine_error`.
4. **The harness's other facts**: timeout, stall, a lost process, failing health, our stop, an
   exit without a word. A ready server that exits 0 without a word, a signal or our stop is
   `killed`, cause `clean_exit`: SGLang exits 0 only when told to stop (SIGTERM, which it logs;
   uvicorn's SIGINT shutdown), so someone stopped it; a silent non-zero exit stays a crash.

Only lines SGLang treats as deaths are failures: a retraction (`KV cache pool is full. Retract
requests.`, older `Decode out of memory happened.`) or a handled out-of-memory fallback is a
serving event (`Kind.RETRACT`, `Kind.OOM_HANDLED`), counted by `logparse.serving`, never an
ending. A request failed with the OOM error (0.5.23's `retract_decode: aborted last request …
due to OOM`) is an OOM. With no facts at all (a log read after the fact) the log alone decides.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from autotune.logparse.events import (
    FAILURE_KINDS,
    MACHINE_KINDS,
    OOM_KINDS,
    SERVING_KINDS,
    Batch,
    Event,
    Kind,
)


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
    send (someone's `kill`, a stray SIGTERM), or a ready server's exit 0 that nothing in its log
    explains (`clean_exit`). Not the parameters' result."""
    MACHINE_ERROR = "machine_error"
    """The host failed the server: its disk full, its port taken by another process, a driver
    or NCCL fault of the machine. Not the parameters' result."""
    REFUSED = "refused"
    """The server lived through the workload and its log shows no failure, but it answered most
    requests with an error of its own (an HTTP error status other than overload, an abort or an
    error object in the stream, an empty or malformed answer): the server and the requests do
    not fit (a model name, a path, prompts longer than its context, a broken tokenizer or
    proxy), which no memory setting changes. Not the parameters' result."""
    DISTURBED = "disturbed"
    """autotune itself was paused (SIGSTOP, a suspended laptop, a VM migration) long enough
    that what it measured is not the server's, or the server's processes were stopped from
    outside and resumed while its workload ran (cause `signal:stopped`); not the parameters'
    result."""

    @classmethod
    def of(cls, value: object) -> Outcome:
        """A stored outcome read back; anything unrecognised is `unknown`."""
        try:
            return cls(str(value))
        except ValueError:
            return cls.UNKNOWN

    @property
    def is_oom(self) -> bool:
        """Whether the run ran out of memory, at startup or under load: the endings that say the
        memory setting itself was too much."""
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
            Outcome.REFUSED,
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
            Outcome.REFUSED,
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
        """The verdict as JSON values (outcome, cause, evidence lines) for `trial.json` and the
        ledger's `--json`."""
        return {"outcome": str(self.outcome), "cause": self.cause, "evidence": list(self.evidence)}


_CAUSE = re.compile(r"^\s*\w+ \(([\w:.-]+)\)")
REASON_CHARS = 160
"""How much of the deciding log line a trial's one-line reason keeps (the whole line stays in the
evidence)."""


def reason_line(outcome: str, cause: str, evidence: Sequence[str]) -> str:
    """The one-line reason a trial is stored with: the outcome, its cause and the start of the
    deciding log line. A finished trial and a seed read from a past log (`record.seeds`) carry
    the same line for the same verdict."""
    text = outcome + (f" ({cause})" if cause else "")
    if not evidence:
        return text
    first = evidence[0]
    line = first if len(first) <= REASON_CHARS else first[:REASON_CHARS] + "…"
    return f"{text}: {line}"


def cause_of(reason: str) -> str:
    """The cause a stored reason line names (`runtime_oom (decode_oom): …` → `decode_oom`), ""
    where it names none: the inverse of `reason_line`."""
    m = _CAUSE.match(reason)
    return m.group(1) if m else ""


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
    oom_ruled_out: bool = False
    """The harness watched the kernel's OOM killer from the launch (its log, the server's
    memory cgroup) and it killed no process meanwhile: a rank's SIGKILL came from elsewhere."""


_OOM_KINDS = OOM_KINDS | {Kind.NCCL_ERROR}
_STARTUP_MEMORY_KINDS = frozenset(
    {Kind.NO_KV_ROOM, Kind.POOL_TOO_SMALL, Kind.HOST_MEMORY, Kind.HOST_ENOMEM}
)
# The most specific cause wins when several failure lines appear (a traceback ends in an
# `…Error:` line after the `Scheduler hit an exception` line that announced it). A rank the
# host's OOM killer ended ranks with the memory lines (`_KILLED_RANK`), above what the other
# ranks print when their peer vanishes (an NCCL remote error); a rank that died otherwise ranks
# below the line that explains why. A rank's own crash (faulthandler's `Fatal Python error:
# Segmentation fault`) explains its peers' watchdog timeouts, waiting in a collective it never
# joined, and the watchdog's report of its exit code; a rank's own failure explains its peers'
# timeout at the barrier after the weights load. A request failed with the OOM error is below
# every death.
_PRIORITY = (
    Kind.NO_KV_ROOM,
    Kind.POOL_TOO_SMALL,
    Kind.HOST_MEMORY,
    Kind.HOST_ENOMEM,
    Kind.GRAPH_CAPTURE_FAILED,
    Kind.TORCH_OOM,
    Kind.CUDA_ERROR_OOM,
    Kind.TRITON_OOM,
    Kind.PREFILL_OOM,
    Kind.DECODE_OOM,
    Kind.RETRACT_OOM,
    Kind.ALLOC_OOM,
    Kind.REQ_SLOTS_OOM,
    Kind.OOM,
    Kind.NCCL_ERROR,
    "killed_rank",
    Kind.PORT_IN_USE,
    Kind.DISK_FULL,
    Kind.GPU_FAULT,
    Kind.HOST_FAULT,
    Kind.FATAL_SIGNAL,
    Kind.WATCHDOG_TIMEOUT,
    Kind.LOAD_BARRIER,
    Kind.HICACHE_TOO_SMALL,
    Kind.WARMUP_FAILED,
    Kind.NCCL_FAULT,
    Kind.RANK_DEAD,
    Kind.SUBPROCESS_CRASHED,
    Kind.REQUEST_OOM_ABORT,
    Kind.LEAK_CHECK,
    Kind.ERROR,
    Kind.ALLOC_FRAME,
    Kind.SCHEDULER_EXCEPTION,
    Kind.SIGQUIT,
)
_RANK = {kind: i for i, kind in enumerate(_PRIORITY)}
_KILLED_RANK = _RANK["killed_rank"]
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


_TRACEBACK_KINDS = FAILURE_KINDS | {Kind.SERVING_FRAME}


_STOP_SIGNALS = frozenset({-float(signal.SIGTERM), -float(signal.SIGHUP), -float(signal.SIGINT)})


def _stop_signal(deciding: Event) -> str:
    """The stop signal a scheduler died of (`Subprocess scheduler_0 (pid=…) crashed with exit
    code -15`, `Rank 0 scheduler died during initialization (exit code: -15)`), "" otherwise: a
    scheduler handles none of them (only the main process's tokenizer manager handles SIGTERM),
    so the signal's default action ended it."""
    code = deciding.values.get("code")
    if deciding.kind not in (Kind.SUBPROCESS_CRASHED, Kind.RANK_DEAD) or code not in _STOP_SIGNALS:
        return ""
    return signal_name(int(code))


def _serving(deciding: Event, events: Sequence[Event], batches: Sequence[Batch]) -> bool:
    """Whether the server was serving when `deciding` was printed, shown by the log itself: the
    line is one only a serving scheduler prints (`Prefill out of memory`, the subprocess
    watchdog, …), a Prefill/Decode batch line or a retraction came before it, or a traceback
    frame of the serving loop or forward pass sits before it or in the tracebacks that follow
    it (up to the next line with a prefix that is not another failure line: each rank prints its
    own traceback, and an excerpt may cut one rank's frames but keep the next's)."""
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
            if e.time is not None and e.kind not in _TRACEBACK_KINDS:
                break  # the next prefixed line that is no failure ends the tracebacks
            after = after or e.kind is Kind.SERVING_FRAME
    return after


def _evidence(
    deciding: Event, failures: Sequence[Event], events: Sequence[Event] = ()
) -> tuple[str, ...]:
    """The deciding line first with the lines its message goes on with (`Kind.OOM_DETAIL`, the
    lines right below it), then the other failure lines in log order."""
    details: list[Event] = []
    for e in events:
        if e.line_no == deciding.line_no + 1 + len(details) and e.kind is Kind.OOM_DETAIL:
            details.append(e)
        elif e.line_no > deciding.line_no + len(details):
            break
    others = sorted((e for e in failures if e is not deciding), key=lambda e: e.line_no)
    return tuple(e.text.strip() for e in [deciding, *details, *others][:_MAX_EVIDENCE])


def _rank(event: Event, events: Sequence[Event]) -> int:
    if event.kind in (Kind.RANK_DEAD, Kind.SUBPROCESS_CRASHED) and _host_oom_killed(event, events):
        return _KILLED_RANK
    return _RANK.get(event.kind, len(_RANK))


STOP_STATUSES = {128 + int(s): s.name for s in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM)}
"""Exit statuses that report a handled stop signal (128 + N): 129 SIGHUP, 130 SIGINT (Python's
`KeyboardInterrupt` exit), 143 SIGTERM."""


def status_signal(code: int | None) -> str:
    """`SIGINT` for an exit status of 130 (128 + SIGINT): the stop signal a handled exit
    reports; "" for any other status, a signal death or a process that runs."""
    return STOP_STATUSES.get(code, "") if code is not None else ""


def sigquit_alone(events: Sequence[Event]) -> Event | None:
    """SGLang's `SIGQUIT received` line when it is the log's first failure line: SGLang's own
    processes send their parent SIGQUIT only after logging their failure (a scheduler's
    exception, a watchdog's timeout, the subprocess watchdog's `… crashed with exit code`), so a
    SIGQUIT with no failure line before it was sent from outside."""
    first = next((e for e in events if e.kind in FAILURE_KINDS), None)
    return first if first is not None and first.kind is Kind.SIGQUIT else None


def signal_name(exit_code: int | None) -> str:
    """`SIGKILL` for a return code of -9 (`subprocess`'s negative signal number); "" for an
    exit status or an unknown code."""
    if exit_code is None or exit_code >= 0:
        return ""
    try:
        return signal.Signals(-exit_code).name
    except ValueError:
        return f"signal {-exit_code}"


def _foreign_sigterm(events: Sequence[Event], facts: RunFacts) -> Event | None:
    """SGLang's `SIGTERM received` (`tokenizer_manager.py` `SignalHandler.sigterm_handler`)
    logged before autotune began any stop, when the harness does not name itself the sender."""
    if facts.sender == "autotune" or (facts.stopped_by_us and facts.stop_line is None):
        return None
    for e in events:
        if e.kind is Kind.SIGTERM_RECEIVED:
            if facts.stop_line is None or e.line_no <= facts.stop_line:
                return e
            return None
    return None


def _signal_line(facts: RunFacts, signame: str) -> str:
    by = {
        "outside": "sent neither by autotune nor by the host's OOM killer",
        "oom_killer": "sent by the host's OOM killer",
        "autotune": "sent by autotune's stop",
    }.get(facts.sender, "sender unknown")
    return f"the server's main process ended by {signame} (exit code {facts.exit_code}), {by}"


def classify(
    events: Sequence[Event], facts: RunFacts | None = None, batches: Sequence[Batch] = ()
) -> Verdict:
    """The outcome of a run from its log events and batch lines (`logparse`) and the harness's
    facts, in the precedence the module docstring gives.

    A failure is a runtime one when it comes after "fired up", or when the log shows the server
    was serving (`_serving`: batch lines, serving-only lines, serving-loop frames) — a log
    excerpt may not hold the ready line. With no facts (a log file read after the fact) the log
    alone decides: a ready log without a failure is `ready`, or `stopped` if it shows SIGTERM; a
    log that neither became ready nor failed is `unknown`.
    """
    log_only = facts is None
    facts = facts or RunFacts()
    ready = next((e for e in events if e.kind is Kind.READY), None)
    sigterm = _foreign_sigterm(events, facts)
    # Live, a SIGTERM autotune did not send is a death from outside. Read after the fact, a
    # logged SIGTERM is the stop: a SIGTERM to the whole process group (`systemctl stop`,
    # `kill -- -PGID`) also ends each scheduler, and 0.5.23's subprocess watchdog reports that
    # as a crash (`… crashed with exit code -15`). Either way the lines after it are its noise.
    foreign = None if log_only else sigterm
    cut = facts.stop_line
    if sigterm is not None:
        cut = sigterm.line_no if cut is None else min(cut, sigterm.line_no)
    failures = [
        e
        for e in events
        if e.kind in FAILURE_KINDS and (cut is None or e.line_no <= cut or e.kind in _OOM_KINDS)
    ]
    # A bare `…Error:` line can be a handled request error; it proves a failure only next to a
    # stronger line or a process that is gone, when no signal (ours, or one from outside)
    # explains that.
    strong = [e for e in failures if e.kind is not Kind.ERROR]
    # a handled stop signal (exit status 128 + N) ends the server as its signal death does
    signame = signal_name(facts.exit_code) or status_signal(facts.exit_code)
    ours = facts.stopped_by_us or facts.sender == "autotune"
    explained = ours or foreign is not None or (facts.sender == "outside" and bool(signame))
    if not strong and (not facts.exited or explained):
        failures = []
    if facts.sender == "oom_killer":
        return _host_oom_verdict(events, batches, ready, failures, facts, signame or "SIGKILL")
    if facts.sender == "outside" and signame and not strong and foreign is None:
        evidence = (_signal_line(facts, signame), *facts.host, *facts.notes)
        return Verdict(Outcome.KILLED, f"signal:{signame}", evidence[:_MAX_EVIDENCE])
    if failures:
        verdict = _from_failure_lines(events, batches, ready, failures, facts)
        quit = sigquit_alone(events) if facts.sender == "outside" else None
        if quit is not None and verdict.cause == str(Kind.SIGQUIT):
            # SGLang answers any SIGQUIT by killing its own tree; with no failure line before
            # it, the signal is someone else's
            line = (
                f"{quit.text.strip()} (no failure line of any server process before it: "
                "SGLang's own processes send SIGQUIT only after logging their failure, so it "
                "came from outside)"
            )
            evidence = (line, *verdict.evidence[1:])[:_MAX_EVIDENCE]
            return Verdict(Outcome.KILLED, "signal:SIGQUIT", evidence)
        return verdict
    if foreign is not None:
        evidence = (
            foreign.text.strip(),
            "SIGTERM not sent by autotune: it came before autotune began any stop",
            *facts.host,
        )
        return Verdict(Outcome.KILLED, "signal:SIGTERM", evidence)
    return _without_failure_lines(events, ready, facts)


def _host_oom_verdict(
    events: Sequence[Event],
    batches: Sequence[Batch],
    ready: Event | None,
    failures: Sequence[Event],
    facts: RunFacts,
    signame: str,
) -> Verdict:
    """The host's OOM killer ended the main process: a host-memory failure of the parameters."""
    serving = ready is not None or bool(batches) or any(e.kind in SERVING_KINDS for e in events)
    outcome = Outcome.RUNTIME_OOM if serving else Outcome.STARTUP_OOM
    ordered = sorted(failures, key=lambda e: e.line_no)
    evidence = (_signal_line(facts, signame), *facts.notes, *(e.text.strip() for e in ordered))
    return Verdict(outcome, "host_oom_killer", evidence[:_MAX_EVIDENCE])


def _from_failure_lines(
    events: Sequence[Event],
    batches: Sequence[Batch],
    ready: Event | None,
    failures: Sequence[Event],
    facts: RunFacts,
) -> Verdict:
    deciding = min(failures, key=lambda e: (_rank(e, events), e.line_no))
    evidence = _evidence(deciding, failures, events)
    if deciding.kind is Kind.ALLOC_FRAME:
        # an excerpt cut the allocator's message: its frame names the pool that ran out
        deciding = deciding._replace(kind=Kind(deciding.label))
    if deciding.kind in MACHINE_KINDS:
        return Verdict(
            Outcome.MACHINE_ERROR, str(deciding.kind), (evidence + facts.host)[:_MAX_EVIDENCE]
        )
    if deciding.kind in (Kind.WATCHDOG_TIMEOUT, Kind.LOAD_BARRIER):
        return Verdict(Outcome.HANG, str(deciding.kind), evidence)
    stop = _stop_signal(deciding)
    if stop:
        # a scheduler ended by a stop signal it does not handle: someone stopped it
        return Verdict(Outcome.KILLED, f"signal:{stop}", (evidence + facts.host)[:_MAX_EVIDENCE])
    after_ready = ready is not None and deciding.line_no > ready.line_no
    serving = after_ready or _serving(deciding, events, batches)
    if _host_oom_killed(deciding, events):
        if facts.oom_ruled_out:
            # SGLang's own hint names the OOM killer; the kernel, watched, says it was not
            line = (evidence[0], OOM_RULED_OUT, *evidence[1:])
            return Verdict(Outcome.KILLED, "signal:SIGKILL", (*line, *facts.host)[:_MAX_EVIDENCE])
        outcome = Outcome.RUNTIME_OOM if serving else Outcome.STARTUP_OOM
        return Verdict(outcome, "host_oom_killer", evidence)
    memory = _is_memory(deciding, failures)
    if serving:
        outcome = Outcome.RUNTIME_OOM if memory else Outcome.CRASH
    else:
        outcome = Outcome.STARTUP_OOM if memory else Outcome.STARTUP_ERROR
    return Verdict(outcome, str(deciding.kind), evidence)


OOM_RULED_OUT = (
    "the kernel's OOM killer, watched from the launch (its log, the server's memory cgroup), "
    "killed no process meanwhile, and autotune did not stop the server: the SIGKILL came from "
    "outside"
)
"""The evidence line of a rank SIGKILLed while the kernel's OOM killer was watched and silent."""

STOPPED_FROM_OUTSIDE = "signal:stopped"
"""The cause of a stall whose server processes a stop signal from outside (SIGSTOP, SIGTSTP)
had stopped."""

_HOST_CAUSES = (
    ("disk", "disk_full"),
    ("the disk", "disk_full"),
    ("port", "port_in_use"),
    ("the server's log", "log_unwritable"),
)
"""How `autotune.server.deaths.host_state`'s lines begin, and the cause each names."""


def _host_verdict(facts: RunFacts) -> Verdict | None:
    """A broken host explains a death, hang or timeout the log does not explain."""
    ours = facts.stopped_by_us or facts.sender == "autotune"
    died = facts.exited and not ours
    if not facts.host or not (
        died or facts.timed_out or facts.stalled or facts.lost or facts.unhealthy
    ):
        return None
    first = facts.host[0].lower()
    cause = next((c for word, c in _HOST_CAUSES if first.startswith(word)), "host_state")
    return Verdict(Outcome.MACHINE_ERROR, cause, (*facts.host, *facts.notes)[:_MAX_EVIDENCE])


def _without_failure_lines(
    events: Sequence[Event], ready: Event | None, facts: RunFacts
) -> Verdict:
    ready_text = (ready.text.strip(),) if ready else ()
    host = _host_verdict(facts)
    if host is not None:
        return host
    if facts.timed_out:
        return Verdict(Outcome.TIMEOUT, f"phase_timeout:{facts.timed_out}", facts.notes)
    if facts.stalled and facts.sender == "outside":
        # the server's processes were stopped from outside: not the parameters' hang
        return Verdict(Outcome.KILLED, STOPPED_FROM_OUTSIDE, facts.notes)
    if facts.stalled:
        return Verdict(Outcome.HANG, f"stall:{facts.stalled}", facts.notes)
    if facts.lost:
        return Verdict(Outcome.CRASH, "process_lost", (facts.lost, *ready_text, *facts.notes))
    if facts.unhealthy:
        return Verdict(Outcome.HANG, "unhealthy", (facts.unhealthy, *ready_text, *facts.notes))
    if facts.stopped_by_us or facts.sender == "autotune":
        return Verdict(Outcome.STOPPED, "stopped", ready_text)
    if facts.exited and facts.exit_code == 0 and ready is not None:
        # SGLang exits 0 only when told to stop (a SIGTERM it logs, uvicorn's SIGINT shutdown):
        # a ready server that exits 0 by itself, with no failure line, was stopped by someone.
        evidence = (
            "the server's main process exited 0 by itself after it was ready: no failure line, "
            "no signal, not autotune's stop (SGLang exits 0 only when told to stop)",
            *ready_text,
            *facts.host,
            *facts.notes,
        )
        return Verdict(Outcome.KILLED, "clean_exit", evidence[:_MAX_EVIDENCE])
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
