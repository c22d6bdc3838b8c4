"""Helpers for server tests: free ports, specs for the fake server, a stranger's process, and a
stand-in SGLang package for the tests of SGLang's own parser."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from autotune.logparse.outcome import Outcome
from autotune.logparse.phase import PhaseLimits
from autotune.server import procs
from autotune.server.launchspec import LaunchSpec
from autotune.server.lifecycle import Death, Server
from autotune.server.preflight import free_port

FAKE = (sys.executable, "-m", "autotune.testing.fakeserver", "--log")


def make_spec(tmp_path: Path, **values: Any) -> LaunchSpec:
    """A spec logging to and keeping pidfiles under `tmp_path`, on a free port; `values` win."""
    base: dict[str, Any] = dict(
        log_path=tmp_path / "server.log",
        run_dir=tmp_path / "run",
        port=free_port("127.0.0.1"),
    )
    return LaunchSpec(**{**base, **values})


# The lifecycle limits for the fake server, which starts and stops in well under a second.
FAKE_LIMITS: dict[str, float] = dict(
    startup_s=60.0,
    stall_s=30.0,
    ready_check_s=10.0,
    health_timeout_s=5.0,
    exit_wait_s=5.0,
    health_interval_s=0.1,
    unhealthy_s=1.0,
    stop_grace_s=5.0,
    release_s=5.0,
)


def fake_spec(tmp_path: Path, *modes: str, **overrides: Any) -> LaunchSpec:
    argv = list(FAKE)
    for mode in modes:
        argv += ["--mode", mode]
    values: dict[str, Any] = dict(env={"PYTHONUNBUFFERED": "1"}, phase_limits=PhaseLimits())
    return make_spec(tmp_path, **{"argv": tuple(argv), **values, **FAKE_LIMITS, **overrides})


def install_fake_sglang(root: Path, server_args: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in `sglang` package under `root` whose `sglang/srt/server_args.py` is
    `server_args`, put on PYTHONPATH so that any Python the test starts imports it; `root`."""
    pkg = root / "sglang" / "srt"
    pkg.mkdir(parents=True)
    (root / "sglang" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "server_args.py").write_text(server_args)
    monkeypatch.setenv("PYTHONPATH", str(root))
    return root


def launch_ready(guard: Guard, spec: LaunchSpec) -> Server:
    """Launch `spec` under `guard` and wait until it is ready (fails the test if it is not)."""
    server = guard.server(Server.launch(spec))
    report = server.wait_ready()
    assert report.outcome is Outcome.READY, report
    return server


def sleeper() -> subprocess.Popen[bytes]:
    """Someone else's process: its own session, started outside any server."""
    return subprocess.Popen(["sleep", "600"], start_new_session=True)


def pid_alive(popen: subprocess.Popen[Any]) -> bool:
    return popen.poll() is None and os.path.exists(f"/proc/{popen.pid}")


def wait_death(server: Server, limit_s: float = 20.0) -> Death:
    """Poll `check_alive` until the server is judged dead (fails the test after `limit_s`)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        death = server.check_alive()
        if death is not None:
            return death
        time.sleep(0.05)
    raise AssertionError("the server was never judged dead")


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
