"""SGLang's memory arithmetic for one launch, from its ledger, in the rules of its version.

`mem_fraction_static` f is a fraction of P, the free memory per GPU measured before the weights
load. The KV pool gets `A − P·(1 − f)` GiB, A being what the weights left; the reserve `P·(1 − f)`
is the headroom that must hold everything allocated later: the request table, CUDA graphs,
workspaces and the transient peak of the forward pass. `max_running_requests` does not size the
pool; it sizes only the request table and the captured CUDA-graph batches.

Where the draft model goes depends on the version (`logparse.semantics`): up to 0.5.9 its
weights, KV pool and graphs come out of the reserve, and the pool is sized with the target's own
bytes per token; from 0.5.18 its weights are in A and an EAGLE draft's layers are folded into the
bytes per token the pool is sized with (`cell + int(cell·L_draft/L_target)`), so its KV is inside
the pool budget. Two cells follow: the *sizing* cell (the budget ÷ tokens) and the GPU bytes each
pool token really takes (target + draft KV lines). The draft is counted once, in whichever of the
two the version puts it.

`Arithmetic.at(f)` says what another fraction would give, holding P, A, both cells and every
post-pool allocation fixed (they do not depend on f): the pool moves by `P·Δf` GiB of budget, and
the free memory by that times the GPU bytes per token over the sizing cell.

Every figure of this kind that another package prints or decides by is one of the functions here,
so the search, the review, `init` and the progress line cannot drift apart: the reserve
(`reserve_gib`), the pool's budget and tokens (`kv_budget_gib`, `pool_tokens`), the fraction a
budget needs (`fraction_for_budget`, `lowest_fraction`), the free memory after CUDA-graph capture
(`free_after_capture_gib`), the stress peak and the free memory at it (`under_load`,
`stress_peak_gib`, `free_at_peak_gib`), what a fraction step moves (`Arithmetic.per_step_gib`)
and how many steps back cover missing headroom (`steps_to_cover`, `uncovered_gib`). The
ceiling, built on one launch's `Arithmetic`, is `autotune.memory.ceiling`'s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from autotune.logparse.ledger import Ledger
from autotune.logparse.semantics import Semantics, rules

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


def free_after_capture_gib(ledger: Ledger) -> float | None:
    """Free GPU memory once startup allocated everything, CUDA graphs included: the summary
    line's figure, else the one after graph capture (the last figure the log shows)."""
    if ledger.available_gpu_mem_gib is not None:
        return ledger.available_gpu_mem_gib
    return ledger.avail_after_graphs_gib


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


def uncovered_gib(missing_gib: float, per_step_gib: float, steps: int) -> float:
    """What of `missing_gib` backing off `steps` fraction steps of `per_step_gib` each leaves
    missing, never below 0 (the inverse of `steps_to_cover`)."""
    return max(0.0, missing_gib - steps * per_step_gib)


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


def held_by_cap(tokens: float | None, cap: int | None) -> bool:
    """Whether `--max-total-tokens` (`cap`) held a launch's pool of `tokens`: SGLang takes
    `min(capacity, max_total_tokens)`, so a pool at the cap says nothing of the budget's own
    size."""
    return cap is not None and tokens is not None and tokens >= cap


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


@dataclass(frozen=True)
class Headroom:
    """Where the reserve `P·(1 − f)` went, GiB per GPU; `other` is what the log lines leave
    unexplained (workspaces, NCCL and cuBLAS buffers), so the parts add up."""

    reserve: float
    request_table: float
    draft: float
    draft_weights: float
    draft_kv: float
    draft_graphs: float
    graphs: float
    other: float
    free: float


@dataclass(frozen=True)
class StartupParts:
    """Where P went at startup as the log's lines show it, GiB per GPU, each None where no line
    shows it: the weights, the KV pool, the draft (its weights, KV and graphs together), the
    request table, the CUDA graphs and a hybrid model's state pool. What they and the free
    memory after startup leave of P is `unexplained_gib` (workspaces, NCCL and cuBLAS
    buffers)."""

    weights_gib: float | None
    kv_gib: float | None
    draft_gib: float | None
    request_table_gib: float | None
    graphs_gib: float | None
    state_gib: float | None = None
    """A hybrid linear-attention model's Mamba state pool."""

    @property
    def used_gib(self) -> float:
        """The parts the log shows, added up (a missing one counts 0)."""
        used = 0.0
        for v in (
            self.weights_gib,
            self.kv_gib,
            self.state_gib,
            self.draft_gib,
            self.request_table_gib,
            self.graphs_gib,
        ):
            if v is not None:
                used += v
        return used

    def unexplained_gib(self, p_gib: float, free_gib: float) -> float:
        """What P less the parts and the free memory after startup leaves."""
        return p_gib - self.used_gib - free_gib


def startup_parts(ledger: Ledger) -> StartupParts:
    """The parts of P a launch's log shows (`StartupParts`)."""
    draft = [ledger.draft_weights_gib, ledger.draft_kv_gib, ledger.draft_graph_gib]
    return StartupParts(
        weights_gib=ledger.weights_gib,
        kv_gib=ledger.kv_gib,
        draft_gib=None if all(d is None for d in draft) else sum(d or 0.0 for d in draft),
        request_table_gib=ledger.req_to_token_gib,
        graphs_gib=ledger.graph_gib,
        state_gib=ledger.mamba_gib,
    )


@dataclass(frozen=True)
class AtFraction:
    """A prediction for another `mem_fraction_static`."""

    fraction: float
    kv_gib: float
    tokens: int
    reserve_gib: float
    static_free_gib: float | None
    free_at_peak_gib: float | None

    @property
    def kv_gb(self) -> float:
        """The target pool in decimal GB, the unit `--hicache-size` counts in."""
        return self.kv_gib * GIB / 1e9


@dataclass(frozen=True)
class Arithmetic:
    """The pool sizing of one launch: P, A, f, the cell and the resulting pool."""

    fraction: float
    p_gib: float
    avail_after_weights_gib: float
    weights_gib: float | None
    cell_bytes: float
    """The sizing cell: bytes per token the KV budget is divided by (fitted, or from the log)."""
    cell_exact: bool
    tokens: int | None
    kv_logged_gib: float | None
    draft_ratio: float
    """GPU bytes per pool token beyond the sizing cell, relative to it: the free memory lost per
    GiB of budget is `1 + draft_ratio`. Up to 0.5.9 the draft's KV per target KV byte (its pool
    has the same tokens and comes out of the reserve); from 0.5.18 the draft is already in the
    sizing cell, so only the difference between its real pool and the fold remains (about 0)."""
    headroom: Headroom | None
    stress_peak_gib: float | None
    kv_cell_bytes: float | None = None
    """The target pool's own bytes per token (its KV line); None falls back to `cell_bytes`."""
    semantics: str = "0.5.9"
    tokens_cap: int | None = None
    """`--max-total-tokens`: SGLang holds the pool to it whatever the budget
    (0.5.23 `mem_cache/kv_cache_configurator.py` `_apply_token_constraints`: `min(capacity,
    max_total_tokens)`), so above the fraction that reaches it the pool stops growing and what
    the budget holds beyond it stays free."""

    @property
    def reserve_gib(self) -> float:
        """`P·(1 − f)` at this launch's fraction."""
        return reserve_gib(self.p_gib, self.fraction)

    @property
    def kv_budget_gib(self) -> float:
        """`A − P·(1 − f)`: what SGLang hands the pool."""
        return kv_budget_gib(self.p_gib, self.avail_after_weights_gib, self.fraction)

    @property
    def tokens_from_formula(self) -> int:
        """The tokens the budget holds at the sizing cell (the log's own count may differ by
        the rounding of its printed figures)."""
        return tokens_for(self.kv_budget_gib, self.cell_bytes)

    @property
    def free_at_peak_gib(self) -> float | None:
        """Free memory after startup less the stress peak; None without either."""
        if self.headroom is None or self.stress_peak_gib is None:
            return None
        return free_at_peak_gib(self.headroom.free, self.stress_peak_gib)

    @property
    def free_per_fraction_gib(self) -> float:
        """GiB of free GPU memory one unit of f takes (the draft counted once)."""
        return self.p_gib * (1.0 + self.draft_ratio)

    def per_step_gib(self, step: float) -> float:
        """GiB of free GPU memory one fraction step of `step` hands back from the KV pool
        (`P × step × (1 + draft)`): what backing a setting off by one step buys."""
        return self.p_gib * step * (1.0 + self.draft_ratio)

    def budget_per_step_gib(self, step: float) -> float:
        """GiB of KV budget one fraction step of `step` moves (`P × step`)."""
        return self.p_gib * step

    def tokens_per_step(self, step: float) -> int:
        """Tokens of pool one fraction step of `step` moves, at the sizing cell."""
        return int(self.budget_per_step_gib(step) * GIB // self.cell_bytes)

    def fraction_for_tokens(self, tokens: int) -> float:
        """The fraction whose budget is exactly `tokens` at the sizing cell (unrounded)."""
        return fraction_for_budget(
            self.p_gib, self.avail_after_weights_gib, tokens * self.cell_bytes / GIB
        )

    def fraction_for_free(self, free_gib: float = 0.0) -> float | None:
        """The fraction at which the predicted free memory after startup is `free_gib`
        (unrounded); None without the free memory after startup, or where it does not move
        with f."""
        per_f = self.free_per_fraction_gib
        if self.headroom is None or per_f <= 0:
            return None
        return self.fraction + (self.headroom.free - free_gib) / per_f

    def at(self, fraction: float) -> AtFraction:
        """What `fraction` would give, all else equal. `kv_gib` is the target pool as its KV line
        would print it."""
        tokens = pool_tokens(self.p_gib, self.avail_after_weights_gib, fraction, self.cell_bytes)
        if self.tokens_cap is not None:
            tokens = min(tokens, self.tokens_cap)
        pool_cell = self.kv_cell_bytes or self.cell_bytes
        kv = kv_gib(tokens, pool_cell)
        static_free = None
        peak_free = None
        if self.headroom is not None and self.tokens is not None:
            moved = kv_gib(tokens, self.cell_bytes) - kv_gib(self.tokens, self.cell_bytes)
            static_free = self.headroom.free - moved * (1.0 + self.draft_ratio)
            if self.stress_peak_gib is not None:
                peak_free = free_at_peak_gib(static_free, self.stress_peak_gib)
        return AtFraction(
            fraction=fraction,
            kv_gib=kv,
            tokens=tokens,
            reserve_gib=reserve_gib(self.p_gib, fraction),
            static_free_gib=static_free,
            free_at_peak_gib=peak_free,
        )

    def highest_fraction(self, min_free_at_peak_gib: float, step: float) -> float | None:
        """The largest multiple of `step` whose predicted free memory at the stress peak is at
        least `min_free_at_peak_gib`; None without a measured peak."""
        free = self.free_at_peak_gib
        if free is None:
            return None
        room = (free - min_free_at_peak_gib) / self.free_per_fraction_gib
        n = math.floor((self.fraction + room) / step + 1e-9)
        return round(n * step, 6)


def arithmetic(
    ledger: Ledger,
    fraction: float,
    *,
    stress_peak_gib: float | None = None,
    cell_bytes: float | None = None,
) -> Arithmetic | None:
    """The arithmetic of one launch; None when the log did not show P and A.

    `cell_bytes` (the sizing cell, bytes per token) is best fitted across launches
    (`cell_from_fit`); without it the cell comes from the log (`sizing_cell`), good to the two
    decimals SGLang prints. The ledger's `semantics` says where the draft goes.
    """
    p, a = ledger.p_gib, ledger.avail_after_weights_gib
    if p is None or a is None:
        return None
    sem = rules(ledger.semantics)
    exact = cell_bytes is not None
    cell = cell_bytes if cell_bytes is not None else sizing_cell(ledger, fraction, sem)
    if cell is None or cell <= 0:
        return None
    pool_cell = target_cell(ledger)
    per_token = gpu_cell(ledger)
    if per_token is not None and pool_cell is not None and not exact:
        ratio = per_token / cell - 1.0
    elif per_token is not None and pool_cell is not None:
        # a fitted sizing cell: keep the log's ratio of GPU bytes to sizing bytes
        logged = sizing_cell(ledger, fraction, sem) or pool_cell
        ratio = per_token / logged - 1.0
        pool_cell = pool_cell * cell / logged
    else:
        ratio = 0.0
    return Arithmetic(
        fraction=fraction,
        p_gib=p,
        avail_after_weights_gib=a,
        weights_gib=ledger.weights_gib,
        cell_bytes=cell,
        cell_exact=exact,
        tokens=ledger.max_total_num_tokens,
        kv_logged_gib=ledger.kv_gib,
        draft_ratio=ratio,
        headroom=_headroom(ledger, reserve_gib(p, fraction), sem),
        stress_peak_gib=stress_peak_gib,
        kv_cell_bytes=pool_cell,
        semantics=sem.name,
        tokens_cap=ledger.max_total_tokens_cap,
    )


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


def _headroom(ledger: Ledger, reserve: float, sem: Semantics) -> Headroom | None:
    """Where the reserve went. Up to 0.5.9 it holds the draft's weights, KV and graphs; from
    0.5.18 the draft's weights are in A and its KV in the pool budget, so only its graphs are
    in the reserve (`draft_weights` and `draft_kv` are then 0 here)."""
    free = free_after_capture_gib(ledger)
    if free is None:
        return None
    table = ledger.req_to_token_gib or 0.0
    dw, dk, dg = (
        ledger.draft_weights_gib or 0.0,
        ledger.draft_kv_gib or 0.0,
        ledger.draft_graph_gib or 0.0,
    )
    in_pool = 0.0
    if sem.draft_in_budget:
        in_pool, dw, dk = dk, 0.0, 0.0
    graphs = ledger.graph_gib or 0.0
    # the pool's own rounding (the padding page) shows up as a few hundredths here
    kv_overshoot = 0.0
    if ledger.avail_after_weights_gib is not None and ledger.kv_gib is not None:
        state = ledger.mamba_gib or 0.0
        kv_overshoot = ledger.kv_gib + in_pool + state - (ledger.avail_after_weights_gib - reserve)
    other = reserve - kv_overshoot - table - dw - dk - dg - graphs - free
    return Headroom(
        reserve=reserve,
        request_table=table,
        draft=dw + dk + dg,
        draft_weights=dw,
        draft_kv=dk,
        draft_graphs=dg,
        graphs=graphs,
        other=round(other, 2) + 0.0,
        free=free,
    )
