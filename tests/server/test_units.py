"""Pure and near-pure pieces of the lifecycle: GPU snapshots, pidfiles, log tailing, phases."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from server_helpers import Guard, pid_alive, sleeper

from autotune.logparse.events import Event
from autotune.logparse.lines import parse_line
from autotune.logparse.phase import Phase, PhaseClock, PhaseLimits, next_phase
from autotune.masking import masked_argv
from autotune.server import pidfile, procs
from autotune.server.gpu import (
    GiB,
    GpuMemory,
    SimProbe,
    foreign_holders,
    unreleased,
    visible_devices,
)
from autotune.server.logtail import LogTail
from autotune.server.teardown import stop_orphans


def gpu(index: int, used: int, **pids: int) -> GpuMemory:
    return GpuMemory(index, 80 * GiB, used, {int(k[1:]): v for k, v in pids.items()})


# -- gpu ----------------------------------------------------------------------------------------


def test_visible_devices() -> None:
    assert visible_devices({}) is None
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "2, 3"}) == (2, 3)
    assert visible_devices({"CUDA_VISIBLE_DEVICES": ""}) == ()
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "GPU-1234abcd"}) is None


def test_foreign_holders_names_strangers_on_selected_gpus_only() -> None:
    snap = [gpu(0, 3 * GiB, p100=3 * GiB), gpu(1, 5 * GiB, p200=5 * GiB)]
    assert foreign_holders(snap, ours=()) == [
        "GPU 0: pid 100 holds 3.00 GiB",
        "GPU 1: pid 200 holds 5.00 GiB",
    ]
    assert foreign_holders(snap, ours={100}) == ["GPU 1: pid 200 holds 5.00 GiB"]
    assert foreign_holders(snap, ours=(), indices=(0,)) == ["GPU 0: pid 100 holds 3.00 GiB"]


def test_memory_without_visible_processes_counts_above_the_idle_allowance() -> None:
    assert foreign_holders([gpu(0, GiB // 2)], ours=()) == []
    [line] = foreign_holders([gpu(0, 10 * GiB)], ours=())
    assert "not shown to us" in line


def test_unreleased_compares_with_the_baseline() -> None:
    base = [gpu(0, 2 * GiB, p7=2 * GiB)]  # someone else's 2 GiB was there before
    assert unreleased(base, [gpu(0, 2 * GiB, p7=2 * GiB)], ours={42}) == []
    held, extra = unreleased(base, [gpu(0, 5 * GiB, p7=2 * GiB, p42=3 * GiB)], ours={42})
    assert "pid(s) 42 still hold" in held and "3.00 GiB more" in extra
    [unattributed] = unreleased(base, [gpu(0, 6 * GiB)], ours={42})
    assert "4.00 GiB more" in unattributed
    # A stranger who arrived meanwhile is not our leak.
    assert unreleased(base, [gpu(0, 6 * GiB, p7=2 * GiB, p9=4 * GiB)], ours={42}) == []


def test_sim_probe_reads_the_simulator_state(tmp_path: Path) -> None:
    from autotune.sim.gpustate import write_holder

    assert SimProbe(tmp_path / "none").snapshot() == []
    write_holder(tmp_path, os.getpid(), {0: 3 * GiB}, {0: 80 * GiB, 1: 80 * GiB})
    snap = SimProbe(tmp_path).snapshot()
    assert [(g.index, g.used, dict(g.pids)) for g in snap] == [
        (0, 3 * GiB, {os.getpid(): 3 * GiB}),
        (1, 0, {}),
    ]


# -- pidfile ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["x", "--api-key", "k1", "--port", "1"], ("x", "--api-key", "***", "--port", "1")),
        (["x", "--api-key=k1"], ("x", "--api-key=***")),
        (["x", "--admin-api-key", "k2"], ("x", "--admin-api-key", "***")),
        (["x", "--note", "prefix-k1-suffix"], ("x", "--note", "prefix-***-suffix")),
    ],
)
def test_masked_argv(argv: list[str], expected: tuple[str, ...]) -> None:
    assert masked_argv(argv, ["k1"]) == expected


def test_pidfile_round_trip_and_unreadable_files_are_skipped(tmp_path: Path) -> None:
    me = procs.read_proc(os.getpid())
    assert me is not None
    record = pidfile.PidRecord(
        os.getpid(), me.pgid, me.sid, me.start_ticks, procs.boot_id(), "h", 1, "l", ("a",), 0.0
    )
    path = pidfile.write(tmp_path, record)
    (tmp_path / "junk.pid.json").write_text("{not json")
    assert pidfile.records(tmp_path) == [(path, record)]
    assert record.alive()
    assert not pidfile.PidRecord(**{**record.__dict__, "start_ticks": 1}).alive()


def test_stop_orphans_removes_stale_pidfiles_without_signalling(
    tmp_path: Path, guard: Guard
) -> None:
    stranger = guard.stranger(sleeper())
    info = procs.read_proc(stranger.pid)
    assert info is not None
    for ticks, boot in ((info.start_ticks + 1, procs.boot_id()), (info.start_ticks, "other-boot")):
        record = pidfile.PidRecord(
            stranger.pid, info.pgid, info.sid, ticks, boot, "h", 1, "l", ("sleep",), 0.0
        )
        pidfile.write(tmp_path, record)
        [line] = stop_orphans(tmp_path, grace_s=0.1)
        assert "not running" in line
        assert pid_alive(stranger)
    assert pidfile.records(tmp_path) == []


# -- procs --------------------------------------------------------------------------------------


def test_group_signal_is_refused_when_the_leader_is_someone_else(guard: Guard) -> None:
    stranger = guard.stranger(sleeper())
    info = procs.read_proc(stranger.pid)
    assert info is not None and info.pgid == stranger.pid
    assert not procs.signal_group(info.pgid, info.start_ticks + 1, signal.SIGKILL)
    assert pid_alive(stranger)
    assert procs.descendants(os.getpid()) and any(
        p.pid == stranger.pid for p in procs.descendants(os.getpid())
    )


def test_zombies_count_as_gone() -> None:
    child = subprocess.Popen(["true"])
    info = procs.read_proc(child.pid)
    while info is not None and not info.gone:
        info = procs.read_proc(child.pid)
    assert info is not None and info.gone
    assert not procs.is_alive(child.pid, info.start_ticks)
    child.wait()


# -- logtail ------------------------------------------------------------------------------------


def test_tail_hands_out_complete_lines_and_keeps_carriage_returns(tmp_path: Path) -> None:
    path = tmp_path / "log"
    tail = LogTail(path)
    assert tail.read() == []  # not created yet
    with open(path, "wb") as fh:
        fh.write(b"one\ntw")
        fh.flush()
        assert tail.read() == ["one"]
        fh.write(b"o\nbar 10%\rbar 100%\n\xff\n")
        fh.flush()
        assert tail.read() == ["two", "bar 10%\rbar 100%", "\ufffd"]
        fh.write(b"last without newline")
        fh.flush()
    assert tail.read() == []
    assert tail.flush() == ["last without newline"]
    tail.close()


# -- phase --------------------------------------------------------------------------------------


def line(message: str, rank: str = "TP0") -> Event:
    item = parse_line(f"[2026-02-24 12:00:00 {rank}] {message}")
    assert isinstance(item, Event), message
    return item


def test_phases_follow_the_startup_and_time_each_phase() -> None:
    clock = PhaseClock(0.0)
    steps = [
        ("Init torch distributed begin.", Phase.DIST_INIT),
        ("Load weight begin. avail mem=94.04 GB", Phase.WEIGHT_LOAD),
        ("Load weight end. type=X, avail mem=21.71 GB, mem usage=72.33 GB.", Phase.KV_POOL),
        ("Capture cuda graph begin. avail mem=11.24 GB", Phase.GRAPH_CAPTURE),
        ("Load weight begin. avail mem=7.49 GB", Phase.DRAFT_LOAD),
        ("KV Cache is allocated. #tokens: 5, K size: 0.30 GB, V size: 0.30 GB", Phase.KV_POOL),
        ("Capture cuda graph begin. avail mem=6.08 GB", Phase.GRAPH_CAPTURE),
        ("max_total_num_tokens=5, chunked_prefill_size=1, max_prefill_tokens=1, "
         "max_running_requests=1, context_len=1", Phase.HOST_CACHE),
        ("The server is fired up and ready to roll!", Phase.READY),
    ]  # fmt: skip
    for t, (message, phase) in enumerate(steps, start=1):
        event = line(message)
        assert clock.feed(event, float(t)) is phase, message
    totals = clock.totals(100.0)
    assert totals["launch"] == 1.0
    assert totals["kv_pool"] == 2.0 and totals["graph_capture"] == 2.0
    assert "ready" not in totals


def test_one_rank_after_another_is_not_a_draft_load() -> None:
    clock = PhaseClock(0.0)
    for rank in ("TP0", "TP1", "TP2"):
        event = line("Load weight begin. avail mem=94.04 GB", rank)
        assert clock.feed(event, 1.0) is Phase.WEIGHT_LOAD


def test_phases_never_go_back() -> None:
    event = line("Init torch distributed begin.")
    assert next_phase(Phase.GRAPH_CAPTURE, event, 0) is Phase.GRAPH_CAPTURE


def test_phase_limits() -> None:
    limits = PhaseLimits(weight_load_s=5.0)
    assert limits.limit(Phase.WEIGHT_LOAD) == 5.0
    assert limits.limit(Phase.READY) is None


# -- NVML (a stand-in module: this machine has no GPU) ------------------------------------------


class _FakeNvml:
    class NVMLError(Exception):
        pass

    class _Mem:
        total, used = 80 * GiB, 5 * GiB

    class _Proc:
        def __init__(self, pid: int, used: int | None) -> None:
            self.pid, self.usedGpuMemory = pid, used

    def __init__(self, fail_init: bool = False) -> None:
        self.fail_init = fail_init
        self.inits = 0

    def nvmlInit(self) -> None:
        self.inits += 1
        if self.fail_init:
            raise self.NVMLError("Driver Not Loaded")

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> object:
        return self._Mem()

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[object]:
        if handle == 1:
            raise self.NVMLError("not supported")
        return [self._Proc(111, 4 * GiB), self._Proc(222, None)]


def test_nvml_probe_maps_devices_and_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.server.gpu import NvmlProbe

    fake = _FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    probe = NvmlProbe()
    snap = probe.snapshot()
    assert [(g.index, g.total, g.used, dict(g.pids)) for g in snap] == [
        (0, 80 * GiB, 5 * GiB, {111: 4 * GiB, 222: 0}),
        (1, 80 * GiB, 5 * GiB, {}),
    ]
    probe.snapshot()
    assert fake.inits == 1


def test_nvml_probe_without_a_driver_is_a_harness_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.errors import HarnessError
    from autotune.server.gpu import NvmlProbe

    monkeypatch.setitem(sys.modules, "pynvml", _FakeNvml(fail_init=True))
    with pytest.raises(HarnessError, match="NVML could not start"):
        NvmlProbe().snapshot()


def test_server_info_key_fields_are_masked() -> None:
    from autotune.masking import masked_fields as masked

    info = {"api_key": "k", "admin_api_key": None, "internal_states": [{"api_key": "k", "x": 1}]}
    assert masked(info) == {
        "api_key": "***",
        "admin_api_key": None,
        "internal_states": [{"api_key": "***", "x": 1}],
    }


def test_servers_number_gpus_in_pci_order_unless_the_study_says_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CUDA's default order is fastest-first; NVML's (and so --gpus') is PCI order."""
    from autotune.server.launchspec import LaunchSpec

    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    spec = LaunchSpec(argv=("x",), log_path=tmp_path / "l", run_dir=tmp_path / "r")
    assert spec.environment()["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    own = LaunchSpec(
        argv=("x",),
        log_path=tmp_path / "l",
        run_dir=tmp_path / "r",
        env={"CUDA_DEVICE_ORDER": "FASTEST_FIRST"},
    )
    assert own.environment()["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST"
