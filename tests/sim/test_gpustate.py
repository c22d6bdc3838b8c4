"""GPU state files: atomic per-process entries, liveness by pid + start time, holds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from autotune.sim.gpustate import (
    GpuStateWriter,
    foreign_used_bytes,
    process_start_time,
    prune,
    read_gpu_state,
    write_holder,
    write_inventory,
)

GiB = 1 << 30


def test_live_holder_counts_and_release_drops_it(tmp_path: Path) -> None:
    write_inventory(tmp_path, {0: 80 * GiB, 1: 80 * GiB})
    w = GpuStateWriter(tmp_path, os.getpid(), {1: 80 * GiB})
    w.set_all(10 * GiB)
    gpus = read_gpu_state(tmp_path)
    assert [(g.index, g.used_bytes) for g in gpus] == [(0, 0), (1, 10 * GiB)]
    assert gpus[1].processes == {os.getpid(): 10 * GiB}
    assert foreign_used_bytes(tmp_path, [0, 1], exclude=12345) == [0, 10 * GiB]
    assert foreign_used_bytes(tmp_path, [1], exclude=os.getpid()) == [0]
    assert foreign_used_bytes(tmp_path, [1], exclude={12345, os.getpid()}) == [0]  # a tree
    w.release()
    assert read_gpu_state(tmp_path)[1].used_bytes == 0
    assert not list(tmp_path.glob("proc-*"))


def test_dead_pid_and_reused_pid_count_as_released(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    dead = int(done.stdout)
    write_holder(tmp_path, dead, {0: GiB}, {0: 80 * GiB})
    assert read_gpu_state(tmp_path)[0].used_bytes == 0
    path = write_holder(tmp_path, os.getpid(), {0: GiB}, {0: 80 * GiB})
    doc = json.loads(path.read_text())
    doc["start_time"] = (process_start_time(os.getpid()) or 0) + 1  # same pid, other process
    path.write_text(json.dumps(doc))
    assert read_gpu_state(tmp_path)[0].used_bytes == 0
    prune(tmp_path)
    assert not list(tmp_path.glob("proc-*"))


def test_zombie_counts_as_dead(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while process_start_time(child.pid) is not None and time.monotonic() < deadline:
        time.sleep(0.02)  # exits, stays a zombie until waited for
    write_holder(tmp_path, child.pid, {0: GiB}, {0: 80 * GiB})
    assert read_gpu_state(tmp_path)[0].used_bytes == 0
    child.wait()


def test_hold_keeps_memory_until_stamp_or_heartbeat_expires(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", "pass"], check=True)
    assert done.returncode == 0
    w = GpuStateWriter(tmp_path, os.getpid(), {0: 80 * GiB}, hold_seconds=30)
    w.set_all(5 * GiB)
    w.release()  # stamps hold_until = now + 30
    doc = json.loads(w.path.read_text())
    doc["pid"] = 999_999_999  # as if the process were gone
    w.path.write_text(json.dumps(doc))
    assert read_gpu_state(tmp_path)[0].used_bytes == 5 * GiB
    assert read_gpu_state(tmp_path, now=lambda: time.monotonic() + 31)[0].used_bytes == 0
    doc["hold_until"] = None  # killed by SIGKILL: the last heartbeat decides
    w.path.write_text(json.dumps(doc))
    assert read_gpu_state(tmp_path)[0].used_bytes == 5 * GiB
    assert read_gpu_state(tmp_path, now=lambda: time.monotonic() + 31)[0].used_bytes == 0
    old = time.time() - 3600
    os.utime(w.path, (old, old))  # a wall-clock step (or an old mtime) moves nothing
    assert read_gpu_state(tmp_path)[0].used_bytes == 5 * GiB
    doc["boot_id"] = "an-earlier-boot"  # the machine rebooted since: nothing is held
    w.path.write_text(json.dumps(doc))
    assert read_gpu_state(tmp_path)[0].used_bytes == 0


def test_missing_directory_reads_empty(tmp_path: Path) -> None:
    assert read_gpu_state(tmp_path / "nope") == []
