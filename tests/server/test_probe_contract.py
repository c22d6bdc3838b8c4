"""The `GpuProbe` contract, run against both implementations: `NvmlProbe` and `SimProbe`.

This machine has no GPU, so `NvmlProbe` reads a stand-in for NVML: a fresh copy of the real
`pynvml` binding (nvidia-ml-py, a dependency of autotune) installed as `sys.modules["pynvml"]`,
whose C library is `FakeLibNvml` below. So the probe goes through the binding's real code paths
(ctypes structs, the two-call process listing, usedGpuMemory N/A turned into None, the NVMLError
class hierarchy, init refcounting); only the driver is simulated, and it behaves like one: calls
before nvmlInit fail with Uninitialized, GPUs are enumerated whatever CUDA_VISIBLE_DEVICES says,
a process's memory counts in `used` and is freed when it frees it or exits.

`SimProbe` reads a simulator GPU-state folder written with the simulator's own writer
(`autotune.sim.gpustate`). The memory holders are real processes (`sleep`) so that both the
simulated driver and the simulator's liveness check see them live or gone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import inspect
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol, cast

import pytest
from server_helpers import Guard, sleeper

from autotune.errors import HarnessError
from autotune.server import gpu
from autotune.server.gpu import (
    GiB,
    GpuMemory,
    GpuProbe,
    MiB,
    NvmlProbe,
    SimProbe,
    foreign_holders,
    unreleased,
    visible_devices,
)
from autotune.sim.gpustate import GpuStateWriter, write_inventory

# Four GPUs; one smaller and one larger, so a probe that mixes up indices cannot pass.
GPUS: dict[int, int] = {0: 80 * GiB, 1: 80 * GiB, 2: 40 * GiB, 3: 96 * GiB}
RESERVED = 512 * MiB  # what an idle card reports in use under NVML (driver and ECC reservation)
SNAPSHOTS_PER_SECOND = 5  # "cheap enough to call a few times a second", with a wide margin


# -- the stand-in NVML --------------------------------------------------------------------------


def _alive(pid: int) -> bool:
    """A process the driver would still keep a context for: it exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :][:1] not in ("Z", "X", "")


class FakeLibNvml:
    """libnvidia-ml.so as the `pynvml` binding calls it: C functions taking ctypes arguments and
    returning NVML return codes. `hold`/`free` are what processes do through CUDA."""

    NOT_AVAILABLE = 2**64 - 1  # NVML_VALUE_NOT_AVAILABLE for unsigned long long
    NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId outside MIG
    HANDLE_BASE = 0x7F0000001000

    def __init__(self, nvml: ModuleType, gpus: Mapping[int, int]) -> None:
        self.nv = nvml  # for the return-code constants
        self.gpus = dict(gpus)
        self.procs: dict[int, dict[int, int]] = {}  # pid -> GPU index -> bytes
        self.refcount = 0
        self.inits = 0
        self.shutdowns = 0
        self.calls = 0
        self.init_error: int | None = None
        self.lost: set[int] = set()  # GPUs fallen off the bus (Xid 79)
        self.usage_hidden = False  # usedGpuMemory reported as N/A
        self.processes_hidden = False  # a container's pid namespace: no processes listed
        self.listing_unsupported: set[int] = set()

    # what processes do
    def hold(self, pid: int, used: Mapping[int, int]) -> None:
        self.procs[pid] = {i: b for i, b in used.items() if b > 0}

    def free(self, pid: int) -> None:
        self.procs.pop(pid, None)

    def _live_procs(self) -> dict[int, dict[int, int]]:
        for pid in [p for p in self.procs if not _alive(p)]:
            del self.procs[pid]  # the driver frees an exited process's memory
        return self.procs

    # the C API
    def nvmlInitWithFlags(self, flags: int) -> int:
        self.inits += 1
        if self.init_error is not None:
            return self.init_error
        self.refcount += 1
        return int(self.nv.NVML_SUCCESS)

    def nvmlShutdown(self) -> int:
        self.shutdowns += 1
        if self.refcount == 0:
            return int(self.nv.NVML_ERROR_UNINITIALIZED)
        self.refcount -= 1
        return int(self.nv.NVML_SUCCESS)

    def _check(self) -> int:
        self.calls += 1
        return int(self.nv.NVML_SUCCESS if self.refcount else self.nv.NVML_ERROR_UNINITIALIZED)

    def _index(self, handle: Any) -> int | None:
        address = ctypes.cast(handle, ctypes.c_void_p).value
        index = None if address is None else address - self.HANDLE_BASE
        return index if index in self.gpus else None

    def _device(self, handle: Any) -> tuple[int, int]:
        """(return code, GPU index) of a call on `handle`: an error before init, for a handle of
        no GPU or for a GPU fallen off the bus, else success."""
        if ret := self._check():
            return ret, -1
        index = self._index(handle)
        if index is None:
            return int(self.nv.NVML_ERROR_INVALID_ARGUMENT), -1
        if index in self.lost:
            return int(self.nv.NVML_ERROR_GPU_IS_LOST), index
        return int(self.nv.NVML_SUCCESS), index

    def nvmlDeviceGetCount_v2(self, count: Any) -> int:
        if ret := self._check():
            return ret
        count._obj.value = len(self.gpus)
        return int(self.nv.NVML_SUCCESS)

    def nvmlDeviceGetHandleByIndex_v2(self, index: Any, device: Any) -> int:
        if ret := self._check():
            return ret
        if index.value not in self.gpus:
            return int(self.nv.NVML_ERROR_INVALID_ARGUMENT)
        pointer = ctypes.c_void_p(self.HANDLE_BASE + index.value)
        ctypes.memmove(ctypes.addressof(device._obj), ctypes.byref(pointer), ctypes.sizeof(pointer))
        return int(self.nv.NVML_SUCCESS)

    def nvmlDeviceGetMemoryInfo(self, handle: Any, memory: Any) -> int:
        ret, index = self._device(handle)
        if ret:
            return ret
        used = RESERVED + sum(p.get(index, 0) for p in self._live_procs().values())
        memory._obj.total = self.gpus[index]
        memory._obj.used = used
        memory._obj.free = self.gpus[index] - used
        return int(self.nv.NVML_SUCCESS)

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any, count: Any, infos: Any) -> int:
        ret, index = self._device(handle)
        if ret:
            return ret
        if index in self.listing_unsupported:
            return int(self.nv.NVML_ERROR_NOT_SUPPORTED)
        rows = [] if self.processes_hidden else [
            (pid, gpus[index]) for pid, gpus in sorted(self._live_procs().items()) if index in gpus
        ]  # fmt: skip
        room = count._obj.value
        count._obj.value = len(rows)
        if infos is None and not rows:
            return int(self.nv.NVML_SUCCESS)
        if infos is None or room < len(rows):
            return int(self.nv.NVML_ERROR_INSUFFICIENT_SIZE)
        for slot, (pid, used) in zip(infos, rows, strict=False):
            slot.pid = pid
            slot.usedGpuMemory = self.NOT_AVAILABLE if self.usage_hidden else used
            slot.gpuInstanceId = slot.computeInstanceId = self.NO_INSTANCE
        return int(self.nv.NVML_SUCCESS)


def install_nvml(monkeypatch: pytest.MonkeyPatch, gpus: Mapping[int, int]) -> FakeLibNvml:
    """A fresh copy of the real `pynvml` as `sys.modules["pynvml"]`, its library `FakeLibNvml`."""
    spec = importlib.util.find_spec("pynvml")
    assert spec is not None and spec.origin, "nvidia-ml-py is a dependency of autotune"
    fresh = importlib.util.spec_from_file_location("pynvml", spec.origin)
    assert fresh is not None and fresh.loader is not None
    module = importlib.util.module_from_spec(fresh)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    fresh.loader.exec_module(module)  # its error classes register on sys.modules["pynvml"]
    lib = FakeLibNvml(module, gpus)
    cast(Any, module).nvmlLib = lib  # what `_LoadNvmlLibrary` would have loaded with CDLL
    return lib


# -- the two rigs ---------------------------------------------------------------------------------


class Rig(Protocol):
    """One probe implementation and the machine it reads: processes take and give back memory."""

    name: str
    probe: GpuProbe

    def hold(self, pid: int, used: Mapping[int, int]) -> None: ...

    def release(self, pid: int) -> None: ...

    def side_effects(self) -> object:
        """What a snapshot must not change once the probe is set up."""
        ...


class NvmlRig:
    name = "nvml"

    def __init__(self, monkeypatch: pytest.MonkeyPatch, gpus: Mapping[int, int]) -> None:
        self.lib = install_nvml(monkeypatch, gpus)
        self.probe: GpuProbe = NvmlProbe()

    def hold(self, pid: int, used: Mapping[int, int]) -> None:
        self.lib.hold(pid, used)

    def release(self, pid: int) -> None:
        self.lib.free(pid)

    def side_effects(self) -> object:
        return (self.lib.inits, self.lib.shutdowns, self.lib.refcount)


class SimRig:
    name = "sim"

    def __init__(self, directory: Path, gpus: Mapping[int, int]) -> None:
        self.directory = directory
        self.gpus = dict(gpus)
        write_inventory(directory, gpus)  # what every simulator server writes at start
        self.writers: dict[int, GpuStateWriter] = {}
        self.probe: GpuProbe = SimProbe(directory)

    def hold(self, pid: int, used: Mapping[int, int]) -> None:
        if pid not in self.writers:
            self.writers[pid] = GpuStateWriter(self.directory, pid, self.gpus)
        self.writers[pid].set_used(used)

    def release(self, pid: int) -> None:
        self.writers.pop(pid).release()

    def side_effects(self) -> object:
        return sorted((p.name, p.stat().st_mtime_ns) for p in self.directory.iterdir())


RIGS = ("nvml", "sim")
"""A rig per `GpuProbe` implementation (`test_every_probe_has_a_rig` holds them equal)."""


def make_rig(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Rig:
    if name == "nvml":
        return NvmlRig(monkeypatch, GPUS)
    return SimRig(tmp_path / "sim-gpu", GPUS)


def test_every_probe_has_a_rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every class of `autotune.server.gpu` that implements `GpuProbe` runs this contract."""
    probes = {
        cls
        for _, cls in inspect.getmembers(gpu, inspect.isclass)
        if cls.__module__ == gpu.__name__
        and not getattr(cls, "_is_protocol", False)
        and callable(getattr(cls, "snapshot", None))
    }
    covered = {type(make_rig(name, tmp_path, monkeypatch).probe) for name in RIGS}
    assert covered == probes == {NvmlProbe, SimProbe}


@pytest.fixture(params=RIGS)
def rig(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Rig:
    return make_rig(request.param, tmp_path, monkeypatch)


@pytest.fixture
def spawn(guard: Guard) -> Iterator[Callable[[], subprocess.Popen[bytes]]]:
    """Processes to hold GPU memory; each is killed, reaped and checked gone at the end."""
    started: list[subprocess.Popen[bytes]] = []

    def new() -> subprocess.Popen[bytes]:
        popen = guard.stranger(sleeper())
        started.append(popen)
        return popen

    yield new
    for popen in started:
        popen.kill()
        popen.wait(timeout=10)
        assert not _alive(popen.pid), f"holder {popen.pid} outlived the test"


def by_index(snapshot: list[GpuMemory]) -> dict[int, GpuMemory]:
    return {g.index: g for g in snapshot}


def exit_process(popen: subprocess.Popen[bytes]) -> None:
    popen.kill()
    popen.wait(timeout=10)  # reaped: no zombie left for either driver to count


# -- the contract ---------------------------------------------------------------------------------


def test_snapshot_lists_every_gpu_by_index_with_consistent_numbers(
    rig: Rig, spawn: Callable[[], subprocess.Popen[bytes]]
) -> None:
    idle = rig.probe.snapshot()
    assert [(g.index, g.total) for g in idle] == sorted(GPUS.items())
    assert all(g.pids == {} for g in idle)
    holder = spawn()
    rig.hold(holder.pid, {3: 90 * GiB, 2: 1 * GiB})
    for snap in (idle, rig.probe.snapshot()):
        assert [g.index for g in snap] == [0, 1, 2, 3]
        for g in snap:
            assert g.total >= g.used >= 0, g
            assert g.free == g.total - g.used
            assert all(isinstance(p, int) and b >= 0 for p, b in g.pids.items())


def test_snapshot_is_not_filtered_by_cuda_visible_devices(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Selection is the helpers' job (`indices`): NVML enumerates every GPU whatever the
    environment says, and so must both probes."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    assert [g.index for g in rig.probe.snapshot()] == [0, 1, 2, 3]


@pytest.mark.parametrize("how", ["frees it", "exits"])
def test_a_holder_shows_up_with_its_bytes_and_is_gone_after_it_releases(
    rig: Rig, spawn: Callable[[], subprocess.Popen[bytes]], how: str
) -> None:
    before = by_index(rig.probe.snapshot())
    holder = spawn()
    rig.hold(holder.pid, {1: 3 * GiB, 2: 5 * GiB})
    during = by_index(rig.probe.snapshot())
    assert dict(during[1].pids) == {holder.pid: 3 * GiB}
    assert dict(during[2].pids) == {holder.pid: 5 * GiB}
    assert during[1].used - before[1].used == 3 * GiB
    assert during[2].used - before[2].used == 5 * GiB
    assert during[0] == before[0] and during[3] == before[3]
    if how == "frees it":
        rig.release(holder.pid)
    else:
        exit_process(holder)
    after = by_index(rig.probe.snapshot())
    assert all(holder.pid not in g.pids for g in after.values())
    assert after == before


def test_repeated_snapshots_are_consistent_and_cheap(
    rig: Rig, spawn: Callable[[], subprocess.Popen[bytes]]
) -> None:
    holder = spawn()
    rig.hold(holder.pid, {0: 7 * GiB})
    first = rig.probe.snapshot()
    effects = rig.side_effects()
    n = 20
    t0 = time.monotonic()
    again = [rig.probe.snapshot() for _ in range(n)]
    elapsed = time.monotonic() - t0
    assert all(snap == first for snap in again)
    assert again[-1] is not again[0]  # a fresh list each time, not a shared one
    assert rig.side_effects() == effects  # no re-init, nothing written
    assert elapsed < n / SNAPSHOTS_PER_SECOND, f"{n} snapshots took {elapsed:.2f} s"


def _scenario(rig: Rig, strangers: tuple[int, int], ours: int) -> dict[str, list[str]]:
    """Someone else's S holds memory before our launch; our server O takes two GPUs; a newcomer
    N arrives while it runs; O exits. What the pure helpers say at each step."""
    s, n = strangers
    rig.hold(s, {1: 3 * GiB})
    base = rig.probe.snapshot()
    rig.hold(ours, {0: 20 * GiB, 2: 20 * GiB})
    running = rig.probe.snapshot()
    rig.hold(n, {3: 5 * GiB})
    rig.release(ours)
    after = rig.probe.snapshot()
    visible = visible_devices({"CUDA_VISIBLE_DEVICES": "0,2"})
    return {
        "foreign before": foreign_holders(base, ()),
        "foreign before, GPUs 0,2,3": foreign_holders(base, (), (0, 2, 3)),
        "foreign while running": foreign_holders(running, {ours}),
        "all holders while running": foreign_holders(running, ()),
        "unreleased while running": unreleased(base, running, {ours}),
        "unreleased while running, visible": unreleased(base, running, {ours}, visible),
        "unreleased after": unreleased(base, after, {ours}),
        "foreign after": foreign_holders(after, {ours}),
        "foreign after, visible": foreign_holders(after, {ours}, visible),
    }


def _expected(strangers: tuple[int, int], ours: int) -> dict[str, list[str]]:
    s, n = strangers
    stranger = f"GPU 1: pid {s} holds 3.00 GiB"
    newcomer = f"GPU 3: pid {n} holds 5.00 GiB"
    leak = [
        f"GPU 0: our pid(s) {ours} still hold memory",
        "GPU 0: 20.00 GiB more in use than before the launch",
        f"GPU 2: our pid(s) {ours} still hold memory",
        "GPU 2: 20.00 GiB more in use than before the launch",
    ]
    return {
        "foreign before": [stranger],
        "foreign before, GPUs 0,2,3": [],
        "foreign while running": [stranger],
        "all holders while running": [
            f"GPU 0: pid {ours} holds 20.00 GiB",
            stranger,
            f"GPU 2: pid {ours} holds 20.00 GiB",
        ],
        "unreleased while running": leak,
        "unreleased while running, visible": leak,
        "unreleased after": [],
        "foreign after": [stranger, newcomer],
        "foreign after, visible": [],
    }


def test_helpers_read_the_snapshot_the_same_whichever_probe_made_it(
    rig: Rig, spawn: Callable[[], subprocess.Popen[bytes]]
) -> None:
    s, n, ours = spawn(), spawn(), spawn()
    got = _scenario(rig, (s.pid, n.pid), ours.pid)
    assert got == _expected((s.pid, n.pid), ours.pid)


def test_both_probes_agree_on_one_scenario(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spawn: Callable[[], subprocess.Popen[bytes]]
) -> None:
    s, n, ours = spawn(), spawn(), spawn()
    answers = [
        _scenario(make_rig(name, tmp_path, monkeypatch), (s.pid, n.pid), ours.pid)
        for name in ("nvml", "sim")
    ]
    assert answers[0] == answers[1]
    assert any(answers[0].values())  # something was said: the agreement is not vacuous


@pytest.mark.parametrize(
    ("env", "stranger_seen"),
    [
        ({}, True),
        ({"CUDA_VISIBLE_DEVICES": "1"}, True),
        ({"CUDA_VISIBLE_DEVICES": " 3, 1 "}, True),
        ({"CUDA_VISIBLE_DEVICES": "0,2"}, False),
        ({"CUDA_VISIBLE_DEVICES": ""}, False),
        ({"CUDA_VISIBLE_DEVICES": "GPU-5d2c0e3a-8f1b-4c6d-9e7f-0123456789ab"}, True),
    ],
    ids=["unset", "1", "3,1", "0,2", "empty", "uuid"],
)
def test_visible_devices_select_the_gpus_the_helpers_watch(
    rig: Rig,
    spawn: Callable[[], subprocess.Popen[bytes]],
    env: dict[str, str],
    stranger_seen: bool,
) -> None:
    stranger = spawn()
    rig.hold(stranger.pid, {1: 4 * GiB})
    base = rig.probe.snapshot()
    ours = spawn()
    rig.hold(ours.pid, {1: 10 * GiB})
    running = rig.probe.snapshot()
    indices = visible_devices(env)
    line = f"GPU 1: pid {stranger.pid} holds 4.00 GiB"
    assert foreign_holders(base, (), indices) == ([line] if stranger_seen else [])
    held = unreleased(base, running, {ours.pid}, indices)
    assert len(held) == (2 if stranger_seen else 0), held


def test_visible_devices_values() -> None:
    assert visible_devices({}) is None
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "3,1"}) == (3, 1)
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "0,,2,"}) == (0, 2)
    assert visible_devices({"CUDA_VISIBLE_DEVICES": ""}) == ()
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "MIG-0a1b2c3d"}) is None
    assert visible_devices({"OTHER": "1"}) is None


# -- what only NVML does --------------------------------------------------------------------------


def test_nvml_is_initialised_once_on_the_first_snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    lib = install_nvml(monkeypatch, GPUS)
    probe = NvmlProbe()
    assert lib.inits == 0 and lib.calls == 0  # nothing happens before the first snapshot
    probe.snapshot()
    assert (lib.inits, lib.refcount) == (1, 1)
    calls = lib.calls
    for _ in range(10):
        probe.snapshot()
    assert (lib.inits, lib.shutdowns, lib.refcount) == (1, 0, 1)
    assert lib.calls > calls  # it did read the driver each time, without re-initialising


def test_nvml_idle_cards_show_the_reservation_as_used(monkeypatch: pytest.MonkeyPatch) -> None:
    install_nvml(monkeypatch, GPUS)
    snap = NvmlProbe().snapshot()
    assert [(g.used, g.free, dict(g.pids)) for g in snap] == [
        (RESERVED, total - RESERVED, {}) for total in GPUS.values()
    ]
    assert foreign_holders(snap, ()) == []  # an idle card is not someone else's memory


def test_nvml_usage_not_available_lists_the_pid_with_zero_bytes(
    monkeypatch: pytest.MonkeyPatch, spawn: Callable[[], subprocess.Popen[bytes]]
) -> None:
    lib = install_nvml(monkeypatch, GPUS)
    lib.usage_hidden = True  # NVML_VALUE_NOT_AVAILABLE: the binding hands over None
    holder = spawn()
    lib.hold(holder.pid, {0: 6 * GiB})
    gpu0 = NvmlProbe().snapshot()[0]
    assert dict(gpu0.pids) == {holder.pid: 0}
    assert gpu0.used == RESERVED + 6 * GiB
    assert foreign_holders([gpu0], ()) == [f"GPU 0: pid {holder.pid} holds 0.00 GiB"]
    assert foreign_holders([gpu0], {holder.pid}) == []


def test_nvml_hidden_processes_count_as_foreign_above_the_allowance(
    monkeypatch: pytest.MonkeyPatch, spawn: Callable[[], subprocess.Popen[bytes]]
) -> None:
    lib = install_nvml(monkeypatch, GPUS)
    lib.processes_hidden = True  # inside a container's pid namespace
    small, big = spawn(), spawn()
    lib.hold(small.pid, {0: 1 * GiB})
    lib.hold(big.pid, {1: 10 * GiB})
    snap = NvmlProbe().snapshot()
    assert all(g.pids == {} for g in snap)
    assert snap[1].used == RESERVED + 10 * GiB
    assert foreign_holders(snap, ()) == ["GPU 1: 10.50 GiB in use by processes not shown to us"]


def test_nvml_without_process_listing_still_reports_memory(
    monkeypatch: pytest.MonkeyPatch, spawn: Callable[[], subprocess.Popen[bytes]]
) -> None:
    lib = install_nvml(monkeypatch, GPUS)
    lib.listing_unsupported = {2}
    holder = spawn()
    lib.hold(holder.pid, {1: 2 * GiB, 2: 2 * GiB})
    snap = by_index(NvmlProbe().snapshot())
    assert dict(snap[1].pids) == {holder.pid: 2 * GiB}
    assert snap[2].pids == {} and snap[2].used == RESERVED + 2 * GiB


def test_nvml_that_cannot_start_is_a_harness_error(monkeypatch: pytest.MonkeyPatch) -> None:
    lib = install_nvml(monkeypatch, GPUS)
    lib.init_error = int(sys.modules["pynvml"].NVML_ERROR_DRIVER_NOT_LOADED)
    with pytest.raises(HarnessError, match=r"NVML could not start \(Driver Not Loaded\)"):
        NvmlProbe().snapshot()


@pytest.mark.skipif(
    ctypes.util.find_library("nvidia-ml") is not None, reason="this machine has the NVML library"
)
def test_nvml_without_the_driver_library_is_a_harness_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    install_nvml(monkeypatch, GPUS)
    # As imported: the binding loads libnvidia-ml.so.1 itself, and this machine has none.
    cast(Any, sys.modules["pynvml"]).nvmlLib = None
    with pytest.raises(HarnessError, match="NVML could not start"):
        NvmlProbe().snapshot()


def test_nvml_failing_after_start_is_a_harness_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every caller of `snapshot()` (preflight's baseline, the teardown's release wait, the
    headroom watch, the orphan sweep) handles HarnessError/OSError only, and `run_trial` records
    those as a failed trial; a raw NVMLError from a GPU that fell off the bus escapes them all."""
    lib = install_nvml(monkeypatch, GPUS)
    probe = NvmlProbe()
    probe.snapshot()
    lib.lost = {3}
    with pytest.raises(HarnessError):
        probe.snapshot()
