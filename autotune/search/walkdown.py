"""`WalkDownSampler`: the walk vLLM's auto_tune script does, as an Optuna sampler.

Start `mem_fraction_static` at the top of its range and step down one step after every launch that
fails for having too much (OOM at startup or under load, headroom too small) until one holds; a
launch whose KV pool found no room says the opposite, so the walk never goes below the lowest
fraction its ledger says can hold a pool; then take the other
searched parameters' grid one combination at a time, each walking down from the fraction the
previous combination settled on. It learns nothing between steps, which is the point of having
it: the benchmark measures what the memory model saves over it.

With `mem_fraction_static` not searched (fixed in the study file) there is nothing to walk down:
each combination of the other parameters is launched once. Where the walk has nothing to act on
(`fallback.why_random`), parameters are sampled at random.

The sampler is a `base.MemorySampler`, as the capacity-aware search is: the ask, the random
fallback and the recorded rule and why are theirs in common; what is this module's own is what
the walk knows (the finished trials, no seed logs), `walk`, and the first fraction of a study
without a baseline (the top of the range).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator, Mapping, Sequence

import optuna
from optuna.trial import FrozenTrial

from autotune.config.schema import Scalar
from autotune.config.space import (
    Space,
    canonical,
    canonical_value,
    point_key,
    same_value,
    step_of,
)
from autotune.search.base import Ask, Known, MemorySampler, Param, record_rule
from autotune.search.points import FRACTION, Point, Push, fmt, num, tokens_of
from autotune.search.records import candidate_values, finished_points, pending_params
from autotune.search.start import nothing_between

WALK_RULE = "walkdown"
CONFIRM_RULE = "confirm"


class WalkDownSampler(MemorySampler):
    """The walk-down baseline (`walk`): no model, no seeds, one step down per failure.

    Args:
        seed: seeds the random fallback.
    """

    def _known(self, study: optuna.Study, trials: Sequence[FrozenTrial], number: int) -> Known:
        """The finished trials other than `number` (the walk reads no seed logs)."""
        return Known(finished_points(trials, number))

    def _choose(self, ask: Ask) -> Mapping[str, Scalar]:
        axes = {n: candidate_values(d, n) for n, d in ask.space.items()}
        pending = pending_params(ask.trials, ask.trial.number)
        params, rule, why = walk(axes, ask.known.points, pending, ask.space)
        done = why if rule == CONFIRM_RULE else None
        record_rule(ask.study, ask.trial, rule, why, done=done)
        return params

    def _first_value(self, study: optuna.Study, trial: FrozenTrial, p: Param) -> Scalar | None:
        """The top of the fraction's range; any other parameter at random."""
        return max(p.values) if p.name == FRACTION else None


def walk(
    axes: Mapping[str, Sequence[Scalar]],
    finished: Sequence[Point],
    pending: Sequence[Mapping[str, Scalar]] = (),
    space: Space | None = None,
) -> tuple[dict[str, Scalar], str, str]:
    """(params, rule, why) for the next launch of the walk; what other workers run now is
    skipped, so several workers walk down side by side. Every point is taken in its canonical
    form in `space` first (`config.space.canonical`), as the capacity search takes it.

    Each failure pushes the way it says (`record.direction`): out of memory or headroom, one step
    down; a KV pool that found no room says every fraction up to the lowest that holds one is too
    low (its ledger gives it), so the walk never steps below that; a host cache too big for host
    RAM ends that combination; a failure that is not about memory is run once more."""
    axes = {n: tuple(canonical_value(v, step_of(space, n)) for v in vs) for n, vs in axes.items()}
    finished = [dataclasses.replace(p, params=canonical(p.params, space)) for p in finished]
    pending = [canonical(p, space) for p in pending]
    fractions = sorted(num(v) for v in axes.get(FRACTION, ()))
    others = [n for n in sorted(axes) if n != FRACTION]
    start = fractions[-1] if fractions else None
    floor = max((f for p in finished if (f := p.floor) is not None), default=None)
    allowed = [f for f in fractions if floor is None or f > floor + 1e-9]
    for combo in _combinations(axes, others, finished):
        here = [p for p in finished if _at(p.params, combo)]
        if not fractions:
            if not here and not any(_at(p, combo) for p in pending):
                return combo, WALK_RULE, f"walk-down: the next combination, {_text(combo)}"
            retry = _retry(here)
            if retry is not None and not any(_at(p, combo) for p in pending):
                return combo, WALK_RULE, f"walk-down: {_text(combo)} once more ({retry})"
            continue
        running = [num(p[FRACTION]) for p in pending if FRACTION in p and _at(p, combo)]
        nxt, why = _next_fraction(allowed, start, here, running)
        if nxt is None:
            held = _settled(here)
            start = start if held is None else held
            continue
        return {**combo, FRACTION: nxt}, WALK_RULE, f"walk-down: {FRACTION}={nxt:g} ({why})"
    return _finish(axes, others, fractions, finished, floor)


def _combinations(
    axes: Mapping[str, Sequence[Scalar]], others: Sequence[str], finished: Sequence[Point]
) -> Iterator[dict[str, Scalar]]:
    """The grid of the parameters other than the fraction, lazily; the first launch's
    combination (the baseline, normally) first."""
    first: dict[str, Scalar] | None = None
    if finished:
        first = {n: v for n in others if (v := finished[0].params.get(n)) is not None}
        if len(first) == len(others) and all(
            any(same_value(first[n], v) for v in axes[n]) for n in others
        ):
            yield first
        else:
            first = None
    for values in itertools.product(*(axes[n] for n in others)):
        combo = dict(zip(others, values, strict=True))
        if first is None or not _at(combo, first):
            yield combo


def _next_fraction(
    fractions: Sequence[float], start: float | None, here: Sequence[Point], running: Sequence[float]
) -> tuple[float | None, str]:
    """The fraction one combination launches next and why: `start`, one step below its lowest
    launch that ran out of memory, or a failure not about memory once more, skipping what other
    workers run; None once it settled (held there), ran out of fractions, or cannot start."""
    held = _settled(here)
    if any(p.push is Push.SHRINK_HOST for p in here) or not fractions:
        return None, ""
    retry = _retry(here)
    if retry is not None and held is None:
        f = num(here[-1].params.get(FRACTION))
        if not any(same_value(f, x) for x in running):
            return f, f"once more: {retry}"
    down = [num(p.params.get(FRACTION)) for p in here if _steps_down(p, here)]
    if start is not None and start < fractions[0] - 1e-9:
        start = fractions[0]  # the previous combination settled below the lowest allowed
    nxt = start if not down else _below(fractions, min(down))
    if nxt is not None and not any(same_value(nxt, f) for f in fractions):
        nxt = _below(fractions, nxt + 1e-6)
    while nxt is not None and any(same_value(nxt, f) for f in running):
        nxt = _below(fractions, nxt)
    if nxt is None or (held is not None and held >= nxt - 1e-9):
        return None, ""
    if not down:
        top = not fractions or same_value(nxt, fractions[-1])
        return nxt, "top of the range" if top else "where the previous combination held"
    return nxt, f"one step below {min(down):g}, which ran out of memory or headroom"


def _steps_down(p: Point, here: Sequence[Point]) -> bool:
    """A launch that says the fraction was too high: out of memory or headroom (also a host
    cache not larger than the GPU pool, which a smaller pool fixes), or a failure not about
    memory that repeated at the same fraction."""
    if p.feasible or p.observation is None:
        return False
    if p.push in (Push.LOWER, Push.GROW_HOST):
        return True
    if p.push is Push.NONE:
        f = num(p.params.get(FRACTION))
        return sum(same_value(num(q.params.get(FRACTION)), f) for q in here if not q.feasible) > 1
    return False


def _retry(here: Sequence[Point]) -> str | None:
    """Why the latest launch of a combination runs once more: it failed for a reason that is not
    about memory, and it was the first launch at its setting."""
    if not here:
        return None
    last = here[-1]
    o = last.observation
    if o is None or last.feasible or last.push is not Push.NONE:
        return None
    f = last.params.get(FRACTION)
    if sum(same_value(q.params.get(FRACTION), f) for q in here) > 1:
        return None
    return f"trial {last.number} failed for a reason that is not memory ({o.outcome})"


def _settled(here: Sequence[Point]) -> float | None:
    """The highest fraction that held for one combination, if any did."""
    return max((num(p.params.get(FRACTION)) for p in here if p.feasible), default=None)


def _below(fractions: Sequence[float], f: float) -> float | None:
    return max((x for x in fractions if x < f - 1e-9), default=None)


def _finish(
    axes: Mapping[str, Sequence[Scalar]],
    others: Sequence[str],
    fractions: Sequence[float],
    finished: Sequence[Point],
    floor: float | None,
) -> tuple[dict[str, Scalar], str, str]:
    """Every combination walked: the best that held (the highest fraction, then the most
    tokens) again, or, when nothing held, the lowest fraction allowed of the first combination
    with the failures' own reason."""
    best = max(
        (p for p in finished if p.feasible),
        key=lambda p: (num(p.params.get(FRACTION)), tokens_of(p)),
        default=None,
    )
    why = "walk-down finished every combination"
    if best is not None:
        params = dict(best.params)
    else:
        params = next(_combinations(axes, others, finished), {})
        if fractions:
            allowed = [f for f in fractions if floor is None or f > floor + 1e-9]
            params[FRACTION] = (allowed or fractions)[0] if floor is None else max(fractions)
            high = [
                num(p.params.get(FRACTION))
                for p in finished
                if p.push is Push.LOWER and FRACTION in p.params
            ]
            why += "; nothing held: " + nothing_between(
                floor, min(high, default=None), fractions, finished
            )
    return ({k: v for k, v in params.items() if k in axes}, CONFIRM_RULE, why)


def _text(combo: Mapping[str, Scalar]) -> str:
    return ", ".join(f"{k}={fmt(v)}" for k, v in combo.items()) or "the fixed setting"


def _at(params: Mapping[str, Scalar], combo: Mapping[str, Scalar]) -> bool:
    """Whether the point `params` runs the combination `combo` (`config.space.PointKey`)."""
    return point_key(combo).within(point_key(params))
