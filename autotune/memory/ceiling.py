"""The ceiling: the pool the box would hold if the reserve held only what the trials measured it
needs.

One launch's arithmetic (`autotune.memory.arithmetic.Arithmetic`) says where its reserve
`P·(1 − f)` went and what its stress peak took; what the reserve must hold (`ReserveNeeds`: the
request table, the draft's part, the CUDA graphs, the workspaces, the stress peak and the
export's margin) and the largest pool that leaves (`Ceiling`, worked out by `ceiling`) are
built on it here, in the same formulas (`autotune.memory.pool`'s `kv_budget_gib`, `reserve_gib`,
`tokens_for`), so the ceiling every review surface prints cannot drift from the pool the search
sizes. It is a reading of a finished launch, not part of one launch's pool sizing: nothing in
`autotune.memory.arithmetic`, `pool` or `cell` depends on it.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.memory.arithmetic import Arithmetic
from autotune.memory.pool import held_by_cap, kv_budget_gib, reserve_gib, tokens_for


@dataclass(frozen=True)
class ReserveNeeds:
    """What the trials measured the reserve `P·(1 − f)` must hold, GiB per GPU of the rank that
    binds: the request table, the draft's part of the reserve (up to 0.5.9 its weights, KV and
    graphs; from 0.5.18 its graphs), the CUDA graphs, the workspaces (what the log lines leave
    unexplained: attention, MoE, NCCL and cuBLAS buffers, sampling; `Headroom.other`), the stress
    peak and the margin the export keeps free at the peak."""

    request_table: float
    draft: float
    graphs: float
    workspaces: float
    stress_peak: float
    margin: float

    @property
    def total(self) -> float:
        """Everything the reserve needs, added up."""
        return (
            self.request_table
            + self.draft
            + self.graphs
            + self.workspaces
            + self.stress_peak
            + self.margin
        )


@dataclass(frozen=True)
class Ceiling:
    """The largest KV pool the box would hold if the reserve held only what the trials measured
    it needs (`ReserveNeeds`), at the rank that binds.

    SGLang sizes the pool as `rest = A − P·(1 − f)` and `N = rest·2^30 ÷ cell`
    (sglang 0.5.23 `mem_cache/kv_cache_configurator.py`, `KVCacheConfigurator.
    _profile_available_bytes`: `available_gpu_memory − pre_model_load_memory·(1 −
    mem_fraction_static)`, both taken with `get_available_gpu_memory(distributed=True)`, the
    minimum over ranks; `model_executor/pool_configurator.py`: `available_bytes // cell_size`).
    P is the GPU's total less what was in use before the weights (CUDA context, NCCL, other
    processes: no flag moves it), A is P less the weights, so `A − needs` is the GPU's total less
    the weights less the measured needs. The ceiling is the pool at the fraction `fraction` (not
    on any step) at which the free memory at the stress peak equals the margin: everything the
    reserve holds beyond the needs moved into the pool. Each GiB of pool budget takes
    `1 + draft_ratio` GiB of free memory (up to 0.5.9 the draft's KV pool grows with the target's,
    out of the reserve), so the budget grows by the spare free memory ÷ `(1 + draft_ratio)`; the
    tokens are that budget at the sizing cell, the conversion every other pool figure uses
    (`tokens_for`). Every post-pool allocation (request table, graphs, workspaces) and the stress
    peak are held fixed, as `Arithmetic.at` holds them. Every figure is the binding rank's: the
    ledger takes P and A as the minimum over ranks and the usages as the maximum, and the free
    memory at the stress peak is the least any of the study's GPUs showed.

    `needs` is what the reserve holds at the ceiling (the draft's KV at the ceiling's pool);
    `reserve_gib` = the pool's rounding + `needs.total`.
    """

    fraction: float
    tokens: int
    p_gib: float
    avail_after_weights_gib: float
    cell_bytes: float
    draft_ratio: float
    needs: ReserveNeeds
    capped_at: int | None = None
    """`--max-total-tokens` where it held the launch's pool: the ceiling is what the box would
    hold without it."""

    @property
    def budget_gib(self) -> float:
        """`A − P·(1 − f*)`: the pool's budget at the ceiling."""
        return kv_budget_gib(self.p_gib, self.avail_after_weights_gib, self.fraction)

    @property
    def reserve_gib(self) -> float:
        """`P·(1 − f*)`: the reserve at the ceiling, what the needs take."""
        return reserve_gib(self.p_gib, self.fraction)

    def unused_gib(self, fraction: float) -> float:
        """GiB per GPU of the reserve at `fraction` that holds nothing the trials measured: the
        free memory at the stress peak beyond the margin, `(rest* − rest(f))·(1 + draft_ratio)`;
        negative where `fraction` is above the ceiling (the reserve is short by that much)."""
        rest = kv_budget_gib(self.p_gib, self.avail_after_weights_gib, fraction)
        return (self.budget_gib - rest) * (1.0 + self.draft_ratio)

    def needs_at(self, fraction: float) -> ReserveNeeds:
        """The needs as the reserve at `fraction` holds them: the draft's KV (up to 0.5.9) is
        that pool's, the rest does not move with f."""
        rest = kv_budget_gib(self.p_gib, self.avail_after_weights_gib, fraction)
        moved = (self.budget_gib - rest) * self.draft_ratio
        n = self.needs
        return ReserveNeeds(
            n.request_table, n.draft - moved, n.graphs, n.workspaces, n.stress_peak, n.margin
        )

    def share(self, tokens: int) -> float | None:
        """`tokens` as a share of the ceiling (1.0: at it; above 1: beyond what the needs
        leave); None where the needs leave no pool at all."""
        return tokens / self.tokens if self.tokens > 0 else None


def ceiling(a: Arithmetic, margin_gib: float) -> Ceiling | None:
    """The ceiling (`Ceiling`) of the launch `a` describes, keeping `margin_gib` free at the
    stress peak; None without the free memory after startup or the stress peak (a launch that
    did not start or did not serve a workload)."""
    h = a.headroom
    free = a.free_at_peak_gib
    if h is None or free is None or a.stress_peak_gib is None:
        return None
    per_f = a.free_per_fraction_gib
    if per_f <= 0:
        return None
    top = a.fraction + (free - margin_gib) / per_f
    rest = kv_budget_gib(a.p_gib, a.avail_after_weights_gib, top)
    grown = (rest - a.kv_budget_gib) * a.draft_ratio
    needs = ReserveNeeds(
        request_table=h.request_table,
        draft=h.draft + grown,
        graphs=h.graphs,
        workspaces=h.other,
        stress_peak=a.stress_peak_gib,
        margin=margin_gib,
    )
    return Ceiling(
        fraction=top,
        tokens=tokens_for(rest, a.cell_bytes),
        p_gib=a.p_gib,
        avail_after_weights_gib=a.avail_after_weights_gib,
        cell_bytes=a.cell_bytes,
        draft_ratio=a.draft_ratio,
        needs=needs,
        capped_at=a.tokens_cap if held_by_cap(a.tokens, a.tokens_cap) else None,
    )
