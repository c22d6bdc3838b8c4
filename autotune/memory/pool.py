"""SGLang's pool formula on plain numbers: what a fraction hands the KV pool, and what the free
memory does around it.

`mem_fraction_static` f is a fraction of P, the free memory per GPU measured before the weights
load. The KV pool gets `A − P·(1 − f)` GiB, A being what the weights left; the reserve `P·(1 − f)`
is the headroom that must hold everything allocated later: the request table, CUDA graphs,
workspaces and the transient peak of the forward pass. `max_running_requests` does not size the
pool; it sizes only the request table and the captured CUDA-graph batches.

Every figure of this kind that another package prints or decides by is one of the functions here,
so the search, the review, `init` and the progress line cannot drift apart: the reserve
(`reserve_gib`), the pool's budget and tokens (`kv_budget_gib`, `pool_tokens`, and `held_by_cap`
where `--max-total-tokens` held it), the fraction a budget needs (`fraction_for_budget`,
`lowest_fraction`), the stress peak and the free memory at it (`under_load`, `stress_peak_gib`,
`free_at_peak_gib`) and how many steps back cover missing headroom (`steps_to_cover`,
`uncovered_gib`). They take numbers, not a ledger, so the formula holds for launches no log shows
yet (a model's geometry, the memory model's predictions), and the cell's derivation
(`autotune.memory.cell`) and one launch's figures (`autotune.memory.arithmetic`) build on it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

GIB = float(1 << 30)
PAGE = 1
"""SGLang allocates one page beyond `max_total_num_tokens` (the padding slot), and its KV line
counts it: `KV size = (N + page) · cell`."""


def kv_gib(tokens: float, cell_bytes: float) -> float:
    """The KV pool's size in GiB for `tokens` usable tokens of `cell_bytes` each."""
    return (tokens + PAGE) * cell_bytes / GIB if tokens > 0 else 0.0


def cell_from_kv(kv_size_gib: float, tokens: int) -> float:
    """Bytes per token from a KV line's size and its token count."""
    return kv_size_gib * GIB / (tokens + PAGE)


def tokens_for(budget_gib: float, cell_bytes: float) -> int:
    """Usable tokens a KV budget of `budget_gib` holds."""
    return max(int(budget_gib * GIB) // round(cell_bytes), 0)


def reserve_gib(p_gib: float, fraction: float) -> float:
    """`P·(1 − f)`: what SGLang leaves outside the static budget (weights + KV pool) for
    everything allocated later and for the transient peak."""
    return p_gib * (1.0 - fraction)


def kv_budget_gib(p_gib: float, avail_after_weights_gib: float, fraction: float) -> float:
    """`A − P·(1 − f)`: the GiB SGLang hands the KV pool at `fraction`."""
    return avail_after_weights_gib - reserve_gib(p_gib, fraction)


def pool_tokens(
    p_gib: float, avail_after_weights_gib: float, fraction: float, cell_bytes: float
) -> int:
    """Usable tokens of the pool `fraction` gives, at `cell_bytes` a token."""
    return tokens_for(kv_budget_gib(p_gib, avail_after_weights_gib, fraction), cell_bytes)


def fraction_for_budget(p_gib: float, avail_after_weights_gib: float, budget_gib: float) -> float:
    """`1 − (A − budget)/P`: the fraction whose KV budget is `budget_gib` (the inverse of
    `kv_budget_gib`)."""
    return 1.0 - (avail_after_weights_gib - budget_gib) / p_gib


def lowest_fraction(p_gib: float, avail_after_weights_gib: float) -> float:
    """`1 − A/P`: the fraction at which the KV budget turns positive; below it nothing is left
    for a pool."""
    return 1.0 - avail_after_weights_gib / p_gib


def pool_zero_fraction(pools: Sequence[tuple[float, int]]) -> float | None:
    """Where the pools launches sized at their fractions (`(fraction, tokens)`) fall to zero on
    the straight line through them: SGLang sizes the pool from the least rank's memory, so the
    line knows a short rank that the figures one rank printed do not. None below two distinct
    fractions or where the pool does not grow with the fraction. Leave out pools that
    `--max-total-tokens` held (`held_by_cap`)."""
    xs = [f for f, _ in pools]
    if len(set(xs)) < 2:
        return None
    mx = sum(xs) / len(xs)
    my = sum(t for _, t in pools) / len(pools)
    sxx = sum((f - mx) ** 2 for f in xs)
    slope = sum((f - mx) * (t - my) for f, t in pools) / sxx
    if slope <= 0:
        return None
    return mx - my / slope


def stress_peak_gib(static_free_gib: float, least_free_gib: float) -> float:
    """What the load took at its worst on top of the free memory after startup: the drop from
    it to the least free memory seen, never below 0."""
    return max(static_free_gib - least_free_gib, 0.0)


def free_at_peak_gib(static_free_gib: float, peak_gib: float) -> float:
    """The free memory left at the stress peak: free after startup less the peak."""
    return static_free_gib - peak_gib


def peak_rise_gib(case_peaks_gib: Sequence[float], stress_peak_gib: float) -> float:
    """How far a confirmation's worst cases took the stress peak above the study's own (the
    trials' peak at the setting's demand): the most any case's peak rose beyond it, never below
    0 (no case: 0). The export's margin must hold this rise on top of the required headroom."""
    return max([0.0, *(p - stress_peak_gib for p in case_peaks_gib)])


def steps_to_cover(missing_gib: float, per_step_gib: float) -> int:
    """Fraction steps to back a setting off so that it gains `missing_gib` of free memory, each
    step handing `per_step_gib` back from the KV pool (`Arithmetic.per_step_gib`): 0 where nothing
    is missing. `per_step_gib` must be positive."""
    if missing_gib <= 0:
        return 0
    return max(0, math.ceil(missing_gib / per_step_gib - 1e-9))


def steps_gib(steps: int, per_step_gib: float) -> float:
    """What backing off `steps` fraction steps of `per_step_gib` each hands back, GiB."""
    return steps * per_step_gib


def uncovered_gib(missing_gib: float, per_step_gib: float, steps: int) -> float:
    """What of `missing_gib` backing off `steps` fraction steps of `per_step_gib` each leaves
    missing, never below 0 (the inverse of `steps_to_cover`)."""
    return max(0.0, missing_gib - steps_gib(steps, per_step_gib))


def under_load(
    static_free_gib: float | None, least_free_gib: float | None, rise_gib: float | None
) -> tuple[float | None, float | None]:
    """(free at the worst moment, stress peak) of a launch that served its workload, consistent
    with its free memory after startup: the least free memory seen is the measurement and the
    peak is what it took from the startup's free memory; without it, the probe's own rise
    (`rise_gib`) is the peak and the free memory at it follows."""
    if least_free_gib is not None:
        if static_free_gib is None:
            return least_free_gib, rise_gib
        return least_free_gib, stress_peak_gib(static_free_gib, least_free_gib)
    if rise_gib is not None and static_free_gib is not None:
        return free_at_peak_gib(static_free_gib, rise_gib), rise_gib
    return None, rise_gib


def held_by_cap(tokens: float | None, cap: int | None) -> bool:
    """Whether `--max-total-tokens` (`cap`) held a launch's pool of `tokens`: SGLang takes
    `min(capacity, max_total_tokens)`, so a pool at the cap says nothing of the budget's own
    size."""
    return cap is not None and tokens is not None and tokens >= cap
