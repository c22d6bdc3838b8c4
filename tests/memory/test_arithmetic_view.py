"""SGLang's pool arithmetic with the operator's figures (DESIGN §1, reference §1)."""

from __future__ import annotations

import pytest

from autotune.logparse.ledger import Ledger
from autotune.memory.arithmetic import arithmetic
from autotune.memory.cell import cell_from_fit
from autotune.memory.pool import pool_zero_fraction
from tests.review.fakes import CELL, GIB, A, P, ledger, tokens


def test_operators_088() -> None:
    a = arithmetic(Ledger.from_dict(ledger(0.88)), 0.88, stress_peak_gib=2.5, cell_bytes=CELL)
    assert a is not None
    assert f"{a.kv_budget_gib:.2f}" == "10.42"
    assert a.tokens_from_formula == 159_276  # the operator's log: 159,277 (P, A unrounded)
    assert f"{a.reserve_gib:.2f}" == "11.29"
    h = a.headroom
    assert h is not None
    total = h.request_table + h.draft + h.graphs + h.other + h.free
    assert total == pytest.approx(h.reserve, abs=0.02)
    assert a.free_at_peak_gib == pytest.approx(h.free - 2.5)


def test_another_fraction_moves_p_times_delta() -> None:
    a = arithmetic(Ledger.from_dict(ledger(0.88)), 0.88, stress_peak_gib=2.5, cell_bytes=CELL)
    assert a is not None
    at = a.at(0.90)
    assert at.tokens == tokens(0.90)
    now = a.at(0.88)
    assert now.static_free_gib is not None and at.static_free_gib is not None
    moved = now.static_free_gib - at.static_free_gib
    assert moved == pytest.approx(0.02 * P * (1 + a.draft_ratio), rel=0.01)


def test_highest_fraction_keeps_the_required_headroom() -> None:
    a = arithmetic(Ledger.from_dict(ledger(0.88)), 0.88, stress_peak_gib=2.5, cell_bytes=CELL)
    assert a is not None
    top = a.highest_fraction(0.5, 0.01)
    assert top is not None
    at_top, above = a.at(top), a.at(round(top + 0.01, 2))
    assert at_top.free_at_peak_gib is not None and at_top.free_at_peak_gib >= 0.5
    assert above.free_at_peak_gib is not None and above.free_at_peak_gib < 0.5


def test_cell_fitted_across_fractions_snaps_to_the_real_cell() -> None:
    pts = [(f, tokens(f), P) for f in (0.86, 0.88, 0.90)]
    assert cell_from_fit(pts) == CELL
    assert cell_from_fit(pts[:1]) is None


def test_no_arithmetic_without_p() -> None:
    assert arithmetic(Ledger(), 0.88) is None


def test_cell_from_the_kv_line_when_not_fitted() -> None:
    a = arithmetic(Ledger.from_dict(ledger(0.88)), 0.88)
    assert a is not None and not a.cell_exact
    assert a.cell_bytes == pytest.approx(CELL, rel=1e-3)


def test_the_pools_launches_sized_fall_to_zero_where_the_least_rank_has_no_room() -> None:
    """SGLang sizes the pool from the least rank: a rank 1.5 GiB short moves the line the pools
    fall along, and its zero, above the `1 − A/P` the printed figures give."""
    short = 1.5
    pools = [(f, int((A - short - P * (1 - f)) * GIB) // CELL) for f in (0.85, 0.88, 0.9)]
    zero = 1 - (A - short) / P
    assert pool_zero_fraction(pools) == pytest.approx(zero, abs=1e-4)
    assert zero > 1 - A / P + 0.015
    assert pool_zero_fraction(pools[:1]) is None  # one fraction: no line
    assert pool_zero_fraction([(0.85, 1000), (0.88, 1000)]) is None  # the cap held both


def test_another_fraction_moves_from_the_pool_the_least_rank_left() -> None:
    """A rank 1.5 GiB short of the one that printed A: SGLang sized the pool from it, so another
    fraction's pool moves from the pool the log counted, and at the launch's own fraction the
    prediction is the launch itself (no free memory moved)."""
    short = 1.5
    d = ledger(0.88)
    d["max_total_num_tokens"] = int((A - short - P * 0.12) * GIB) // CELL
    a = arithmetic(Ledger.from_dict(d), 0.88, stress_peak_gib=2.5, cell_bytes=CELL)
    assert a is not None and a.headroom is not None
    assert a.pool_offset_tokens == pytest.approx(-short * GIB / CELL, abs=2)
    assert a.at(0.88).tokens == d["max_total_num_tokens"]
    assert a.at(0.88).static_free_gib == pytest.approx(a.headroom.free)
    below = a.at(0.86)
    assert below.tokens == pytest.approx(d["max_total_num_tokens"] - 0.02 * P * GIB / CELL, abs=2)
    assert below.tokens < d["max_total_num_tokens"]
    # a pool the printed figures' rounding explains moves on the formula alone
    plain = arithmetic(Ledger.from_dict(ledger(0.88)), 0.88, cell_bytes=CELL)
    assert plain is not None and plain.pool_offset_tokens == 0
