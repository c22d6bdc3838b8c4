"""The simulator against a broken host, as SGLang meets it: its port taken by another process
(uvicorn's and the warm-up's own lines), a full disk under its GPU-state files (NVML's stand-in:
never fatal), and a full disk under its kernel cache (`TRITON_CACHE_DIR`: the capture fails
with `[Errno 28]`). Full disks are real tmpfs mounts (root only; skipped otherwise)."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.reliability.helpers import fill_disk
from tests.sim.conftest import READY, SMALL, Launcher

STAMP = r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] "


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs with not a byte left."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    fill_disk(disk)
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_port_taken_by_a_listener_prints_uvicorns_lines_then_the_warmup_gives_up(
    launch_sim: Launcher, taken_port: int
) -> None:
    """uvloop's bind error once (`… ('H', P): address already in use`, not asyncio's doubled
    text), uvicorn's lifespan shutdown, then SGLang's warm-up thread, which waited for
    `/model_info` on the taken port, gives up and the tree is SIGKILLed."""
    busy = launch_sim(SMALL, port=taken_port, scale=30000)
    assert busy.wait_exit() == -9
    log = busy.log()
    bind = (
        "ERROR:    [Errno 98] error while attempting to bind on address "
        f"('127.0.0.1', {taken_port}): address already in use"
    )
    assert re.search(STAMP + re.escape(bind) + "\n", log), log[-2000:]
    assert log.count("error while attempting to bind") == 1
    after = log[log.index(bind) :]
    assert "INFO:     Waiting for application shutdown." in after
    assert "Initialization failed. warmup error: Traceback (most recent call last):" in after
    assert f"ReadTimeout: HTTPConnectionPool(host='127.0.0.1', port={taken_port})" in after
    assert READY not in log


def test_port_taken_without_warmup_exits_1_after_the_lifespan_shutdown(
    launch_sim: Launcher, taken_port: int
) -> None:
    busy = launch_sim([*SMALL, "--skip-server-warmup"], port=taken_port)
    assert busy.wait_exit() == 1
    tail = busy.log().splitlines()[-3:]
    assert tail[0].endswith(f"('127.0.0.1', {taken_port}): address already in use"), tail
    assert [line.split("] ", 1)[1] for line in tail[1:]] == [
        "INFO:     Waiting for application shutdown.",
        "INFO:     Application shutdown complete.",
    ]


def test_full_disk_under_the_gpu_state_does_not_kill_the_server(
    launch_sim: Launcher, full_disk: Path
) -> None:
    """The GPU-state files stand for the driver's bookkeeping, which needs no disk: with their
    disk full the server starts and serves. Before, it died with `OSError: [Errno 28]`."""
    sim = launch_sim(SMALL, gpu_dir=full_disk / "gpu", scale=30000)
    sim.wait_ready()
    assert sim.proc.poll() is None
    assert "Errno 28" not in sim.log()


def test_full_kernel_cache_disk_fails_the_capture_with_errno_28(
    launch_sim: Launcher, full_disk: Path
) -> None:
    """With `TRITON_CACHE_DIR` on a full disk, the first decode graph capture cannot store its
    kernel: each rank's `Capture cuda graph failed: [Errno 28] No space left on device`, then
    SGLang's SIGQUIT path and SIGKILL."""
    sim = launch_sim(SMALL, env={"TRITON_CACHE_DIR": str(full_disk / "triton")}, scale=30000)
    assert sim.wait_exit() == -9
    log = sim.log()
    assert "Exception: Capture cuda graph failed: [Errno 28] No space left on device" in log
    assert "Received sigquit from a child process" in log
    assert READY not in log
    assert not list((full_disk / "triton").rglob("*.cubin"))  # nothing half-written is left


def test_kernel_cache_on_a_disk_with_room_is_written_and_the_server_starts(
    launch_sim: Launcher, tmp_path: Path
) -> None:
    sim = launch_sim(SMALL, env={"TRITON_CACHE_DIR": str(tmp_path / "triton")}, scale=30000)
    sim.wait_ready()
    [kernel] = list((tmp_path / "triton").rglob("*.cubin"))
    assert kernel.stat().st_size > 0
    assert not [p for p in (tmp_path / "triton").rglob("tmp.*")]
