"""SGLang's memory arithmetic for one launch, from its ledger (reference/sglang.md §1).

`mem_fraction_static` f is a fraction of P, the free memory per GPU measured before the weights
load. The KV pool gets `A − P·(1 − f)` GiB, A being what the weights left; the reserve `P·(1 − f)`
is the headroom that must hold everything allocated later: the request table, the draft model,
CUDA graphs, workspaces, and the transient peak of the forward pass. `max_running_requests` does
not size the pool; it sizes only the request table and the captured CUDA-graph batches.

`Arithmetic.at(f)` says what another fraction would give, holding P, A, the bytes per token and
every post-pool allocation fixed (they do not depend on f): the pool moves by `P·Δf` GiB and the
free memory by the same amount the other way (plus the draft's share of KV).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from autotune.logparse.ledger import Ledger

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
class AtFraction:
    """A prediction for another `mem_fraction_static`."""

    fraction: float
    kv_gib: float
    tokens: int
    reserve_gib: float
    static_free_gib: float | None
    free_at_peak_gib: float | None


@dataclass(frozen=True)
class Arithmetic:
    """The pool sizing of one launch: P, A, f, the cell and the resulting pool."""

    fraction: float
    p_gib: float
    avail_after_weights_gib: float
    weights_gib: float | None
    cell_bytes: float
    cell_exact: bool
    tokens: int | None
    kv_logged_gib: float | None
    draft_ratio: float
    headroom: Headroom | None
    stress_peak_gib: float | None

    @property
    def reserve_gib(self) -> float:
        return self.p_gib * (1.0 - self.fraction)

    @property
    def kv_budget_gib(self) -> float:
        """`A − P·(1 − f)`: what SGLang hands the pool."""
        return self.avail_after_weights_gib - self.reserve_gib

    @property
    def tokens_from_formula(self) -> int:
        return tokens_for(self.kv_budget_gib, self.cell_bytes)

    @property
    def free_at_peak_gib(self) -> float | None:
        if self.headroom is None or self.stress_peak_gib is None:
            return None
        return self.headroom.free - self.stress_peak_gib

    def at(self, fraction: float) -> AtFraction:
        """What `fraction` would give, all else equal."""
        budget = self.avail_after_weights_gib - self.p_gib * (1.0 - fraction)
        tokens = tokens_for(budget, self.cell_bytes)
        kv = kv_gib(tokens, self.cell_bytes)
        static_free = None
        peak_free = None
        if self.headroom is not None and self.tokens is not None:
            now_kv = kv_gib(self.tokens, self.cell_bytes)
            static_free = self.headroom.free - (kv - now_kv) * (1.0 + self.draft_ratio)
            if self.stress_peak_gib is not None:
                peak_free = static_free - self.stress_peak_gib
        return AtFraction(
            fraction=fraction,
            kv_gib=kv,
            tokens=tokens,
            reserve_gib=self.p_gib * (1.0 - fraction),
            static_free_gib=static_free,
            free_at_peak_gib=peak_free,
        )

    def highest_fraction(self, min_free_at_peak_gib: float, step: float) -> float | None:
        """The largest multiple of `step` whose predicted free memory at the stress peak is at
        least `min_free_at_peak_gib`; None without a measured peak."""
        free = self.free_at_peak_gib
        if free is None:
            return None
        room = (free - min_free_at_peak_gib) / (self.p_gib * (1.0 + self.draft_ratio))
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

    `cell_bytes` (bytes per token) is best fitted across launches (`cell_from_fit`); without it
    the cell is read from the KV line, good to the two decimals SGLang prints.
    """
    p, a = ledger.p_gib, ledger.avail_after_weights_gib
    if p is None or a is None:
        return None
    exact = cell_bytes is not None
    cell = cell_bytes if cell_bytes is not None else _cell_from_kv_line(ledger, p, a, fraction)
    if cell is None or cell <= 0:
        return None
    return Arithmetic(
        fraction=fraction,
        p_gib=p,
        avail_after_weights_gib=a,
        weights_gib=ledger.weights_gib,
        cell_bytes=cell,
        cell_exact=exact,
        tokens=ledger.max_total_num_tokens,
        kv_logged_gib=ledger.kv_gib,
        draft_ratio=(ledger.draft_kv_gib or 0.0) / ledger.kv_gib if ledger.kv_gib else 0.0,
        headroom=_headroom(ledger, p * (1.0 - fraction)),
        stress_peak_gib=stress_peak_gib,
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


def _cell_from_kv_line(ledger: Ledger, p: float, a: float, f: float) -> float | None:
    if ledger.max_total_num_tokens and ledger.kv_gib:
        return cell_from_kv(ledger.kv_gib, ledger.max_total_num_tokens)
    return None


def _headroom(ledger: Ledger, reserve: float) -> Headroom | None:
    free = (
        ledger.available_gpu_mem_gib
        if ledger.available_gpu_mem_gib is not None
        else ledger.avail_after_graphs_gib
    )
    if free is None:
        return None
    table = ledger.req_to_token_gib or 0.0
    dw, dk, dg = (
        ledger.draft_weights_gib or 0.0,
        ledger.draft_kv_gib or 0.0,
        ledger.draft_graph_gib or 0.0,
    )
    graphs = ledger.graph_gib or 0.0
    # the pool's own rounding (the padding page) shows up as a few hundredths here
    kv_overshoot = 0.0
    if ledger.avail_after_weights_gib is not None and ledger.kv_gib is not None:
        kv_overshoot = ledger.kv_gib - (ledger.avail_after_weights_gib - reserve)
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
