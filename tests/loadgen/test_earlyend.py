"""The early-end rule over a phase's own samples: a steady phase ends once its throughput sits
inside its noise and its least free memory stopped falling; a stress phase once its peak
repeated. Pure functions, fed by hand-made windows and rounds."""

from __future__ import annotations

import dataclasses

from autotune.config.workload import EarlyEnd
from autotune.loadgen.earlyend import Round, Window, min_requests, steady_end, stress_end

RULE = EarlyEnd(window_s=30.0, windows=3, tolerance=0.02, min_s=120.0, min_requests=0)


def _windows(rates: list[float], frees: list[float | None] | None = None) -> list[Window]:
    frees = frees or [None] * len(rates)
    return [
        Window(30.0 * (i + 1), r, 100 * (i + 1), f)
        for i, (r, f) in enumerate(zip(rates, frees, strict=True))
    ]


def test_a_flat_throughput_ends_the_phase_and_says_why() -> None:
    why = steady_end(_windows([500, 900, 1000, 1005, 995, 1000]), RULE, concurrency=150)
    assert why is not None
    assert "within 2% over 3 windows of 30 s" in why
    assert "no GPU reading" in why


def test_a_spread_over_the_tolerance_goes_on() -> None:
    assert steady_end(_windows([1000, 1030, 990, 1025, 980, 1010]), RULE, 150) is None


def test_the_minimum_time_holds_it() -> None:
    # flat from the start, but the last window ends at 90 s < 120 s
    assert steady_end(_windows([1000, 1000, 1000]), RULE, 10) is None
    assert steady_end(_windows([1000, 1000, 1000, 1000]), RULE, 10) is not None


def test_the_minimum_requests_hold_it() -> None:
    windows = _windows([1000] * 6)  # 600 requests completed by the last window
    assert min_requests(RULE, 150) == 150
    assert steady_end(windows, RULE, 600) is not None
    assert steady_end(windows, RULE, 601) is None  # one answer per client: 601 > 600
    assert steady_end(windows, dataclasses.replace(RULE, min_requests=601), 1) is None


def test_free_memory_still_falling_holds_it() -> None:
    flat = [1000.0] * 6
    falling = [10.0, 9.0, 8.0, 7.0, 6.0, 5.0]
    assert steady_end(_windows(flat, list(falling)), RULE, 10) is None
    settled = [10.0, 8.0, 6.0, 6.0, 5.95, 5.95]  # fell, then stayed within 0.1 GiB
    why = steady_end(_windows(flat, list(settled)), RULE, 10)
    assert why is not None and "not falling" in why


def test_off_or_empty_never_ends() -> None:
    assert steady_end(_windows([1000] * 6), dataclasses.replace(RULE, enabled=False), 1) is None
    assert steady_end(_windows([0.0] * 6), RULE, 1) is None  # nothing produced: no verdict
    assert steady_end([], RULE, 1) is None


def test_a_stress_peak_seen_twice_skips_the_rest() -> None:
    why = stress_end([Round(48, 0, 3.20), Round(48, 0, 3.15)], RULE)
    assert why is not None and "rounds 1 and 2" in why
    assert stress_end([Round(48, 0, None), Round(48, 0, None)], RULE) is not None


def test_a_stress_peak_that_moved_or_failed_goes_on() -> None:
    assert stress_end([Round(48, 0, 3.2)], RULE) is None
    assert stress_end([Round(48, 0, 3.2), Round(48, 0, 2.9)], RULE) is None  # 0.3 GiB deeper
    assert stress_end([Round(47, 1, 3.2), Round(48, 0, 3.2)], RULE) is None  # a failure
    assert stress_end([Round(48, 0, 3.2), Round(40, 0, 3.2)], RULE) is None  # not alike
    assert stress_end([Round(48, 0, 3.2), Round(48, 0, None)], RULE) is None
    off = dataclasses.replace(RULE, enabled=False)
    assert stress_end([Round(48, 0, 3.2), Round(48, 0, 3.2)], off) is None
