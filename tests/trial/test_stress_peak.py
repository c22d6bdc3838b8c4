"""The stress peak a trial records: GPU memory in use at its peak under load minus what was in use
when the load began, per GPU, the largest rise over the server's GPUs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from autotune.config.schema import Limits
from autotune.server.gpu import GpuMemory
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
