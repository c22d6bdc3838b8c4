"""Check autotune's GPU probe on the GPU box before the first night; prints a table and one line
per check, exits 0 when every check passes and 1 when one fails.

1. NVML as autotune reads it (`autotune.server.gpu.NvmlProbe`) against `nvidia-smi
   --query-gpu=index,memory.total,memory.used,memory.free`, per GPU: the same GPUs, the same
   total and free memory (NVML's `used` is total − free and so also counts the memory the driver
   reserves, which newer nvidia-smi leaves out of its `used`: the table shows both).
2. A process that holds GPU memory (torch when it is importable and sees CUDA, else the CUDA
   driver API through `libcuda.so.1`; the line says which) is started in its own session: the
   probe must see the memory and `foreign_holders` (what the pre-launch check refuses or waits
   for) must name it as foreign.
3. Its process group is killed with SIGKILL, and the memory must come back to the baseline taken
   before it started (`unreleased`, the comparison `server.release.wait_released` makes after
   each teardown); the line says how long that took.

Where there is no GPU (no NVML library, no `nvidia-smi`, no device) it prints one line saying so
and exits 0.

Example: .venv/bin/python scripts/device_check.py --device 0 --hold-gib 3
"""

from __future__ import annotations

import argparse
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from autotune.errors import HarnessError
from autotune.server.gpu import GiB, GpuMemory, MiB, NvmlProbe, foreign_holders, unreleased

SMI_QUERY = [
    "nvidia-smi",
    "--query-gpu=index,memory.total,memory.used,memory.free",
    "--format=csv,noheader,nounits",
]

HOLDER = r"""
import ctypes, sys, time
n = int(sys.argv[1])
try:
    import torch
except ImportError:
    torch = None
if torch is not None and torch.cuda.is_available():
    held = torch.ones(n, dtype=torch.uint8, device="cuda:0")  # written, so resident
    torch.cuda.synchronize()
    how = f"torch {torch.__version__}"
else:
    cuda = ctypes.CDLL("libcuda.so.1")
    def ok(rc, what):
        if rc != 0:
            print(f"failed: {what} returned CUDA error {rc}", flush=True)
            sys.exit(3)
    cuda.cuInit.argtypes = [ctypes.c_uint]
    cuda.cuDeviceGet.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
    cuda.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
    cuda.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
    cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
    cuda.cuMemsetD8_v2.argtypes = [ctypes.c_uint64, ctypes.c_ubyte, ctypes.c_size_t]
    ok(cuda.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    ok(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    ctx = ctypes.c_void_p()
    ok(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev.value), "cuDevicePrimaryCtxRetain")
    ok(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    ptr = ctypes.c_uint64()
    ok(cuda.cuMemAlloc_v2(ctypes.byref(ptr), n), "cuMemAlloc_v2")
    ok(cuda.cuMemsetD8_v2(ptr.value, 1, n), "cuMemsetD8_v2")
    ok(cuda.cuCtxSynchronize(), "cuCtxSynchronize")
    how = "the CUDA driver API (libcuda.so.1, cuMemAlloc)"
print(f"holding {n} bytes with {how}", flush=True)
while True:
    time.sleep(60)
"""
"""The memory holder, run with this Python; its first line says how it holds the memory."""


@dataclass(frozen=True)
class Check:
    """One check's result: its name, whether it passed, and what it saw."""

    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class SmiRow:
    """One GPU as nvidia-smi reports it, MiB."""

    index: int
    total: int
    used: int
    free: int


def no_gpu_reason() -> str:
    """Why there is no GPU to check here ("" when there is one)."""
    try:
        import pynvml  # the nvidia-ml-py package, as NvmlProbe imports it
    except ImportError:
        return "nvidia-ml-py (pynvml) is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return f"NVML could not start: {exc}"
    try:
        count = int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()
    if count == 0:
        return "NVML shows no GPU"
    if shutil.which("nvidia-smi") is None:
        return "nvidia-smi is not on PATH"
    return ""


def parse_smi(text: str) -> dict[int, SmiRow]:
    """`index, total, used, free` lines (MiB) → rows by index."""
    rows = {}
    for line in text.strip().splitlines():
        index, total, used, free = (int(x.strip()) for x in line.split(","))
        rows[index] = SmiRow(index, total, used, free)
    return rows


def compare(
    snapshot: Sequence[GpuMemory], smi: dict[int, SmiRow], free_tolerance_mib: int
) -> list[Check]:
    """The probe against nvidia-smi: the same GPUs, total within 2 MiB (nvidia-smi rounds down
    to MiB), free within `free_tolerance_mib` (the two reads are not at the same instant), and
    the probe's `used` at least nvidia-smi's (NVML's counts the driver's reserve too)."""
    checks = [
        Check(
            "same GPUs",
            sorted(g.index for g in snapshot) == sorted(smi),
            f"NVML {sorted(g.index for g in snapshot)}, nvidia-smi {sorted(smi)}",
        )
    ]
    for g in snapshot:
        row = smi.get(g.index)
        if row is None:
            continue
        total, free, used = g.total / MiB, g.free / MiB, g.used / MiB
        checks.append(
            Check(
                f"GPU {g.index} total",
                abs(total - row.total) <= 2,
                f"probe {total:.0f} MiB, nvidia-smi {row.total} MiB",
            )
        )
        checks.append(
            Check(
                f"GPU {g.index} free",
                abs(free - row.free) <= free_tolerance_mib,
                f"probe {free:.0f} MiB, nvidia-smi {row.free} MiB",
            )
        )
        checks.append(
            Check(
                f"GPU {g.index} used",
                used >= row.used - 2,
                f"probe {used:.0f} MiB, nvidia-smi {row.used} MiB "
                f"(difference {used - row.used:.0f} MiB: the driver's reserve)",
            )
        )
    return checks


def table(snapshot: Sequence[GpuMemory], smi: dict[int, SmiRow]) -> str:
    """The probe's figures per GPU, with nvidia-smi's beside them."""
    head = (
        f"{'GPU':>3}  {'total GiB':>9}  {'used GiB':>8}  {'free GiB':>8}  {'pids':>4}  "
        f"{'smi total MiB':>13}  {'smi used MiB':>12}  {'smi free MiB':>12}"
    )
    lines = [head]
    for g in snapshot:
        row = smi.get(g.index)
        smi_cells = (
            f"{row.total:>13}  {row.used:>12}  {row.free:>12}" if row else f"{'-':>13}  " * 3
        )
        lines.append(
            f"{g.index:>3}  {g.total / GiB:>9.2f}  {g.used / GiB:>8.2f}  {g.free / GiB:>8.2f}  "
            f"{len(g.pids):>4}  {smi_cells}"
        )
    return "\n".join(lines)


def _gpu(probe: NvmlProbe, index: int) -> GpuMemory:
    return next(g for g in probe.snapshot() if g.index == index)


def _first_line(proc: subprocess.Popen[str], timeout_s: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    return proc.stdout.readline().strip() if ready else ""


def hold_and_release(
    probe: NvmlProbe, device: int, hold: int, ready_s: float, release_s: float
) -> list[Check]:
    """Start the holder on `device`, check the probe sees its memory as foreign, kill its
    process group and time until the memory is back at the baseline."""
    before = probe.snapshot()
    gpu = next((g for g in before if g.index == device), None)
    if gpu is None:
        return [Check("holder", False, f"GPU {device} is not on this machine")]
    if gpu.free < hold + GiB:
        why = f"GPU {device} has {gpu.free / GiB:.2f} GiB free, the check needs {hold / GiB + 1:g}"
        return [Check("holder", False, why)]
    env = {**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": str(device)}
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(hold)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,  # its own process group, killed as one
    )
    checks: list[Check] = []
    try:
        line = _first_line(proc, ready_s)
        if not line.startswith("holding"):
            rest = "" if proc.poll() is None else (proc.stdout.read() if proc.stdout else "")
            detail = f"no memory held within {ready_s:g} s: {line} {rest}".strip()
            return [Check("holder", False, detail[-600:])]
        checks.append(Check("holder", True, f"pid {proc.pid}, {line}"))
        deadline = time.monotonic() + 10
        now = _gpu(probe, device)
        while now.used - gpu.used < 0.9 * hold and time.monotonic() < deadline:
            time.sleep(0.2)
            now = _gpu(probe, device)
        rise = now.used - gpu.used
        checks.append(
            Check(
                "probe sees the held memory",
                rise >= 0.9 * hold,
                f"GPU {device} used {gpu.used / GiB:.2f} → {now.used / GiB:.2f} GiB "
                f"(+{rise / GiB:.2f}, held {hold / GiB:.2f})",
            )
        )
        foreign = foreign_holders([now], (), [device])
        mine = [x for x in foreign if f"pid {proc.pid} " in x or "not shown to us" in x]
        checks.append(
            Check("foreign memory seen", bool(mine), "; ".join(foreign) or "nothing foreign")
        )
        if now.pids and proc.pid not in now.pids:
            pids = ", ".join(map(str, sorted(now.pids)))
            checks.append(
                Check(
                    "holder found by its pid",
                    False,
                    f"NVML lists pid(s) {pids}, not {proc.pid} (another pid namespace): a "
                    "server's own memory could not be told from a stranger's",
                )
            )
        t0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        left = ["not read yet"]
        while left and time.monotonic() - t0 < release_s:
            left = unreleased(before, probe.snapshot(), {proc.pid}, [device])
            if left:
                time.sleep(0.1)
        took = time.monotonic() - t0
        detail = (
            f"back at the baseline {took:.2f} s after SIGKILL to its process group"
            if not left
            else f"still held {took:.1f} s after SIGKILL: {'; '.join(left)}"
        )
        checks.append(Check("memory released", not left, detail))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
        if proc.stdout is not None:
            proc.stdout.close()
    return checks


def main(argv: Sequence[str] | None = None) -> int:
    """Run the checks; 0 when all pass (or there is no GPU to check), 1 when one fails."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--device", type=int, default=None, help="NVML index to hold memory on")
    p.add_argument("--hold-gib", type=float, default=3.0, help="memory the holder takes")
    p.add_argument("--ready-s", type=float, default=120.0, help="wait for the holder this long")
    p.add_argument("--release-s", type=float, default=60.0, help="wait for the release this long")
    p.add_argument("--free-tolerance-mib", type=int, default=256)
    args = p.parse_args(argv)
    why = no_gpu_reason()
    if why:
        print(f"device check skipped: no GPU here: {why}")
        return 0
    probe = NvmlProbe()
    try:
        snapshot = probe.snapshot()
        done = subprocess.run(SMI_QUERY, capture_output=True, text=True, timeout=60)
        smi = parse_smi(done.stdout) if done.returncode == 0 else {}
    except (HarnessError, OSError, ValueError, subprocess.TimeoutExpired) as exc:
        print(f"FAIL reading the GPUs: {exc}")
        return 1
    print(table(snapshot, smi))
    checks = compare(snapshot, smi, args.free_tolerance_mib)
    if done.returncode != 0:
        checks.append(Check("nvidia-smi", False, done.stderr.strip() or f"rc {done.returncode}"))
    device = args.device if args.device is not None else snapshot[0].index
    hold = int(args.hold_gib * GiB)
    checks += hold_and_release(probe, device, hold, args.ready_s, args.release_s)
    for c in checks:
        print(f"{'PASS' if c.ok else 'FAIL'} {c.name}: {c.detail}")
    failed = sum(not c.ok for c in checks)
    print(f"{len(checks) - failed}/{len(checks)} checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
