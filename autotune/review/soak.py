"""How long `autotune confirm` soaks, and the margin an exported setting needs to pass it (pure).

A trial sees one workload: one stress phase, one workload's worth of serving. A soak sees
`factor` of them, so it meets a higher worst stress peak and, where the server's footprint grows
while serving (the harness's `growth_gib`, read after SGLang's `/flush_cache` gave the
allocator's cache back), less free memory. `soak_factor` makes the soak long enough that a
steady leak at the measured rate would eat the setting's spare headroom, so a slow leak that
passes a trial fails the soak instead of the night after; `soak_steps` backs the exported
fraction off until the headroom the trials kept covers the required headroom, the growth over
the soak and how far the soak's worst peak may rise; `soak_plan` puts the three together from
the trials, for `export`'s default margin and `confirm`'s default length. Where a confirmation
ran worst cases at the exported setting (`WorstCases`), the rise is at least how far their peaks
rose beyond the trials' (`memory.pool.peak_rise_gib`), and a case that failed there backs
the setting off one step beyond it (`WorstFound` says what they did).

The rise is read from the peaks alone. The setting's own headroom and growth are measured, so how
far the memory model's forecasts missed (the search's kappa: a short rank, a leak) is already in
them; and a peak that grows with the pool (the live context of a fuller pool) is a line in the
pool's size, not a spread: within a demand the peaks are taken about that line.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from autotune.config.schema import FRACTION, Scalar
from autotune.config.space import Space, point_key, snap
from autotune.memory.fit import fit_line
from autotune.memory.pool import peak_rise_gib, steps_to_cover
from autotune.record.view import TrialView

DEFAULT_SOAK_FACTOR = 3.0
"""A soak's length in trials where the trials measured no growth."""

LEAK_FACTOR = 1.5
"""A soak lasts long enough that a steady leak would eat this many times the spare headroom."""
MAX_SOAK_FACTOR = 8.0
"""The longest soak, in trials. A leak slow enough to need more to eat the spare headroom is
measured already (its rate per trial is the trials' growth): the plan says how many workloads the
setting's spare headroom lasts at that rate (`SoakPlan.leak_lasts`) instead of soaking a day."""
GROWTH_NOISE_GIB = 0.02
"""Below this much per trial, growth is the probe's noise, not a leak."""


def growth_per_trial(trials: Iterable[TrialView]) -> float | None:
    """The server's growth over one trial's workload, the median over the trials that
    measured it (None when none did)."""
    rows = sorted(t.growth_gib for t in trials if t.growth_gib is not None)
    if not rows:
        return None
    mid = len(rows) // 2
    return rows[mid] if len(rows) % 2 else (rows[mid - 1] + rows[mid]) / 2


def soak_factor(growth_gib: float | None, spare_gib: float | None, default: float) -> float:
    """How many trials long the soak is: `default`, or, where the trials measured growth, long
    enough that a steady leak at that rate eats `LEAK_FACTOR` times the headroom the setting
    kept beyond the required (`spare_gib`), so a slow leak that passes a trial's workload fails
    the soak instead of the night after."""
    if growth_gib is None or growth_gib < GROWTH_NOISE_GIB or spare_gib is None:
        return default
    need = 1.0 + LEAK_FACTOR * max(spare_gib, 0.0) / growth_gib
    return min(max(default, math.ceil(need)), MAX_SOAK_FACTOR)


def soak_margin_gib(growth_gib: float | None, factor: float) -> float:
    """Headroom a setting needs beyond the required one to pass a soak `factor` trials long:
    what the allocator grows by over the part of the soak a trial did not see."""
    if growth_gib is None or growth_gib < GROWTH_NOISE_GIB:
        return 0.0
    return growth_gib * max(factor - 1.0, 0.0)


PEAK_NOISE = 0.05
"""The least run-to-run spread (sd) a stress peak is given, as a share of its transient: the
peak less what the server kept over the workload (the trials' growth), which the soak's margin
counts on its own and which no forward's activations spread."""
MAX_RISE = 1.0
"""The most a soak's worst peak is taken to rise, as a share of the trials' median peak: a
forward's transient memory is the activations of the batch it runs, bounded by the largest
chunk and batch the setting allows, so its worst over a soak is taken at most twice its
median; a heavy tail widened by the model's misses must not size a margin past what the
activations can take (that margin backs the fraction off to a pool that holds nothing)."""
SOAK_RISK = 0.001
"""The chance a soak may meet a peak above the margin: the margin covers the worst stress peak
of a soak with this risk (the 99.9th percentile of `factor` trials' worst peaks)."""


def soak_peak_rise_gib(
    peaks: Sequence[float],
    peak_gib: float,
    factor: float,
    groups: Sequence[Sequence[float]] = (),
    lines: int = 0,
    growth_gib: float | None = None,
) -> float:
    """How far above the stress peak of the trial it was judged by the worst peak of a soak
    `factor` trials long may rise: a soak meets about the worst of that many trials. The spread
    is the run-to-run sd of the trials' peaks, pooled over `peaks` and `groups` (the peaks at
    each other demand the trials ran) as a share of each group's median, `PEAK_NOISE` at
    least; `lines` of the groups were taken about a line in the pool (`peaks_about_pool`), each
    one degree of freedom fewer. A heavy tail (`heavy_tail_z`) puts the worst of `factor`
    draws `z` spreads up (`SOAK_RISK`), one more for the judged trial having been a lucky one,
    up to `MAX_RISE` times the peak's transient part: a stress peak is measured from the
    workload's start, so it holds what the server kept meanwhile (`growth_gib`, the trials'
    growth per trial), which the soak's margin counts on its own (`soak_margin_gib`) and no
    forward's activations double. Never less than the worst rise the trials at this setting's
    demand (`peaks`) saw."""
    rows = sorted(peaks)
    share = _pooled_share([*groups, rows], lines)
    transient = max(peak_gib - max(growth_gib or 0.0, 0.0), 0.0)
    sd = max(share * peak_gib, PEAK_NOISE * transient)
    z = heavy_tail_z(1.0 - SOAK_RISK / max(factor, 1.0)) + 1.0
    worst = rows[-1] - statistics.median(rows) if len(rows) >= 2 else 0.0
    return max(worst, min(z * sd, MAX_RISE * transient))


def peaks_about_pool(rows: Sequence[tuple[float, float]]) -> tuple[list[float], bool]:
    """The stress peaks of one demand, `(pool tokens, peak GiB)` each, as they would be at the
    rows' median pool, and whether a line was taken out: a stress phase fills the pool, so a
    transient that grows with the live context grows with the fraction, and read as spread it
    would size the soak's margin by the fractions the search tried. The line (least squares, at
    least three peaks over two pools) comes out only where the peak rises with the pool."""
    xs = [x for x, _ in rows]
    ys = [y for _, y in rows]
    if len(rows) < 3 or len(set(xs)) < 2:
        return ys, False
    slope = fit_line(xs, ys, prior_slope=0.0, prior_slope_sd=0.0, floor_sd=0.0).slope
    if slope <= 0:
        return ys, False
    mid = statistics.median(xs)
    return [y - slope * (x - mid) for x, y in rows], True


def heavy_tail_z(q: float) -> float:
    """How many spreads above the median a peak's `q` quantile lies (1/2 ≤ q < 1), its tail
    taken as heavy as Student's t with four degrees of freedom: a forward's memory depends on
    the batch it meets and on the allocator's fragmentation, a handful of trials cannot tell a
    normal tail from a heavy one, and four is the heaviest with a finite spread (the closed-form
    quantile, in units of that distribution's sd, √2). At 99.99% it is 9.2 spreads to the
    normal tail's 3.7."""
    a = 4.0 * q * (1.0 - q)
    if a <= 0.0:
        return math.inf
    c = math.cos(math.acos(math.sqrt(a)) / 3.0) / math.sqrt(a)
    return 2.0 * math.sqrt(max(c - 1.0, 0.0)) / math.sqrt(2.0)


def _pooled_share(groups: Sequence[Sequence[float]], lines: int = 0) -> float:
    """The run-to-run sd of a stress peak as a share of its median, pooled over the groups of
    peaks measured at one demand (groups of one say nothing), `lines` of them about a line."""
    squares: list[float] = []
    for g in groups:
        if len(g) < 2:
            continue
        med = statistics.median(g)
        if med > 0:
            squares += [((x - med) / med) ** 2 for x in g]
    n = len(squares) - sum(1 for g in groups if len(g) >= 2) - lines
    return math.sqrt(sum(squares) / n) if n > 0 else 0.0


def soak_need_gib(
    required_gib: float, growth_gib: float | None, factor: float, rise_gib: float = 0.0
) -> float:
    """The headroom a trial must have kept for its setting to pass a soak `factor` trials long:
    the required one plus the growth over the soak plus how far the soak's worst peak may rise."""
    return required_gib + soak_margin_gib(growth_gib, factor) + max(rise_gib, 0.0)


def soak_steps(
    headroom_gib: float,
    required_gib: float,
    growth_gib: float | None,
    factor: float,
    step_gib: float,
    rise_gib: float = 0.0,
) -> int:
    """Fraction steps to back a setting off so that it passes a soak `factor` trials long: at
    least one, more while the headroom it kept (`headroom_gib`, its worst trial) does not cover
    the required one plus the growth over the soak plus how far the soak's worst peak may rise
    (`soak_peak_rise_gib`); each step hands `step_gib` (P × the step) back from the KV pool."""
    need = soak_need_gib(required_gib, growth_gib, factor, rise_gib)
    if step_gib <= 0:
        return 1
    return max(1, steps_to_cover(need - headroom_gib, step_gib))


DEMAND = ("max_running_requests", "chunked_prefill_size")
"""The parameters a stress peak follows: the trials' peaks are grouped by them."""


@dataclass(frozen=True)
class SoakPlan:
    """The soak a setting is sized for and the fraction steps it is backed off by."""

    factor: float
    steps: int
    growth_gib: float | None
    rise_gib: float
    headroom_gib: float
    required_gib: float
    need_gib: float = 0.0
    """The headroom the setting needs to pass the soak: required + growth over it + the rise."""
    step_gib: float = 0.0
    """What one step of the fraction hands back from the KV pool (P × step × (1 + draft))."""
    worst: WorstFound | None = None
    """What a confirmation's worst cases at the exported point found, when one ran them."""
    measured: tuple[int, float] | None = None
    """The trial that ran the backed-off point and kept less than the need, and its headroom:
    the steps were counted from that trial's measurement, not from the arithmetic's."""

    @property
    def leak_lasts(self) -> float | None:
        """Workloads the setting's spare headroom (beyond the required) lasts at the measured
        growth per trial; None where the trials measured no growth above the probe's noise."""
        g = self.growth_gib
        if g is None or g < GROWTH_NOISE_GIB:
            return None
        return max(self.headroom_gib - self.required_gib, 0.0) / g

    def describe(self) -> str:
        """`2 steps for a 6× soak (0.29 GiB growth per trial, the peak may rise 0.87 GiB)`, with
        the worst case that set the rise, or the one it does not cover."""
        parts = []
        lasts = self.leak_lasts
        if self.growth_gib is not None and lasts is not None:
            leak = f"{self.growth_gib:.2f} GiB growth per trial"
            if lasts < self.factor * LEAK_FACTOR:
                leak += f": the spare headroom lasts about {lasts:.0f} workloads at that rate"
            else:
                leak += (
                    f": the spare headroom lasts about {lasts:.0f} workloads at that rate, more "
                    f"than a {MAX_SOAK_FACTOR:g}× soak can show; restart the server within that "
                    "or lower the fraction"
                )
            parts.append(leak)
        rise = f"the worst peak may rise {self.rise_gib:.2f} GiB"
        w = self.worst
        if w is not None and w.set_rise:
            rise += f", set by {the_case(w.case)}"
        elif w is not None and w.measured and not w.uncovered:
            rise += f", set by the soak: {the_case(w.case)} rose {w.case_rise_gib:.2f} GiB"
        parts.append(rise)
        if self.measured is not None and self.measured[1] >= self.need_gib - 1e-9:
            number, kept = self.measured
            parts.append(
                f"trial {number} ran the point it lands on and kept {kept:.2f} GiB, the "
                f"{self.need_gib:.2f} GiB needed: its measurement stands for the arithmetic's "
                "forecast"
            )
        elif self.measured is not None:
            number, kept = self.measured
            parts.append(
                f"trial {number} ran a point fewer steps back and kept {kept:.2f} GiB of the "
                f"{self.need_gib:.2f} GiB needed, so the steps count on from its measurement"
            )
        if w is not None and w.uncovered:
            parts.append(
                f"not covered: {case_words(w.uncovered)} failed at the confirmed setting, "
                "backed off one step more"
            )
        if w is not None and w.unrun:
            parts.append(f"not covered: {case_words(w.unrun)} did not serve")
        n = f"{self.steps} step{'s' if self.steps != 1 else ''}"
        return f"{n} for a {self.factor:g}× soak ({', '.join(parts)})"


@dataclass(frozen=True)
class WorstCases:
    """What the export's margin is told of a confirmation's worst cases: each measured case's
    name and peak, the cases that failed serving (out of memory, a crash, a broken constraint),
    the cases that never served (their launch failed or was cut short: they say nothing of the
    setting's peak), and the steps the confirmed point was backed off by."""

    peaks: tuple[tuple[str, float], ...]
    failed: tuple[str, ...] = ()
    confirmed_steps: int = 0
    unrun: tuple[str, ...] = ()

    def joined(self, later: WorstCases) -> WorstCases:
        """What two confirmations found, this one's point and then `later`'s (a point the margin
        backed off to after this one): every measured peak and failure counts, and a failure
        keeps the margin a step beyond the deepest point that failed."""
        deepest = max(
            (w.confirmed_steps for w in (self, later) if w.failed), default=later.confirmed_steps
        )
        return WorstCases(
            peaks=(*self.peaks, *later.peaks),
            failed=tuple(dict.fromkeys((*self.failed, *later.failed))),
            confirmed_steps=deepest,
            unrun=later.unrun,
        )


SOAK_CASE = "soak"
"""The name the confirmation soak itself goes by among the cases the margin is told of, where
the soak failed serving at the exported point (`review.source`)."""


def the_case(name: str) -> str:
    """`the worst case longest-context`, or `the soak` for the soak itself."""
    words = case_words([name])
    return words if name == SOAK_CASE else f"the {words}"


def case_words(names: Sequence[str], article: bool = True) -> str:
    """`worst case longest-context, max-running`, `the soak` (`soak` without the article, after
    a possessive), or `the soak and worst case max-running`: the cases a note names."""
    cases = [n for n in names if n != SOAK_CASE]
    words = [f"worst case {', '.join(cases)}"] if cases else []
    if SOAK_CASE in names:
        words.insert(0, "the soak" if article else "soak")
    return " and ".join(words)


@dataclass(frozen=True)
class WorstFound:
    """What the worst cases did to the margin: the case with the highest peak, how far it rose
    beyond the study's stress peak, whether that set the rise, the margin without the cases
    (rise, steps), the failed cases the margin cannot cover by a measurement, and the cases that
    never served."""

    case: str
    case_rise_gib: float
    set_rise: bool
    rise_before_gib: float
    steps_before: int
    uncovered: tuple[str, ...] = ()
    unrun: tuple[str, ...] = ()
    measured: bool = True
    """Whether any case measured a peak (`case` is then the one with the highest)."""

    def to_dict(self) -> dict[str, object]:
        """The finding as the export's `margin` records it."""
        return {
            "worst_case": self.case,
            "worst_case_rise_gib": round(self.case_rise_gib, 4),
            "worst_case_set_rise": self.set_rise,
            "rise_before_gib": round(self.rise_before_gib, 4),
            "steps_before": self.steps_before,
            "uncovered": list(self.uncovered),
            "not_served": list(self.unrun),
        }


def soak_plan(
    trials: Sequence[TrialView],
    params: Mapping[str, Scalar],
    *,
    required_gib: float,
    step: float,
    default_factor: float = DEFAULT_SOAK_FACTOR,
    space: Space | None = None,
    worst: WorstCases | None = None,
) -> SoakPlan | None:
    """The soak for the setting `params` that held, sized from the trials: its worst headroom,
    the growth they measured and the spread of their stress peaks by demand; None when no trial
    that held at `params` (the same point of `space`) kept a measured headroom or its launch
    logged no P.

    With `worst` (a confirmation's worst cases at the exported point), the rise is at least how
    far the cases' peaks rose beyond the trials' stress peak at this demand
    (`memory.pool.peak_rise_gib`), and a case that failed there backs the setting off one
    step beyond the confirmed one (its peak was cut short by the failure: no measurement covers
    it)."""
    held = [t for t in trials if t.feasible]
    same = _held_at(held, params, space)
    heads = [h for t in same if (h := _headroom(t)) is not None]
    if not heads:
        return None
    head = min(heads)
    a = same[-1].arithmetic()
    if a is None:
        return None
    per_step = a.per_step_gib(step)
    growth = growth_per_trial(trials)
    factor = soak_factor(growth, head - required_gib, default_factor)
    by_demand: dict[tuple[object, ...], list[tuple[float, float]]] = {}
    for t in held:
        if t.stress_peak_gib is not None:
            row = (float(t.capacity_tokens or 0), t.stress_peak_gib)
            by_demand.setdefault(tuple(t.params.get(k) for k in DEMAND), []).append(row)
    own = by_demand.pop(tuple(params.get(k) for k in DEMAND), [])
    peak = statistics.median(y for _, y in own) if own else 0.0
    about = [peaks_about_pool(rows) for rows in [own, *by_demand.values()]]
    lines = sum(sloped for _, sloped in about)
    groups = [g for g, _ in about[1:]]
    rise = soak_peak_rise_gib(about[0][0], peak, factor, groups, lines, growth)
    found = None
    if worst is not None and (worst.peaks or worst.failed or worst.unrun):
        before = soak_steps(head, required_gib, growth, factor, per_step, rise)
        case_rise = peak_rise_gib([p for _, p in worst.peaks], peak)
        top = max(worst.peaks, key=lambda x: x[1])[0] if worst.peaks else ""
        found = WorstFound(top or (worst.failed + worst.unrun)[0], case_rise, case_rise > rise,
                           rise, before, worst.failed, worst.unrun, bool(worst.peaks))  # fmt: skip
        rise = max(rise, case_rise)
    steps = soak_steps(head, required_gib, growth, factor, per_step, rise)
    if worst is not None and worst.failed:
        steps = max(steps, worst.confirmed_steps + 1)
    need = soak_need_gib(required_gib, growth, factor, rise)
    steps, measured = _measured_steps(held, params, steps, need, per_step, step, space)
    if worst is None or not worst.failed:
        steps, measured = _fewer_steps(trials, params, steps, need, step, space) or (
            steps,
            measured,
        )
    return SoakPlan(
        factor, steps, growth, rise, head, required_gib, need, per_step, found, measured
    )


def _measured_steps(
    held: Sequence[TrialView],
    params: Mapping[str, Scalar],
    steps: int,
    need: float,
    per_step: float,
    step: float,
    space: Space | None,
) -> tuple[int, tuple[int, float] | None]:
    """The steps back, where a trial that held ran the backed-off point: its own worst headroom
    must cover the soak's need too, since the arithmetic's step (`per_step`) is a forecast and a
    trial there is a measurement. A step count whose point kept less than the need grows by the
    steps that shortfall takes; the last trial that was short, with its headroom, comes back."""
    f0 = params.get(FRACTION)
    if not isinstance(f0, float) or per_step <= 0:
        return steps, None
    measured = None
    while True:  # each pass needs a held trial a step lower still: the trials end it
        there = _held_at(held, {**params, FRACTION: snap(f0 - steps * step, step)}, space)
        heads = [h for t in there if (h := _headroom(t)) is not None]
        if not heads or min(heads) >= need - 1e-9:
            break
        kept = min(heads)
        measured = (max(t.number for t in there), kept)
        steps += max(1, steps_to_cover(need - kept, per_step))
    return steps, measured


def _fewer_steps(
    trials: Sequence[TrialView],
    params: Mapping[str, Scalar],
    steps: int,
    need: float,
    step: float,
    space: Space | None,
) -> tuple[int, tuple[int, float]] | None:
    """Fewer steps back, where every trial that ran a point fewer steps back held and kept the
    soak's need: the arithmetic's step is a forecast from the chosen trial's headroom (a thin
    one, often), and a trial at the point is a measurement. The fewest such steps, with the last
    of those trials and the least it kept; None where no point fewer steps back ran so."""
    f0 = params.get(FRACTION)
    if not isinstance(f0, float):
        return None
    for k in range(1, steps):
        point = {**params, FRACTION: snap(f0 - k * step, step)}
        there = [t for t in _held_at(trials, point, space) if t.state == "complete"]
        heads = [_headroom(t) for t in there]
        if there and all(t.feasible for t in there) and None not in heads:
            kept = min(h for h in heads if h is not None)
            if kept >= need - 1e-9:
                return k, (max(t.number for t in there), kept)
    return None


def _held_at(
    held: Sequence[TrialView], params: Mapping[str, Scalar], space: Space | None
) -> list[TrialView]:
    """The trials of `held` that ran the point `params` of `space`."""
    key = point_key(params, space)
    return [t for t in held if point_key(t.params, space) == key]


def _headroom(t: TrialView) -> float | None:
    return t.recorded_headroom_gib if t.recorded_headroom_gib is not None else t.free_at_peak_gib
