"""The ceiling: the pool the operator's box would hold if the reserve held only what the trials
measured it needs, worked by hand from the operator's figures (docs/sglang-memory.md).

P = 94.05 GiB, A = 21.71 GiB, 70,272 B/token, f = 0.88: the pool's budget is
21.71 − 94.05 × 0.12 = 10.424 GiB. Startup took the request table 0.04, CUDA graphs 3.70 and
1.20 GiB of workspaces from the reserve (11.286 GiB) and left 6.35 GiB free; the stress peak
took 2.50 of it, so 3.85 GiB were free at the worst moment. With a margin of 0.50 GiB, 3.35 GiB
of the reserve held nothing the trials measured: the ceiling's budget is 10.424 + 3.35 =
13.774 GiB, ⌊13.774 · 2^30 / 70,272⌋ = 210,463 tokens, at f = 0.88 + 3.35 / 94.05 = 0.91562.
"""

from __future__ import annotations

from typing import Any

import pytest

from autotune.logparse.ledger import Ledger
from autotune.memory.arithmetic import Arithmetic, arithmetic
from autotune.memory.ceiling import ceiling
from autotune.memory.pool import GIB
from tests.review.fakes import CELL, ledger

PEAK = 2.5


def _no_draft(f: float = 0.88) -> dict[str, Any]:
    """The operator's ledger without the draft: request table, graphs and 1.20 GiB other."""
    d = ledger(f)
    for k in ("draft_weights_gib", "draft_kv_gib", "draft_graph_gib"):
        d.pop(k)
    free = round(21.71 - d["kv_gib"] - 0.04 - 1.20 - 3.70, 2)
    d["avail_after_graphs_gib"] = d["available_gpu_mem_gib"] = free
    return d


def _arith(d: dict[str, Any], peak: float | None = PEAK) -> Arithmetic:
    a = arithmetic(Ledger.from_dict(d), 0.88, stress_peak_gib=peak, cell_bytes=CELL)
    assert a is not None
    return a


def test_the_hand_worked_ceiling() -> None:
    a = _arith(_no_draft())
    assert a.headroom is not None and a.headroom.free == 6.35
    assert a.free_at_peak_gib == pytest.approx(3.85)
    c = ceiling(a, 0.5)
    assert c is not None
    assert c.budget_gib == pytest.approx(13.774)
    assert c.tokens == int(13.774 * GIB) // CELL == 210_463
    assert c.fraction == pytest.approx(0.88 + 3.35 / 94.05)
    n = c.needs
    assert (n.request_table, n.draft, n.graphs, n.workspaces, n.stress_peak, n.margin) == (
        0.04, 0.0, 3.70, 1.20, PEAK, 0.5)  # fmt: skip
    # the reserve at the ceiling holds the needs (and the pool's rounding, a few thousandths)
    assert c.reserve_gib == pytest.approx(n.total, abs=0.01)
    assert c.unused_gib(0.88) == pytest.approx(3.35)
    assert a.tokens is not None and c.share(a.tokens) == pytest.approx(159_276 / 210_463)


def test_a_winner_backed_off_has_more_of_its_reserve_unused() -> None:
    c = ceiling(_arith(_no_draft()), 0.5)
    assert c is not None
    # two steps down: 2 × 0.01 × P more of the reserve holds nothing
    assert c.unused_gib(0.86) == pytest.approx(3.35 + 0.02 * 94.05)
    assert c.needs_at(0.86) == c.needs


def test_a_winner_at_the_ceiling_is_100_percent() -> None:
    a = _arith(_no_draft())
    assert a.free_at_peak_gib is not None
    c = ceiling(a, a.free_at_peak_gib)  # the margin takes every GiB left at the peak
    assert c is not None
    assert c.fraction == pytest.approx(0.88)
    assert c.tokens == a.tokens_from_formula
    assert c.unused_gib(0.88) == pytest.approx(0.0, abs=1e-9)
    assert a.tokens is not None and c.share(a.tokens) == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("over", [0.01, 1.0])
def test_a_winner_beyond_the_ceiling_is_above_100_percent_and_short(over: float) -> None:
    a = _arith(_no_draft())
    assert a.free_at_peak_gib is not None and a.tokens is not None
    c = ceiling(a, a.free_at_peak_gib + over)  # the margin asks for more than was left
    assert c is not None
    assert c.unused_gib(0.88) == pytest.approx(-over)
    share = c.share(a.tokens)
    assert share is not None and share > 1.0
    assert c.tokens == int((10.424 - over) * GIB) // CELL


def test_just_below_the_ceiling_is_just_below_100_percent() -> None:
    a = _arith(_no_draft())
    assert a.free_at_peak_gib is not None and a.tokens is not None
    c = ceiling(a, a.free_at_peak_gib - 0.01)
    assert c is not None
    share = c.share(a.tokens)
    assert share is not None and 0.998 < share < 1.0
    assert c.unused_gib(0.88) == pytest.approx(0.01)


def test_a_0_5_9_draft_grows_its_kv_with_the_pool() -> None:
    a = _arith(ledger(0.88))  # the draft's weights, KV and graphs are in the reserve
    assert a.draft_ratio > 0 and a.headroom is not None and a.free_at_peak_gib is not None
    c = ceiling(a, 0.5)
    assert c is not None
    spare = a.free_at_peak_gib - 0.5
    # each GiB of budget takes 1 + ratio GiB of free memory: the draft's KV grows with the pool
    assert c.budget_gib == pytest.approx(a.kv_budget_gib + spare / (1 + a.draft_ratio))
    grown = (c.budget_gib - a.kv_budget_gib) * a.draft_ratio
    assert c.needs.draft == pytest.approx(a.headroom.draft + grown)
    assert c.reserve_gib == pytest.approx(c.needs.total, abs=0.02)
    assert c.unused_gib(0.88) == pytest.approx(spare)
    assert c.needs_at(0.88).draft == pytest.approx(a.headroom.draft)
    # the ceiling is the same wherever the winner sits
    at = a.at(0.87)
    assert at.free_at_peak_gib is not None
    # (`at` moves whole tokens, the ceiling the budget: a token's rounding apart)
    assert c.unused_gib(0.87) == pytest.approx(at.free_at_peak_gib - 0.5, abs=1e-3)


def test_no_ceiling_without_a_stress_peak_or_free_memory() -> None:
    assert ceiling(_arith(_no_draft(), peak=None), 0.5) is None
    d = _no_draft()
    d["avail_after_graphs_gib"] = d["available_gpu_mem_gib"] = None
    assert ceiling(_arith(d), 0.5) is None


def test_needs_that_leave_no_pool_have_no_share() -> None:
    c = ceiling(_arith(_no_draft()), 20.0)
    assert c is not None and c.tokens == 0 and c.share(100) is None


def test_a_pool_held_to_max_total_tokens_stops_growing_with_the_fraction() -> None:
    """`--max-total-tokens 100000` below the 159,276 the budget holds at 0.88: SGLang takes
    `min(capacity, max_total_tokens)`, so another fraction gives the same pool and the same free
    memory, and the ceiling (what the box holds without the cap) says the cap is set."""
    d = _no_draft()
    d["max_total_num_tokens"] = 100_000
    d["max_total_tokens_cap"] = 100_000
    a = _arith(d)
    assert a.tokens_cap == 100_000
    lower, higher = a.at(0.86), a.at(0.92)
    assert lower.tokens == higher.tokens == 100_000
    assert lower.static_free_gib == higher.static_free_gib == pytest.approx(6.35)
    c = ceiling(a, 0.5)
    assert c is not None and c.capped_at == 100_000 and c.tokens > 100_000
    uncapped = ceiling(_arith(_no_draft()), 0.5)
    assert uncapped is not None and uncapped.capped_at is None
