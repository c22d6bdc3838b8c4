"""The memory model fitted to the launches' ledgers: `fit` turns the observations of the
launches seen so far into the `MemoryModel` of `autotune.memory.model`, which owns what the
model says; this module owns only how it learns it.

Nothing here reads a simulator profile or a GPU; it learns from what trials recorded (with the
names of `autotune.logparse.ledger.Ledger`), in the rules of the SGLang version the logs show
(`autotune.logparse.semantics`):

* The pool line `N(f)`: with two launches at different f the slope and offset come straight
  from their token counts; with one, the slope is `P·2^30 / cell` and the cell is the version's
  (`cell.sizing_cell`).
* The GPU bytes per pool token are measured from the KV lines, never derived from the sizing
  cell.
* The overhead after the pool: the CUDA graphs as a line against the captured batch, the request
  table per slot, and the rest as one figure.
* The stress peak is measured in the stress phase (GPU peak minus static use) and fitted against
  max_running_requests, the prefill chunk and, once pools differ enough, the pool; a runtime OOM
  is only a floor under it.
* Every figure carries a standard deviation, no smaller than the log's rounding.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from autotune.logparse.outcome import Outcome
from autotune.logparse.semantics import Semantics, rules
from autotune.memory.cell import gpu_cell, sizing_cell
from autotune.memory.model import (
    CHUNK_SLOPE_REL_SD,
    MAX_GRAPH_BATCH,
    PEAK_TOKENS_PER_REQUEST,
    Estimate,
    GiB,
    Line,
    MemoryModel,
    Observation,
    PeakModel,
    Setting,
)
from autotune.memory.pool import held_by_cap, pool_tokens

LOG_ROUNDING_GIB = 0.005
"""SGLang prints GiB with two decimals."""
SPIKE_RATIO = 1.25
"""A stress peak this many times the largest other peak measured at the same requests and prefill
chunk is a spike of the peak's tail, not its spread."""
POOL_SPREAD = 0.05
"""Peaks measured at pools this far apart (a share of the largest) fit a term for the live
context; closer ones cannot tell it from noise."""


def fit(observations: Iterable[Observation]) -> MemoryModel:
    """Fit every part the observations allow; parts without data stay None."""
    obs = list(observations)
    sem = _semantics(obs)
    with_tokens = [o for o in obs if o.tokens and o.ledger.kv_gib]
    p = _mean_estimate(o.ledger.p_gib for o in obs)
    cell = _sizing_cell(with_tokens, sem)
    per_token = _gpu_cell(with_tokens)
    consumed = per_token / cell if per_token and cell else None
    slope, offset, tokens_sd = _tokens_line(with_tokens, p, cell)
    caps = [o.ledger.max_total_tokens_cap for o in obs if o.ledger.max_total_tokens_cap]
    if (
        slope is not None
        and p is not None
        and _distinct(o.setting.mem_fraction for o in with_tokens) >= 2
    ):
        cell = p.mean * GiB / slope
        if consumed is not None:
            per_token = cell * consumed  # the fitted cell, the logged draft share
    started = [o for o in obs if o.started and o.tokens and o.ledger.kv_gib is not None]
    slot_gib = _slot_gib(obs)
    graph, other = _overhead(started, cell, slot_gib)
    probe = _probe_offset(obs)
    return MemoryModel(
        p_gib=p,
        weights_gib=_mean([o.ledger.weights_gib for o in obs]),
        avail_after_weights=_mean_estimate(o.ledger.avail_after_weights_gib for o in obs),
        cell_bytes=cell,
        tokens_slope=slope,
        tokens_offset=offset,
        tokens_sd=tokens_sd,
        tokens_cap=min(caps) if caps else None,
        draft_ratio=_draft_ratio(with_tokens),
        kv_cell_bytes=per_token,
        semantics=sem.name,
        slot_gib=slot_gib,
        graph=graph,
        other_overhead=other,
        peak=_peak_model(obs),
        peak_floors=_peak_floors(obs, probe),
        host_bytes_per_token=_host_bytes_per_token(obs),
        host_draft_ratio=_host_draft_ratio(obs),
        host_free_gb=min((f for o in obs if (f := o.host_free_gb) is not None), default=None),
        host_budget_gb=min((b for o in obs if (b := o.host_budget_gb) is not None), default=None),
        ranks=max((o.ledger.host_ranks or o.ledger.ranks or 1 for o in obs), default=1),
        observations=len(obs),
        probe_offset=probe,
    )


def _peak_floors(obs: Sequence[Observation], offset: Estimate) -> tuple[tuple[Setting, float], ...]:
    """Each GPU out-of-memory under load's floor on the stress peak (not the KV pool's own
    slots, nor another crash: `Observation.gpu_oom_under_load`): the static free memory it ran
    out of, as the GPU probe sees it (the log's figure less the probe offset): the peak is
    measured by the probe, and the least rank, which runs out first, can hold less than rank 0's
    log shows."""
    return tuple(
        (o.setting, max(free - offset.mean, 0.0))
        for o in obs
        if o.gpu_oom_under_load and (free := o.static_free_gib) is not None
    )


def _semantics(obs: Sequence[Observation]) -> Semantics:
    """The rule set most observations name (a study runs one SGLang); 0.5.9's when none does."""
    names = [o.ledger.semantics for o in obs if o.ledger.semantics]
    if not names:
        return rules(None)
    return rules(max(sorted(set(names)), key=names.count))


def _probe_offset(obs: Sequence[Observation]) -> Estimate:
    """Log's static free − (probe's least free + probe's peak rise), where both were measured."""
    rows = [
        free - o.stress_peak_gib - o.headroom_gib
        for o in obs
        if o.outcome == "ok"
        and (free := o.static_free_gib) is not None
        and o.stress_peak_gib is not None
        and o.headroom_gib is not None
    ]
    if not rows:
        return Estimate(0.0, 0.0)
    spread = float(np.std(rows, ddof=1)) if len(rows) >= 2 else 0.0
    return Estimate(float(np.mean(rows)), max(spread, LOG_ROUNDING_GIB))


def _distinct(values: Iterable[object]) -> int:
    return len(set(values))


def _mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(np.mean(present)) if present else None


def _mean_estimate(values: Iterable[float | None]) -> Estimate | None:
    present = [v for v in values if v is not None]
    if not present:
        return None
    spread = float(np.std(present, ddof=1)) if len(present) >= 2 else 0.0
    return Estimate(float(np.mean(present)), max(spread, LOG_ROUNDING_GIB))


def _largest_pool(obs: Sequence[Observation]) -> Observation | None:
    return max(obs, key=lambda x: x.ledger.kv_gib or 0.0) if obs else None


def _sizing_cell(obs: Sequence[Observation], sem: Semantics) -> float | None:
    """Bytes per token the budget was divided by, from the largest pool (its KV line is the most
    precise), in the version's rules: the draft folded in from 0.5.18."""
    o = _largest_pool(obs)
    return sizing_cell(o.ledger, o.setting.mem_fraction, sem) if o is not None else None


def _gpu_cell(obs: Sequence[Observation]) -> float | None:
    """GPU bytes per pool token, target and draft KV lines together (largest pool)."""
    o = _largest_pool(obs)
    return gpu_cell(o.ledger) if o is not None else None


def _tokens_line(
    obs: Sequence[Observation], p: Estimate | None, cell: float | None
) -> tuple[float | None, float | None, float]:
    """N(f) = slope·f − offset, fitted on (f, N) pairs, or through one pair with slope P/cell."""
    if not obs:
        return None, None, 0.0
    fs = [o.setting.mem_fraction for o in obs]
    ns = [_sized_tokens(o, cell) for o in obs]
    if len(set(fs)) >= 2:
        a = np.vstack([np.asarray(fs), -np.ones(len(fs))]).T
        coef, *_ = np.linalg.lstsq(a, np.asarray(ns), rcond=None)
        resid = np.asarray(ns) - a @ coef
        sd = float(math.sqrt(float(resid @ resid) / max(len(fs) - 2, 1)))
        return float(coef[0]), float(coef[1]), max(sd, 1.0)
    if p is None or cell is None:
        return None, None, 0.0
    slope = p.mean * GiB / cell
    offset = float(np.mean([slope * f - n for f, n in zip(fs, ns, strict=True)]))
    # the cell read from a two-decimal KV line is good to ~0.005 GiB over the whole pool
    rel = LOG_ROUNDING_GIB / max(o.ledger.kv_gib or 1.0 for o in obs)
    return slope, offset, max(rel * slope * 0.05, 1.0)


def _sized_tokens(o: Observation, cell: float | None) -> float:
    """The pool SGLang's linear sizing gave the launch: its logged tokens, or, where
    `--max-total-tokens` held the pool below it, the budget at the sizing cell (the line the
    uncapped launches follow, which the cap then cuts)."""
    n = float(o.tokens or 0)
    led = o.ledger
    if not held_by_cap(n, led.max_total_tokens_cap) or not cell:
        return n
    if led.p_gib is None or led.avail_after_weights_gib is None:
        return n
    return float(pool_tokens(led.p_gib, led.avail_after_weights_gib, o.setting.mem_fraction, cell))


def _draft_ratio(obs: Sequence[Observation]) -> float:
    ratios = [
        (o.ledger.draft_kv_gib or 0.0) / o.ledger.kv_gib
        for o in obs
        if o.ledger.kv_gib and o.ledger.draft_kv_gib is not None
    ]
    return float(np.median(ratios)) if ratios else 0.0


def _slot_gib(obs: Sequence[Observation]) -> float:
    """Request-table GiB per slot: measured when the table is big enough to read, else
    SGLang's formula slots × (context + 4 + draft tokens) × 4 B."""
    measured = [
        o.ledger.req_to_token_gib / o.slots
        for o in obs
        if o.ledger.req_to_token_gib and o.ledger.req_to_token_gib >= 0.2 and o.slots
    ]
    if measured:
        return float(np.median(measured))
    contexts = [o.ledger.context_len for o in obs if o.ledger.context_len]
    return (max(contexts) + 8) * 4 / GiB if contexts else 0.0


def _overhead(
    obs: Sequence[Observation], cell: float | None, slot_gib: float
) -> tuple[Line | None, Estimate | None]:
    """Graph memory against the captured batch, and the rest of the post-pool overhead."""
    if not obs or cell is None:
        return None, None
    xs, graphs, others = [], [], []
    for o in obs:
        led = o.ledger
        free = o.static_free_gib
        slots = o.slots
        if free is None or slots is None or led.avail_after_weights_gib is None:
            continue
        kv = (led.kv_gib or 0.0) + (led.draft_kv_gib or 0.0) + (led.mamba_gib or 0.0)
        overhead = led.avail_after_weights_gib - free - kv
        graph = (led.graph_gib or 0.0) + (led.draft_graph_gib or 0.0)
        xs.append(float(min(slots, MAX_GRAPH_BATCH)))
        graphs.append(graph)
        others.append(overhead - graph - slot_gib * slots)
    if not xs:
        return None, None
    x0 = xs[0]
    prior = 0.5 * graphs[0] / max(x0, 1.0)
    line = fit_line(
        xs, graphs, prior_slope=prior, prior_slope_sd=prior, floor_sd=2 * LOG_ROUNDING_GIB
    )
    other = Estimate(
        float(np.mean(others)),
        max(float(np.std(others, ddof=1)) if len(others) >= 2 else 0.0, 3 * LOG_ROUNDING_GIB),
    )
    return line, other


def _peak_model(obs: Sequence[Observation]) -> PeakModel | None:
    # what a launch that ran out of memory under load saw before it died is no measure of the
    # peak, only a floor under it (`peak_floors`)
    rows = [
        (float(o.slots or 0), float(o.chunk or 0), float(o.tokens or 0), peak)
        for o in obs
        if (peak := o.measured_peak_gib) is not None and not Outcome.of(o.outcome).fails_at_runtime
    ]
    # a rare spike would widen every prediction's spread by one event: the fit leaves it out
    # (the calibration still scores the launch, `search.calibration`)
    rows = [row for i, row in enumerate(rows) if not _spiked(row, rows[:i] + rows[i + 1 :])]
    if not rows:
        return None
    rs = [r for r, _, _, _ in rows]
    cs = [c for _, c, _, _ in rows]
    ts = np.asarray([t for _, _, t, _ in rows])
    ys = np.asarray([y for _, _, _, y in rows])
    mean_y = float(np.mean(ys))
    c_ref = max(cs) or 8192.0
    # priors: a decode sequence weighs ≤ PEAK_TOKENS_PER_REQUEST prefill tokens; the peak is
    # proportional to the chunk
    r_sd = mean_y * PEAK_TOKENS_PER_REQUEST / c_ref
    c_prior = 0.0 if c_ref <= 0 else mean_y / c_ref
    fit_r = len(set(rs)) >= 2
    fit_c = len(set(cs)) >= 2
    # the live context a stress phase builds is the pool it fills: a term for it once launches
    # of pools that differ by POOL_SPREAD measured peaks, with a residual left to judge it by
    t_mean = float(np.mean(ts))
    fit_t = float(np.ptp(ts)) >= POOL_SPREAD * float(np.max(ts)) > 0
    while True:
        cols = [np.ones(len(rows))]
        if fit_r:
            cols.append(np.asarray(rs))
        if fit_c:
            cols.append(np.asarray(cs))
        if fit_t and len(rows) > len(cols) + 1:
            cols.append(ts - t_mean)
        else:
            fit_t = False
        a = np.vstack(cols).T
        coef, *_ = np.linalg.lstsq(a, ys, rcond=None)
        # a peak that shrinks with more requests, a bigger chunk or a bigger pool is noise:
        # drop that term
        j_c = 1 + fit_r
        if fit_r and coef[1] < 0:
            fit_r = False
        elif fit_c and coef[j_c] < 0:
            fit_c = False
        elif fit_t and coef[-1] < 0:
            fit_t = False
        else:
            break
    resid = ys - a @ coef
    k = a.shape[1]
    # the peak of a stress phase is the largest of its forwards' peaks: it varies launch to
    # launch by a few percent even where nothing else changes
    floor = 0.04 * mean_y + 0.02 if len(rows) >= 2 else 0.05 * mean_y + 0.05
    sd = float(math.sqrt(float(resid @ resid) / (len(rows) - k))) if len(rows) > k else 0.0
    sd = max(sd, floor)
    per_r = float(coef[1]) if fit_r else 0.0
    per_c = float(coef[1 + fit_r]) if fit_c else c_prior
    per_t, per_t_sd = 0.0, 0.0
    if fit_t:
        per_t = float(coef[-1])
        per_t_sd = sd * math.sqrt(float(np.linalg.pinv(a.T @ a)[-1, -1]))
    base = float(coef[0])
    if not fit_c:
        base -= per_c * cs[0]
    return PeakModel(
        base=base,
        per_request=per_r,
        per_request_sd=0.0 if fit_r else r_sd,
        per_chunk_token=per_c,
        per_chunk_token_sd=0.0 if fit_c else CHUNK_SLOPE_REL_SD * c_prior,
        sd=sd,
        slots_seen=tuple(sorted({int(r) for r in rs})),
        chunks_seen=tuple(sorted({int(c) for c in cs})),
        per_pool_token=per_t,
        per_pool_token_sd=per_t_sd,
        pool_mean=t_mean,
    )


def _spiked(
    row: tuple[float, float, float, float], others: Sequence[tuple[float, float, float, float]]
) -> bool:
    """The row's peak is over SPIKE_RATIO times every other peak of the same requests and chunk."""
    same = [y for r, c, _, y in others if (r, c) == row[:2]]
    return bool(same) and row[3] > SPIKE_RATIO * max(same)


def _host_draft_ratio(obs: Sequence[Observation]) -> float:
    rows = [
        o.ledger.draft_host_cache_gb / o.ledger.host_cache_gb
        for o in obs
        if o.ledger.host_cache_gb and o.ledger.draft_host_cache_gb is not None
    ]
    return float(np.median(rows)) if rows else 0.0


def _host_bytes_per_token(obs: Sequence[Observation]) -> float | None:
    rows = [
        o.ledger.host_cache_gb * 1e9 / o.ledger.host_cache_tokens
        for o in obs
        if o.ledger.host_cache_gb and o.ledger.host_cache_tokens
    ]
    return float(np.median(rows)) if rows else None


def fit_line(
    xs: Sequence[float],
    ys: Sequence[float],
    *,
    prior_slope: float,
    prior_slope_sd: float,
    floor_sd: float,
) -> Line:
    """Least squares when x varies, else the mean with a prior slope through it."""
    distinct = sorted(set(xs))
    if len(distinct) >= 2:
        a = np.vstack([np.ones(len(xs)), np.asarray(xs, dtype=float)]).T
        coef, *_ = np.linalg.lstsq(a, np.asarray(ys, dtype=float), rcond=None)
        resid = np.asarray(ys) - a @ coef
        dof = max(len(xs) - 2, 1)
        sd = max(float(math.sqrt(float(resid @ resid) / dof)), floor_sd)
        return Line(float(coef[0]), float(coef[1]), sd, sd / max(np.ptp(xs), 1e-9), tuple(xs))
    mean = float(np.mean(ys))
    spread = float(np.std(ys, ddof=1)) if len(ys) >= 2 else 0.0
    x0 = distinct[0]
    return Line(
        mean - prior_slope * x0, prior_slope, max(spread, floor_sd), prior_slope_sd, tuple(xs)
    )
