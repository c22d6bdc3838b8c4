"""What the finished launches establish for the capacity-aware planner, once a model can be fit.

`PlanState` reads the launches once per proposal: the memory model fitted to them, its
calibration and the doubt the launches cast on it, the failures that bound the search (and
those that are noise), the best stable launch and the most capacity held only thinly, the
reference launch whose demand the capacity search keeps to, and the candidate settings the
model lets start and no failure or running launch rules out. Every rule (`search.edge`,
`search.holding`, `search.explore`) and the words of the proposals (`search.words`) judge from
this one reading, so two rules never disagree on what is stable or what a setting's odds are;
it decides nothing itself, which `search.planner` does, rule by rule.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from typing import TypeAlias

from autotune.config.schema import Scalar
from autotune.config.space import FIXED_FRACTION_STEP, PointKey, same_value
from autotune.memory.fit import SPIKE_RATIO, fit
from autotune.memory.model import Forecast, Setting
from autotune.search.calibration import calibrate
from autotune.search.doubt import DOUBT_Z, REPEATS, doubt
from autotune.search.points import (
    CHUNK,
    FRACTION,
    MEMORY_PARAMS,
    REQUESTS,
    SAME_CAPACITY,
    Point,
    Push,
    best_of,
    host_failure,
    key_of,
    needs_more,
    num,
    same_gpu,
    setting_of,
    tokens_of,
)
from autotune.search.proposal import Goal
from autotune.search.retries import retry_once

MAX_CANDIDATES = 4000
NEIGHBOURS = 2
"""Past MAX_CANDIDATES settings, axes other than the fraction keep this many values each side of
the reference launch's."""

Scored: TypeAlias = tuple[dict[str, Scalar], Forecast, float]
"""A candidate setting's parameters, its forecast and its p(stable)."""


class PlanState:
    """The launches as the rules read them: the model and its doubt, the bounds, the best and
    the thin hold, the reference launch, the taken points and the candidates."""

    def __init__(
        self,
        axes: Mapping[str, Sequence[Scalar]],
        names: Sequence[str],
        known: Sequence[Point],
        pending: Sequence[Mapping[str, Scalar]],
        goal: Goal,
    ) -> None:
        self.axes = axes
        self.names = names
        self.known = known
        self.pending = pending
        self.goal = goal
        self.bounds = [p for p in known if _bounds(p, known)]
        """Failures that bound the search: each rules out every setting needing at least as
        much memory of its kind. A GPU-memory failure that a launch needing at least as much
        memory contradicts (it held) is noise of the peak, not a bound: it widens the model's
        margins instead (`calibration`), until the failures are too many for the holds
        (`_bounds`)."""
        # a runtime OOM that a launch needing more memory contradicts says nothing of the peak
        # those settings will see (the model would take it as a floor for all of them)
        self.model = fit(
            p.observation
            for p in known
            if p.observation is not None
            and not (p.observation.outcome == "runtime_oom" and _contradicted(p, known))
        )
        self.cal = calibrate(known)
        # launches that contradict the model beyond its noise (`search.doubt`): margins judged
        # against a heavy tail (which answers for the outliers, not a wider spread), the edge
        # repeated, and the why and the end say so
        self.doubt = doubt(known, self.cal)
        if self.doubt.tails:
            self.cal = dataclasses.replace(self.cal, clip=DOUBT_Z)
        started = [p for p in known if p.observation and p.observation.started]
        last = started[-1] if started else known[-1]
        assert last.observation is not None
        self.default_slots = last.observation.slots
        self.default_chunk = last.observation.chunk
        # held: kept the headroom, and nothing needing no more GPU memory failed (a repeat of
        # the same fraction, requests and chunk that ran out of headroom disqualifies it)
        held = [
            p
            for p in known
            if p.feasible and p.observation and p.observation.tokens and not self.beaten(p)
        ]
        # stable: held, and the model (widened by its misses) expects it to hold again; one
        # stress phase that happened to pass at the edge is not stability
        stable = [p for p in held if self.proven(p)]
        if not stable:
            # what held REPEATS times is stable by measurement, whatever a doubted model says:
            # a study never ends with nothing kept when a setting held
            stable = [p for p in held if self.holds(p) >= REPEATS]
        self.best = best_of(stable)
        self.cap = tokens_of(self.best) if self.best else 0
        unproven = [
            p for p in held if p not in stable and tokens_of(p) > (1 + SAME_CAPACITY) * self.cap
        ]
        self.thin = best_of(unproven)
        """The most capacity that held but that the model does not call stable yet."""
        self.ref = self.best or self.thin or last
        ref_obs = self.ref.observation
        assert ref_obs is not None
        self.default_slots = ref_obs.slots
        self.default_chunk = ref_obs.chunk
        self.launched_gpu = [p.observation.setting for p in known if p.observation is not None]
        self.taken = {key_of(p.params, names) for p in known if not retry_once(p, known)}
        self.taken |= {key_of(p, names) for p in pending}
        self.floor = max((f for p in known if (f := p.floor) is not None), default=None)
        """Below this fraction the KV pool finds no room (a launch's ledger said so)."""

    def p_stable(self, fc: Forecast) -> float:
        """p(stable) of a forecast, its margin widened by the model's misses (`calibration`),
        judged against a heavy tail where the launches contradict the model's (`doubt`)."""
        tail = self.doubt.p_above if self.doubt.tails else None
        return self.cal.p_stable(fc, self.goal.min_headroom_gib, tail)

    def forecast(self, s: Setting) -> Forecast:
        """The model's forecast for `s`, with the reference launch's requests and chunk where
        `s` leaves them to SGLang."""
        return self.model.forecast(
            s, default_slots=self.default_slots, default_chunk=self.default_chunk
        )

    def p_stable_of(self, p: Point) -> float:
        """p(stable) of the setting a finished launch ran."""
        assert p.observation is not None
        return self.p_stable(self.forecast(p.observation.setting))

    def proven(self, p: Point) -> bool:
        """A launch that held counts as stable while the model cannot judge it (no stress peak
        measured yet), or when it expects it to hold again with accept_p."""
        assert p.observation is not None
        fc = self.forecast(p.observation.setting)
        return fc.headroom is None or self.p_stable(fc) >= self.goal.accept_p

    def beaten(self, p: Point) -> bool:
        """Whether a failure that bounds the search needed no more memory than `p`'s setting:
        then `p` holding says nothing for it (a repeat of it ran out)."""
        s = p.observation.setting if p.observation else None
        for q in self.known:
            o = q.observation
            if s is None or o is None or q not in self.bounds or host_failure(o) is not None:
                continue
            if needs_more(s, o.setting):
                return True
        return False

    # ---- candidates ----------------------------------------------------------------------

    def candidates(self) -> list[tuple[dict[str, Scalar], Forecast]]:
        """The untaken settings of the memory parameters (the other searched parameters as the
        reference launch has them), with their forecasts, that nothing rules out and the model
        expects to start."""
        mem = [n for n in self.names if n in MEMORY_PARAMS]
        fixed = {k: v for k, v in self.ref.params.items() if k in self.axes and k not in mem}
        values = {n: list(self.axes[n]) for n in mem}
        size = 1
        for v in values.values():
            size *= len(v)
        if size > MAX_CANDIDATES:
            # a large space: the other axes near the reference launch's values only
            for n in mem:
                if n != FRACTION:
                    values[n] = _window(values[n], self.ref.params.get(n), NEIGHBOURS)
        out = []
        for combo in itertools.product(*(values[n] for n in mem)):
            params: dict[str, Scalar] = {
                **self.ref.params,
                **fixed,
                **dict(zip(mem, combo, strict=True)),
            }
            params = {k: v for k, v in params.items() if k in self.axes}
            if key_of(params, self.names) in self.taken:
                continue
            s = setting_of({**self.ref.params, **params})
            if s is None or self.ruled_out(s):
                continue
            fc = self.forecast(s)
            if fc.blocked is None and fc.p_start() >= 0.5:
                out.append((params, fc))
        return out

    def ruled_out(self, s: Setting) -> bool:
        """Needs at least as much memory as a launch that failed (or one still running), or
        leaves the KV pool no room (at or below a fraction whose pool found none)."""
        if self.floor is not None and s.mem_fraction <= self.floor + 1e-9:
            return True
        for p in self.bounds:
            o = p.observation
            assert o is not None
            if needs_more(s, o.setting, host=host_failure(o)):
                return True
        for params in self.pending:
            other = setting_of(params)
            if (
                other is not None
                and tokens_rank(other) > _tokens_rank_cap(self)
                and needs_more(s, other)
            ):
                return True
        return False

    def holds(self, p: Point) -> int:
        """How many times `p`'s GPU setting held: one for each stress pass of each launch of it
        that held (a launch that ran its stress phases `repeats` times held that often)."""
        s = p.observation.setting if p.observation else None
        return sum(
            q.repeats
            for q in self.known
            if s is not None and q.feasible and q.observation and same_gpu(q.observation.setting, s)
        )

    def distance(self, params: Mapping[str, Scalar], demand: bool = True) -> int:
        """How many parameters other than the fraction differ from the reference launch (with
        `demand` False, nor max_running_requests and chunked_prefill_size)."""
        skip = (FRACTION,) if demand else (FRACTION, REQUESTS, CHUNK)
        return sum(
            not same_value(params.get(n), self.ref.params.get(n))
            for n in self.names
            if n not in skip
        )

    def besides_demand(self, params: Mapping[str, Scalar]) -> PointKey:
        """The point less the fraction, max_running_requests and the prefill chunk: two points
        with equal ones differ at most in their GPU memory demand."""
        return key_of(params, self.names).without((FRACTION, REQUESTS, CHUNK))

    def grid_fraction_step(self) -> float:
        """The smallest gap between two fractions of the candidate grid the plan walks
        (`config.space.FIXED_FRACTION_STEP` when it holds fewer than two: the fraction does not
        move). Not `config.space.fraction_step`: that is the lattice a range is walked on, and
        this is the spacing of the values handed to the plan, the same for a range but wider
        for a choice of fractions (`[0.80, 0.85, 0.90]` is walked by 0.05)."""
        fs = sorted(float(v) for v in self.axes.get(FRACTION, ()))
        return min((b - a for a, b in itertools.pairwise(fs)), default=FIXED_FRACTION_STEP)

    def steps_above_best(self, params: Mapping[str, Scalar]) -> int:
        """How many fraction steps `params` lies above the best stable launch (2 when either is
        not known)."""
        f = params.get(FRACTION)
        if not isinstance(f, float | int) or self.best is None or self.best.observation is None:
            return 2
        return round(
            (float(f) - self.best.observation.setting.mem_fraction) / self.grid_fraction_step()
        )


def _contradicted(p: Point, known: Sequence[Point]) -> bool:
    """A GPU-memory failure where a launch needing at least as much GPU memory held, or a
    runtime OOM that was a spike (`_spike`)."""
    o = p.observation
    if o is None or host_failure(o) is not None or p.push is not Push.LOWER:
        return False
    return _spike(p, known) or any(
        q.feasible and q.observation is not None and needs_more(q.observation.setting, o.setting)
        for q in known
    )


def _bounds(p: Point, known: Sequence[Point]) -> bool:
    """Whether a memory failure bounds the search: it is not contradicted (`_contradicted`), or
    the failures at or below its setting are too many for the holds at or above it to stand for
    a stable setting (`_refuted`: one failure beside a hold is a spike of the tail, a second one
    is the edge). A refuted hold is still left out of the model's fit as a contradicted OOM is:
    its peak is the tail's, not the setting's mean."""
    if not p.memory_failure:
        return False
    o = p.observation
    if not _contradicted(p, known) or o is None:
        return True
    held = failed = 0
    for q in known:
        x = q.observation
        if x is None:
            continue
        if q.feasible and needs_more(x.setting, o.setting):
            held += q.repeats
        elif q.push is Push.LOWER and host_failure(x) is None and needs_more(o.setting, x.setting):
            failed += 1
    return _refuted(held, failed)


STABLE_FAILS = 0.05
"""The most often a stable setting's stress pass fails (the benchmark's stable: 95%)."""
REFUTED = 0.05
"""Failures a stable setting shows with less than this chance refute the holds beside them."""


def _refuted(held: int, failed: int) -> bool:
    """Whether `failed` GPU-memory failures at or below a setting, beside `held` holds at or
    above it (each of which it would have held or failed alike: memory is monotone), are more
    than a setting that fails `STABLE_FAILS` of its passes shows but with chance `REFUTED`. One
    failure beside one hold is not (10%): a spike of the tail, which widens the margins; two
    beside two are (1.4%): the setting is not stable, and the failures bound the search."""
    n = held + failed
    tail = sum(
        math.comb(n, k) * STABLE_FAILS**k * (1 - STABLE_FAILS) ** (n - k)
        for k in range(failed, n + 1)
    )
    return tail < REFUTED


def _spike(p: Point, known: Sequence[Point]) -> bool:
    """A runtime OOM above a peak its demand never came near: its forward needed more than the
    static free memory, over SPIKE_RATIO times the largest stress peak that launches of the same
    requests and chunk measured while they held. The first such OOM at a setting is a rare
    spike of the peak's tail, not the edge (the calibration still counts the miss)."""
    o = p.observation
    if o is None or o.outcome != "runtime_oom" or o.static_free_gib is None:
        return False
    same = [q.observation for q in known if q.observation is not None]
    if sum(1 for x in same if x.outcome == "runtime_oom" and same_gpu(x.setting, o.setting)) > 1:
        return False
    peaks = [
        peak
        for x in same
        if x.feasible
        and x.slots == o.slots
        and x.chunk == o.chunk
        and (peak := x.measured_peak_gib) is not None
    ]
    return bool(peaks) and o.static_free_gib > SPIKE_RATIO * max(peaks)


def tokens_rank(s: Setting) -> float:
    """How a setting ranks for capacity: at one model, the pool grows with the fraction."""
    return s.mem_fraction


def _tokens_rank_cap(planner: PlanState) -> float:
    if planner.best is None or planner.best.observation is None:
        return -1.0
    return planner.best.observation.setting.mem_fraction


def fc_tokens(fc: Forecast) -> float:
    """The tokens a forecast expects (0 where the model cannot say)."""
    return fc.tokens.mean if fc.tokens is not None else 0.0


def _window(values: list[Scalar], at: Scalar | None, width: int) -> list[Scalar]:
    """`values` within `width` places of `at` (the nearest value when `at` is not among them)."""
    if not values:
        return values
    idx = min(range(len(values)), key=lambda i: abs(num(values[i]) - num(at)))
    return values[max(0, idx - width) : idx + width + 1]
