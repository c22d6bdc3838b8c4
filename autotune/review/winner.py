"""The winner: the setting to export, chosen from the trials and backed off by a safety margin.

The rule, in order:

1. Among feasible trials, find the best throughput T.
2. Keep the feasible trials whose throughput is at least `(1 − tolerance)·T` (the default 5 %
   treats throughput as a tie-breaker, not a rival: more KV capacity is what the operator asked
   for) and take the one with the highest capacity (ties: higher throughput, then lower number).
3. Back its `mem_fraction_static` off by the margin: by default the soak's (`review.soak`:
   enough steps that the setting passes a confirm soak as long as the trials' growth asks for,
   its worst stress peak and its growth included), or a number of fraction steps, or a headroom
   in GiB: the smallest whole number of steps after which the free memory at the measured
   stress peak, predicted with SGLang's arithmetic (each step moves `P·step` GiB from the KV
   pool to free memory), is at least that many GiB.

The backed-off point is usually a trial that ran (a walk or a grid ran the step below); then its
measured figures are exported. Otherwise the figures are predicted from the chosen trial's
ledger and say so. Pure: trials in, a `Winner` out.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from autotune.config import space as search_space
from autotune.config.schema import CHUNK, FRACTION, Scalar
from autotune.config.space import Space, point_key, snap
from autotune.errors import UsageError
from autotune.memory.model import peak_fall_gib
from autotune.memory.pool import (
    held_by_cap,
    pool_zero_fraction,
    steps_gib,
    steps_to_cover,
    uncovered_gib,
)
from autotune.record.direction import Push, direction, floor_fraction
from autotune.record.view import TrialView
from autotune.review.soak import (
    SoakPlan,
    WorstCases,
    WorstFound,
    case_words,
    soak_plan,
)

DEFAULT_TOLERANCE = 0.05
SAME_CAPACITY = 0.99
"""Where backing off cannot give the soak's margin, the export trades demand for it among the
settings that keep this share of the chosen one's capacity (the same fraction), never capacity."""
MIN_CHUNK = 256
"""The smallest prefill chunk an export lowers `chunked_prefill_size` to for the soak's margin."""
_MARGIN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(steps?|gib|gb|g)?\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Margin:
    """How far below the highest stable setting to export: `steps` of the fraction, enough
    steps to leave `headroom_gib` free at the stress peak, or (`soak`) enough to pass a confirm
    soak."""

    steps: int = 1
    headroom_gib: float | None = None
    soak: bool = False

    def describe(self) -> str:
        """The margin in words, for the export's notes and the headline."""
        if self.soak:
            return "the margin a confirm soak needs"
        if self.headroom_gib is not None:
            return f"{self.headroom_gib:g} GiB free at the stress peak"
        if self.steps == 0:
            return "none"
        return f"{self.steps} step{'s' if self.steps != 1 else ''} of {FRACTION}"

    def to_dict(self) -> dict[str, object]:
        """The margin as JSON values, as the export's `margin` records it."""
        return {"steps": self.steps, "headroom_gib": self.headroom_gib, "soak": self.soak}


DEFAULT_MARGIN = Margin(steps=0, soak=True)


def parse_margin(text: str) -> Margin:
    """`soak` (what a confirm soak needs), `1step`, `2 steps`, `0` (no margin), `1.5GiB` (free
    at the stress peak)."""
    if text.strip().lower() == "soak":
        return DEFAULT_MARGIN
    m = _MARGIN.match(text)
    if not m:
        raise UsageError(
            f"--margin {text!r}: use soak, a number of steps (e.g. 1step) or GiB (2GiB)"
        )
    value, unit = float(m.group(1)), (m.group(2) or "steps").lower()
    if unit.startswith("step"):
        if not value.is_integer():
            raise UsageError(f"--margin {text!r}: steps must be a whole number, e.g. 1step")
        return Margin(steps=int(value))
    return Margin(steps=0, headroom_gib=value)


def parse_tolerance(text: str) -> float:
    """`0.05` or `5%`: how far below the best feasible throughput a winner may be."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError as exc:
        raise UsageError(f"--tolerance {text!r}: use a fraction (0.05) or a percentage") from exc
    if not 0.0 <= value < 1.0:
        raise UsageError(f"--tolerance {text!r}: must be between 0 and 1 (or 0% and 100%)")
    return value


_UNRUN = "no trial ran "
"""How the note on a point no trial ran begins (dropped once a confirmation soak ran it)."""


@dataclass(frozen=True)
class Winner:
    """The exported setting and where it came from."""

    chosen: TrialView
    """The highest-capacity feasible trial within the throughput tolerance."""
    params: Mapping[str, Scalar]
    """What to export: `chosen`'s parameters with the fraction backed off."""
    source: TrialView | None
    """The trial that ran exactly `params`, when one did."""
    margin: Margin
    steps_back: int
    tolerance: float
    best_throughput_tok_s: float
    capacity_tokens: int | None
    throughput_tok_s: float | None
    free_at_peak_gib: float | None
    """The headroom left at the worst moment (measured, or predicted when `predicted`)."""
    predicted: bool
    """True when the figures are predicted, not measured (no trial ran `params`)."""
    notes: tuple[str, ...] = field(default=())
    soak: SoakPlan | None = None
    """The soak the margin was sized for (the default margin)."""
    soaked: bool = False
    """The figures are those of the confirmation soak that ran `params`, which no trial ran."""

    def measured_by_soak(
        self, capacity_tokens: int, throughput_tok_s: float | None, free_at_peak_gib: float | None
    ) -> Winner:
        """This winner with the figures its passed confirmation soak measured at `params` in
        place of the predicted ones: every surface then shows what ran."""
        notes = tuple(n for n in self.notes if not n.startswith(_UNRUN))
        return replace(
            self,
            capacity_tokens=capacity_tokens,
            throughput_tok_s=throughput_tok_s,
            free_at_peak_gib=free_at_peak_gib,
            predicted=False,
            soaked=True,
            notes=(*notes, "figures measured by the confirmation soak"),
        )

    @property
    def trial(self) -> int:
        """The trial whose figures are exported (the backed-off one when it ran)."""
        return self.source.number if self.source is not None else self.chosen.number

    def describe(self) -> str:
        """One line: what was chosen and why."""
        f0, f1 = self.chosen.fraction, self.params.get(FRACTION)
        cap = f"{self.capacity_tokens:,} tokens" if self.capacity_tokens is not None else "?"
        how = "predicted" if self.predicted else f"measured in trial {self.trial}"
        margin = self.soak.describe() if self.soak is not None else self.margin.describe()
        back = f", backed off from {f0:g} to {f1} ({margin})" if self.steps_back else ""
        return (
            f"trial {self.chosen.number} has the most capacity within "
            f"{self.tolerance:.0%} of the best throughput{back}: {cap} ({how})"
        )


def choose(
    trials: Sequence[TrialView],
    *,
    space: Space | None = None,
    fraction_step: float | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    margin: Margin | None = None,
    cell_bytes: float | None = None,
    min_headroom_gib: float = 0.0,
    worst: WorstCases | None = None,
) -> Winner | None:
    """The winner among `trials`, or None while no trial is feasible; `space` is the study's
    (a point's identity and the fraction's step, `config.space.fraction_step`, unless
    `fraction_step` says otherwise); `cell_bytes` (bytes per token fitted across the study)
    sharpens predictions for a point that never ran; `min_headroom_gib` is the study's required
    headroom (the soak's margin keeps it); `worst` what a confirmation's worst cases found at
    the point the soak's margin exported (`review.soak.soak_plan`: the margin covers their rise,
    or backs off a step beyond a case that failed)."""
    step = fraction_step if fraction_step is not None else search_space.fraction_step(space)
    margin = margin or DEFAULT_MARGIN
    feasible = [t for t in trials if t.feasible]
    if not feasible:
        return None
    best_tp = max(t.throughput_tok_s or 0.0 for t in feasible)
    close = [t for t in feasible if (t.throughput_tok_s or 0.0) >= (1 - tolerance) * best_tp]
    chosen = max(
        close, key=lambda t: (t.capacity_tokens or 0, t.throughput_tok_s or 0.0, -t.number)
    )
    notes: list[str] = []
    plan = None
    chunk: SmallerChunk | None = None
    worst_at: tuple[int, SoakPlan] | None = None  # the worst cases' note and the plan it read
    if margin.soak:
        plan = soak_plan(
            trials,
            chosen.params,
            required_gib=min_headroom_gib,
            step=step,
            space=space,
            worst=worst,
        )
        if plan is not None and plan.worst is not None:
            worst_at = (len(notes), plan)
            notes.append(_worst_note(plan))
        if plan is None:
            notes.append("no headroom measured to size the soak's margin from; backed off 1 step")
        else:
            lowest = lowest_startable(trials, step)
            short = _short(chosen, plan, lowest, step)
            if short > 0:
                level = [
                    t
                    for t in feasible
                    if (t.capacity_tokens or 0) >= SAME_CAPACITY * (chosen.capacity_tokens or 0)
                ]
                closer = _closest_to_soak(level, trials, lowest, step, min_headroom_gib, space)
                if closer is not None and closer[0] is not chosen and short > closer[2] + 0.005:
                    notes.append(
                        f"no fraction that can start gives trial {chosen.number}'s setting the "
                        f"soak's margin; trial {closer[0].number}'s comes closer"
                    )
                    chosen, plan = closer[0], closer[1]
            chunk = _chunk_for_soak(chosen, plan, _short(chosen, plan, lowest, step))
            if chunk is not None:
                notes.append(chunk.note(chosen.number))
        steps = plan.steps if plan is not None else 1
        refuted = plan is not None and plan.worst is not None and bool(plan.worst.uncovered)
        if plan is not None and chunk is not None and chunk.left_gib <= 0 and not refuted:
            # the smaller chunk covers part of the margin: the fraction backs off for the rest
            # (not past a point whose confirmation failed: its shortfall was measured, the
            # chunk's fall is predicted)
            remaining = steps_to_cover(
                plan.need_gib - plan.headroom_gib - chunk.covers_gib, plan.step_gib
            )
            if remaining < steps:
                notes.append(
                    f"the smaller chunk covers {chunk.covers_gib:.2f} GiB of the soak's margin: "
                    f"backed off {remaining} step{'s' if remaining != 1 else ''} for the rest"
                )
                steps = remaining
    else:
        steps = _steps_back(chosen, margin, step, notes, cell_bytes)
    params = dict(chosen.params)
    if chunk is not None:
        params[CHUNK] = chunk.to
    f0 = chosen.fraction
    if f0 is not None and steps:
        lowest = lowest_startable(trials, step)
        if lowest is not None and f0 - steps * step < lowest - 1e-9:
            room = max(0, math.floor((f0 - lowest) / step + 1e-9))
            notes.append(
                f"backed off {room} step{'s' if room != 1 else ''} instead of {steps}: below "
                f"{FRACTION}={snap(lowest, step)} the KV pool finds no room"
            )
            steps = room
            if worst_at is not None:
                notes[worst_at[0]] = _worst_note(worst_at[1], floor=True)
    if f0 is not None and steps:
        params[FRACTION] = snap(f0 - steps * step, step)
    elif f0 is None:
        steps = 0
        notes.append(f"the trials have no {FRACTION}; exported as run, without a margin")
    source = chosen if steps == 0 and chunk is None else _ran(trials, params, space)
    if source is not None and not source.feasible:
        notes.append(
            f"trial {source.number} ran these settings and was {source.kind} "
            f"({source.outcome}); consider a larger margin"
        )
    if source is not None:
        figures = (source.capacity_tokens, source.throughput_tok_s, source.free_at_peak_gib)
    else:
        figures = _predicted(chosen, params, steps, chunk, cell_bytes)
        unrun = [f"{FRACTION}={params[FRACTION]}"] if steps else []
        unrun += [f"{CHUNK}={chunk.to}"] if chunk is not None else []
        rest = [f"{k}={v}" for k, v in params.items() if k not in (FRACTION, CHUNK)]
        at = f" at {', '.join(rest)}" if rest and unrun else ""
        notes.append(f"{_UNRUN}{' with '.join(unrun)}{at}; its figures are predicted")
    return Winner(
        chosen=chosen,
        params=params,
        source=source,
        margin=margin,
        steps_back=steps,
        tolerance=tolerance,
        best_throughput_tok_s=best_tp,
        capacity_tokens=figures[0],
        throughput_tok_s=figures[1],
        free_at_peak_gib=figures[2],
        predicted=source is None,
        notes=tuple(notes),
        soak=plan,
    )


CONFIRM_AGAIN = "; run autotune confirm again"
"""How a worst-case note sends the operator back to `autotune confirm` for the point the margin
moved to."""


def _worst_note(plan: SoakPlan, floor: bool = False) -> str:
    """What the confirmation's worst cases did to the margin, in one sentence (`floor`: the
    margin was cut short by the lowest fraction that can start)."""
    w = plan.worst
    assert w is not None
    unrun = (
        f"; {case_words(w.unrun)} did not serve at the confirmed setting (its launch failed or "
        "was cut short), so nothing covers it: run autotune confirm again"
        if w.unrun
        else ""
    )
    if not w.measured and not w.uncovered:
        return unrun[2:].capitalize()
    return _worst_finding(plan, w, floor) + unrun


def _worst_finding(plan: SoakPlan, w: WorstFound, floor: bool = False) -> str:
    steps = f"{plan.steps} step{'s' if plan.steps != 1 else ''} instead of {w.steps_before}"
    if w.uncovered:
        if floor:
            more = "and no lower fraction can start to back the margin off to"
        elif plan.steps > w.steps_before:
            more = f"so the margin backs off one step more ({steps})"
        else:
            more = (
                f"and the margin's {plan.steps} step{'s' if plan.steps != 1 else ''} already "
                "go beyond it"
            )
        return (
            f"the confirmation's {case_words(w.uncovered, article=False)} failed at the "
            f"confirmed setting: no measured peak covers it, {more}{CONFIRM_AGAIN}"
        )
    if w.set_rise:
        return (
            f"the confirmation's {case_words([w.case], article=False)} peaked "
            f"{w.case_rise_gib:.2f} GiB above the study's stress peak (the soak's own rise was "
            f"{w.rise_before_gib:.2f} GiB): the margin covers it ({steps})"
        )
    return (
        f"the confirmation's worst cases stayed within the soak's margin (the worst, {w.case}, "
        f"rose {w.case_rise_gib:.2f} GiB of the {w.rise_before_gib:.2f} GiB allowed)"
    )


def _predicted(
    chosen: TrialView,
    params: Mapping[str, Scalar],
    steps: int,
    chunk: SmallerChunk | None,
    cell_bytes: float | None,
) -> tuple[int | None, float | None, float | None]:
    """Capacity, throughput and headroom of a setting no trial ran: the chosen trial's, at the
    backed-off fraction by SGLang's arithmetic, with the smaller chunk's predicted fall of the
    peak added to the headroom."""
    if steps:
        at = chosen.predict(float(params[FRACTION]), cell_bytes)
        tokens, free = (at.tokens, at.free_at_peak_gib) if at is not None else (None, None)
    else:
        tokens, free = chosen.capacity_tokens, chosen.free_at_peak_gib
    if chunk is not None and free is not None:
        free += chunk.saving_gib
    return tokens, chosen.throughput_tok_s, free


def _short(t: TrialView, plan: SoakPlan, lowest: float | None, step: float) -> float:
    """How much of the soak's margin, GiB, the fractions that can start (`lowest` and up) leave
    out (0: none)."""
    if t.fraction is None or lowest is None:
        return 0.0
    room = max(0, math.floor((t.fraction - lowest) / step + 1e-9))
    if room >= plan.steps:
        return 0.0
    short = uncovered_gib(plan.need_gib - plan.headroom_gib, plan.step_gib, room)
    if plan.worst is not None and plan.worst.uncovered:
        # what failed at the confirmed point asks for steps the window does not have: each
        # is short a step's worth of memory
        short = max(short, steps_gib(plan.steps - room, plan.step_gib))
    return short


def _closest_to_soak(
    feasible: Sequence[TrialView],
    trials: Sequence[TrialView],
    lowest: float | None,
    step: float,
    required: float,
    space: Space | None,
) -> tuple[TrialView, SoakPlan, float] | None:
    """On a narrow window (weights leave little above the lowest fraction that can start)
    backing off may not give the soak's margin: of `feasible`, the setting whose margin the
    window cuts least (less demand: a smaller peak), then the most capacity and speed."""
    scored = []
    for t in feasible:
        plan = soak_plan(trials, t.params, required_gib=required, step=step, space=space)
        if plan is not None:
            scored.append((t, plan, _short(t, plan, lowest, step)))
    if not scored:
        return None
    return min(
        scored,
        key=lambda x: (
            round(x[2], 2),
            -(x[0].capacity_tokens or 0),
            -(x[0].throughput_tok_s or 0.0),
        ),
    )


@dataclass(frozen=True)
class SmallerChunk:
    """A prefill chunk below the one the trials ran, for the soak's margin the fractions that
    can start leave out."""

    was: int
    to: int
    saving_gib: float
    """How far the stress peak should fall (predicted)."""
    short_gib: float
    """How much of the soak's margin the fractions left out."""
    left_gib: float
    """How much is still missing with the smaller chunk (0: none)."""
    covers_gib: float = 0.0
    """How much of the soak's margin the smaller chunk covers: its fall of the peak and of the
    soak's rise with it."""

    def note(self, trial: int) -> str:
        """The sentence saying trial `trial`'s setting cannot get the soak's margin from the
        fraction, and how far the smaller chunk should bring its stress peak down (a prediction, to
        confirm)."""
        still = (
            f"; still {self.left_gib:.2f} GiB short: this box leaves this model little room"
            if self.left_gib > 0
            else ""
        )
        return (
            f"no {FRACTION} that can start leaves trial {trial}'s setting the soak's margin "
            f"({self.short_gib:.2f} GiB short): {CHUNK} {self.to} instead of {self.was} should "
            f"lower the stress peak by about {self.saving_gib:.2f} GiB (a prefill's transient "
            f"taken as proportional to its chunk, counted at the low end of that prior; predicted, "
            f"so run autotune confirm){still}"
        )


def _chunk_for_soak(t: TrialView, plan: SoakPlan, short: float) -> SmallerChunk | None:
    """Where no fraction that can start gives the soak's margin (`short` GiB of it missing),
    the prefill chunk is what is left to trade: its transient is the largest part of a
    stress peak. The largest of the chunk halved, quartered, … (`MIN_CHUNK` at least) whose
    predicted fall of the peak (the trial's peak less its growth, taken as proportional to the
    chunk, and the soak's rise with it) covers the shortfall, else the smallest; None when
    nothing is short or the chunk or the peak is unknown. The fall counted on is the least the
    chunk prior allows (`memory.model.peak_fall_gib`): part of a peak (a base, the decode
    batch) does not shrink with the chunk."""
    was = t.chunk
    peak = t.stress_peak_gib
    if short <= 0.005 or not was or peak is None or peak <= 0:
        return None
    best: SmallerChunk | None = None
    size = was // 2
    while size >= MIN_CHUNK:
        saving = peak_fall_gib(peak, plan.growth_gib, was, size)
        rise_fall = plan.rise_gib * saving / peak
        left = max(0.0, short - saving - rise_fall)
        best = SmallerChunk(was, size, saving, short, left, saving + rise_fall)
        if left <= 0:
            break
        size //= 2
    return best


def lowest_startable(trials: Sequence[TrialView], step: float) -> float | None:
    """The lowest mem_fraction_static the trials say can start: above every fraction that
    failed for want of room for the KV pool, and a step above the `1 − A/P` of every ledger
    (where the pool's budget turns positive; a step more for ranks the log does not show) and
    above where the pools the launches sized fall to zero (`memory.pool.pool_zero_fraction`:
    that line knows a short rank the printed figures miss), on the grid of `step`; never above a
    fraction a trial started at. None when nothing says."""

    def above(floor: float) -> float:
        """The grid's fraction a step above the one at or below `floor`."""
        return math.floor(floor / step + 1e-9) * step + 2 * step

    bounds: list[float] = []
    started: list[float] = []
    pools: list[tuple[float, int]] = []
    for t in trials:
        if t.fraction is not None and direction(t) == Push.RAISE:
            bounds.append(t.fraction + step)
        floor = floor_fraction(t.ledger)
        if floor is not None:
            bounds.append(above(floor))
        tokens = t.ledger.max_total_num_tokens
        if t.fraction is not None and tokens and not t.ending.fails_at_startup:
            started.append(t.fraction)
            if not held_by_cap(tokens, t.ledger.max_total_tokens_cap):
                pools.append((t.fraction, tokens))
    zero = pool_zero_fraction(pools)
    if zero is not None:
        bounds.append(above(zero))
    if not bounds:
        return None
    return min(max(bounds), *started) if started else max(bounds)


def _steps_back(
    chosen: TrialView, margin: Margin, step: float, notes: list[str], cell: float | None
) -> int:
    if margin.headroom_gib is None:
        return margin.steps
    a = chosen.arithmetic(cell)
    free = chosen.free_at_peak_gib
    if a is None or free is None:
        notes.append("no ledger to size a GiB margin from; backed off one step instead")
        return 1
    return steps_to_cover(margin.headroom_gib - free, a.per_step_gib(step))


def _ran(
    trials: Sequence[TrialView], params: Mapping[str, Scalar], space: Space | None
) -> TrialView | None:
    """The latest finished trial that ran the point `params` of `space` (a feasible one first)."""
    key = point_key(params, space)
    found = None
    for t in trials:
        if t.kind != "running" and point_key(t.params, space) == key:
            found = t if found is None or t.feasible or not found.feasible else found
    return found
