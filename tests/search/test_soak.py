"""What a trial is too short to see: the soak's length from the growth the trials measured, and
the margin an exported setting needs to pass it (`autotune.review.confirm`)."""

from __future__ import annotations

import pytest

from autotune.review.confirm import (
    DEFAULT_SOAK_FACTOR,
    growth_per_trial,
    soak_factor,
    soak_margin_gib,
    soak_peak_rise_gib,
    soak_steps,
)
from autotune.sim.profiles import load_profile
from autotune.testing.oracle import MISMATCH, bench_for, launch, p_stable


def test_growth_is_the_median_the_trials_recorded() -> None:
    assert growth_per_trial([{}, {"growth_gib": None}]) is None
    assert growth_per_trial([{"growth_gib": 0.3}, {"growth_gib": 0.1}, {}]) == pytest.approx(0.2)
    assert growth_per_trial([{"growth_gib": 0.3}, {"growth_gib": 0.1}, {"growth_gib": 0.2}]) == 0.2


def test_the_soak_lasts_long_enough_for_a_leak_to_eat_the_spare_headroom() -> None:
    assert soak_factor(None, 1.0, DEFAULT_SOAK_FACTOR) == DEFAULT_SOAK_FACTOR
    assert soak_factor(0.001, 1.0, DEFAULT_SOAK_FACTOR) == DEFAULT_SOAK_FACTOR  # probe noise
    k = soak_factor(0.1, 1.0, DEFAULT_SOAK_FACTOR)
    assert k == 16  # 1 + 1.5 × 1.0 / 0.1: a leak that passes a trial cannot pass the soak
    assert 0.1 * k > 1.0
    assert soak_factor(0.001 + 0.02, 100.0, 3.0) == 100.0  # capped


def test_the_exported_margin_covers_the_growth_over_the_soak() -> None:
    assert soak_margin_gib(None, 5.0) == 0.0
    assert soak_margin_gib(0.3, 5.0) == pytest.approx(1.2)
    # at least one step; more while the headroom kept does not cover growth and the peak's rise
    assert soak_steps(2.0, 0.5, None, 3.0, 0.5) == 1
    assert soak_steps(1.0, 0.5, 0.3, 3.0, 0.25) == 1  # needs 1.1: 0.1 short, one step
    assert soak_steps(1.0, 0.5, 0.3, 3.0, 0.25, rise_gib=0.2) == 2
    assert soak_steps(0.6, 0.5, 0.3, 3.0, 0.25, rise_gib=0.4) == 4


def test_a_longer_soak_meets_a_higher_peak_and_a_model_that_missed_a_heavier_tail() -> None:
    one = soak_peak_rise_gib([4.0], 4.0, 3.0)
    assert one > 0.05 * 4.0 * 3  # at least PEAK_NOISE's spread, several of them up
    assert soak_peak_rise_gib([4.0], 4.0, 12.0) > one  # a longer soak: a higher worst peak
    assert soak_peak_rise_gib([4.0], 4.0, 3.0, kappa=2.0) == pytest.approx(4 * one)
    assert soak_peak_rise_gib([4.0], 4.0, 3.0, kappa=9.0) == pytest.approx(4 * one)  # capped
    # the spread pooled over the demands the trials ran, as a share of each one's median
    noisy = soak_peak_rise_gib([4.0], 4.0, 3.0, groups=[[2.0, 2.4, 1.6], [1.0, 1.1, 0.9]])
    assert noisy > one
    # never less than the worst rise the trials at this demand saw
    assert soak_peak_rise_gib([3.0, 3.0, 9.0], 3.0, 1.0) >= 6.0


def test_a_slow_leak_that_passes_a_trial_fails_the_soak() -> None:
    bench = bench_for(load_profile("qwen3-32b-h200"), mismatch=MISMATCH)
    params = {"mem_fraction_static": 0.95, "max_running_requests": 32, "hicache_size": 0}
    trial, result = launch(bench, params, 3)
    assert trial.feasible and result.measured is not None
    rec = result.attrs["record"]
    assert isinstance(rec, dict)
    growth = growth_per_trial([rec])
    head = result.measured.headroom_gib
    assert growth is not None and head is not None and growth > 0.2
    k = soak_factor(growth, head - 0.5, DEFAULT_SOAK_FACTOR)
    soaked, _ = launch(bench, params, 3, soak=k)
    assert not soaked.feasible
    # backed off by soak_steps, the same soak passes
    p_gib = 0.01 * float(rec["ledger"]["p_gib"])
    peak = float(rec["stress_peak_gib"])
    steps = soak_steps(head, 0.5, growth, k, p_gib, soak_peak_rise_gib([peak], peak, k))
    safer = {**params, "mem_fraction_static": round(0.95 - 0.01 * steps, 2)}
    assert p_stable(bench, safer, soak=k)[0] > 0.9
