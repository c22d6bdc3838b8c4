"""Stopping a server's whole process tree, and proving it is gone.

Reference §7.3: SIGTERM to the main process (SGLang then drains and kills its own tree), a grace
period, then SIGKILL to the process group for stragglers such as compile workers, plus any known
descendant that left the group. Survivors are looked for in /proc by process group and session.
Every signal goes to a process identified by pid and start time; nothing is matched by name, so
no process autotune did not start is touched. `stop_orphans` applies the same procedure to the
servers a killed autotune left behind, found through their pidfiles.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.errors import HarnessError
from autotune.logparse.outcome import Outcome
from autotune.server import pidfile, procs

Clock = Callable[[], float]
Sleep = Callable[[float], None]


@dataclass(frozen=True)
class Teardown:
    """The stop: `clean` when no process of ours survives, GPU memory is back at the baseline
    and the port is free. `outcome` is how the run ended, read from the whole log."""

    clean: bool
    seconds: float
    signals: tuple[str, ...]
    survivors: tuple[int, ...]
    gpu_problems: tuple[str, ...]
    port_free: bool
    outcome: Outcome
    cause: str
    evidence: tuple[str, ...]

    @property
    def problems(self) -> tuple[str, ...]:
        out = [f"pid {pid} survived SIGKILL" for pid in self.survivors]
        out += list(self.gpu_problems)
        if not self.port_free:
            out.append("the port is still in use")
        return tuple(out)

    def raise_if_unclean(self) -> None:
        if not self.clean:
            raise HarnessError("server teardown incomplete: " + "; ".join(self.problems))

    def to_dict(self) -> dict[str, Any]:
        return {
            "clean": self.clean,
            "seconds": round(self.seconds, 3),
            "signals": list(self.signals),
            "problems": list(self.problems),
            "outcome": str(self.outcome),
            "cause": self.cause,
            "evidence": list(self.evidence),
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


def group_alive(record: pidfile.PidRecord) -> bool:
    return bool(procs.members(record.pgid, record.sid))


def terminate(
    record: pidfile.PidRecord,
    known: Mapping[int, procs.ProcInfo],
    grace_s: float,
    clock: Clock,
    sleep: Sleep,
    process: subprocess.Popen[bytes] | None = None,
) -> tuple[str, ...]:
    """SIGTERM the main process and wait up to `grace_s` for it to end, then SIGKILL the group
    and every known descendant that left it. Returns the signals sent, in order."""
    sent: list[str] = []
    if procs.is_alive(record.pid, record.start_ticks):
        os.kill(record.pid, signal.SIGTERM)
        sent.append("SIGTERM")
        # SGLang's main process kills its own tree on SIGTERM; once it is gone, whatever is left
        # of the group is a straggler for SIGKILL, so the grace period ends with it.
        deadline = clock() + grace_s
        while clock() < deadline and procs.is_alive(record.pid, record.start_ticks):
            if process is not None:
                process.poll()  # reap it, so that it stops counting as alive
            sleep(0.02)
    if group_alive(record) and procs.signal_group(record.pgid, record.start_ticks, signal.SIGKILL):
        sent.append("SIGKILL")
    for proc in known.values():
        now = procs.read_proc(proc.pid)  # it may have left the group since it was recorded
        if now is None or now.pgid == record.pgid or now.start_ticks != proc.start_ticks:
            continue
        if procs.signal_verified(now, signal.SIGKILL):
            sent.append(f"SIGKILL:{proc.pid}")
    return tuple(sent)


def wait_gone(
    record: pidfile.PidRecord,
    known: Mapping[int, procs.ProcInfo],
    clock: Clock,
    sleep: Sleep,
    limit_s: float = 5.0,
) -> list[int]:
    """Pids of ours still alive after SIGKILL had `limit_s` to work (should be none)."""
    deadline = clock() + limit_s
    while True:
        left = {p.pid for p in procs.members(record.pgid, record.sid)}
        left |= {p.pid for p in known.values() if procs.is_alive(p.pid, p.start_ticks)}
        if not left or clock() >= deadline:
            return sorted(left)
        sleep(0.02)


def _ours(record: pidfile.PidRecord) -> bool:
    """Some process of the record's group runs and the group is the one we started: same
    boot, and its leader (while it lives) has the recorded start time. A process group id is
    not reused while any member lives, so members of a leaderless group are ours too."""
    if record.boot_id != procs.boot_id():
        return False
    group = [p for p in procs.all_procs() if p.pgid == record.pgid]
    leader = next((p for p in group if p.pid == record.pgid), None)
    return bool(group) and (leader is None or leader.start_ticks == record.start_ticks)


def stop_orphans(
    run_dir: Path,
    grace_s: float = 30.0,
    clock: Clock = time.monotonic,
    sleep: Sleep = time.sleep,
) -> list[str]:
    """Stop the servers an earlier, killed autotune started under `run_dir`, and only those.
    Returns one line per pidfile handled; stale pidfiles are removed without any signal."""
    done = []
    for path, record in pidfile.records(run_dir):
        if not _ours(record):
            pidfile.remove(path)
            done.append(f"pid {record.pid}: not running; removed its pidfile")
            continue
        signals = terminate(record, {}, grace_s, clock, sleep)
        left = wait_gone(record, {}, clock, sleep)
        if left:
            done.append(f"pid {record.pid}: processes {left} survived {', '.join(signals)}")
            continue
        pidfile.remove(path)
        done.append(f"pid {record.pid} (port {record.port}): stopped with {', '.join(signals)}")
    return done
