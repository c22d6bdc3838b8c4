"""Fixtures: a fake SGLang-like server in its own process group, killed and verified gone."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest


@dataclass
class FakeServer:
    proc: subprocess.Popen[str]
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def is_dead(self) -> str | None:
        code = self.proc.poll()
        return None if code is None else f"server exited with {code}"


def _gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture
def fake_server() -> Iterator[Callable[..., FakeServer]]:
    """Starts `python -m autotune.loadgen.fakeserver ARGS` on a free port; cleans up after."""
    started: list[subprocess.Popen[str]] = []

    def start(*args: str) -> FakeServer:
        proc = subprocess.Popen(
            [sys.executable, "-m", "autotune.loadgen.fakeserver", "--port", "0", *args],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        started.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("listening on "), line
        return FakeServer(proc, int(line.split()[-1]))

    yield start
    for proc in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()
        for _ in range(100):
            if _gone(proc.pid):
                break
            time.sleep(0.05)
        assert _gone(proc.pid), f"fake server group {proc.pid} still alive"
