"""The stress peak a trial records: GPU memory in use at its peak under load minus what was in use
when the load began, per GPU, the largest rise over the server's GPUs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from autotune.config.schema import Limits
from autotune.server.gpu import GpuMemory
from autotune.trial import gpuwatch
from autotune.trial.gpuwatch import FreeMemoryWatch
from autotune.trial.plan import TrialPlan
from autotune.trial.run import run_trial
from autotune.trial.seam import Load, Startup, Stop

GiB = 1 << 30


class Probe:
    def __init__(self, used_gib: list[tuple[float, float]]) -> None:
        self._frames: Iterator[tuple[float, float]] = iter(used_gib)

    def snapshot(self) -> list[GpuMemory]:
        a, b = next(self._frames)
        return [GpuMemory(0, 96 * GiB, int(a * GiB)), GpuMemory(1, 96 * GiB, int(b * GiB))]


def test_peak_is_the_largest_rise_over_the_static_use() -> None:
    watch = FreeMemoryWatch(Probe([(90.0, 90.5), (92.4, 91.0), (91.0, 92.9), (90.2, 90.6)]), None)
    for _ in range(4):
        watch._sample()
    assert watch.peak_gib is not None
    assert abs(watch.peak_gib - 2.4) < 1e-9
    assert watch.min_free_gib is not None and abs(watch.min_free_gib - 3.1) < 1e-9


def test_no_sample_no_peak() -> None:
    assert FreeMemoryWatch(Probe([]), None).peak_gib is None


A, B, C = 4_194_301, 4_194_302, 4_194_303
"""Pids no process here has (the kernel's largest), so their names read as `?`."""


class Holders:
    """GPU 0 with the server's pid 100 and other holders, one frame per sample; GPU 1 with the
    holders `also` (growing by 1 GiB a sample), where the server holds nothing."""

    def __init__(self, frames: list[dict[int, float]], also: dict[int, float] | None = None):
        self._frames = iter(frames)
        self._also = dict(also or {})

    def snapshot(self) -> list[GpuMemory]:
        pids = {pid: int(gib * GiB) for pid, gib in next(self._frames).items()}
        gpus = [GpuMemory(0, 96 * GiB, sum(pids.values()), pids)]
        if self._also:
            other = {pid: int(gib * GiB) for pid, gib in self._also.items()}
            self._also = {pid: gib + 1.0 for pid, gib in self._also.items()}
            gpus.append(GpuMemory(1, 96 * GiB, sum(other.values()), other))
        return gpus


def test_memory_another_process_takes_while_the_workload_runs_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A holder there from the start that stays put is not an intruder (the launch's check saw
    it); one that grows, or comes later, by more than a CUDA context is; the server's own pids,
    however many, never are, and the server is asked for them only when a pid is new."""
    asked = []

    def ours() -> set[int]:
        asked.append(1)
        return {100, 101}

    frames = [
        {100: 80.0, A: 2.0, B: 1.0},
        {100: 82.0, 101: 0.5, A: 2.0, B: 3.5},
        {100: 83.0, 101: 0.5, A: 2.1, B: 3.5, C: 6.0},
    ]
    watch = FreeMemoryWatch(Holders(frames), None, ours)
    for _ in frames:
        watch._sample()
    lines = watch.intruders()
    assert [line.split(",")[0] for line in lines] == [f"GPU 0: pid {B} (?)", f"GPU 0: pid {C} (?)"]
    assert "took 2.50 GiB while the workload ran" in lines[0]
    assert "took 6.00 GiB" in lines[1]
    assert len(asked) == 4  # the strangers A, B at the first sample, 101, then C
    # a GPU the server holds nothing on is another job's: nothing there is named
    other = [{100: 80.0}, {100: 81.0}]
    elsewhere = FreeMemoryWatch(Holders(other, also={C: 9.0}), None, ours)
    for _ in other:
        elsewhere._sample()
    assert elsewhere.intruders() == []
    # the MPS server holds its clients' memory: never a stranger
    monkeypatch.setattr(gpuwatch, "process_name", lambda pid: "nvidia-cuda-mps-server")
    mps = FreeMemoryWatch(Holders(frames), None, ours)
    for _ in frames:
        mps._sample()
    assert mps.intruders() == []
    # and stays so when a later stranger makes the watch ask for the server's pids again: it
    # is asked once per new pid, not again for the MPS server at every sample
    monkeypatch.setattr(
        gpuwatch, "process_name", lambda pid: "nvidia-cuda-mps-server" if pid == A else "?"
    )
    asked.clear()
    later = [{100: 80.0, A: 1.0}, {100: 80.0, A: 2.0, C: 3.0}, {100: 80.0, A: 3.0, C: 3.0}]
    mixed = FreeMemoryWatch(Holders(later), None, ours)
    for _ in later:
        mixed._sample()
    assert [line.split(",")[0] for line in mixed.intruders()] == [f"GPU 0: pid {C} (?)"]
    assert len(asked) == 3  # the server and A at the first sample, C at the second
    # without the server's pids to tell them by, nothing is named
    plain = FreeMemoryWatch(Holders(frames), None)
    for _ in frames:
        plain._sample()
    assert plain.intruders() == []


class _Run:
    def wait_ready(self) -> Startup:
        return Startup("ready", ledger={"max_total_num_tokens": 1000})

    def drive(self, ledger: object) -> Load:
        return Load(
            "ready", throughput_tok_s=10.0, error_rate=0.0, min_free_gib=3.1, stress_peak_gib=2.4
        )

    def stop(self) -> Stop:
        return Stop(clean=True)


class _Launcher:
    def launch(self, plan: TrialPlan) -> _Run:
        return _Run()

    def extra_args(self) -> tuple[str, ...]:
        return ()

    def stop_orphans(self) -> list[str]:
        return []


def test_the_trial_record_carries_the_stress_peak(tmp_path: Path) -> None:
    plan = TrialPlan(0, {}, ("x",), {}, "127.0.0.1", 1, tmp_path, Limits(), "sim")
    record = run_trial(plan, _Launcher(), clock=lambda: 0.0, phase=lambda _: None)
    assert record.stress_peak_gib == 2.4
    assert record.to_dict()["stress_peak_gib"] == 2.4
