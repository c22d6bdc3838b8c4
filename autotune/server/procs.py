"""Processes as /proc shows them: identity (pid + start time), groups, sessions, descendants.

A pid alone is not an identity: pids are reused. Everywhere autotune decides to signal a process
it checks the start time (field 22 of /proc/<pid>/stat, clock ticks since boot) and the boot id
it recorded, so it can never kill a stranger that inherited a number. Zombies count as gone.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class ProcInfo:
    """The fields of /proc/<pid>/stat autotune uses."""

    pid: int
    ppid: int
    pgid: int
    sid: int
    start_ticks: int
    state: str

    @property
    def gone(self) -> bool:
        return self.state in ("Z", "X")


def read_proc(pid: int) -> ProcInfo | None:
    """/proc/<pid>/stat, or None when the process does not exist."""
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError, NotADirectoryError):
        return None
    # The command name may hold spaces and parentheses; the fields follow the last ')'.
    rest = raw[raw.rfind(")") + 2 :].split()
    try:
        return ProcInfo(pid, int(rest[1]), int(rest[2]), int(rest[3]), int(rest[19]), rest[0])
    except (IndexError, ValueError):
        return None


def boot_id() -> str:
    try:
        return (PROC / "sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def is_alive(pid: int, start_ticks: int) -> bool:
    """True when `pid` runs and is the same process that started at `start_ticks`."""
    info = read_proc(pid)
    return info is not None and not info.gone and info.start_ticks == start_ticks


def all_procs() -> Iterator[ProcInfo]:
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            info = read_proc(int(entry.name))
            if info is not None and not info.gone:
                yield info


def members(pgid: int, sid: int) -> list[ProcInfo]:
    """Live processes in the process group `pgid` or the session `sid`."""
    return [p for p in all_procs() if p.pgid == pgid or p.sid == sid]


def descendants(root: int, procs: Iterable[ProcInfo] | None = None) -> list[ProcInfo]:
    """Live descendants of `root` (children, grandchildren, …), from one /proc scan."""
    table = list(all_procs() if procs is None else procs)
    children: dict[int, list[ProcInfo]] = {}
    for p in table:
        children.setdefault(p.ppid, []).append(p)
    found: list[ProcInfo] = []
    stack = [root]
    while stack and len(found) < 100_000:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child.pid)
    return found


def signal_verified(proc: ProcInfo, sig: signal.Signals) -> bool:
    """Send `sig` to `proc` only if it is still the same process; True if sent."""
    if not is_alive(proc.pid, proc.start_ticks):
        return False
    try:
        os.kill(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def signal_group(pgid: int, leader_start_ticks: int | None, sig: signal.Signals) -> bool:
    """Send `sig` to process group `pgid` if one of its members is ours.

    With `leader_start_ticks` the group is signalled only while the group leader is the process we
    started or, the leader gone, while some member still carries our group id (a pgid cannot be
    reused while any member lives, so survivors of our group are ours).
    """
    group = [p for p in all_procs() if p.pgid == pgid]
    if not group:
        return False
    leader = next((p for p in group if p.pid == pgid), None)
    if leader is not None and leader_start_ticks not in (None, leader.start_ticks):
        return False
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True
