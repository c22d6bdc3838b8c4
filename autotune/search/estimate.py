"""How many launches a night's search is expected to take, and at worst, before it runs.

The capacity-aware planner (`search.planner`) makes no forecast of its own length: it decides
one launch at a time. This estimate follows its rules and the benchmark's figures
(docs/search.md, `scripts/bench_search.py`: the capacity search holds a stable setting within 1%
of the best after 2 launches at the median, 8 at worst in the world that differs from the
model), then counts the launches its later rules add: `explore` tries at most each other value
of max_running_requests once (fewer where the fitted throughput law, `search.front`, puts a value
within the noise of what held, or more requests hold as much capacity), one probe each of
hicache_size and chunked_prefill_size (an axis whose probe moved neither throughput nor capacity
is not explored further; on the benchmark's boxes the host cache never does), and `confirm` runs
the best once more. The worst is the study's budget, for every sampler (the search may
stop earlier, never later). `grid` runs every grid point; the other samplers stop only at the
budget.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.config.schema import CHUNK, HICACHE, REQUESTS, Choices, IntRange, SearchConfig
from autotune.config.space import grid

BENCH_TO_EDGE = 2
"""Launches the capacity search takes to a stable setting within 1% of the best (median)."""
BENCH_TO_EDGE_WORST = 8
"""The same at worst, in the benchmark's world that differs from the model."""
EXPLORED = (REQUESTS, HICACHE, CHUNK)
"""The parameters the planner's `explore` rule tries one value at a time at the edge."""
PROBED = (HICACHE, CHUNK)
"""The explored parameters the throughput law does not cover: one probe each, more only where
the probe showed an effect (`search.front.no_effect`)."""
CONFIRM = 1
"""The planner's `confirm` rule: the best setting once more before it says it is done."""


@dataclass(frozen=True)
class LaunchEstimate:
    """The launches a night is expected to take and at worst, and how the estimate was made."""

    expected: int
    worst: int
    basis: str


def launch_estimate(search: SearchConfig, sampler: str, budget: int) -> LaunchEstimate:
    """The launches `sampler` is expected to take over `search` within `budget` trials."""
    if sampler == "grid":
        points = grid(search)
        n = min(len(points), budget) if points is not None else budget
        return LaunchEstimate(n, n, f"grid: every point ({n}), within the budget of {budget}")
    if sampler != "capacity":
        return LaunchEstimate(
            budget, budget, f"{sampler}: it stops only at the budget of {budget} trials"
        )
    others = sum(
        min(_count(search, name) - 1, 1) if name in PROBED else _count(search, name) - 1
        for name in EXPLORED
    )
    expected = min(BENCH_TO_EDGE + others + CONFIRM, budget)
    return LaunchEstimate(
        expected,
        budget,
        f"capacity: {BENCH_TO_EDGE} launches to the edge (the benchmark's median, worst "
        f"{BENCH_TO_EDGE_WORST}) + {others} explore + {CONFIRM} confirm; worst: the budget "
        f"of {budget}",
    )


def _count(search: SearchConfig, name: str) -> int:
    """How many values parameter `name` takes (1 when it is fixed or not searched)."""
    for p in search.params:
        if p.name != name:
            continue
        if isinstance(p, Choices):
            return len(p.values)
        if isinstance(p, IntRange) and p.step:
            return (p.high - p.low) // p.step + 1
    return 1
