"""A real simulator log for `autotune init`: the simulated Kimi-K2.5 box (TP8, EAGLE3 draft, 48 GB
host cache) started at f = 0.88, a burst of requests so the log has Prefill and Decode lines,
then stopped (its process group killed and proved gone)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from autotune.server.preflight import free_port
from tests.simstudy import assert_none_left

KIMI_FLAGS = (
    ("model-path", "moonshotai/Kimi-K2.5"),
    ("tp-size", 8),
    ("trust-remote-code", True),
    ("speculative-algorithm", "EAGLE3"),
    ("speculative-draft-model-path", "lightseekorg/kimi-k2.5-eagle3"),
    ("speculative-num-steps", 3),
    ("speculative-eagle-topk", 1),
    ("speculative-num-draft-tokens", 4),
    ("tool-call-parser", "kimi_k2"),
    ("reasoning-parser", "kimi_k2"),
    ("enable-metrics", True),
)
"""The operator's fixed flags (configs/kimi.toml)."""
MEMORY_FLAGS = (
    "--mem-fraction-static", "0.88", "--max-running-requests", "48",
    "--enable-hierarchical-cache", "--hicache-size", "48",
)  # fmt: skip


def kimi_argv() -> list[str]:
    out: list[str] = []
    for name, value in KIMI_FLAGS:
        out += [f"--{name}"] if value is True else [f"--{name}", str(value)]
    return [*out, *MEMORY_FLAGS]


def _post(url: str, body: dict[str, object]) -> None:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        resp.read()


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the simulator's process group, SIGKILL after 10 s; then prove it gone."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError(f"the simulator's process group {proc.pid} outlived SIGKILL")


def simulator_log(
    folder: Path,
    *,
    version: str | None = None,
    requests: int = 16,
    prompt: Callable[[int], int] = lambda i: 300 + 40 * i,
    answer: int = 400,
) -> Path:
    """Start the simulator, drive `requests` concurrent requests (request i: `prompt(i)` tokens,
    `answer` tokens of answer), stop it; its log."""
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "server.log"
    port = free_port("127.0.0.1")
    argv = [
        sys.executable, "-m", "autotune.sim",
        "--sim-profile", "kimi-k2.5-tp8-96g", "--sim-time-scale", "30000",
        "--sim-gpu-dir", str(folder / "gpu"),
        *(("--sim-version", version) if version else ()),
        *kimi_argv(), "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while "fired up and ready" not in log.read_text(errors="replace"):
            assert proc.poll() is None, log.read_text(errors="replace")[-2000:]
            assert time.monotonic() < deadline, "the simulator did not get ready in 60 s"
            time.sleep(0.05)
        url = f"http://127.0.0.1:{port}/generate"
        errors: list[BaseException] = []

        def one(i: int) -> None:
            body: dict[str, object] = {
                "input_ids": [7 + i] * prompt(i),
                "sampling_params": {"max_new_tokens": answer, "ignore_eos": True},
            }
            try:
                _post(url, body)
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(requests)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=60)
        assert not errors, errors
    finally:
        _stop(proc)
    return log


@pytest.fixture(scope="module")
def kimi_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 0.5.9-format log of the simulated Kimi box at 0.88 with serving lines."""
    folder = tmp_path_factory.mktemp("kimi-sim")
    try:
        return simulator_log(folder)
    finally:
        assert_none_left(folder)


@pytest.fixture(scope="module")
def kimi_log_0523(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same in SGLang 0.5.23's format (`server_args={...}`, the draft folded into the cell)."""
    folder = tmp_path_factory.mktemp("kimi-sim-0523")
    try:
        return simulator_log(folder, version="0.5.23")
    finally:
        assert_none_left(folder)
