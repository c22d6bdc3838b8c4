"""SGLang's memory arithmetic for one launch, from its ledger, in the rules of its version: the
pool formula (`autotune.memory.pool`) at the launch's P, A and fraction, with the cells its log
implies (`autotune.memory.cell`).

`Arithmetic.at(f)` says what another fraction would give, holding P, A, both cells and every
post-pool allocation fixed (they do not depend on f): the pool moves by `P·Δf` GiB of budget, and
the free memory by that times the GPU bytes per token over the sizing cell.

One launch's figures that another package prints or decides by are the ones here, so the search,
the review, `init` and the progress line read a launch alike: the free memory after CUDA-graph
capture (`free_after_capture_gib`), where the reserve went (`Headroom`), the parts of P the log
shows (`startup_parts`), another fraction's prediction (`Arithmetic.at`) and what a fraction step
moves (`Arithmetic.per_step_gib`). The ceiling, built on one launch's `Arithmetic`, is
`autotune.memory.ceiling`'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autotune.logparse.ledger import Ledger
from autotune.logparse.semantics import Semantics, rules
from autotune.memory.cell import gpu_cell, sizing_cell, target_cell
from autotune.memory.pool import (
    GIB,
    fraction_for_budget,
    free_at_peak_gib,
    kv_budget_gib,
    kv_gib,
    pool_tokens,
    reserve_gib,
    tokens_for,
)

ROUNDING_GIB = 0.02
"""How far a launch's pool may depart from the formula by the rounding of the figures SGLang
prints (P and A to 0.01 GB) before the departure counts as the box's own (`pool_offset_tokens`)."""


def free_after_capture_gib(ledger: Ledger) -> float | None:
    """Free GPU memory once startup allocated everything, CUDA graphs included: the summary
    line's figure, else the one after graph capture (the last figure the log shows)."""
    if ledger.available_gpu_mem_gib is not None:
        return ledger.available_gpu_mem_gib
    return ledger.avail_after_graphs_gib


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

    @property
    def pool_offset_tokens(self) -> int:
        """How far the pool the launch's log counted departs from the formula at its own
        fraction, beyond what the printed figures' rounding explains (`ROUNDING_GIB`); 0 where it
        does not, or where `--max-total-tokens` held the pool. SGLang sizes the pool from the
        least free memory of every rank (0.5.23 `get_available_gpu_memory(distributed=True)`
        reduces it with MIN), while A is one rank's figure: a rank short of the others shows
        here, and it does not move with the fraction."""
        if self.tokens is None or self.tokens <= 0:
            return 0
        if self.tokens_cap is not None and self.tokens >= self.tokens_cap:
            return 0
        own = pool_tokens(self.p_gib, self.avail_after_weights_gib, self.fraction, self.cell_bytes)
        off = self.tokens - own
        return off if abs(off) * self.cell_bytes / GIB > ROUNDING_GIB else 0

    def at(self, fraction: float) -> AtFraction:
        """What `fraction` would give, all else equal. `kv_gib` is the target pool as its KV line
        would print it. The pool moves from the one the launch counted (`pool_offset_tokens`):
        what made it depart from the formula is part of "all else"."""
        tokens = pool_tokens(self.p_gib, self.avail_after_weights_gib, fraction, self.cell_bytes)
        tokens = max(tokens + self.pool_offset_tokens, 0)
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
