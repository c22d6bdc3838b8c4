"""The KV cell: the bytes per token SGLang divides the pool's budget by, derived from a launch's
ledger in the rules of its version.

Where the draft model goes depends on the version (`logparse.semantics`): up to 0.5.9 its
weights, KV pool and graphs come out of the reserve, and the pool is sized with the target's own
bytes per token; from 0.5.18 its weights are in A and an EAGLE draft's layers are folded into the
bytes per token the pool is sized with (`cell + int(cell·L_draft/L_target)`), so its KV is inside
the pool budget. Two cells follow: the *sizing* cell (the budget ÷ tokens) and the GPU bytes each
pool token really takes (target + draft KV lines). The draft is counted once, in whichever of the
two the version puts it.

The cell is read from the log's two-decimal lines (`sizing_cell`, `gpu_cell`), worked out from
the model's attention before any launch (`cell_from_geometry`) or fitted across launches at
different fractions (`cell_from_fit`), good to a few bytes; the fraction a log's pool implies
where its `server_args=` line does not show it (`implied_fraction`) comes from the same lines. The
cell is what the version's rules change while the pool formula (`autotune.memory.pool`) stays
the same, so it is worked out here once and one launch's figures (`autotune.memory.arithmetic`)
and the memory model's fit take it from here.
"""

from __future__ import annotations

from collections.abc import Sequence

from autotune.logparse.ledger import Ledger
from autotune.logparse.semantics import Semantics, rules
from autotune.memory.pool import (
    GIB,
    cell_from_kv,
    fraction_for_budget,
    held_by_cap,
    kv_budget_gib,
)


def cell_from_geometry(
    *,
    layers: int,
    elem_bytes: int,
    mla: bool,
    kv_lora_rank: int = 0,
    qk_rope_head_dim: int = 0,
    kv_heads: int = 0,
    head_dim: int = 0,
    v_head_dim: int | None = None,
    tp: int = 1,
) -> int:
    """Bytes per token of the target's pool from the model's attention: MLA keeps
    `(kv_lora_rank + qk_rope_head_dim)` elements a layer, other attention K and V for each KV
    head on a rank (at least one)."""
    if mla:
        return (kv_lora_rank + qk_rope_head_dim) * layers * elem_bytes
    per_layer = max(1, kv_heads // tp) * (head_dim + (v_head_dim or head_dim))
    return per_layer * layers * elem_bytes


FOLDING_ALGORITHMS = frozenset({"EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "FROZEN_KV_MTP"})
"""Speculative algorithms whose draft layers 0.5.18+ fold into the target's bytes per token
(`is_eagle()` or `is_standalone()`; NEXTN is EAGLE). DFLASH/DSPARK scale the cell by the draft's
own bytes per token, which the draft's KV line shows; NGRAM has no draft model."""
LOG_ROUNDING_GIB = 0.005


def target_cell(ledger: Ledger) -> float | None:
    """Bytes per token of the target's pool, from its KV line."""
    if ledger.max_total_num_tokens and ledger.kv_gib:
        return cell_from_kv(ledger.kv_gib, ledger.max_total_num_tokens)
    return None


def state_ratio(ledger: Ledger) -> float:
    """A hybrid linear-attention model's Mamba state pool per KV pool byte, from its lines. SGLang
    carves the state pool from the KV budget before the KV pool, by default the share
    `mamba_full_memory_ratio/(1 + ratio)` of it (0.5.9 `model_runner_kv_cache_mixin.py`
    `handle_max_mamba_cache`, 0.5.23 `mem_cache/kv_cache_configurator.py`), so it grows with the
    budget as the KV pool does: each pool token takes this much more of the budget."""
    if ledger.kv_gib and ledger.mamba_gib:
        return ledger.mamba_gib / ledger.kv_gib
    return 0.0


def pool_budget_gib(ledger: Ledger, semantics: Semantics | None = None) -> float | None:
    """What the log's pool lines show SGLang handed out of the budget `A − P·(1 − f)`: the
    target's KV lines, a hybrid model's state pool (`state_ratio`) and, where the release folds
    the draft into the cell (0.5.18+), the draft's KV lines. None without a KV line."""
    if ledger.kv_gib is None:
        return None
    sem = semantics or rules(ledger.semantics)
    budget = ledger.kv_gib + (ledger.mamba_gib or 0.0)
    if sem.draft_in_budget:
        budget += ledger.draft_kv_gib or 0.0
    return budget


def implied_fraction(ledger: Ledger) -> float | None:
    """The fraction a log's pool implies when its `server_args=` line does not show it:
    `1 − (A − budget)/P`, the budget being what its pool lines show (`pool_budget_gib`). Good to
    about 0.0005 from the two-decimal figures; None where the pool did not come from the budget
    (a `--max-total-tokens` cap, post-capture resizing) or a figure is missing."""
    p, a, budget = ledger.p_gib, ledger.avail_after_weights_gib, pool_budget_gib(ledger)
    if not p or a is None or budget is None or not ledger.max_total_num_tokens:
        return None
    if ledger.kv_va_gib is not None or ledger.max_total_tokens_cap is not None:
        return None
    f = fraction_for_budget(p, a, budget)
    return round(f, 3) if 0.0 < f < 1.0 else None


def draft_kv_ratio(ledger: Ledger) -> float:
    """The draft pool's bytes per target pool byte (same token count), from the KV lines."""
    if ledger.kv_gib and ledger.draft_kv_gib is not None:
        return ledger.draft_kv_gib / ledger.kv_gib
    return 0.0


def folds_draft(ledger: Ledger, semantics: Semantics) -> bool:
    """Whether the pool of this launch was sized with the draft folded into the cell."""
    if not semantics.draft_in_budget:
        return False
    algo = (ledger.speculative_algorithm or "").upper()
    if algo:
        return algo != "NGRAM" and algo != "NONE"
    return ledger.draft_kv_gib is not None or ledger.draft_weights_gib is not None


def implied_cell(ledger: Ledger, fraction: float) -> float | None:
    """`(A − P·(1 − f))·2^30 ÷ N`: the bytes per token the pool was sized with, as the log's own
    figures imply; None where N did not come from that budget (a `--max-total-tokens` cap,
    post-capture resizing) or a figure is missing."""
    p, a, n = ledger.p_gib, ledger.avail_after_weights_gib, ledger.max_total_num_tokens
    if p is None or a is None or not n or ledger.kv_va_gib is not None:
        return None
    if held_by_cap(n, ledger.max_total_tokens_cap):
        return None
    rest = kv_budget_gib(p, a, fraction)
    return rest * GIB / n if rest > 0 else None


def sizing_cell(
    ledger: Ledger, fraction: float, semantics: Semantics | None = None
) -> float | None:
    """The bytes per token SGLang divided this launch's KV budget by.

    Up to 0.5.9, and without a folding draft, the target's own cell (its KV line). From 0.5.18
    with an EAGLE-type draft, `cell + int(cell·L_draft/L_target)`. The layer counts are not in
    the log, so there are two readings: the fold the draft's KV line implies (it assumes the
    draft's per-layer KV equals the target's, which holds for EAGLE/MTP heads), and the budget
    the log shows, `(A − P·(1 − f)) ÷ N`. Where they agree within what two printed decimals
    allow, both are averaged by their precision; where they do not (an MHA head on an MLA
    target: the fold follows the target's layers, not the head's own pool), the budget's. A
    hybrid model's state pool comes out of the same budget in proportion to the KV pool: its
    bytes per pool token (`state_ratio`) are part of the cell."""
    sem = semantics or rules(ledger.semantics)
    base = target_cell(ledger)
    if base is None:
        return None
    state = base * state_ratio(ledger)  # a hybrid model's state pool, from the same budget
    if not folds_draft(ledger, sem):
        return base + state
    ratio = draft_kv_ratio(ledger)
    assumed = base + int(base * ratio) + state if ratio else None
    implied = implied_cell(ledger, fraction)
    n = ledger.max_total_num_tokens
    if implied is None or not n:
        return assumed if assumed is not None else base + state
    rest = implied * n / GIB
    implied_err = implied * LOG_ROUNDING_GIB * (2.0 - fraction) / rest + 1.0
    if assumed is None or ledger.kv_gib is None:
        return max(implied, base + state)
    # the target cell and the draft's share are each read from a two-decimal KV line
    assumed_err = 2.0 * base * LOG_ROUNDING_GIB / ledger.kv_gib + 1.0
    if abs(assumed - implied) <= implied_err + assumed_err:
        wa, wi = assumed_err**-2, implied_err**-2
        return (assumed * wa + implied * wi) / (wa + wi)
    return max(implied, base + state)


def gpu_cell(ledger: Ledger) -> float | None:
    """GPU bytes each pool token takes: the target's pool plus the draft's (their KV lines) and
    a hybrid model's state pool (`state_ratio`)."""
    base = target_cell(ledger)
    if base is None:
        return None
    return base * (1.0 + draft_kv_ratio(ledger) + state_ratio(ledger))


def cell_from_fit(points: Sequence[tuple[float, int, float]]) -> float | None:
    """Bytes per token from launches at different fractions: (f, tokens, P) triples.

    N(f) is linear in f with slope `P·2^30 / cell`; the fit is good to a few bytes where one KV
    line, printed with two decimals, is good to a few hundred. Snapped to a multiple of 16 bytes
    (cells are whole vectors of 2-byte or 1-byte elements over every layer) when that is within
    the fit's precision.
    """
    fs = [f for f, _, _ in points]
    if len(set(fs)) < 2:
        return None
    n = len(points)
    mf = sum(fs) / n
    mn = sum(t for _, t, _ in points) / n
    sxx = sum((f - mf) ** 2 for f in fs)
    slope = sum((f - mf) * (t - mn) for f, t, _ in points) / sxx
    if slope <= 0:
        return None
    p = sum(pp for _, _, pp in points) / n
    cell = p * GIB / slope
    snapped = round(cell / 16) * 16
    return float(snapped) if abs(snapped - cell) <= max(4e-4 * cell, 8.0) else cell
