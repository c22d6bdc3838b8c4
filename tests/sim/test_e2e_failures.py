"""End to end: every startup failure, the runtime OOM, every fault, and SIGTERM handling."""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
from pathlib import Path

import pytest

from autotune.sim.gpustate import read_gpu_state, write_holder
from tests.sim.conftest import KIMI, READY, SMALL, Launcher
from tests.sim.http import request, sse_events

pytestmark = pytest.mark.e2e
GiB = 1 << 30


def kimi(fraction: float, *extra: str) -> list[str]:
    return [*KIMI, "--mem-fraction-static", str(fraction), *extra]


@pytest.mark.parametrize(
    ("args", "evidence"),
    [
        (kimi(0.5), "RuntimeError: Not enough memory. Please try to increase "
         "--mem-fraction-static. Current value: self.server_args.mem_fraction_static=0.5"),
        (kimi(0.95), "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate"),
        (kimi(0.88, "--hicache-size", "5000"), "ValueError: Not enough host memory available. "
         "Requesting 5000.00 GB"),
        ([*kimi(0.88), "--tp", "4"], "torch.OutOfMemoryError: CUDA out of memory. Tried to "),
        ([*kimi(0.88), "--context-length", "300000"], "ValueError: User-specified context_length "
         "(300000) is greater than the derived context_length (262144)."),
        (kimi(0.94), "torch.OutOfMemoryError: CUDA out of memory."),
    ],
)  # fmt: skip
def test_startup_failures_die_like_sglang(
    launch_sim: Launcher, args: list[str], evidence: str
) -> None:
    sim = launch_sim(args, scale=5000)
    assert sim.wait_exit() == -signal.SIGKILL
    log = sim.log()
    assert evidence in log
    assert "Scheduler hit an exception: Traceback (most recent call last):" in log
    assert "Received sigquit from a child process. It usually means the child failed." in log
    assert "fired up" not in log
    assert all(g.used_bytes == 0 for g in read_gpu_state(sim.gpu_dir))


def test_host_overcommit_hits_the_oom_killer(launch_sim: Launcher) -> None:
    sim = launch_sim(kimi(0.88, "--hicache-size", "400"), scale=5000)
    assert sim.wait_exit() == 1
    log = sim.log()
    assert "[TP0] Allocating" not in log
    assert "Rank 5 scheduler is dead. Please check if there are relevant logs." in log
    assert log.count("Allocating 400.00 GB host memory for hierarchical KV cache.") == 5


def long_prompt(sim_base: str) -> tuple[int, bytes] | None:
    try:
        return request(f"{sim_base}/generate", {"input_ids": list(range(1, 9001)),
                       "sampling_params": {"max_new_tokens": 8}}, timeout=20)  # fmt: skip
    except (urllib.error.URLError, http.client.HTTPException, ConnectionError):
        return None


def test_runtime_oom_at_093_but_not_at_088(launch_sim: Launcher) -> None:
    high = launch_sim(kimi(0.93), scale=5000)
    high.wait_ready()
    assert "available_gpu_mem=0.7" in high.log() or "available_gpu_mem=0.8" in high.log()
    assert long_prompt(high.base) is None
    assert high.wait_exit() == -signal.SIGKILL
    log = high.log()
    assert "Scheduler hit an exception: Traceback" in log
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate " in log
    assert "SIGQUIT received. signum=None, frame=None. It usually means one child failed." in log
    assert all(g.used_bytes == 0 for g in read_gpu_state(high.gpu_dir))
    safe = launch_sim(kimi(0.88), scale=5000)
    safe.wait_ready()
    result = long_prompt(safe.base)
    assert result is not None and result[0] == 200
    assert safe.proc.poll() is None


def test_fault_hang_weight_load_then_sigterm_kills(launch_sim: Launcher) -> None:
    sim = launch_sim([*SMALL, "--sim-fault", "hang-weight-load"])
    assert sim.wait_for("Load weight begin")
    time.sleep(0.5)
    assert "Load weight end" not in sim.log() and sim.proc.poll() is None
    sim.proc.send_signal(signal.SIGTERM)
    assert sim.wait_exit() == -signal.SIGTERM


def test_fault_crash_mid_load(launch_sim: Launcher) -> None:
    sim = launch_sim([*SMALL, "--sim-fault", "crash-mid-load"])
    assert sim.wait_exit() == -signal.SIGKILL
    log = sim.log()
    assert "SafetensorError" in log and "Load weight end" not in log
    assert "Received sigquit from a child process" in log


def test_fault_health_empty_while_serving_works(launch_sim: Launcher) -> None:
    sim = launch_sim([*SMALL, "--sim-fault", "health-empty"])
    sim.wait_ready()
    with pytest.raises((http.client.RemoteDisconnected, ConnectionError, urllib.error.URLError)):
        request(f"{sim.base}/health")
    events = sse_events(f"{sim.base}/generate", {"text": "a b", "stream": True,
                        "sampling_params": {"max_new_tokens": 3}})  # fmt: skip
    assert events[-2]["meta_info"]["completion_tokens"] == 3


def test_fault_health_fail_while_serving_works(launch_sim: Launcher) -> None:
    sim = launch_sim([*SMALL, "--sim-fault", "health-fail"])
    sim.wait_ready()
    assert request(f"{sim.base}/health")[0] == 503
    assert request(f"{sim.base}/health_generate")[0] == 503
    assert (
        request(f"{sim.base}/generate", {"text": "a", "sampling_params": {"max_new_tokens": 2}})[0]
        == 200
    )


def test_fault_hold_gpu_keeps_memory_after_sigkill(launch_sim: Launcher) -> None:
    sim = launch_sim([*SMALL, "--sim-fault", "hold-gpu=1.5"])
    sim.wait_ready()
    sim.kill()
    held = read_gpu_state(sim.gpu_dir)
    assert held[0].used_bytes > 60 * GiB
    deadline = time.monotonic() + 5
    while read_gpu_state(sim.gpu_dir)[0].used_bytes and time.monotonic() < deadline:
        time.sleep(0.1)
    assert read_gpu_state(sim.gpu_dir)[0].used_bytes == 0


def test_fault_ignore_sigterm(launch_sim: Launcher) -> None:
    sim = launch_sim([*SMALL, "--sim-fault", "ignore-sigterm"])
    sim.wait_ready()
    sim.proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    assert sim.proc.poll() is None


def test_fault_slow_startup_scales_phases(launch_sim: Launcher) -> None:
    sim = launch_sim([*SMALL, "--sim-fault", "slow-startup=3"])
    sim.wait_ready()
    assert "Load weight end. elapsed=120.00 s" in sim.log()


def test_sigterm_before_first_request_is_uvicorn_shutdown(launch_sim: Launcher) -> None:
    sim = launch_sim([*SMALL, "--skip-server-warmup"])
    sim.wait_ready()
    sim.proc.send_signal(signal.SIGTERM)
    assert sim.wait_exit() == 0
    assert "Finished server process" in sim.log()
    assert read_gpu_state(sim.gpu_dir)[0].used_bytes == 0


def test_sigterm_after_warmup_drains_then_kills_itself(launch_sim: Launcher) -> None:
    sim = launch_sim(SMALL)
    sim.wait_ready()
    out: list[object] = []
    body = {"text": "go", "stream": True, "sampling_params": {"max_new_tokens": 60}}
    worker = threading.Thread(target=lambda: out.append(sse_events(f"{sim.base}/generate", body)))
    worker.start()
    time.sleep(0.2)
    sim.proc.send_signal(signal.SIGTERM)
    assert sim.wait_for("SIGTERM received. signum=15 frame=None. Draining requests", 5)
    assert request(f"{sim.base}/health")[0] == 503
    worker.join(timeout=30)
    assert sim.wait_exit() == -signal.SIGKILL
    events = out[0]
    assert isinstance(events, list) and events[-2]["meta_info"]["completion_tokens"] == 60
    assert "Gracefully exiting... Remaining number of requests 1." in sim.log()


def test_foreign_holder_shrinks_p(launch_sim: Launcher, tmp_path: Path) -> None:
    gpu_dir = tmp_path / "shared-gpus"
    write_holder(gpu_dir, os.getpid(), {3: 2 * GiB})
    sim = launch_sim(kimi(0.88), scale=5000, gpu_dir=gpu_dir)
    sim.wait_ready()
    log = sim.log()
    assert "TP3] Load weight begin. avail mem=92.0" in log  # the MIN over ranks is what counts
    assert "TP0] KV Cache is allocated. #tokens: 1" in log
    assert "KV Cache is allocated. #tokens: 159" not in log


def test_bad_flags_and_profile_exit_2() -> None:
    for args in (
        ["--model-path", "m", "--no-such-flag"],
        ["--model-path", "m", "--sim-profile", "nope"],
    ):
        proc = subprocess.run([sys.executable, "-m", "autotune.sim", *args], capture_output=True,
                              timeout=30, check=False)  # fmt: skip
        assert proc.returncode == 2
        assert b"error" in proc.stderr


def test_port_in_use_fails_like_uvicorn(launch_sim: Launcher, taken_port: int) -> None:
    busy = launch_sim([*SMALL, "--skip-server-warmup"], port=taken_port)
    assert busy.wait_exit() == 1
    assert "address already in use" in busy.log()
    assert READY not in busy.log()
