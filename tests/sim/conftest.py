"""Launching simulator processes for end-to-end tests; every process is verified gone after."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from autotune.server.preflight import free_port

READY = "The server is fired up and ready to roll!"
SMALL = ["--model-path", "Qwen/Qwen3-32B", "--sim-profile", "qwen3-32b-h200"]
OPERATOR = [
    "--model-path", "moonshotai/Kimi-K2.5", "--tp", "8", "--max-running-requests", "48",
    "--chunked-prefill-size", "8192", "--enable-hierarchical-cache", "--hicache-size", "48",
    "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "draft",
]  # fmt: skip
"""The operator's SGLang flags (Kimi-K2.5 on 8 GPUs, EAGLE3 draft, HiCache), but the fraction."""
KIMI = [*OPERATOR, "--sim-profile", "kimi-k2.5-tp8-96g"]


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port on 127.0.0.1 that this process listens on for the whole test."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield int(taken.getsockname()[1])


@dataclass
class SimProcess:
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path
    gpu_dir: Path
    pgid: int = field(init=False)

    def __post_init__(self) -> None:
        self.pgid = self.proc.pid

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for(self, text: str, timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.log():
                return True
            if self.proc.poll() is not None:
                return text in self.log()
            time.sleep(0.02)
        return False

    def wait_ready(self, timeout: float = 30.0) -> None:
        assert self.wait_for(READY, timeout), self.log()[-3000:]

    def wait_exit(self, timeout: float = 30.0) -> int:
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        if self.proc.poll() is None or group_alive(self.pgid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pgid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        # The schedulers and the detokenizer die on their own schedule after the signal: the
        # kill is over when the whole group is gone, not when the parent is.
        deadline = time.monotonic() + 10
        while group_alive(self.pgid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not group_alive(self.pgid), f"process group {self.pgid} outlived SIGKILL"

    def children(self) -> dict[str, int]:
        """The server's child processes by title (`sglang::scheduler_TP0`, …), read from /proc."""
        return {title: pid for pid, ppid, _, title in processes() if ppid == self.proc.pid}

    def group(self) -> list[tuple[int, int, int, str]]:
        """Every live process of the server's process group: (pid, ppid, pgid, command line)."""
        return [p for p in processes() if p[2] == self.pgid]


def processes() -> list[tuple[int, int, int, str]]:
    """Every live (not zombie) process: (pid, ppid, pgid, command line as `ps` shows it)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if fields[0] in ("Z", "X"):
            continue
        args = cmdline.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")
        out.append((int(entry.name), int(fields[1]), int(fields[2]), args))
    return sorted(out)


Launcher = Callable[..., SimProcess]


def group_alive(pgid: int) -> bool:
    """Whether any process of group `pgid` still runs (a zombie does not)."""
    return any(p[2] == pgid for p in processes())


@pytest.fixture
def launch_sim(tmp_path: Path) -> Iterator[Launcher]:
    """launch_sim(args, scale=, env=, gpu_dir=, port=) -> SimProcess (killed at teardown)."""
    launched: list[SimProcess] = []

    def launch(
        args: list[str],
        scale: float = 2000.0,
        env: dict[str, str] | None = None,
        gpu_dir: Path | None = None,
        port: int | None = None,
    ) -> SimProcess:
        port = port or free_port("127.0.0.1")
        log_path = tmp_path / f"sim-{len(launched)}.log"
        gdir = gpu_dir or tmp_path / "gpus"
        full_env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
        full_env.update(env or {})
        cmd = [sys.executable, "-m", "autotune.sim", *args, "--host", "127.0.0.1", "--port",
               str(port), "--sim-time-scale", str(scale), "--sim-gpu-dir", str(gdir)]  # fmt: skip
        with log_path.open("wb") as fh:
            proc = subprocess.Popen(
                cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True, env=full_env
            )
        sim = SimProcess(proc, port, log_path, gdir)
        launched.append(sim)
        return sim

    yield launch
    for sim in launched:
        sim.kill()
        deadline = time.monotonic() + 5
        while group_alive(sim.pgid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not group_alive(sim.pgid), f"process group {sim.pgid} survived its test"
