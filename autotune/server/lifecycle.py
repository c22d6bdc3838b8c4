"""One server under test, from launch to verified teardown; the same code for SGLang and the sim.

`Server.launch(spec)` checks that the port is free, that no server autotune started earlier is
still running, and that no other process holds memory on the GPUs it will use; then it starts
the command in its own session (so its whole tree can be signalled as one group), with stdout and
stderr going straight into the trial's server.log, and writes a pidfile (`server.spawn`). From
then on the handle follows the log file as it grows:

* `wait_ready()` tracks the startup phase, enforces each phase's time limit and the stall
  watchdog, and confirms readiness as SGLang's "fired up" line plus a successful
  `/health_generate`. Trial outcomes (OOM, crash, hang, timeout) come back as values.
* `check_alive()` is cheap and never blocks on the network: process, log and a background
  `/health` watch together. A failing `/health` alone is not death while the log still shows
  batches; it becomes death only when batches stop too, or when a server process vanished.
* `stop()` sends SIGTERM, waits a grace period, SIGKILLs the process group and every other
  process of the server (`autotune.server.teardown`), waits for each to be gone, then waits until
  the GPU probe shows memory back at the pre-launch baseline and the port is free, all within one
  budget of `stop_grace_s + release_s` from the start of the stop (a SIGKILLed process can stay
  in uninterruptible sleep for tens of seconds while the kernel unpins its host buffers, SGLang's
  `mem_cache/pool_host/base.py` says).

Every verdict the handle builds carries the main process's exit status and who sent the signal
that ended it (`autotune.server.deaths`: our stop, the kernel's OOM killer, someone outside), and,
for a death that was not our stop, the host's state (a full disk under the trial folder, the port
held by another process). A SIGTERM the server logs while autotune is not stopping it is a death
from outside even while the server still drains. The exit code alone never makes a parameter
verdict (SGLang SIGKILLs itself after a crash, and up to 0.5.9 after a clean stop).

Every process of the server's group and session, and their descendants, seen while it runs
(about once a second, and whenever its start ends) or at the stop is recorded as ours
(`procs.Seen`, and in the pidfile): the teardown kills and waits for all of them, and the GPU
check counts their memory as the server's, also after a failed start whose main process died
before its schedulers.

Every signal goes to a process identified by pid and start time, never by name; a process
autotune did not start is never touched.

What the handle is given and uses lives beside it: the spec (`server.launchspec`), the start of its
process and its pidfile (`server.spawn`), the masking log writer between the server and its log
(`server.logpipe`), stopping the process tree (`server.teardown`) and the wait for the GPU memory
and the port after it (`server.release`).
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from autotune.logparse.accounting import build_ledger
from autotune.logparse.events import Batch, Event, Kind
from autotune.logparse.ledger import Ledger
from autotune.logparse.outcome import Outcome, RunFacts, Verdict, classify, sigquit_alone
from autotune.logparse.phase import Phase
from autotune.logparse.serverinfo import cross_check, ledger_from_server_info
from autotune.logparse.serving import ServingSummary, summarize
from autotune.server import deaths, pidfile, procs
from autotune.server.gpu import GpuMemory, GpuProbe
from autotune.server.health import HealthWatch, probe_ready, server_info
from autotune.server.launchspec import LaunchSpec
from autotune.server.logpipe import WRITER_END_S, LogWriter
from autotune.server.logwatch import LogWatch
from autotune.server.release import wait_released
from autotune.server.spawn import spawn
from autotune.server.teardown import Clock, Sleep, Teardown, terminate

OBSERVE_S = 1.0
"""How often a running server's processes are looked for in /proc (one scan each time)."""


@dataclass(frozen=True)
class StartupReport:
    """How the start ended; `ledger` is the log's, filled in from /server_info where it was
    silent, and `mismatches` names fields on which the two disagree."""

    outcome: Outcome
    cause: str
    evidence: tuple[str, ...]
    ledger: Ledger
    phase: Phase
    phase_seconds: Mapping[str, float]
    seconds: float
    ready_line_at: float | None = None
    ready_at: float | None = None
    server_info: Mapping[str, Any] = field(default_factory=dict)
    mismatches: tuple[str, ...] = ()

    @property
    def ready(self) -> bool:
        """Whether the server came up and answered a generation."""
        return self.outcome is Outcome.READY

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON values, for `trial.json`."""
        return {
            "outcome": str(self.outcome),
            "cause": self.cause,
            "evidence": list(self.evidence),
            "ledger": self.ledger.to_dict(),
            "phase": str(self.phase),
            "phase_seconds": dict(self.phase_seconds),
            "seconds": round(self.seconds, 3),
            "mismatches": list(self.mismatches),
        }


@dataclass(frozen=True)
class Death:
    """Why a server that was up is no longer serving."""

    outcome: Outcome
    cause: str
    evidence: tuple[str, ...]

    def describe(self) -> str:
        """One line: `outcome (cause): the deciding log line`."""
        last = self.evidence[0] if self.evidence else ""
        return f"{self.outcome} ({self.cause})" + (f": {last}" if last else "")


# ---------------------------------------------------------------------------------------------
# The handle
# ---------------------------------------------------------------------------------------------


class Server:
    """A launched server. Create with `Server.launch`; always end with `stop()`."""

    def __init__(
        self,
        spec: LaunchSpec,
        process: subprocess.Popen[bytes],
        record: pidfile.PidRecord,
        record_path: Path,
        probe: GpuProbe | None,
        baseline: list[GpuMemory],
        clock: Clock,
        sleep: Sleep,
        writer: LogWriter | None = None,
    ) -> None:
        self.spec = spec
        self.process = process
        self.writer = writer
        """The masking log writer between the server and its log (None: no secret to mask)."""
        self._settled = False
        self.record = record
        self._record_path = record_path
        self._probe = probe
        self._baseline = baseline
        self._clock = clock
        self._sleep = sleep
        self.launched_at = clock()
        self.log = LogWatch(spec.log_path, clock)
        self._startup: StartupReport | None = None
        self._watch: HealthWatch | None = None
        self._members: list[procs.ProcInfo] = []
        self._members_checked = 0.0
        self._seen = procs.Seen(record.pid, record.pgid, record.sid, record.start_ticks)
        self._observed_at = float("-inf")
        self._death: Death | None = None
        self._teardown: Teardown | None = None
        self._stopping = False
        """Our stop has begun: a signal from here on is ours."""
        self._exit_seen: tuple[int, bool] | None = None
        """The main process's return code and whether our stop had begun when it was seen."""
        self._exit: deaths.ExitFacts | None = None
        self._host: tuple[str, ...] | None = None
        self._sigterm_checked = 0
        self._foreign_sigterm = False
        if spec.kernel_log is None:
            self._kernel = deaths.KernelOomWatch()
            self._kernel.track(process.pid)
        else:  # a simulated machine: its kernel log alone, not the host's cgroups
            self._kernel = deaths.KernelOomWatch(str(spec.kernel_log), appears_later=True)

    # -- launch ---------------------------------------------------------------------------

    @classmethod
    def launch(
        cls,
        spec: LaunchSpec,
        probe: GpuProbe | None = None,
        *,
        clock: Clock = time.monotonic,
        sleep: Sleep = time.sleep,
    ) -> Server:
        """Start the server (`server.spawn`); raises HarnessError when the machine is not ready
        for it."""
        s = spawn(spec, probe, clock, sleep)
        return cls(
            spec, s.process, s.record, s.record_path, probe, s.baseline, clock, sleep, s.writer
        )

    @property
    def pid(self) -> int:
        """The main process's pid (the launched command's)."""
        return self.process.pid

    @property
    def base_url(self) -> str:
        """The server's `http://host:port`, where the workload sends requests."""
        return self.spec.base_url

    @property
    def phase(self) -> Phase:
        """The startup phase the log shows now."""
        return self.log.phase

    @property
    def events(self) -> tuple[Event, ...]:
        """Every event read from the log so far, in line order."""
        return tuple(self.log.events)

    @property
    def batches(self) -> Sequence[Batch]:
        """Prefill/Decode lines so far (the serving time series), oldest first."""
        return self.log.batches

    @property
    def ready_line_at(self) -> float | None:
        """When the log's "fired up and ready" line was read (the handle's clock), None before
        it."""
        return self.log.ready_line_at

    def ledger(self) -> Ledger:
        """The memory ledger of the log so far, built again from its events each call."""
        return build_ledger(self.log.events)

    def serving(self) -> ServingSummary:
        """The batch lines logged so far, summed up (peaks, CUDA-graph share, retractions)."""
        return summarize(self.log.batches, self.log.events)

    def _exited(self) -> bool:
        """The main process has exited; the first time, the log writer is given a moment to
        write what the server said last (the evidence of a crash is in those lines)."""
        if self.process.poll() is None:
            return False
        self._note_exit()
        if self.writer is not None and not self._settled:
            self._settled = True
            self.writer.settle(self._clock, self._sleep)
        return True

    def _pump(self, final: bool = False) -> None:
        if self.writer is not None:
            self.writer.relay()
        self.log.pump(final=final)

    def _note_exit(self) -> None:
        """Record the return code the first time the main process is seen gone, and whether
        our stop had begun by then (the signal was ours)."""
        code = self.process.returncode
        if self._exit_seen is None and code is not None:
            self._exit_seen = (code, self._stopping)

    def _sigterm_from_outside(self) -> bool:
        """The log shows a SIGTERM (SGLang's `SIGTERM received …`, `Signal SIGTERM received …`)
        that came while autotune was not stopping the server."""
        events = self.log.events
        if not self._foreign_sigterm and not self._stopping:
            for event in events[self._sigterm_checked :]:
                if event.kind is Kind.SIGTERM_RECEIVED:
                    self._foreign_sigterm = True
                    break
            self._sigterm_checked = len(events)
        return self._foreign_sigterm

    def exit_facts(self) -> deaths.ExitFacts:
        """How the main process ended (code None while it runs) and who ended it; fixed once it
        is gone and its log has been read to the end."""
        if self._exit is not None:
            return self._exit
        self._note_exit()
        foreign = self._sigterm_from_outside()
        if self._exit_seen is None:
            # a failure line read while the main process still runs (a rank's SIGKILL reported,
            # the tree not yet killed): the kernel, watched from the launch, already says
            # whether its OOM killer killed anything, as it will once the process is gone
            ruled_out = not self._stopping and self._kernel.silent()
            return deaths.ExitFacts(None, deaths.OUTSIDE if foreign else "", (), ruled_out)
        code, stopping = self._exit_seen
        oom = "" if stopping else self._kernel.killed(self._seen.pids_now())
        sender = deaths.sender_of(
            code,
            stopping=stopping,
            oom_killed=bool(oom),
            foreign_sigterm=foreign,
            own_failure=self.log.failure_at is not None and sigquit_alone(self.log.events) is None,
        )
        ruled_out = not stopping and not oom and self._kernel.silent()
        self._exit = deaths.ExitFacts(code, sender, (oom,) if oom else (), ruled_out)
        return self._exit

    def own_pids(self) -> set[int]:
        """The server's processes now, every one seen (the tree scanned afresh): what holds GPU
        memory for it, where any other holder is a process autotune did not start."""
        self._observe(force=True)
        return self._seen.pids_now()

    def host_state(self) -> tuple[str, ...]:
        """What stood in the server's way on the host (a full disk under the trial folder, its
        port held by another process): as read at the death that was not our stop, or now."""
        if self._host is not None:
            return self._host
        spec = self.spec
        return deaths.host_state(
            spec.log_path.parent, spec.host, spec.port, self._seen.pids_now(), spec.log_path
        )

    def _verdict(self, facts: RunFacts, ready: bool = False) -> Verdict:
        """The log's verdict with the harness's facts: the exit status and its sender always,
        and the host's state for a death that was not our stop."""
        end = self.exit_facts()
        seen: tuple[str, ...] = ()
        notes = facts.notes
        if not facts.stopped_by_us and not ready:
            seen = self.host_state()
            notes = (*end.detail, *notes)
        facts = replace(
            facts,
            exit_code=end.code,
            sender=end.sender or facts.sender,  # the exit's, else what the stall saw
            oom_ruled_out=end.oom_ruled_out,
            host=(*facts.host, *seen),
            notes=notes,
        )
        verdict = classify(self.log.events, facts, batches=list(self.log.batches))
        if seen and self._host is None and verdict.outcome not in (Outcome.READY, Outcome.UNKNOWN):
            self._host = seen  # the host's state at the death, for the record
        return verdict

    # -- startup ----------------------------------------------------------------------------

    def wait_ready(self) -> StartupReport:
        """Follow the startup to its end: ready, or the outcome that stopped it. Never raises
        for what the server did; the caller still calls `stop()` in every case."""
        if self._startup is not None:
            return self._startup
        spec = self.spec
        while True:
            self._observe()
            exited = self._exited()
            self._pump(final=exited)
            now = self._clock()
            if self.log.failure_at is not None:
                if exited or now - self.log.failure_at >= spec.exit_wait_s:
                    return self._finish_startup(RunFacts(exited=exited))
            elif exited:
                return self._finish_startup(RunFacts(exited=True, notes=self.log.last_lines()))
            elif self.ready_line_at is not None:
                answer = probe_ready(self.base_url, spec.api_key, spec.health_timeout_s)
                if answer.ok:
                    return self._finish_startup(RunFacts(), ready=True)
                if self._clock() - self.ready_line_at >= spec.ready_check_s:
                    note = f"readiness check after the ready line: {answer.detail}"
                    return self._finish_startup(RunFacts(timed_out="ready_check", notes=(note,)))
            else:
                timeout = self._timeout(now)
                if timeout:
                    return self._finish_startup(RunFacts(timed_out=timeout))
                if now - self.log.last_growth >= spec.stall_s:
                    note = f"no log output for {now - self.log.last_growth:.0f} s in {self.phase}"
                    return self._finish_startup(self._stall(str(self.phase), note))
            self._sleep(spec.poll_s)

    def _timeout(self, now: float) -> str:
        if now - self.launched_at >= self.spec.startup_s:
            return "startup"
        limit = self.spec.phase_limits.limit(self.phase)
        if limit is not None and self.log.phases.in_phase(now) >= limit:
            return str(self.phase)
        return ""

    def _finish_startup(self, facts: RunFacts, ready: bool = False) -> StartupReport:
        self._observe(force=True)  # a failed start: the schedulers may outlive the main process
        now = self._clock()
        verdict = self._verdict(facts, ready=ready)
        ledger = self.ledger()
        info: dict[str, Any] = {}
        mismatches: tuple[str, ...] = ()
        if ready:
            info = server_info(self.base_url, self.spec.api_key)
            if info:
                from_server = ledger_from_server_info(info)
                mismatches = cross_check(ledger, from_server)
                ledger = ledger.merged(from_server)
            main = procs.read_proc(self.pid)
            self._members = [m for m in (main, *procs.descendants(self.pid)) if m and not m.gone]
            self._watch = HealthWatch(
                self.base_url,
                self.spec.api_key,
                self.spec.health_interval_s,
                self.spec.health_timeout_s,
                self._clock,
            )
            self._watch.start()
        self._startup = StartupReport(
            outcome=verdict.outcome,
            cause=verdict.cause,
            evidence=verdict.evidence,
            ledger=ledger,
            phase=self.phase,
            phase_seconds=self.log.phases.totals(now),
            seconds=now - self.launched_at,
            ready_line_at=self.ready_line_at,
            ready_at=now if ready else None,
            server_info=info,
            mismatches=mismatches,
        )
        return self._startup

    # -- liveness ---------------------------------------------------------------------------

    def check_alive(self, owed_s: float | None = None, *, streamed: bool = False) -> Death | None:
        """None while the server serves; otherwise why not. Cheap: reads new log lines, polls
        the process, and reads the health watch's last state (no network call here).

        `owed_s` is how long the workload's requests have gone without a single byte back
        (`loadgen.Activity`); with the log silent as long, past `stall_s`, the server is hung
        while serving (frozen, deadlocked, or its HTTP front alive and generation stuck). Where
        the requests stream (`streamed`), a running request sends a byte at every decode step,
        so `owed_s` past `stall_s` is a hang even while the log moves: generation runs and its
        output never reaches the client (a stuck detokenizer or tokenizer manager)."""
        if self._death is not None:
            return self._death
        self._observe()
        self._pump()
        now = self._clock()
        facts: RunFacts | None = None
        if self._exited():
            self._pump(final=True)
            facts = RunFacts(exited=True, notes=self.log.last_lines())
        elif self.log.failure_at is not None or self._sigterm_from_outside():
            facts = RunFacts()
        else:
            facts = self._serving_stall(now, owed_s, streamed) or self._unhealthy(now)
        if facts is None:
            return None
        verdict = self._verdict(facts)
        if verdict.outcome in (Outcome.READY, Outcome.UNKNOWN):
            return None
        self._death = Death(verdict.outcome, verdict.cause, verdict.evidence)
        return self._death

    def dead_reason(self, owed_s: float | None = None, *, streamed: bool = False) -> str | None:
        """`check_alive()` as the workload driver's `is_dead` wants it."""
        death = self.check_alive(owed_s, streamed=streamed)
        return death.describe() if death else None

    def _serving_stall(self, now: float, owed_s: float | None, streamed: bool) -> RunFacts | None:
        """A hang while serving: requests out and nothing back from the server, and no log
        output, both for `stall_s`; or, where the requests stream, nothing back for `stall_s`
        while the log moves. A `/health` that still answers proves nothing here (an HTTP front
        can answer while generation is stuck); a stopped process (SIGSTOP, a debugger) is named
        in the evidence, and one stopped by a signal makes the stall a death from outside."""
        if owed_s is None or owed_s < self.spec.stall_s:
            return None
        quiet = now - self.log.last_growth
        if quiet >= self.spec.stall_s:
            note = (
                f"no answer to the workload for {owed_s:.1f} s and no log output for "
                f"{quiet:.1f} s while serving (stall_s = {self.spec.stall_s:g} s)"
            )
        elif streamed and self._generating_unheard(now, owed_s):
            note = (
                f"no byte of any streamed answer for {owed_s:.1f} s while the log kept moving "
                f"(its last line {quiet:.1f} s ago): generation runs and its output does not "
                f"reach the client (stall_s = {self.spec.stall_s:g} s)"
            )
        else:
            return None
        info = procs.read_proc(self.pid)
        if info is not None and info.state in ("T", "t", "D"):
            note += f"; pid {self.pid} is in state {procs.describe_state(info.state)}"
        return self._stall("serving", note)

    def _stall(self, phase: str, note: str) -> RunFacts:
        """A stall in `phase`; where a signal from outside stopped any of the server's processes
        (SGLang never stops itself: SIGSTOP, SIGTSTP), a death from outside, named."""
        stopped = procs.stopped_of(self._seen.pids_now())
        if not stopped:
            return RunFacts(stalled=phase, notes=(note,))
        who = ", ".join(f"pid {p}" for p in stopped)
        note += f"; {who} stopped by a signal from outside (SGLang never stops itself)"
        return RunFacts(stalled=phase, notes=(note,), sender=deaths.OUTSIDE)

    def _generating_unheard(self, now: float, owed_s: float) -> bool:
        """Whether the scheduler kept generating long after the client last heard a byte: a
        Decode batch line read more than half of `stall_s` after that byte, and the log still
        moving. A long prefill (no decode line) or a server that froze soon after the last byte
        (the log quiet too) is not this."""
        half = self.spec.stall_s / 2
        decode = self.log.last_decode_at
        return (
            decode is not None
            and decode >= now - owed_s + half
            and now - self.log.last_growth < half
        )

    def _unhealthy(self, now: float) -> RunFacts | None:
        """Death by the live checks: generation failing (health route and one-token generate)
        while no batch line appears, or failing while a server process has vanished."""
        if self._watch is None:
            return None
        state = self._watch.state()
        if state.failing_since is None:
            return None
        if now - self._members_checked >= 1.0 and self._members:
            self._members_checked = now
            gone = [m.pid for m in self._members if not procs.is_alive(m.pid, m.start_ticks)]
            if gone:
                return RunFacts(lost=f"server process {gone[0]} is gone ({state.last_detail})")
        failing = now - state.failing_since
        batches_since = (
            self.log.last_batch_at is not None and self.log.last_batch_at >= state.failing_since
        )
        if failing >= self.spec.unhealthy_s and not batches_since:
            reason = f"generation failing for {failing:.0f} s ({state.last_detail}), no batches"
            return RunFacts(unhealthy=reason)
        return None

    # -- processes --------------------------------------------------------------------------

    def _observe(self, force: bool = False) -> None:
        """Record the server's processes now (throttled to one /proc scan per OBSERVE_S)."""
        now = self._clock()
        if not force and now - self._observed_at < OBSERVE_S:
            return
        self._observed_at = now
        if self._teardown is not None:
            return
        before = len(self._seen.identities())
        self._seen.scan()
        if self.process.poll() is None:
            self._kernel.track(self.pid)  # it may have been moved to another memory cgroup
        if len(self._seen.identities()) > before:
            self._save_members()

    def _save_members(self) -> None:
        """Rewrite the pidfile with every process seen (and the log writer), for a restarted
        autotune."""
        main = (self.record.pid, self.record.start_ticks)
        members = tuple(key for key in self._seen.identities() if key != main)
        if self.writer is not None:
            members += (self.writer.identity,)
        if members == self.record.members:
            return
        self.record = replace(self.record, members=members)
        with contextlib.suppress(OSError):  # a full disk must not stop the trial or its teardown
            pidfile.write(self.spec.run_dir, self.record)

    # -- teardown ---------------------------------------------------------------------------

    def stop(self) -> Teardown:
        """Stop the server and verify it is gone and its GPU memory and port are released.
        Idempotent; never raises for what the server did (see `Teardown.raise_if_unclean`)."""
        if self._teardown is not None:
            return self._teardown
        started = self._clock()
        budget = self.spec.stop_grace_s + self.spec.release_s
        self._pump()
        stop_line = self.log.lines
        was_running = not self._exited()
        if self._watch is not None:
            self._watch.stop()
        self._observe(force=True)
        self._sigterm_from_outside()  # a SIGTERM logged before our stop is someone else's
        self._stopping = True
        stopped = terminate(
            self.record,
            self._seen,
            self.spec.stop_grace_s,
            budget,
            self._clock,
            self._sleep,
            self.process,
        )
        self._reap()
        writer_note = ""
        if self.writer is not None:  # it ends once the server's last process closed the pipe
            self._pump()
            writer_note = self.writer.finish(self._clock, self._sleep, WRITER_END_S)
        gpu_problems, gpu_record, port_free = wait_released(
            self.spec,
            self._probe,
            self._baseline,
            self._seen,
            started,
            started + budget,
            clock=self._clock,
            sleep=self._sleep,
        )
        self._pump(final=True)
        self.log.close()
        verdict = self._final_verdict(was_running, stop_line)
        end = self.exit_facts()
        self._kernel.close()
        survivors = stopped.survivors
        clean = not survivors and not gpu_problems and port_free
        if survivors:
            self._save_members()  # a restarted autotune stops and waits for them again
        else:
            pidfile.remove(self._record_path)
        self._teardown = Teardown(
            clean=clean,
            seconds=self._clock() - started,
            signals=stopped.signals,
            survivors=survivors,
            gpu_problems=tuple(gpu_problems),
            port_free=port_free,
            outcome=verdict.outcome,
            cause=verdict.cause,
            evidence=verdict.evidence,
            stuck=stopped.stuck(),
            waited=(*stopped.record(), *gpu_record, *((writer_note,) if writer_note else ())),
            budget_s=budget,
            exit_code=end.code,
            sender=end.sender,
            host=self._host or (),
        )
        return self._teardown

    def _final_verdict(self, was_running: bool, stop_line: int) -> Verdict:
        """How the run ended: an earlier judgement stands (a failed start, a death seen while
        serving); otherwise the whole log, with lines after our stop treated as its noise."""
        if self._startup is not None and not self._startup.ready:
            return Verdict(self._startup.outcome, self._startup.cause, self._startup.evidence)
        if self._death is not None:
            return Verdict(self._death.outcome, self._death.cause, self._death.evidence)
        facts = RunFacts(
            exited=True, stopped_by_us=was_running, stop_line=stop_line if was_running else None
        )
        return self._verdict(facts)

    def _reap(self) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=1.0)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
