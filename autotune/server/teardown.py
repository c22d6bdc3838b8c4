"""Stopping a server's whole process tree, and proving it is gone.

Reference §7.3: SIGTERM to the main process (SGLang then drains and kills its own tree), a grace
period, then SIGKILL to the process group for stragglers such as compile workers, and to every
other process of the server: its session, the descendants of any of them, and each process seen
while it ran (`procs.Seen`). Then a wait until each is gone, within one budget counted from the
start of the stop (`stop_grace_s + release_s` for a trial): a SIGKILLed process can stay in
uninterruptible sleep for tens of seconds while the kernel unpins its host buffers (SGLang's
`mem_cache/pool_host/base.py`), and it is only a survivor once the budget is spent. Every signal
goes to a process identified by pid and start time; nothing is matched by name, so no process
autotune did not start is touched. `stop_orphans` applies the same procedure to the servers a
killed autotune left behind, found through their pidfiles.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.errors import HarnessError
from autotune.logparse.outcome import Outcome
from autotune.server import pidfile, procs

Clock = Callable[[], float]
Sleep = Callable[[float], None]


@dataclass(frozen=True)
class Waited:
    """One process of the server the teardown waited for once SIGKILL was sent: its role, every
    state /proc showed for it (`D` is uninterruptible sleep) and when it was gone, in seconds
    after the SIGKILL (None: still present when the budget was spent)."""

    pid: int
    role: str
    states: str
    gone_s: float | None

    def describe(self) -> str:
        """One line: the pid, its role, any state but running or sleeping, and when it was gone (or
        that it is still present)."""
        odd = [c for c in dict.fromkeys(self.states) if c not in "RS"]
        state = f", state {', '.join(procs.describe_state(c) for c in odd)}" if odd else ""
        if self.gone_s is None:
            return f"pid {self.pid} ({self.role}{state}) still present"
        return f"pid {self.pid} ({self.role}{state}) gone {self.gone_s:.2f} s after SIGKILL"


@dataclass(frozen=True)
class ProcessStop:
    """How the processes of one server were stopped: the signals sent, in order, and each process
    waited for after SIGKILL. Times are seconds since the stop began."""

    signals: tuple[str, ...]
    waited: tuple[Waited, ...]
    killed_at: float | None
    seconds: float
    budget_s: float

    @property
    def survivors(self) -> tuple[int, ...]:
        """The pids still present when the budget was spent."""
        return tuple(w.pid for w in self.waited if w.gone_s is None)

    def stuck(self) -> tuple[str, ...]:
        """One problem line per process still present when the budget was spent."""
        return tuple(
            f"{w.describe()} {self.seconds:.1f} s after the stop began, past the teardown budget "
            f"(stop_grace_s + release_s = {self.budget_s:g} s)"
            for w in self.waited
            if w.gone_s is None
        )

    def record(self) -> tuple[str, ...]:
        """What was waited for, for the teardown's record."""
        if self.killed_at is None or not self.waited:
            return ()
        head = (
            f"SIGKILL at {self.killed_at:.2f} s; waited for {len(self.waited)} process(es) of "
            f"the server's group, session and descendants until {self.seconds:.2f} s "
            f"(budget {self.budget_s:g} s)"
        )
        return (head, *(w.describe() for w in self.waited))


@dataclass(frozen=True)
class Teardown:
    """The stop: `clean` when no process of ours survives, GPU memory is back at the baseline
    and the port is free. `outcome` is how the run ended, read from the whole log. `waited` says
    what the teardown waited for (processes after SIGKILL, GPU memory), `budget_s` is
    `stop_grace_s + release_s`, the most it waits in all. `exit_code` is the main process's
    return code (negative: the signal), `sender` who sent that signal (`server.deaths`), `host`
    what stood in the server's way on the host when it died (a full disk, its port taken)."""

    clean: bool
    seconds: float
    signals: tuple[str, ...]
    survivors: tuple[int, ...]
    gpu_problems: tuple[str, ...]
    port_free: bool
    outcome: Outcome
    cause: str
    evidence: tuple[str, ...]
    stuck: tuple[str, ...] = ()
    waited: tuple[str, ...] = ()
    budget_s: float = 0.0
    exit_code: int | None = None
    sender: str = ""
    host: tuple[str, ...] = ()

    @property
    def problems(self) -> tuple[str, ...]:
        """What keeps the teardown from being clean: processes stuck or surviving, GPU memory not
        back, the port still in use."""
        out = list(self.stuck) or [f"pid {pid} survived SIGKILL" for pid in self.survivors]
        out += list(self.gpu_problems)
        if not self.port_free:
            out.append("the port is still in use")
        return tuple(out)

    def raise_if_unclean(self) -> None:
        """Raise `HarnessError` naming the problems unless the teardown was clean: nothing may
        launch on a GPU group a server still holds."""
        if not self.clean:
            raise HarnessError("server teardown incomplete: " + "; ".join(self.problems))

    def to_dict(self) -> dict[str, Any]:
        """The teardown as JSON values, for `trial.json`."""
        return {
            "clean": self.clean,
            "seconds": round(self.seconds, 3),
            "budget_s": self.budget_s,
            "signals": list(self.signals),
            "waited": list(self.waited),
            "problems": list(self.problems),
            "outcome": str(self.outcome),
            "cause": self.cause,
            "evidence": list(self.evidence),
            "exit_code": self.exit_code,
            "sender": self.sender,
            "host": list(self.host),
        }


def port_is_free(host: str, port: int) -> bool:
    """True when `host:port` can be bound the way uvicorn binds it (SO_REUSEADDR)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def terminate(
    record: pidfile.PidRecord,
    seen: procs.Seen,
    grace_s: float,
    budget_s: float,
    clock: Clock,
    sleep: Sleep,
    process: subprocess.Popen[bytes] | None = None,
) -> ProcessStop:
    """Stop every process of the server and wait for each to be gone.

    SIGTERM to the main process and up to `grace_s` for it to end (SGLang's main process stops
    its own tree); then SIGKILL to the process group and to every other process of the server
    found in /proc (its session, descendants of any of them, the processes recorded in `seen`
    while it ran), each checked by pid and start time. Then wait until all of them are gone, up
    to `budget_s` after the start: a process the kernel holds after SIGKILL (uninterruptible
    sleep while it unpins host memory, say) counts as present, and is a survivor only once the
    budget is spent."""
    started = clock()
    deadline = started + budget_s
    sent: list[str] = []
    if procs.signal_verified(
        procs.ProcInfo(record.pid, 0, 0, 0, record.start_ticks, "?"), signal.SIGTERM
    ):
        sent.append("SIGTERM")
        # SGLang's main process kills its own tree on SIGTERM; once it is gone, whatever is left
        # of the server is a straggler for SIGKILL, so the grace period ends with it.
        grace_end = min(deadline, clock() + grace_s)
        while clock() < grace_end and procs.is_alive(record.pid, record.start_ticks):
            if process is not None:
                process.poll()  # reap it, so that it stops counting as alive
            sleep(0.02)
    signalled: set[tuple[int, int]] = set()
    live = seen.scan()
    killed_at: float | None = None
    if live:
        killed_at = clock() - started
        sent += _kill(record, live, signalled)
    tracks: dict[tuple[int, int], list[Any]] = {}  # key -> [role, states, gone_s]
    while live:
        now = clock() - started
        for p in live:
            track = tracks.setdefault(p.key, [seen.role_of(p.pid), "", None])
            if not track[1].endswith(p.state):
                track[1] += p.state
        present = {p.key for p in live}
        for key, track in tracks.items():
            if key not in present and track[2] is None:
                track[2] = max(0.0, now - (killed_at or 0.0))
        if clock() >= deadline:
            break
        step = 0.05 if now - (killed_at or 0.0) < 2.0 else 0.25  # each look is one /proc scan
        sleep(max(0.0, min(step, deadline - clock())))
        if process is not None:
            process.poll()
        live = seen.scan()
        sent += _kill(record, live, signalled)  # anything that appeared since (a racing fork)
    end = clock() - started
    for track in tracks.values():
        if not live and track[2] is None:
            track[2] = max(0.0, end - (killed_at or 0.0))
    waited = tuple(
        Waited(key[0], role, states, gone) for key, (role, states, gone) in tracks.items()
    )
    return ProcessStop(tuple(sent), waited, killed_at, end, budget_s)


def _kill(
    record: pidfile.PidRecord, live: list[procs.ProcInfo], signalled: set[tuple[int, int]]
) -> list[str]:
    """SIGKILL the group once, then each live process of ours outside it; each process once."""
    fresh = [p for p in live if p.key not in signalled]
    sent: list[str] = []
    in_group = [p for p in fresh if p.pgid == record.pgid]
    if in_group and procs.signal_group(record.pgid, record.start_ticks, signal.SIGKILL):
        sent.append("SIGKILL")
        signalled.update(p.key for p in in_group)
    for p in fresh:
        if p.key in signalled:
            continue
        signalled.add(p.key)
        if procs.signal_verified(p, signal.SIGKILL):
            sent.append(f"SIGKILL:{p.pid}")
    return sent


def seen_from(record: pidfile.PidRecord) -> procs.Seen | None:
    """The processes a pidfile names, as a `Seen` to stop: its group and session while they are
    the ones we started (same boot, and the leader, while it lives, has the recorded start time;
    a process group or session id is not reused while any member lives), and each recorded member
    that is still the same process. None when the record is from another boot."""
    if record.boot_id != procs.boot_id():
        return None
    return procs.Seen(
        record.pid,
        record.pgid,
        record.sid,
        record.start_ticks,
        members=record.members,
    )


def live_processes(record: pidfile.PidRecord) -> list[procs.ProcInfo]:
    """Processes of the server `record` names that run now (none for a stale record)."""
    seen = seen_from(record)
    return [] if seen is None else seen.scan()


def stop_orphans(
    run_dir: Path,
    grace_s: float = 30.0,
    clock: Clock = time.monotonic,
    sleep: Sleep = time.sleep,
    release_s: float = 120.0,
) -> list[str]:
    """Stop the servers an earlier, killed autotune started under `run_dir`, and only those,
    waiting for each up to `grace_s + release_s`: a server whose owning autotune still runs is
    left to it. Returns one line per pidfile handled; stale pidfiles are removed without any
    signal."""
    done = []
    for path, record in pidfile.records(run_dir):
        if record.owner_alive():
            done.append(
                f"pid {record.pid} (port {record.port}): left running, its autotune (pid "
                f"{record.owner_pid}{', study ' + record.study if record.study else ''}) is alive"
            )
            continue
        seen = seen_from(record)
        if seen is None or not seen.scan():
            pidfile.remove(path)
            done.append(f"pid {record.pid}: not running; removed its pidfile")
            continue
        stopped = terminate(record, seen, grace_s, grace_s + release_s, clock, sleep)
        signals = ", ".join(stopped.signals) or "no signal"
        if stopped.survivors:
            done.append(f"pid {record.pid}: {'; '.join(stopped.stuck())} ({signals})")
            continue
        pidfile.remove(path)
        done.append(f"pid {record.pid} (port {record.port}): stopped with {signals}")
    return done
