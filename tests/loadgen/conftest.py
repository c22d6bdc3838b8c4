"""The simulator as a fixture (`sim_server`), in its own process group, killed and verified gone
after the test (the fake SGLang server's fixture, `fake_server`, is in tests/conftest.py)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from autotune.loadgen import ServerFacts
from autotune.server.preflight import free_port
from autotune.testing.fakeserver import Running

SIM_READY = "The server is fired up and ready to roll!"
_FACTS = re.compile(
    r"max_total_num_tokens=(\d+), chunked_prefill_size=(-?\d+), max_prefill_tokens=-?\d+, "
    r"max_running_requests=(\d+), context_len=(\d+)"
)


@dataclass
class SimServer(Running):
    """The simulator's process and port (`url`, `is_dead`, `stop` as the fake server's), and its
    log."""

    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def facts(self) -> ServerFacts:
        m = _FACTS.search(self.text())
        assert m is not None, "no max_total_num_tokens summary line in the log"
        return ServerFacts(int(m[3]), int(m[2]), int(m[4]), int(m[1]))


@pytest.fixture
def sim_server(tmp_path: Path) -> Iterator[Callable[..., SimServer | None]]:
    """Launches `python -m autotune.sim` like SGLang and waits until it is ready."""
    started: list[SimServer] = []

    def start(
        *flags: str, profile: str = "qwen3-32b-h200", tp: int = 1, may_fail: bool = False
    ) -> SimServer | None:
        """The ready simulator; None if it died during startup and `may_fail` is set."""
        port = free_port("127.0.0.1")
        log = tmp_path / f"sim-{port}.log"
        gpu_dir = tmp_path / f"gpu-{port}"
        gpu_dir.mkdir()
        argv = [
            sys.executable,
            "-m",
            "autotune.sim",
            "--model-path",
            "m",
            "--tp",
            str(tp),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--sim-profile",
            profile,
            "--sim-time-scale",
            "1000",
            "--sim-gpu-dir",
            str(gpu_dir),
            *flags,
        ]
        with log.open("wb") as out:
            proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, text=True
            )
        sim = SimServer(proc, port, log)
        started.append(sim)
        for _ in range(600):
            if SIM_READY in sim.text():
                return sim
            if proc.poll() is not None and may_fail:
                return None
            assert proc.poll() is None, f"simulator exited during startup:\n{sim.text()[-2000:]}"
            time.sleep(0.1)
        raise AssertionError("simulator not ready after 60 s")

    yield start
    for sim in started:
        assert sim.stop(), f"simulator group {sim.proc.pid} still alive"
