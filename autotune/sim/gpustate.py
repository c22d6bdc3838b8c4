"""Simulated GPU memory, readable from outside like a tiny NVML.

It owns the state directory's format, writer and reader, so the tuner's GPU checks can read
simulated servers' memory (and foreign holders') as they would read nvidia-smi on a real box.

Layout of a state directory (all JSON, every write atomic via a temp file and `os.replace`):

    gpus.json           {"gpus": [{"index": 0, "total_bytes": N}, ...]}   the inventory
    kmsg                the simulated machine's kernel log: one `/dev/kmsg` record a line
                        (`6,SEQ,USEC,-;TEXT`), the OOM killer's kills the simulator acts out
    proc-<pid>.json     {"pid": P, "start_time": T, "gpus": {"0": bytes, ...},
                         "totals": {"0": total_bytes, ...}, "hold_seconds": S | null,
                         "hold_until": T | null, "beat": T, "boot_id": B}

`start_time` is field 22 of /proc/<pid>/stat (clock ticks since boot) so a reused pid is not
mistaken for the holder. A holder counts while its process is alive (a zombie counts as dead). A
dead holder counts as released unless it carries `hold_seconds`: then its memory stays counted
until `hold_until`, or, when it died without writing that (SIGKILL), until its last heartbeat
(`beat`, rewritten every half second while alive) plus `hold_seconds`. Both are read on
CLOCK_MONOTONIC, which every process on the machine shares and no wall-clock step moves, with
the boot they belong to (`boot_id`): a hold from an earlier boot is over. No helper process is
involved, so nothing is left behind.

A real GPU's memory bookkeeping lives in the driver and needs no disk, so a state file the disk
refuses (`ENOSPC`, `EDQUOT`: the results disk full) never fails the server: the write is kept and
made again at the next change or heartbeat, and readers see the last state written meanwhile.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import tempfile
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

INVENTORY = "gpus.json"
PREFIX = "proc-"
KERNEL_LOG = "kmsg"
"""The simulated machine's kernel log in the state directory, read as autotune reads
`/dev/kmsg` on a real box (`autotune.server.deaths.KernelOomWatch`)."""
DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


def kernel_log(directory: Path) -> Path:
    """The simulated machine's kernel log in the state directory `directory` (written by the
    simulator when it acts the OOM killer out; it may not exist yet)."""
    return Path(directory) / KERNEL_LOG


def kernel_oom_kill(directory: Path, pid: int, comm: str) -> None:
    """Append the kernel's OOM-killer record for `pid` to the simulated kernel log, as the
    kernel logs it (`Out of memory: Killed process PID (COMM) …`)."""
    usec = time.monotonic_ns() // 1000
    line = f"3,0,{usec},-;Out of memory: Killed process {pid} ({comm}) total-vm:0kB\n"
    with contextlib.suppress(OSError):
        Path(directory).mkdir(parents=True, exist_ok=True)
        with open(kernel_log(directory), "a", encoding="utf-8") as f:
            f.write(line)


@dataclass(frozen=True)
class SimGpu:
    """One simulated GPU: capacity, memory in use, and who holds it (pid -> bytes)."""

    index: int
    total_bytes: int
    used_bytes: int
    processes: Mapping[int, int] = field(default_factory=dict)


def process_start_time(pid: int) -> int | None:
    """Start time of `pid` in clock ticks since boot, or None when it is gone or a zombie."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name may contain spaces or parentheses; fields follow the last ')'.
    rest = raw[raw.rfind(")") + 2 :].split()
    if not rest or rest[0] in ("Z", "X"):
        return None
    return int(rest[19])


def holder_alive(pid: int, start_time: int | None) -> bool:
    """Whether the holder `pid` still runs as the process that wrote its entry (same start time; a
    zombie is dead); off Linux, a signal probe."""
    if not Path("/proc").is_dir():  # not Linux: fall back to a signal probe
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    now = process_start_time(pid)
    if now is None:
        return False
    return start_time is None or now == start_time


def _write_json(path: Path, doc: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(doc, fh)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _try_write_json(path: Path, doc: object) -> bool:
    """`_write_json`, False instead of an error when the disk is full (`DISK_FULL`)."""
    try:
        _write_json(path, doc)
    except OSError as exc:
        if exc.errno in DISK_FULL:
            return False
        raise
    return True


def _read_json(path: Path) -> dict[str, object] | None:
    try:
        doc = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError, OSError):
        return None
    return doc if isinstance(doc, dict) else None


def write_inventory(directory: Path, totals: Mapping[int, int]) -> None:
    """Record GPU capacities (merged with what is already there)."""
    current = _inventory(directory)
    current.update(totals)
    doc = {"gpus": [{"index": i, "total_bytes": t} for i, t in sorted(current.items())]}
    _try_write_json(directory / INVENTORY, doc)


def _inventory(directory: Path) -> dict[int, int]:
    doc = _read_json(directory / INVENTORY)
    out: dict[int, int] = {}
    if doc is None:
        return out
    gpus = doc.get("gpus")
    if isinstance(gpus, list):
        for g in gpus:
            if isinstance(g, dict):
                out[int(g["index"])] = int(g["total_bytes"])
    return out


@dataclass(frozen=True)
class _Holder:
    pid: int
    gpus: dict[int, int]
    totals: dict[int, int]
    counted: bool
    expired: bool


def _holders(directory: Path, now: float) -> list[_Holder]:
    out = []
    for path in sorted(directory.glob(f"{PREFIX}*.json")):
        doc = _read_json(path)
        if doc is None:
            continue
        try:
            pid = int(doc["pid"])  # type: ignore[call-overload]
            start = doc.get("start_time")
            gpus = {int(k): int(v) for k, v in dict(doc.get("gpus") or {}).items()}  # type: ignore[call-overload]
            totals = {int(k): int(v) for k, v in dict(doc.get("totals") or {}).items()}  # type: ignore[call-overload]
        except (KeyError, TypeError, ValueError):
            continue
        alive = holder_alive(pid, start if isinstance(start, int) else None)
        counted = alive
        expired = False
        if not alive:
            hold = doc.get("hold_seconds")
            until = doc.get("hold_until")
            beat = doc.get("beat")
            if doc.get("boot_id") != BOOT_ID:
                limit = 0.0
            elif isinstance(until, int | float):
                limit = float(until)
            elif isinstance(hold, int | float) and isinstance(beat, int | float):
                limit = float(beat) + float(hold)
            else:
                limit = 0.0
            counted = now < limit
            expired = not counted
        out.append(_Holder(pid, gpus, totals, counted, expired))
    return out


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


BOOT_ID = _boot_id()


def read_gpu_state(directory: Path, now: Callable[[], float] = time.monotonic) -> list[SimGpu]:
    """Every simulated GPU in `directory` with the memory live (or held) processes use."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    totals = _inventory(directory)
    holders = _holders(directory, now())
    for h in holders:
        for idx, total in h.totals.items():
            totals.setdefault(idx, total)
    out = []
    for idx in sorted(totals):
        procs = {h.pid: h.gpus[idx] for h in holders if h.counted and h.gpus.get(idx, 0) > 0}
        out.append(SimGpu(idx, totals[idx], sum(procs.values()), procs))
    return out


def foreign_used_bytes(
    directory: Path, indices: list[int], exclude: int | Collection[int]
) -> list[int]:
    """Bytes other holders use on each of `indices` (what shrinks a new server's P); `exclude` is
    the server's own pid, or every pid of its process tree."""
    ours = {exclude} if isinstance(exclude, int) else set(exclude)
    state = {g.index: g for g in read_gpu_state(directory)}
    out = []
    for idx in indices:
        gpu = state.get(idx)
        out.append(0 if gpu is None else sum(b for p, b in gpu.processes.items() if p not in ours))
    return out


def prune(directory: Path) -> None:
    """Delete files of holders that are dead and no longer held (best effort)."""
    for h in _holders(Path(directory), time.monotonic()):
        if h.expired:
            with contextlib.suppress(FileNotFoundError):
                (Path(directory) / f"{PREFIX}{h.pid}.json").unlink()


class GpuStateWriter:
    """One process's entry in the state directory."""

    def __init__(
        self,
        directory: Path,
        pid: int,
        totals: Mapping[int, int],
        hold_seconds: float | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.pid = pid
        self.totals = dict(totals)
        self.hold_seconds = hold_seconds
        self.used: dict[int, int] = {i: 0 for i in totals}
        self.start_time = process_start_time(pid)
        self.path = self.directory / f"{PREFIX}{pid}.json"
        self.unwritten = False
        """The last state could not be written (a full disk); the next write makes it."""

    def set_used(self, used: Mapping[int, int]) -> None:
        """Set this process's use per GPU (bytes by index; a GPU not named holds 0) and write the
        entry."""
        self.used = {i: int(used.get(i, 0)) for i in self.totals}
        self._write(None)

    def set_all(self, used_bytes: int) -> None:
        """Set the same use on every GPU of this process (one tensor-parallel rank per GPU)."""
        self.set_used({i: used_bytes for i in self.totals})

    def heartbeat(self) -> None:
        """Rewrite the entry's heartbeat, which a dead holder's memory is held from; an entry never
        written (or removed) is left alone unless a failed write is owed."""
        if self.unwritten or self.path.exists():
            self._write(None)

    def release(self) -> None:
        """The process is exiting: drop the entry, or stamp the end of the hold."""
        if self.hold_seconds:
            self._write(time.monotonic() + self.hold_seconds)
            return
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def _write(self, hold_until: float | None) -> None:
        doc = {
            "pid": self.pid,
            "start_time": self.start_time,
            "gpus": {str(i): b for i, b in self.used.items()},
            "totals": {str(i): t for i, t in self.totals.items()},
            "hold_seconds": self.hold_seconds,
            "hold_until": hold_until,
            "beat": time.monotonic(),
            "boot_id": BOOT_ID,
        }
        self.unwritten = not _try_write_json(self.path, doc)


def write_holder(
    directory: Path, pid: int, used: Mapping[int, int], totals: Mapping[int, int] | None = None
) -> Path:
    """Register `pid` as holding `used` bytes per GPU (e.g. a foreign process in a test)."""
    writer = GpuStateWriter(Path(directory), pid, totals or {i: 0 for i in used})
    writer.totals = dict(totals or {})
    writer.used = dict(used)
    writer._write(None)
    return writer.path
