"""A hybrid linear-attention model's Mamba state pool in the pool arithmetic.

SGLang carves the state pool from the KV budget `A − P·(1 − f)` before the KV pool, by default
`mamba_full_memory_ratio/(1 + ratio)` of it (0.5.9 `model_runner_kv_cache_mixin.py`
`handle_max_mamba_cache`, 0.5.23 `mem_cache/kv_cache_configurator.py`). The log is Qwen3.5-9B TP2
from public notes of a start on SGLang main (2026-04) at `--mem-fraction-static 0.8`.
"""

from __future__ import annotations

import pytest

from autotune.logparse.ledger import Ledger
from autotune.memory.arithmetic import arithmetic, startup_parts
from autotune.memory.cell import implied_fraction, pool_budget_gib, state_ratio

LEDGER = Ledger(
    p_gib=22.93,
    weights_gib=8.85,
    avail_after_weights_gib=14.08,
    max_total_num_tokens=327310,
    kv_gib=5.00,
    mamba_gib=4.48,
    req_to_token_gib=0.11,
    avail_after_pool_gib=4.49,
    graph_gib=0.26,
    avail_after_graphs_gib=3.79,
    available_gpu_mem_gib=3.79,
)
"""The ledger of tests/fixtures/logs/v0_5_10_qwen35_mamba_tp2.log (the logparse tests read it)."""


def test_the_state_pool_is_in_the_budget() -> None:
    assert pool_budget_gib(LEDGER) == pytest.approx(9.48)
    assert state_ratio(LEDGER) == pytest.approx(4.48 / 5.00)


def test_the_fraction_the_pool_implies_counts_the_state_pool() -> None:
    """22.93 × (1 − 0.8) = 4.59 GiB of reserve leaves 9.49 GiB: 4.48 state, 5.00 KV. Counting
    the KV lines alone gave 0.604."""
    assert implied_fraction(LEDGER) == pytest.approx(0.8, abs=0.002)


def test_another_fraction_moves_both_pools() -> None:
    a = arithmetic(LEDGER, 0.8)
    assert a is not None
    at = a.at(0.8)
    assert at.tokens == pytest.approx(327310, rel=0.005)
    assert at.kv_gib == pytest.approx(5.00, abs=0.02)
    step = a.at(0.81)
    # 0.01 of f is 0.23 GiB of budget, a little more than half of it KV (ratio 0.9)
    assert step.kv_gib - at.kv_gib == pytest.approx(0.2293 / 1.896, abs=0.01)
    assert step.static_free_gib is not None and at.static_free_gib is not None
    assert at.static_free_gib - step.static_free_gib == pytest.approx(0.2293, abs=0.01)


def test_the_state_pool_is_a_part_of_p() -> None:
    parts = startup_parts(LEDGER)
    assert parts.state_gib == 4.48
    free = LEDGER.available_gpu_mem_gib
    assert free is not None and LEDGER.p_gib is not None
    # weights 8.85, KV 5.00, state 4.48, table 0.11, graphs 0.26, free 3.79 of 22.93
    assert parts.unexplained_gib(LEDGER.p_gib, free) == pytest.approx(0.44, abs=0.01)
