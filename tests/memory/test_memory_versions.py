"""The memory model and the one-launch arithmetic in each release's rules (`logparse.semantics`).

Ledgers follow SGLang's own arithmetic at the log's two-decimal precision: a Kimi-K2-like MLA
target (70,272 B per token) with an EAGLE3 head whose own pool is MHA (2,048 B per token), tp 2.
0.5.23 sizes the pool with the draft folded into the cell (70,272 + ⌊70,272/61⌋ = 71,424 B) after
both models loaded; 0.5.9 sized it with the target's cell before the draft loaded, and took the
draft's weights and pool out of the reserve. Either way the draft is in the GPU's bytes per token
exactly once.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from autotune.logparse.accounting import build_ledger
from autotune.logparse.ledger import Ledger
from autotune.logparse.lines import parse_text
from autotune.memory.arithmetic import arithmetic
from autotune.memory.cell import sizing_cell
from autotune.memory.fit import fit
from autotune.memory.model import Observation, Setting

LOGS = Path(__file__).parent.parent / "fixtures" / "logs"
GIB = float(1 << 30)
P, WEIGHTS, DRAFT_WEIGHTS = 94.03, 72.33, 0.81
CELL, DRAFT_CELL, FOLDED = 70272, 2048, 70272 + 70272 // 61
TABLE, GRAPHS, DRAFT_GRAPHS, OTHER = 0.05, 3.70, 0.75, 0.30


def r2(x: float) -> float:
    return round(x, 2)


def launch(f: float, version: str) -> Ledger:
    """One start at `mem_fraction_static` f, as its log would show it."""
    after_target = P - WEIGHTS
    if version == "0.5.9":
        a = after_target
        n = int((a - P * (1 - f)) * GIB) // CELL
        kv, draft_kv = (n + 1) * CELL / GIB, (n + 1) * DRAFT_CELL / GIB
        free = a - TABLE - kv - GRAPHS - DRAFT_WEIGHTS - draft_kv - DRAFT_GRAPHS - OTHER
    else:
        a = after_target - DRAFT_WEIGHTS
        n = int((a - P * (1 - f)) * GIB) // FOLDED
        kv, draft_kv = (n + 1) * CELL / GIB, (n + 1) * DRAFT_CELL / GIB
        free = a - TABLE - kv - draft_kv - GRAPHS - DRAFT_GRAPHS - OTHER
    return Ledger(
        p_gib=P,
        weights_gib=WEIGHTS,
        avail_after_weights_gib=r2(a),
        max_total_num_tokens=n,
        kv_gib=r2(kv),
        draft_weights_gib=DRAFT_WEIGHTS,
        draft_kv_gib=r2(draft_kv),
        req_to_token_gib=TABLE,
        graph_gib=GRAPHS,
        draft_graph_gib=DRAFT_GRAPHS,
        avail_after_graphs_gib=r2(free),
        available_gpu_mem_gib=r2(free),
        max_running_requests=48,
        context_len=262144,
        ranks=2,
        semantics=version,
        speculative_algorithm="EAGLE3",
    )


def obs(f: float, version: str) -> Observation:
    return Observation(Setting(f, 48), launch(f, version), "ok")


@pytest.mark.parametrize("version", ["0.5.23", "0.5.18"])
def test_one_launch_predicts_the_pool_with_the_folded_cell(version: str) -> None:
    model = fit([obs(0.88, version)])
    assert model.semantics == version
    assert model.cell_bytes == pytest.approx(FOLDED, rel=0.001)
    truth = launch(0.92, version).max_total_num_tokens
    n = model.tokens(0.92)
    assert n is not None and truth is not None
    assert n.mean == pytest.approx(truth, rel=0.001)
    # read with 0.5.9's rule (the target's cell), the same ledger over-predicts by the fold
    legacy = fit(
        [
            dataclasses.replace(
                obs(0.88, version),
                ledger=dataclasses.replace(launch(0.88, version), semantics="0.5.9"),
            )
        ]
    )
    wrong, start = legacy.tokens(0.92), launch(0.88, version).max_total_num_tokens or 0
    assert wrong is not None and wrong.mean - truth > 0.01 * (truth - start)


def test_one_0_5_9_launch_still_uses_the_targets_cell() -> None:
    model = fit([obs(0.88, "0.5.9")])
    assert model.cell_bytes == pytest.approx(CELL, rel=0.001)
    n, truth = model.tokens(0.92), launch(0.92, "0.5.9").max_total_num_tokens
    assert n is not None and truth is not None and n.mean == pytest.approx(truth, rel=0.001)


@pytest.mark.parametrize("version", ["0.5.23", "0.5.9"])
def test_the_fit_counts_the_draft_once(version: str) -> None:
    """Two fractions fit the sizing cell from the token counts; the free memory each pool token
    takes is the target's and the draft's KV lines, never the fitted cell times the draft again
    (which in 0.5.23 would count the folded draft twice)."""
    model = fit([obs(0.80, version), obs(0.88, version)])
    sizing = FOLDED if version == "0.5.23" else CELL
    assert model.cell_bytes == pytest.approx(sizing, rel=0.001)
    assert model.kv_cell_bytes == pytest.approx(CELL + DRAFT_CELL, rel=0.002)
    truth = launch(0.92, version).available_gpu_mem_gib
    free = model.static_free(Setting(0.92, 48), 48)
    assert free is not None and truth is not None
    assert free.mean == pytest.approx(truth, abs=0.04)
    twice = (model.cell_bytes or 0) * (1 + model.draft_ratio)
    if version == "0.5.23":  # the old formula would have been this far off at f = 0.92
        drift = (twice - (CELL + DRAFT_CELL)) * (0.12 * P * GIB / sizing) / GIB
        assert drift > 0.1


def test_one_launch_arithmetic_in_0_5_23() -> None:
    led = launch(0.88, "0.5.23")
    a = arithmetic(led, 0.88)
    assert a is not None and a.semantics == "0.5.23"
    assert a.cell_bytes == pytest.approx(FOLDED, rel=0.001)
    assert a.free_per_fraction_gib == pytest.approx(P * (CELL + DRAFT_CELL) / FOLDED, rel=0.002)
    at = a.at(0.92)
    assert at.tokens == pytest.approx(launch(0.92, "0.5.23").max_total_num_tokens, rel=0.001)
    truth = launch(0.92, "0.5.23").available_gpu_mem_gib
    assert at.static_free_gib == pytest.approx(truth, abs=0.03)
    h = a.headroom
    assert h is not None
    # the draft's weights are in A and its KV in the pool: only its graphs are in the reserve
    assert (h.draft_weights, h.draft_kv, h.draft_graphs) == (0.0, 0.0, DRAFT_GRAPHS)
    assert h.other == pytest.approx(OTHER, abs=0.03)


def test_one_launch_arithmetic_in_0_5_9() -> None:
    a = arithmetic(launch(0.88, "0.5.9"), 0.88)
    assert a is not None and a.cell_bytes == pytest.approx(CELL, rel=0.001)
    truth = launch(0.92, "0.5.9").available_gpu_mem_gib
    assert a.at(0.92).static_free_gib == pytest.approx(truth, abs=0.03)
    h = a.headroom
    assert h is not None and h.draft_weights == DRAFT_WEIGHTS
    assert h.other == pytest.approx(OTHER, abs=0.03)


def test_the_fold_follows_the_targets_layers_when_the_draft_pool_differs() -> None:
    """An MHA EAGLE3 head on an MLA target: the fold is ⌊cell/61⌋ (the target's geometry), not
    the head's own 2,048 B; the budget the log shows says which."""
    led = launch(0.88, "0.5.23")
    assert sizing_cell(led, 0.88) == pytest.approx(FOLDED, abs=45)  # not 70,272 + 2,048
    same_geometry = dataclasses.replace(
        led, draft_kv_gib=r2((led.max_total_num_tokens or 0) * (CELL // 61) / GIB)
    )
    assert sizing_cell(same_geometry, 0.88) == pytest.approx(FOLDED, abs=45)
    assert sizing_cell(dataclasses.replace(led, semantics="0.5.9"), 0.88) == pytest.approx(
        CELL, abs=40
    )


def _fixture(name: str) -> Ledger:
    return build_ledger(parse_text((LOGS / name).read_text()).events)


def test_a_0_5_23_log_feeds_the_model_in_its_rules() -> None:
    led = _fixture("v0_5_23_eagle3_hicache_tp2.log")
    model = fit([Observation(Setting(0.88, 48), led, "ok")])
    n = model.tokens(0.90)
    truth = int((20.89 - 94.03 * 0.10) * GIB) // FOLDED
    assert n is not None and n.mean == pytest.approx(truth, rel=0.002)


def test_host_ram_in_0_5_23_is_a_per_rank_budget() -> None:
    """Y in "only have Y GB free" is (available − 10 GiB) ÷ ranks: 2 × 700 GB fits a 799.94 GB
    per-rank budget (0.5.9's reading, Y for the whole machine, would block it), 800 does not."""
    led = _fixture("v0_5_23_startup_host_memory.log")
    failed = Observation(Setting(0.88, 48, None, 800.0), led, "startup_oom")
    ok = Observation(Setting(0.88, 48, None, 2.0), _fixture("v0_5_23_eagle3_hicache_tp2.log"), "ok")
    model = fit([ok, failed])
    assert model.host_budget_gb == pytest.approx(799.94)
    assert model.host_draft_ratio == pytest.approx(0.59 / 20.3)
    blocked = model.forecast(Setting(0.88, 48, None, 800.0), default_slots=48, default_chunk=None)
    assert blocked.blocked is not None and "per rank" in blocked.blocked
    fits = model.forecast(Setting(0.88, 48, None, 700.0), default_slots=48, default_chunk=None)
    assert fits.blocked is None


def test_a_host_pool_smaller_than_the_gpu_pool_blocks_only_in_0_5_9() -> None:
    for version, blocks in (("0.5.9", True), ("0.5.23", False)):
        led = dataclasses.replace(
            launch(0.88, version), host_cache_gb=48.0, host_cache_tokens=int(48e9 // CELL)
        )
        model = fit([Observation(Setting(0.88, 48, None, 48.0), led, "ok")])
        small = model.forecast(Setting(0.88, 48, None, 4.0), default_slots=48, default_chunk=None)
        assert (small.blocked is not None) is blocks, version


def test_host_ram_in_0_5_18_is_the_machines() -> None:
    """0.5.18 reports the machine's `available − 10 GiB`: every rank's pools share it."""
    led = _fixture("v0_5_18_startup_host_memory.log")
    assert led.semantics == "0.5.18" and led.host_free_gb == 12.31
    model = fit([Observation(Setting(0.88, 48, None, 700.0), led, "startup_oom")])
    assert model.host_budget_gb is None and model.host_free_gb == 12.31
    fc = model.forecast(Setting(0.88, 48, None, 8.0), default_slots=48, default_chunk=None)
    assert fc.blocked is not None and "2 ×" in fc.blocked
