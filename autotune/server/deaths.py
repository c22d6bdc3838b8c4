"""How a server's main process ended, who ended it, and what the host showed at that moment.

The verdict on a death is taken from evidence in this order: the exit status and the signal
with its sender, the log's own error lines, the host's state. This module owns the first and
the last; the log is `autotune.logparse`'s.

* `ExitFacts`: the main process's return code as `subprocess` gives it (negative: the signal
  that ended it) and who sent that signal, where the harness can know it:

  - `autotune`: our stop had begun (we sent SIGTERM, then SIGKILL) when the process was seen
    gone;
  - `oom_killer`: the kernel's OOM killer, named by the kernel itself. `KernelOomWatch` opens
    `/dev/kmsg` at the launch (root, or `kernel.dmesg_restrict = 0`) and reads what the kernel
    logged since: `Killed process PID (…)` or `oom-kill:…,pid=PID,…` naming a process of the
    server; and it reads the `oom_kill` counter of the server's memory cgroup (v2
    `memory.events`, v1 `memory.oom_control`) when first seen and at the death: a rise while a
    SIGKILL ended the server counts too (the cgroup may be shared, so it is named as such);
  - `outside`: neither of those, and the log shows no end of the server's own making: a SIGTERM
    the server logged that we did not send, or a signal death with no failure line before it.
    SGLang SIGKILLs its own tree after a crash (`kill_process_tree`) and, up to 0.5.9, after a
    graceful drain, so a SIGKILL that follows the server's own failure line is its own ("");
  - "": no signal ended it, or the server ended itself.

  A stop signal the server handled also counts as a signal death (`status_signal`): a Python
  process that caught SIGINT as `KeyboardInterrupt` exits 130 (128 + SIGINT), and a wrapper
  shell reports a child its SIGHUP, SIGINT or SIGTERM ended as 128 + N. autotune stops a
  server with SIGTERM and SIGKILL only while `stopping`, and the OOM killer sends SIGKILL, so
  such an exit status at any other moment came from outside.

  Linux does not tell a parent who sent the signal that killed its child (`waitid` gives the
  signal, not the sender), so `outside` is what remains once our own stop, the kernel's OOM
  killer and the server's own kill are ruled out.

* `host_state`: one line per thing in the way when a server died that was not ours to stop:
  the disk under the trial folder full (`shutil.disk_usage`, under `DISK_FULL_BYTES`), the
  server's port held by a process that is not the server's (`/proc/net/tcp*` listening
  sockets, their inodes matched in `/proc/*/fd`), and its log that cannot be written (a log
  that cannot grow reads as a server gone silent).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import signal
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from autotune.logparse.outcome import signal_name, status_signal
from autotune.server import procs

DISK_FULL_BYTES = 16 << 20
"""Below this much free space under the trial folder the disk counts as full at a death: a
server's log lines and a trial's record are a few KiB to a few MiB."""

AUTOTUNE = "autotune"
OOM_KILLER = "oom_killer"
OUTSIDE = "outside"

_KILLED = re.compile(r"Killed process (\d+)\b")
_OOM_KILL = re.compile(r"oom-kill:.*\bpid=(\d+)\b")
_KMSG_MAX_RECORDS = 100_000


@dataclass(frozen=True)
class ExitFacts:
    """The main process's end: its return code (None while it runs), the signal's name, who
    sent it (`sender`, see the module), and the lines that show who (the kernel's own)."""

    code: int | None = None
    sender: str = ""
    detail: tuple[str, ...] = field(default_factory=tuple)
    oom_ruled_out: bool = False
    """The kernel's OOM killer was watched from the launch and killed nothing at all meanwhile
    (`KernelOomWatch.silent`)."""

    @property
    def signal(self) -> str:
        """The name of the signal that ended the main process (`SIGKILL`, …), "" when it exited by
        itself or still runs."""
        return signal_name(self.code)


def sender_of(
    code: int | None,
    *,
    stopping: bool,
    oom_killed: bool,
    foreign_sigterm: bool,
    own_failure: bool,
) -> str:
    """Who ended the process (the module's rule): our stop, the kernel's OOM killer, someone
    outside, or "" (it exited by itself, or ended itself after its own failure line). A SIGTERM
    from outside (logged before our stop began) is the end's sender whatever came after it:
    SGLang's own SIGKILL after the drain, or our stop of a server still draining."""
    if foreign_sigterm:
        return OUTSIDE
    if code is None:
        return ""
    if stopping:
        return AUTOTUNE
    if oom_killed and code == -signal.SIGKILL:
        return OOM_KILLER
    if (code < 0 or status_signal(code)) and not own_failure:
        return OUTSIDE
    return ""


# ---------------------------------------------------------------------------------------------
# The kernel's OOM killer
# ---------------------------------------------------------------------------------------------


def _mounts() -> list[tuple[str, str, str, str]]:
    """(root, mount point, fs type, super options) for each cgroup mount of /proc/self/mountinfo."""
    out = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            parts, tail = left.split(), right.split()
            if len(parts) >= 5 and len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
                out.append((parts[3], parts[4], tail[0], tail[2]))
    return out


def oom_counter_files(pid: int) -> list[Path]:
    """The files holding the `oom_kill` counter of `pid`'s memory cgroup: v2 `memory.events`,
    v1 `memory.oom_control` (those that exist)."""
    try:
        lines = (procs.PROC / str(pid) / "cgroup").read_text().splitlines()
    except OSError:
        return []
    mounts = _mounts()
    found: list[Path] = []
    for line in lines:
        hier, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        v2 = hier == "0" and controllers == ""
        if not v2 and "memory" not in controllers.split(","):
            continue
        for root, point, kind, options in mounts:
            if v2 != (kind == "cgroup2") or (not v2 and "memory" not in options.split(",")):
                continue
            rel = path[len(root) :] if root != "/" and path.startswith(root) else path
            name = "memory.events" if v2 else "memory.oom_control"
            candidate = Path(point + rel.rstrip("/")) / name
            if candidate.is_file():
                found.append(candidate)
    return found


def read_oom_kills(path: Path) -> int | None:
    """The `oom_kill N` counter in a cgroup file, None when unreadable."""
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
    except OSError:
        return None
    return None


class KernelOomWatch:
    """What the kernel says about the OOM killer since one server was launched: its log
    (`/dev/kmsg`, from the launch on) and its memory cgroups' `oom_kill` counters. Best effort:
    where neither can be read, nothing is known (`killed` returns "")."""

    def __init__(self, kmsg: str = "/dev/kmsg", *, appears_later: bool = False) -> None:
        """`appears_later`: `kmsg` is a simulated machine's kernel log, which the simulator
        creates when it first writes to it; missing at the launch, it is read from its start
        once it exists (all it holds came after the launch)."""
        self._fd: int | None = None
        self._records: list[str] = []
        self._counters: dict[Path, int] = {}
        self._later: str | None = None
        try:
            fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            self._later = kmsg if appears_later else None
            return
        except OSError:
            return
        try:
            os.lseek(fd, 0, os.SEEK_END)  # only what the kernel logs from now on
        except OSError:
            os.close(fd)
            return
        self._fd = fd

    def track(self, pid: int) -> None:
        """Note the `oom_kill` counters of `pid`'s memory cgroups the first time each is seen
        (a process may be moved to another cgroup while it runs)."""
        for path in oom_counter_files(pid):
            if path not in self._counters:
                count = read_oom_kills(path)
                if count is not None:
                    self._counters[path] = count

    def _read(self) -> None:
        if self._fd is None and self._later is not None:
            with contextlib.suppress(OSError):
                self._fd = os.open(self._later, os.O_RDONLY | os.O_NONBLOCK)
                self._later = None
        if self._fd is None:
            return
        for _ in range(_KMSG_MAX_RECORDS):
            try:
                raw = os.read(self._fd, 8192)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # records overwritten before we read them
                    continue
                return
            if not raw:
                return
            text = raw.decode("utf-8", "replace")
            self._records.append(text.partition(";")[2].strip() or text.strip())

    @property
    def watching(self) -> bool:
        """Whether the kernel could speak: its log is open (or is a simulated machine's, to come)
        or a cgroup counter was read."""
        return self._fd is not None or self._later is not None or bool(self._counters)

    def silent(self) -> bool:
        """Whether the kernel could speak (`watching`) and its OOM killer killed nothing since
        the launch: no `Killed process`/`oom-kill` record of any process (a child the scans
        never saw has a pid the watch cannot match) and no rise of a tracked cgroup counter."""
        if not self.watching:
            return False
        self._read()
        killed_any = any(p.search(r) for r in self._records for p in (_KILLED, _OOM_KILL))
        return not killed_any and not self._counter_rise()

    def killed(self, pids: Collection[int]) -> str:
        """The kernel's own line saying its OOM killer killed one of `pids`, or a rise of a
        tracked cgroup's `oom_kill` counter; "" when the kernel says neither."""
        self._read()
        for pattern in (_KILLED, _OOM_KILL):  # the plainer line first
            for record in self._records:
                match = pattern.search(record)
                if match and int(match.group(1)) in pids:
                    return f"kernel log: {record}"
        return self._counter_rise()

    def _counter_rise(self) -> str:
        """The first tracked cgroup whose `oom_kill` counter rose since it was noted, as a line;
        "" where none did."""
        for path, before in self._counters.items():
            now = read_oom_kills(path)
            if now is not None and now > before:
                return (
                    f"the OOM killer killed {now - before} process(es) in the server's memory "
                    f"cgroup ({path}: oom_kill {before} -> {now})"
                )
        return ""

    def close(self) -> None:
        """Close the kernel log's descriptor; the counters need nothing closed."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


# ---------------------------------------------------------------------------------------------
# The host's state
# ---------------------------------------------------------------------------------------------


def disk_line(folder: Path, full_below: int = DISK_FULL_BYTES) -> str:
    """`the disk under F is full: N MiB free of M MiB` when it is, else ""."""
    try:
        usage = shutil.disk_usage(folder)
    except OSError:
        return ""
    if usage.free >= full_below:
        return ""
    return (
        f"the disk under {folder} is full: {usage.free / 2**20:.1f} MiB free of "
        f"{usage.total / 2**20:.0f} MiB"
    )


def _listening_inodes(port: int) -> set[int]:
    """Inodes of the sockets listening on `port` (any address), from /proc/net/tcp and tcp6."""
    inodes: set[int] = set()
    for name in ("tcp", "tcp6"):
        try:
            rows = (procs.PROC / "net" / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) < 10 or cols[3] != "0A":  # 0A: LISTEN
                continue
            local_port = int(cols[1].rpartition(":")[2], 16)
            if local_port == port and cols[9].isdigit():
                inodes.add(int(cols[9]))
    return inodes


def port_holders(port: int, inodes: set[int] | None = None) -> list[int]:
    """Pids of the processes holding a socket that listens on `port` (those /proc lets us see);
    `inodes` are that port's listening sockets when the caller has read them already."""
    inodes = _listening_inodes(port) if inodes is None else inodes
    if not inodes:
        return []
    wanted = {f"socket:[{i}]" for i in inodes}
    return sorted(
        info.pid
        for info in procs.all_procs()
        if any(link in wanted for _, link in procs.descriptors(info.pid))
    )


def port_line(host: str, port: int, ours: Iterable[int]) -> str:
    """`port N on H is held by pid P (comm), a process autotune did not start` when a process
    that is not the server's listens on it, else ""."""
    mine = set(ours)
    inodes = _listening_inodes(port)
    if not inodes:
        return ""
    holders = port_holders(port, inodes)
    foreign = [p for p in holders if p not in mine]
    if holders and not foreign:
        return ""
    if not foreign:
        return f"port {port} on {host} is held by a process autotune cannot see"
    who = ", ".join(f"pid {p} ({procs.process_name(p)})" for p in foreign)
    return f"port {port} on {host} is held by {who}, a process autotune did not start"


def log_line(log: Path) -> str:
    """`the server's log L cannot be written: …` when opening it to append fails (made
    read-only or immutable, its folder gone), else "": a log that cannot grow looks like a
    server that went silent."""
    try:
        fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    except FileNotFoundError:
        return ""  # never written yet: a startup that failed before it, not the host
    except OSError as exc:
        return f"the server's log {log} cannot be written: {exc.strerror or exc}"
    os.close(fd)
    return ""


def host_state(
    folder: Path, host: str, port: int, ours: Iterable[int], log: Path | None = None
) -> tuple[str, ...]:
    """One line per thing in the host's state that stood in the server's way (none: ())."""
    lines = (disk_line(folder), port_line(host, port, ours), log_line(log) if log else "")
    return tuple(line for line in lines if line)
