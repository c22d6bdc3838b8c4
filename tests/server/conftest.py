"""The guard every lifecycle test uses: each process a test started must be gone when it ends
(what is left is killed by process group, and the test fails)."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from autotune import procs
from autotune.server import Server


@dataclass
class Guard:
    """Process groups and pids a test started. Servers' groups and `must_die` pids must be gone
    when the test ends; `strangers` (stand-ins for other people's processes) are killed then."""

    groups: list[tuple[int, int]] = field(default_factory=list)  # (pgid, sid)
    must_die: list[procs.ProcInfo] = field(default_factory=list)
    strangers: list[subprocess.Popen[Any]] = field(default_factory=list)

    def server(self, server: Server) -> Server:
        self.groups.append((server.record.pgid, server.record.sid))
        return server

    def stranger(self, popen: subprocess.Popen[Any]) -> subprocess.Popen[Any]:
        self.strangers.append(popen)
        return popen

    def leftovers(self) -> list[int]:
        left = [p.pid for pgid, sid in self.groups for p in procs.members(pgid, sid)]
        left += [p.pid for p in self.must_die if procs.is_alive(p.pid, p.start_ticks)]
        return left

    def kill_all(self) -> None:
        for pgid, sid in self.groups:
            for p in procs.members(pgid, sid):
                procs.signal_verified(p, signal.SIGKILL)
        for p in self.must_die:
            procs.signal_verified(p, signal.SIGKILL)
        for popen in self.strangers:
            popen.kill()
            popen.wait()


@pytest.fixture
def guard() -> Iterator[Guard]:
    g = Guard()
    yield g
    deadline = time.monotonic() + 3.0
    left = g.leftovers()
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = g.leftovers()
    g.kill_all()
    assert not left, f"processes left behind by the test: {left}"
