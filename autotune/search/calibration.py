"""How well the memory model predicted each launch, and how much to widen its margins (pure).

The model is SGLang's arithmetic fitted to the launches so far; the real box can differ from it
(the allocator grows while serving, ranks are not identical, peaks have heavy tails, a transient
grows with the live context, rare spikes). So the search checks the model against every launch
before trusting it: for each launch, the model fitted on the launches *before* it predicts the
headroom it would keep under the stress peak (static free memory minus the stress peak, as the
GPU probe sees it), and the launch's measurement scores that prediction in standard deviations,

    z = (measured headroom − predicted headroom) / predicted sd.

A launch that ran out of memory under load kept less than nothing: its z is that of a headroom
of 0, an upper bound. A launch that ran out of memory at startup after its pool was allocated
scores the predicted static free memory against 0 the same way.

If the model is right, z is about standard normal. The widening factor `kappa` is the root mean
square of the misses, shrunk towards 1 by `PRIOR_WEIGHT` launches' worth of a model that is right:
`kappa² = (PRIOR_WEIGHT + Σ z²) / (PRIOR_WEIGHT + n)`, kept within `MIN_KAPPA`–`MAX_KAPPA` (below 1
when the launches land closer to the predictions than the model's spread says). Every probability
the search computes divides the margin by `kappa · sd` instead of `sd`, so a model that missed by 3
sd once (kappa 1.9) needs about twice the margin before a setting counts as safe, and one that
keeps hitting its predictions keeps its nerve. A miss on the optimistic side (the launch kept less
than predicted) also shifts every prediction down by the mean such miss in GiB (`bias_gib`), since
a world that took more than the model once will likely do so again.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from autotune.logparse.outcome import Outcome
from autotune.memory.fit import fit
from autotune.memory.model import Forecast, phi
from autotune.search.points import Point, Push

PRIOR_WEIGHT = 2.0
"""How many launches' worth of "the model is right" the widening starts from."""
MAX_KAPPA = 4.0
MIN_KAPPA = 0.5
MISS_Z = 2.0
"""A prediction this many sd off is a miss (reported in the proposal's why)."""


@dataclass(frozen=True)
class Check:
    """One launch scored against the model fitted on the launches before it."""

    number: int
    predicted: float
    sd: float
    measured: float
    """The headroom kept (GiB); for a launch that ran out of memory, 0 (an upper bound)."""

    @property
    def z(self) -> float:
        """The miss in standard deviations, `(measured − predicted) / sd` (0 when the sd is 0)."""
        return (self.measured - self.predicted) / self.sd if self.sd > 0 else 0.0

    @property
    def missed(self) -> bool:
        """Whether the prediction was off by `MISS_Z` sd or more: reported in the proposal's why."""
        return abs(self.z) >= MISS_Z


@dataclass(frozen=True)
class Calibration:
    """The model's record against the launches, and the widening it earns."""

    checks: tuple[Check, ...] = ()
    clip: float | None = None
    """With a heavy tail taken for the outliers (`search.doubt`), a miss counts in the spread
    and the bias as at most this many sd: the tail, not a wider spread, answers for it."""

    @property
    def kappa(self) -> float:
        """The widening factor, the root mean square of the z's shrunk towards 1 by `PRIOR_WEIGHT`
        launches and kept within `MIN_KAPPA`–`MAX_KAPPA`; a z above 10 (far more headroom than
        predicted) counts as 10, so one safe surprise cannot take over (and any z beyond `clip`
        as `clip`)."""
        if not self.checks:
            return 1.0
        total = PRIOR_WEIGHT + sum(self._z(c) ** 2 for c in self.checks)
        return min(max(math.sqrt(total / (PRIOR_WEIGHT + len(self.checks))), MIN_KAPPA), MAX_KAPPA)

    def _z(self, c: Check) -> float:
        z = min(c.z, 10.0)
        return z if self.clip is None else max(min(z, self.clip), -self.clip)

    @property
    def bias_gib(self) -> float:
        """How much less headroom than predicted the launches kept, on average over the misses
        on the optimistic side (0 when the model was never optimistic by a miss)."""
        over = [
            c.predicted - c.measured
            if self.clip is None
            else min(c.predicted - c.measured, self.clip * c.sd)
            for c in self.checks
            if c.missed and c.z < 0
        ]
        return sum(over) / (PRIOR_WEIGHT + len(self.checks)) if over else 0.0

    @property
    def misses(self) -> tuple[Check, ...]:
        """The checks that missed, for the why's "the model missed N of M launches"."""
        return tuple(c for c in self.checks if c.missed)

    def p_stable(
        self,
        fc: Forecast,
        min_headroom_gib: float,
        tail: Callable[[float, float], float] | None = None,
    ) -> float:
        """`Forecast.p_stable` with the margin judged against the widened sd and the bias; with
        `tail` (margin, sd → p), against that tail instead of the normal one (`search.doubt`)."""
        p = fc.p_stable(min_headroom_gib)
        head = fc.headroom
        if head is None or fc.blocked is not None:
            return p
        if tail is None and self.kappa == 1.0 and self.bias_gib <= 0:
            return p
        margin = head.mean - self.bias_gib - min_headroom_gib
        sd = head.sd * self.kappa
        if tail is not None:
            wide = tail(margin, sd)
        else:
            wide = phi(margin / sd) if sd > 0 else float(margin >= 0)
        return min(wide, fc.p_start())

    def describe(self) -> str:
        """One clause for the proposal's why ("" while the model has not missed)."""
        if not self.misses:
            return ""
        worst = max(self.misses, key=lambda c: abs(c.z))
        return (
            f"; the model missed {len(self.misses)} of {len(self.checks)} launches (worst: trial "
            f"{worst.number} kept {worst.measured:.2f} GiB, predicted {worst.predicted:.2f} ± "
            f"{worst.sd:.2f}), so its margins are {self.kappa:.1f}× wider"
            + (f" and {self.bias_gib:.2f} GiB lower" if self.bias_gib > 0 else "")
        )


def calibrate(known: Sequence[Point]) -> Calibration:
    """Score every launch against the model fitted on the launches before it."""
    checks = []
    for i, p in enumerate(known):
        check = _check(p, known[:i])
        if check is not None:
            checks.append(check)
    return Calibration(tuple(checks))


def _check(p: Point, before: Sequence[Point]) -> Check | None:
    o = p.observation
    if o is None or not any(q.observation and q.observation.tokens for q in before):
        return None
    started = [q for q in before if q.observation and q.observation.started]
    if not started:
        return None
    model = fit(q.observation for q in before if q.observation is not None)
    ref = started[-1].observation
    assert ref is not None
    fc = model.forecast(o.setting, default_slots=ref.slots, default_chunk=ref.chunk)
    if fc.blocked is not None:
        return None
    ending = Outcome.of(o.outcome)
    if ending == Outcome.OK and o.headroom_gib is not None:
        head = fc.headroom
        if head is None:
            return None
        return Check(p.number, head.mean, head.sd, o.headroom_gib)
    if o.gpu_oom_under_load:
        head = fc.headroom
        if head is None:
            return None
        return Check(p.number, head.mean, head.sd, min(0.0, head.mean))
    if ending.fails_at_startup and p.push is Push.LOWER and o.tokens and fc.static_free:
        free = fc.static_free
        return Check(p.number, free.mean, free.sd, min(0.0, free.mean))
    return None
