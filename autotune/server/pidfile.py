"""Pidfiles: what autotune records about each server it runs, so a restarted autotune can find it.

One JSON file per running server, `<run_dir>/server-<pid>.pid.json`, written right after the
launch and removed once the teardown confirmed every process gone. It holds the pid, process
group and session, the start time from /proc and the boot id (so a reused pid is never taken for
ours), the port, the log path and the argv with secrets masked (`autotune.masking.masked_argv`).
`members` lists every other process of the server seen while it ran (pid and start time; its
schedulers and whatever they started, in or out of its group and session), rewritten whenever a
new one appears, so a restarted autotune can stop and wait for those too. The API key never
reaches it.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from autotune.server import procs

SUFFIX = ".pid.json"


@dataclass(frozen=True)
class PidRecord:
    """What one pidfile holds about a server autotune started: its identity (pid, start time, boot),
    group and session, address, log, masked argv, the members seen, and who launched it."""

    pid: int
    pgid: int
    sid: int
    start_ticks: int
    boot_id: str
    host: str
    port: int
    log_path: str
    argv: tuple[str, ...]
    launched_at: float
    members: tuple[tuple[int, int], ...] = ()
    owner_pid: int = 0
    """The autotune process that launched the server (0 in pidfiles from before owners)."""
    owner_start_ticks: int = 0
    study: str = ""
    """The study the server ran a trial (or a confirmation) of."""

    def alive(self) -> bool:
        """The recorded process still runs (same boot, same start time)."""
        return self.boot_id == procs.boot_id() and procs.is_alive(self.pid, self.start_ticks)

    def owner_alive(self) -> bool:
        """The autotune that launched the server still runs, and it is not this process: only
        it may stop the server; anyone else leaves it alone."""
        if not self.owner_pid or self.owner_pid == os.getpid():
            return False
        return self.boot_id == procs.boot_id() and procs.is_alive(
            self.owner_pid, self.owner_start_ticks
        )

    def to_json(self) -> str:
        """The record as the pidfile's JSON text."""
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> PidRecord:
        """The record a pidfile's JSON text holds (older pidfiles without members or owners read
        too)."""
        data = json.loads(text)
        data["argv"] = tuple(data["argv"])
        data["members"] = tuple((int(p), int(t)) for p, t in data.get("members", ()))
        return cls(**data)


def owner() -> tuple[int, int]:
    """This process as a pidfile's owner: its pid and start time."""
    me = procs.read_proc(os.getpid())
    return os.getpid(), me.start_ticks if me else 0


def path_for(run_dir: Path, pid: int) -> Path:
    """The pidfile of the server with main process `pid` in `run_dir`."""
    return Path(run_dir) / f"server-{pid}{SUFFIX}"


def write(run_dir: Path, record: PidRecord) -> Path:
    """Write atomically (temp file + rename) so a crash never leaves half a record."""
    path = path_for(run_dir, record.pid)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".pid-", dir=path.parent)
    with os.fdopen(fd, "w") as fh:
        fh.write(record.to_json())
    os.replace(tmp, path)
    return path


def remove(path: Path) -> None:
    """Remove a pidfile, already gone or not: done once the teardown proved every process gone."""
    path.unlink(missing_ok=True)


def records(run_dir: Path) -> list[tuple[Path, PidRecord]]:
    """Every readable pidfile under `run_dir` (unreadable ones are skipped, never acted on)."""
    out: list[tuple[Path, PidRecord]] = []
    directory = Path(run_dir)
    if not directory.is_dir():
        return out
    for path in sorted(directory.glob(f"*{SUFFIX}")):
        try:
            out.append((path, PidRecord.from_json(path.read_text())))
        except (OSError, ValueError, TypeError, KeyError):
            continue
    return out
