"""Plot data: small NamedTuples extracted from trial views, one per figure (pure).

The renderers (`autotune.review.html`, `autotune.review.png`) only draw what is here, so tests
assert on these values rather than on pixels. A figure adapts to the study: when its axis was not
searched (one value in every trial) or its objective did not vary beyond its noise, its `note`
says so and the renderers print that sentence instead of an empty or misleading chart. Trials
that were never launched (skipped) are not drawn at all, and every figure of a trial is the one
its view computes (`autotune.record.view`), so a chart says what `status` and `explain` say.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from autotune.config.schema import FRACTION, REQUESTS
from autotune.memory import fit as memory_fit
from autotune.memory.arithmetic import startup_parts
from autotune.memory.cell import cell_from_fit
from autotune.record.view import TrialView
from autotune.review import figures as fig
from autotune.search.records import observation_of

MODEL_POINTS = 41
DEFAULT_NOISE = 0.05
"""Relative throughput differences below this are noise (the winner's default tolerance)."""


class Point(NamedTuple):
    """One trial on a scatter: its number, coordinates, kind (the colour) and hover label."""

    number: int
    x: float
    y: float
    kind: str
    label: str


class ParetoData(NamedTuple):
    """Capacity (x) against throughput (y); the front joins the non-dominated feasible trials."""

    points: tuple[Point, ...]
    front: tuple[int, ...]
    winner: int | None
    chosen: int | None
    confirmed: bool | None
    winner_label: str = "exported"
    note: str = ""
    """When set, the figure says nothing: this sentence replaces it."""


class FeasibilityData(NamedTuple):
    """mem_fraction_static (x) × max_running_requests (y), one point per trial, by outcome."""

    points: tuple[Point, ...]
    outcomes: tuple[str, ...]
    """Outcome of each point, in the same order (the kind says how it is drawn)."""
    note: str = ""
    """When set (an axis was not searched), this sentence replaces the map."""


class CapacityData(NamedTuple):
    """KV capacity against mem_fraction_static, the fitted line and the OOM edge."""

    points: tuple[Point, ...]
    line_x: tuple[float, ...]
    line_y: tuple[float, ...]
    line_source: str
    """Which fit drew the line: the memory model, or a least-squares line over the ledgers."""
    oom_edge: float | None
    """The lowest fraction that ran out of memory."""
    stable_edge: float | None
    """The highest fraction that was feasible."""
    note: str = ""
    """When set (the fraction was not searched), this sentence replaces the chart."""


class Step(NamedTuple):
    """One bar of a ledger waterfall: a label, GiB, and whether it is an absolute start, a change or
    a total (plotly's `measure`)."""

    label: str
    value: float
    measure: str  # absolute | relative | total


class WaterfallData(NamedTuple):
    """Where one GPU's memory went in one trial, from P down to the free memory at the peak."""

    number: int
    title: str
    steps: tuple[Step, ...]
    reserve_gib: float | None
    """`P·(1 − f)`: the reserve SGLang leaves outside the static budget."""
    min_headroom_gib: float | None
    stress_peak_gib: float | None
    free_at_peak_gib: float | None
    """The headroom left at the worst moment (the trial view's figure)."""


class LoadPoint(NamedTuple):
    """One served trial on the load figure: its request slots, throughput and p99 latencies."""

    number: int
    requests: float
    throughput: float | None
    p99_ttft_ms: float | None
    p99_itl_ms: float | None
    kind: str


class LoadData(NamedTuple):
    """Throughput and latency against max_running_requests (trials that served the workload)."""

    points: tuple[LoadPoint, ...]
    note: str = ""
    """When set (max_running_requests was not searched), this sentence replaces the chart."""
    flat: str = ""
    """When set, throughput did not vary beyond its noise: it is left out, latency is drawn."""


class HistoryData(NamedTuple):
    """Capacity per trial in the order they ran, and the best feasible capacity so far."""

    points: tuple[Point, ...]
    best_x: tuple[float, ...]
    best_y: tuple[float, ...]


class Row(NamedTuple):
    """One trial's row of the trials table, every figure already formatted as text."""

    number: int
    state: str
    outcome: str
    kind: str
    params: str
    capacity: str
    throughput: str
    free: str
    """Free after startup (GiB)."""
    headroom: str
    """Free at the worst moment (GiB)."""
    peak: str
    p99_ttft: str
    p99_itl: str
    seconds: str
    reason: str
    log_path: str | None


# ------------------------------------------------------------------------------------------------


def drawn(trials: Sequence[TrialView]) -> list[TrialView]:
    """The trials a figure may draw: launched ones (skipped trials never ran)."""
    return [t for t in trials if t.launched]


def throughput_noise(trials: Sequence[TrialView], tolerance: float = DEFAULT_NOISE) -> float:
    """How much throughput differs without meaning anything, tok/s: the spread between trials
    of the same parameters, and at least `tolerance` of the best (the winner treats throughput
    within it as a tie)."""
    served = [t for t in trials if t.throughput_tok_s is not None]
    best = max((t.throughput_tok_s or 0.0 for t in served), default=0.0)
    groups: dict[str, list[float]] = {}
    for t in served:
        groups.setdefault(repr(sorted(t.params.items())), []).append(t.throughput_tok_s or 0.0)
    repeats = max((max(g) - min(g) for g in groups.values() if len(g) > 1), default=0.0)
    return max(repeats, tolerance * best)


def _flat_throughput(trials: Sequence[TrialView], tolerance: float) -> str:
    """A sentence when the served trials' throughput stayed within its noise, else ""."""
    served = [t.throughput_tok_s for t in trials if t.throughput_tok_s is not None]
    if len(served) < 2:
        return ""
    lo, hi = min(served), max(served)
    noise = throughput_noise(trials, tolerance)
    if hi - lo > noise:
        return ""
    return (
        f"Throughput did not vary beyond its noise: {lo:,.0f}–{hi:,.0f} tok/s over the "
        f"{len(served)} trials that served the workload (noise {noise:,.1f} tok/s: "
        f"{tolerance:.0%} of the best, or the spread of repeated settings)"
    )


def pareto(
    trials: Sequence[TrialView],
    *,
    winner: int | None = None,
    chosen: int | None = None,
    confirmed: bool | None = None,
    predicted: bool = False,
    tolerance: float = DEFAULT_NOISE,
) -> ParetoData:
    """The capacity × throughput figure's data: counted trials with a capacity, the feasible Pareto
    front, the exported trial and its label; a note instead when throughput did not vary beyond
    `tolerance`."""
    points = tuple(
        Point(t.number, float(t.capacity_tokens or 0), float(t.throughput_tok_s or 0.0), t.kind,
              t.label())
        for t in drawn(trials)
        if t.kind != "running" and t.counted
        and (t.capacity_tokens is not None or t.kind == "feasible")
    )  # fmt: skip
    feasible = [p for p in points if p.kind == "feasible"]
    front = [
        p
        for p in feasible
        if not any((q.x >= p.x and q.y >= p.y) and (q.x > p.x or q.y > p.y) for q in feasible)
    ]
    front.sort(key=lambda p: p.x)
    label = "chosen; exported backed off (predicted)" if predicted else "exported"
    if not confirmed:
        label += " (UNCONFIRMED)" if confirmed is None else " (FAILED confirmation)"
    note = _flat_throughput(trials, tolerance)
    if note:
        note += (
            ": there is no capacity/throughput trade-off to draw, capacity decides "
            "(see KV capacity vs mem_fraction_static)."
        )
    elif len(feasible) < 2:
        note = (
            f"{len(feasible)} feasible trial{'s' if len(feasible) != 1 else ''} so far: "
            "no trade-off between capacity and throughput to draw yet."
        )
    return ParetoData(
        points, tuple(p.number for p in front), winner, chosen, confirmed, label, note
    )


def _values(trials: Sequence[TrialView], name: str) -> list[float]:
    out = []
    for t in trials:
        v = t.fraction if name == FRACTION else t.requests if name == REQUESTS else None
        if v is not None:
            out.append(float(v))
    return sorted(set(out))


def not_searched(trials: Sequence[TrialView], name: str) -> str:
    """A sentence when every launched trial ran one value of `name` (or none), else ""."""
    values = _values(drawn(trials), name)
    if len(values) > 1:
        return ""
    if not values:
        return f"{name} is not in these trials: nothing to draw along it."
    return f"{name} was {fig.scalar(_int_or(values[0]))} in every trial (not searched)"


def _int_or(v: float) -> float | int:
    return int(v) if float(v).is_integer() else v


def feasibility(trials: Sequence[TrialView]) -> FeasibilityData:
    """The outcome map's data over `mem_fraction_static` × `max_running_requests`; a note instead
    when either was not searched."""
    kept = [t for t in drawn(trials) if t.fraction is not None]
    points = tuple(
        Point(t.number, float(t.fraction or 0.0), float(t.requests or 0), t.kind, t.label())
        for t in kept
    )
    note = ""
    for name in (REQUESTS, FRACTION):
        why = not_searched(trials, name)
        if why:
            note = (
                f"{why}: the map of mem_fraction_static × max_running_requests would be a "
                "single line; the outcomes by fraction are in the capacity chart and the "
                "trials table."
            )
            break
    return FeasibilityData(points, tuple(t.outcome or t.state for t in kept), note)


def capacity(trials: Sequence[TrialView]) -> CapacityData:
    """The capacity figure's data: pool tokens per fraction, the memory model's line (else a
    least-squares one), the first OOM and highest feasible fractions; a note when the fraction was
    not searched."""
    trials = drawn(trials)
    kept = [t for t in trials if t.fraction is not None and t.capacity_tokens]
    points = tuple(
        Point(t.number, float(t.fraction or 0.0), float(t.capacity_tokens or 0), t.kind,
              t.label())
        for t in kept
    )  # fmt: skip
    xs = [p.x for p in points]
    line_x: tuple[float, ...] = ()
    line_y: tuple[float, ...] = ()
    source = "no line: capacities at fewer than two fractions"
    fractions = [t.fraction for t in trials if t.fraction is not None]
    if fractions:
        lo, hi = min(fractions), max(fractions)
        pad = max((hi - lo) * 0.05, 0.005)
        grid = np.linspace(lo - pad, hi + pad, MODEL_POINTS)
        fitted = _model_tokens(trials, grid)
        if fitted is not None:
            line_y, source = fitted
            line_x = tuple(float(x) for x in grid)
        elif len(set(xs)) >= 2:
            slope, icpt = np.polyfit(xs, [p.y for p in points], 1)
            line_x = tuple(float(x) for x in grid)
            line_y = tuple(float(max(icpt + slope * x, 0.0)) for x in grid)
            source = f"least-squares line over {len(points)} ledgers"
    ooms = [t.fraction for t in trials if t.kind == "oom" and t.fraction is not None]
    stable = [t.fraction for t in trials if t.feasible and t.fraction is not None]
    why = not_searched(trials, FRACTION)
    return CapacityData(
        points,
        line_x,
        line_y,
        source,
        min(ooms) if ooms else None,
        max(stable) if stable else None,
        f"{why}: the pool's size along it cannot be drawn; see the trials table." if why else "",
    )


def _model_tokens(
    trials: Sequence[TrialView], grid: np.ndarray
) -> tuple[tuple[float, ...], str] | None:
    """The memory model's N(f), when `autotune.memory.fit` can fit one from these trials, each
    read as the search reads it (`search.records.observation_of`)."""
    try:
        obs = [
            o
            for t in trials
            if t.kind != "running" and (o := observation_of(t, t.params)) is not None
        ]
        model = memory_fit.fit(obs)
        ys = []
        for x in grid:
            est = model.tokens(float(x))
            if est is None:
                return None
            ys.append(max(est.mean, 0.0))
    except (ImportError, AttributeError, TypeError, ValueError, ArithmeticError):
        return None
    return tuple(
        ys
    ), f"memory model (autotune.memory.model) fitted to {model.observations} launches"


def waterfall(
    t: TrialView, *, cell_bytes: float | None = None, min_headroom_gib: float | None = None
) -> WaterfallData:
    """The memory ledger of one trial, per GPU (SGLang takes the tightest GPU's figures); the
    free memory after startup, the stress peak and the free memory at the worst moment are the
    trial view's own figures."""
    led = t.ledger
    steps: list[Step] = []
    if led.p_gib is not None:
        steps.append(Step("P (free before weights)", led.p_gib, "absolute"))
    shown = startup_parts(led)
    parts = [
        ("weights", shown.weights_gib),
        ("KV pool", shown.kv_gib),
        ("Mamba state pool", shown.state_gib),
        ("draft (weights, KV, graphs)", shown.draft_gib),
        ("request table", shown.request_table_gib),
        ("CUDA graphs", shown.graphs_gib),
    ]
    for label, value in parts:
        if value is not None:
            steps.append(Step(label, -value, "relative"))
    free = t.static_free_gib
    peak = t.stress_peak_gib
    at_peak = t.free_at_peak_gib
    if free is not None and led.p_gib is not None:
        other = shown.unexplained_gib(led.p_gib, free)
        if abs(other) >= 0.005:
            steps.append(Step("other (workspaces)", -other, "relative"))
        steps.append(Step("free after startup", free, "total"))
        if peak is not None and at_peak is not None:
            steps.append(Step("stress peak", -peak, "relative"))
            steps.append(Step(f"{fig.FREE_AT_WORST}", at_peak, "total"))
    title = f"trial {t.label()}: {t.outcome or t.state}"
    return WaterfallData(
        t.number, title, tuple(steps), t.reserve_gib, min_headroom_gib, peak, at_peak
    )


def load(trials: Sequence[TrialView], *, tolerance: float = DEFAULT_NOISE) -> LoadData:
    """The load figure's data: the trials that served, by request slots; a note when the slots were
    not searched, `flat` when throughput did not vary beyond `tolerance`."""
    points = tuple(
        LoadPoint(t.number, float(t.requests or 0), t.throughput_tok_s, t.p99_ttft_ms,
                  t.p99_itl_ms, t.kind)
        for t in trials
        if t.outcome == "ok" and t.requests is not None
    )  # fmt: skip
    why = not_searched(trials, REQUESTS)
    note = ""
    if why:
        note = (
            f"{why}: throughput and latency against it would stand on one vertical line; "
            "the trials table has each trial's figures."
        )
    flat = _flat_throughput(trials, tolerance)
    return LoadData(points, note, flat)


def history(trials: Sequence[TrialView]) -> HistoryData:
    """The search history's data: each drawn trial's capacity by number, and the best feasible
    capacity so far."""
    ordered = sorted(drawn(trials), key=lambda t: t.number)
    points = tuple(
        Point(t.number, float(t.number), float(t.capacity_tokens or 0), t.kind, t.label())
        for t in ordered
        if t.capacity_tokens is not None
    )
    best_x: list[float] = []
    best_y: list[float] = []
    best: float | None = None
    for t in ordered:
        if t.feasible and t.capacity_tokens is not None:
            best = max(best or 0.0, float(t.capacity_tokens))
        if best is not None:
            best_x.append(float(t.number))
            best_y.append(best)
    return HistoryData(points, tuple(best_x), tuple(best_y))


def table(trials: Sequence[TrialView]) -> tuple[Row, ...]:
    """The trials table's rows, in trial order."""
    return tuple(_row(t) for t in sorted(trials, key=lambda t: t.number))


def _row(t: TrialView) -> Row:
    return Row(
        number=t.number,
        state=t.state,
        outcome=t.outcome,
        kind=t.kind,
        params=", ".join(f"{k}={_asked_ran(t, k, v)}" for k, v in t.params.items()),
        capacity=fig.tokens(t.capacity_tokens, ""),
        throughput=f"{t.throughput_tok_s:,.0f}" if t.throughput_tok_s is not None else "",
        free=fig.gib(t.static_free_gib),
        headroom=fig.gib(t.free_at_peak_gib),
        peak=fig.gib(t.stress_peak_gib),
        p99_ttft=f"{t.p99_ttft_ms:,.0f}" if t.p99_ttft_ms is not None else "",
        p99_itl=f"{t.p99_itl_ms:,.0f}" if t.p99_itl_ms is not None else "",
        seconds=f"{t.seconds:.0f}" if t.seconds is not None else "",
        reason="; ".join(
            [*([t.reason] if t.reason else []), *(f"SGLang ran {x}" for x in t.clamps.lines())]
        ),
        log_path=t.log_path,
    )


def _asked_ran(t: TrialView, name: str, value: object) -> str:
    """A parameter as asked, `asked→ran` where SGLang ran another value (`TrialView.clamps`)."""
    ran = next((c.effective for c in t.clamps.clamped if c.name == name), None)
    return _scalar(value) if ran is None else f"{_scalar(value)}→{_scalar(ran)}"


def study_cell_bytes(trials: Sequence[TrialView]) -> float | None:
    """Bytes per token fitted across the trials' pools (None with fewer than two fractions)."""
    pts = [
        (float(t.fraction), int(t.capacity_tokens), float(t.ledger.p_gib))
        for t in trials
        if t.fraction is not None and t.capacity_tokens and t.ledger.p_gib is not None
        and t.ledger.max_total_num_tokens
    ]  # fmt: skip
    return cell_from_fit(pts)


def _scalar(v: object) -> str:
    return fig.scalar(v)
