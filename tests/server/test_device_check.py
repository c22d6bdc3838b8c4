"""`scripts/device_check.py`, the GPU probe's check on the GPU box: here, where NVML cannot start,
it says so in one line and exits 0; its comparison with nvidia-smi is checked on figures as a box
with the driver's reserve shows them."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "device_check.py"
GiB, MiB = 1 << 30, 1 << 20


@pytest.fixture
def device_check(load_script: Callable[[str], ModuleType]) -> ModuleType:
    return load_script("device_check")


def _nvml_starts() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return False
    pynvml.nvmlShutdown()
    return True


@pytest.mark.skipif(_nvml_starts(), reason="a GPU box runs the full check instead")
def test_without_a_gpu_it_is_one_line_and_exit_0() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and done.stderr == "", done.stdout + done.stderr
    assert lines[0].startswith("device check skipped: no GPU here: "), lines[0]


def test_the_probe_against_nvidia_smi(device_check: ModuleType) -> None:
    from autotune.server.gpu import GpuMemory

    smi = device_check.parse_smi("0, 143771, 0, 143190\n1, 143771, 10240, 132950\n")
    assert smi[1].used == 10240 and smi[0].free == 143190
    total = 143771 * MiB
    # NVML v1: used = total − free, so the 581 MiB the driver reserves count as used
    probe = [GpuMemory(0, total, 581 * MiB), GpuMemory(1, total, (10240 + 581) * MiB)]
    checks = device_check.compare(probe, smi, 256)
    assert all(c.ok for c in checks), checks
    assert "difference 581 MiB: the driver's reserve" in checks[3].detail
    off = [GpuMemory(0, total, 2 * GiB), GpuMemory(1, total, (10240 + 581) * MiB)]
    failed = [c.name for c in device_check.compare(off, smi, 256) if not c.ok]
    assert failed == ["GPU 0 free"]
    missing = device_check.compare(probe[:1], smi, 256)
    assert not missing[0].ok and missing[0].name == "same GPUs"
    table = device_check.table(probe, smi).splitlines()
    assert table[0].split()[:4] == ["GPU", "total", "GiB", "used"]
    assert table[1].split() == ["0", "140.40", "0.57", "139.83", "0", "143771", "0", "143190"]
