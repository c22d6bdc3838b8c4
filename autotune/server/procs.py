"""Processes as /proc shows them: identity (pid + start time), groups, sessions, descendants.

A pid alone is not an identity: pids are reused. Everywhere autotune decides to signal a process
it checks the start time (field 22 of /proc/<pid>/stat, clock ticks since boot) and the boot id
it recorded, so it can never kill a stranger that inherited a number. Zombies count as gone.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from threading import Lock

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
        """Whether the process has ended: a zombie (`Z`) or dead (`X`) process counts as gone."""
        return self.state in ("Z", "X")

    @property
    def key(self) -> tuple[int, int]:
        """The identity: pid and start time."""
        return (self.pid, self.start_ticks)


STATES = {
    "R": "running",
    "S": "sleeping",
    "D": "uninterruptible sleep",
    "T": "stopped",
    "t": "stopped by a tracer",
    "Z": "zombie",
    "X": "dead",
    "I": "idle",
}
"""What the state letter of /proc/<pid>/stat means; `D` is the kernel's uninterruptible sleep, in
which a SIGKILLed process stays until the kernel lets go (e.g. while it unpins host memory)."""


def describe_state(state: str) -> str:
    """A /proc state letter with its meaning (`D: uninterruptible sleep`), for the teardown's
    lines."""
    return f"{state}: {STATES[state]}" if state in STATES else state


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
    """This boot's id (`/proc/sys/kernel/random/boot_id`), "" when unreadable: a pid and start time
    identify a process only within one boot."""
    try:
        return (PROC / "sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def is_alive(pid: int, start_ticks: int) -> bool:
    """True when `pid` runs and is the same process that started at `start_ticks`."""
    info = read_proc(pid)
    return info is not None and not info.gone and info.start_ticks == start_ticks


def all_procs() -> Iterator[ProcInfo]:
    """Every live process /proc shows now (zombies left out)."""
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            info = read_proc(int(entry.name))
            if info is not None and not info.gone:
                yield info


def descriptors(pid: int) -> Iterator[tuple[Path, str]]:
    """Each open descriptor of `pid` (its /proc/<pid>/fd entry) with what it points at: a path,
    or `socket:[INODE]`; nothing for a process whose descriptors cannot be read (another
    user's, or gone)."""
    try:
        entries = list((PROC / str(pid) / "fd").iterdir())
    except OSError:
        return
    for fd in entries:
        with contextlib.suppress(OSError):
            yield fd, os.readlink(fd)


def writers(path: Path) -> list[ProcInfo]:
    """Live processes with a descriptor open for writing on the file `path` (a server writing
    its log, the masking writer writing it for the server); a reader such as `tail -f` is not
    one. Processes whose descriptors cannot be read (another user's) are left out."""
    target = os.path.realpath(path)
    out = []
    for info in all_procs():
        for fd, link in descriptors(info.pid):
            if link != target:
                continue
            try:
                flags = (PROC / str(info.pid) / "fdinfo" / fd.name).read_text().split("flags:")[1]
            except (OSError, IndexError):
                continue
            if int(flags.split()[0], 8) & os.O_ACCMODE in (os.O_WRONLY, os.O_RDWR):
                out.append(info)
                break
    return out


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


def family(
    pgid: int, sid: int, roots: Iterable[ProcInfo], procs: Iterable[ProcInfo] | None = None
) -> list[ProcInfo]:
    """Live processes of one server, from one /proc scan: its process group `pgid`, its session
    `sid`, and the descendants of each of those and of every root still alive as itself (same
    start time), whichever group or session they moved to."""
    table = list(all_procs() if procs is None else procs)
    by_pid = {p.pid: p for p in table}
    found: dict[int, ProcInfo] = {p.pid: p for p in table if p.pgid == pgid or p.sid == sid}
    for root in roots:
        now = by_pid.get(root.pid)
        if now is not None and now.start_ticks == root.start_ticks:
            found[now.pid] = now
    for p in _below(list(found.values()), table):
        found.setdefault(p.pid, p)
    return sorted(found.values(), key=lambda p: p.pid)


def _below(tops: list[ProcInfo], table: list[ProcInfo]) -> list[ProcInfo]:
    children: dict[int, list[ProcInfo]] = {}
    for p in table:
        children.setdefault(p.ppid, []).append(p)
    out: list[ProcInfo] = []
    seen = {p.pid for p in tops}
    stack = [p.pid for p in tops]
    while stack:
        for child in children.get(stack.pop(), []):
            if child.pid not in seen:
                seen.add(child.pid)
                out.append(child)
                stack.append(child.pid)
    return out


class Seen:
    """Every process of one server seen so far, by identity (pid and start time), with the role
    it had when first seen: its main process, members of its process group or session, and
    their descendants wherever they went. Thread-safe.

    Group and session count only while they are the server's: while the main process lives as
    itself, or once it is gone (a group or session id is not reused while any member lives).
    Processes recorded earlier (`members`, from a pidfile) count while each is still the same
    process."""

    def __init__(
        self,
        pid: int,
        pgid: int,
        sid: int,
        start_ticks: int,
        members: Iterable[tuple[int, int]] = (),
    ) -> None:
        self.pid = pid
        self.pgid = pgid
        self.sid = sid
        self.start_ticks = start_ticks
        self._lock = Lock()
        self._keys: dict[tuple[int, int], str] = {(pid, start_ticks): "main process"}
        for key in members:
            self._keys.setdefault((int(key[0]), int(key[1])), "process")

    def role(self, proc: ProcInfo) -> str:
        """The role `proc` has in the server: its main process, a member of its group or session, or
        a descendant."""
        if proc.key == (self.pid, self.start_ticks):
            return "main process"
        if proc.pgid == self.pgid:
            return "group member"
        if proc.sid == self.sid:
            return "session member"
        return "descendant"

    def add(self, found: Iterable[ProcInfo]) -> list[ProcInfo]:
        """Record `found`; returns the ones not seen before."""
        new = []
        with self._lock:
            for p in found:
                if self._keys.get(p.key, "process") == "process":
                    new.append(p)
                    self._keys[p.key] = self.role(p)
        return new

    def scan(self, procs: Iterable[ProcInfo] | None = None) -> list[ProcInfo]:
        """The server's live processes now, from one /proc scan (recorded as seen)."""
        table = list(all_procs() if procs is None else procs)
        leader = next((p for p in table if p.pid == self.pid), None)
        own = leader is None or leader.start_ticks == self.start_ticks
        roots = [ProcInfo(pid, 0, 0, 0, ticks, "?") for pid, ticks in self.identities()]
        live = family(self.pgid if own else -1, self.sid if own else -1, roots, table)
        self.add(live)
        return live

    def identities(self) -> list[tuple[int, int]]:
        """Every identity seen, in the order first seen."""
        with self._lock:
            return list(self._keys)

    def role_of(self, pid: int) -> str:
        """The role the process with `pid` had when last seen, "process" for one never seen."""
        with self._lock:
            roles = [r for (p, _), r in self._keys.items() if p == pid]
        return roles[-1] if roles else "process"

    def pids_now(self) -> set[int]:
        """Pids that are ours now: every pid seen whose process is gone (its memory is still
        ours until the driver lets go) or is still the same process; never a pid reused by
        another process."""
        out = set()
        for pid, ticks in self.identities():
            now = read_proc(pid)
            if now is None or now.gone or now.start_ticks == ticks:
                out.add(pid)
        return out


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


def stopped_of(pids: Iterable[int]) -> list[int]:
    """Those of `pids` in state T (stopped by a signal), in pid order. A traced stop (t) is left
    out: SGLang's own watchdog attaches py-spy to a hung scheduler."""
    out = []
    for pid in sorted(pids):
        info = read_proc(pid)
        if info is not None and not info.gone and info.state == "T":
            out.append(pid)
    return out


def process_name(pid: int) -> str:
    """The command name of `pid` (`/proc/PID/comm`), "?" where it cannot be read."""
    try:
        return (PROC / str(pid) / "comm").read_text().strip()
    except OSError:
        return "?"
