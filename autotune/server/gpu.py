"""GPU memory as the harness sees it: one protocol, NVML on real boxes, state files in rehearsal.

`GpuProbe.snapshot()` is the only seam: `NvmlProbe` reads NVML through `nvidia-ml-py` (imported
on first use, so machines without it can still run the simulator), `SimProbe` reads the
simulator's state directory through `autotune.sim.gpustate`. The pure helpers below decide what a
snapshot means: who holds memory that autotune did not start, and whether memory came back after
a teardown.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from autotune.errors import HarnessError
from autotune.sim.gpustate import read_gpu_state

MiB = 1 << 20
GiB = 1 << 30


@dataclass(frozen=True)
class GpuMemory:
    """One GPU: capacity, memory in use, and the processes holding it (pid -> bytes; empty
    when the driver does not show them, e.g. inside a container's pid namespace)."""

    index: int
    total: int
    used: int
    pids: Mapping[int, int] = field(default_factory=dict)

    @property
    def free(self) -> int:
        """Bytes free on the GPU (capacity less use), as the driver reports them."""
        return self.total - self.used


class GpuProbe(Protocol):
    """Reads GPU memory now. Implementations must be cheap enough to call a few times a second."""

    def snapshot(self) -> list[GpuMemory]:
        """Every GPU's memory now, one entry per GPU in index order."""


class NvmlProbe:
    """GPU memory through NVML (`nvidia-ml-py`), initialised on the first snapshot."""

    def __init__(self) -> None:
        self._nvml: Any = None

    def _lib(self) -> Any:
        if self._nvml is None:
            try:
                import pynvml  # the nvidia-ml-py package
            except ImportError as exc:  # pragma: no cover - depends on the machine
                raise HarnessError(
                    "nvidia-ml-py is not installed; install it or use the simulator backend"
                ) from exc
            try:
                pynvml.nvmlInit()
            except pynvml.NVMLError as exc:
                raise HarnessError(
                    f"NVML could not start ({exc}); is the NVIDIA driver loaded?"
                ) from exc
            self._nvml = pynvml
        return self._nvml

    def snapshot(self) -> list[GpuMemory]:
        """Every GPU's memory from NVML; a failure of NVML itself (a GPU off the bus) is a
        `HarnessError`."""
        nvml = self._lib()
        try:
            return self._read(nvml)
        except nvml.NVMLError as exc:  # a GPU fell off the bus, the driver went away
            raise HarnessError(f"NVML failed reading GPU memory ({exc})") from exc

    def _read(self, nvml: Any) -> list[GpuMemory]:
        out = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            info = nvml.nvmlDeviceGetMemoryInfo(handle)
            pids: dict[int, int] = {}
            try:
                procs = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except nvml.NVMLError:
                procs = []
            for proc in procs:
                used = proc.usedGpuMemory
                pids[int(proc.pid)] = int(used) if isinstance(used, int) else 0
            out.append(GpuMemory(index, int(info.total), int(info.used), pids))
        return out


class SimProbe:
    """The simulator's GPUs, read from its state directory (`--sim-gpu-dir`)."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    def snapshot(self) -> list[GpuMemory]:
        """Every simulated GPU's memory as the simulator last wrote its state files."""

        return [
            GpuMemory(g.index, g.total_bytes, g.used_bytes, dict(g.processes))
            for g in read_gpu_state(self.directory)
        ]


def visible_devices(env: Mapping[str, str]) -> tuple[int, ...] | None:
    """The GPU indices `CUDA_VISIBLE_DEVICES` selects, or None for "all" (unset or not numeric)."""
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    parts = [p.strip() for p in raw.split(",") if p.strip()]
    if not all(p.isdigit() for p in parts):
        return None  # UUIDs or MIG names: cannot map to NVML indices here, so watch every GPU
    return tuple(int(p) for p in parts)


def _selected(snapshot: Sequence[GpuMemory], indices: Collection[int] | None) -> list[GpuMemory]:
    return [g for g in snapshot if indices is None or g.index in indices]


def foreign_holders(
    snapshot: Sequence[GpuMemory],
    ours: Collection[int],
    indices: Collection[int] | None = None,
    unattributed_bytes: int = 2 * GiB,
) -> list[str]:
    """One line per GPU memory holder autotune did not start, on the selected GPUs.

    Memory in use with no process listed (a container hides them) counts as foreign above
    `unattributed_bytes`, which covers the driver's own reservation on an idle card.
    """
    found = []
    for gpu in _selected(snapshot, indices):
        strangers = {pid: b for pid, b in gpu.pids.items() if pid not in ours}
        for pid, used in sorted(strangers.items()):
            found.append(f"GPU {gpu.index}: pid {pid} holds {used / GiB:.2f} GiB")
        if not gpu.pids and gpu.used > unattributed_bytes:
            found.append(
                f"GPU {gpu.index}: {gpu.used / GiB:.2f} GiB in use by processes not shown to us"
            )
    return found


def unreleased(
    baseline: Sequence[GpuMemory],
    now: Sequence[GpuMemory],
    ours: Collection[int],
    indices: Collection[int] | None = None,
    tolerance: int = 256 * MiB,
) -> list[str]:
    """What is still held after a teardown: our pids on any selected GPU, or memory in use
    above the pre-launch baseline by more than `tolerance` (not counting processes of others
    that started meanwhile). Empty when everything came back."""
    before = {g.index: g for g in baseline}
    problems = []
    for gpu in _selected(now, indices):
        held = sorted(pid for pid in gpu.pids if pid in ours)
        if held:
            pids = ", ".join(map(str, held))
            problems.append(f"GPU {gpu.index}: our pid(s) {pids} still hold memory")
        old = before.get(gpu.index)
        old_pids = old.pids if old else {}
        newcomers = sum(b for p, b in gpu.pids.items() if p not in ours and p not in old_pids)
        extra = gpu.used - (old.used if old else 0) - newcomers
        if extra > tolerance:
            problems.append(
                f"GPU {gpu.index}: {extra / GiB:.2f} GiB more in use than before the launch"
            )
    return problems
