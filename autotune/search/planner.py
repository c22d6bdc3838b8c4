"""The capacity-aware search's decisions, as a pure function of what the trials recorded.

`plan` looks at the finished launches (their ledgers, outcomes and stress peaks), the launches
other workers are running now, and the candidate values of each searched parameter, fits the
memory model and returns the next setting with the rule that chose it and why:

* `start`: nothing is known; a conservative point (the study's baseline normally comes first).
* `jump` / `step`: the highest-capacity setting the model calls safe (stable with a margin of
  two standard deviations over the required headroom) and better than the best stable so far,
  at the demand most likely to hold at its fraction.
* `edge`: one fraction step above that safe setting instead, when the model gives it accept_p:
  if it holds it counts as stable, and the safe one would only have been the launch before it.
* `bisect`: no better setting is safe but some are uncertain; probe the middle of the uncertain
  range, between the best stable setting and the lowest known or predicted failure. Also when
  the highest safe setting lies several steps below a failure (a miss widened the margins):
  halfway between the two instead of one safe step at a time.
* `down`: nothing stable yet and nothing predicted safe; the most likely to be stable.
* `explore`: the capacity edge is known to one step; try max_running_requests, the host cache
  and the prefill chunk one at a time at that capacity, for throughput: only a launch that can
  add a point to the capacity/throughput front (`search.front`: more requests where the fitted
  throughput law puts them above the noise of what held, one probe of another host cache or
  chunk, the axis left where it moved nothing). A probe of more requests that held once with
  a thin margin (below accept_p) is answered by the highest fraction below it the model expects
  to hold at its demand, the point of the front that demand really holds; until then the thin
  hold does not stand for that point.
* `secure` / `recheck`: the best setting held with a thin margin; first the highest fraction
  the model calls safe for its demand (unless more demand held there), then the best again
  until it held RECHECKS times. Where the launches contradict the model, `secure` also holds
  the step below the best before the search turns to throughput or ends.
* `confirm`: what is left to learn is smaller than one step; run the best setting again and say
  so in `done`.

Where the launches contradict the model beyond its noise (`search.doubt`), its margins are
judged against a heavy tail, the best setting runs until it held twice (`recheck`), and the why
and `done` give the evidence instead of "smaller than one step". A setting that held twice is
stable by measurement, and one that held runs again before the search would end with nothing
kept.

Settings that the model says cannot start (no room for KV, host RAM exceeded, host cache smaller
than the GPU pool) are never proposed, nor settings that need at least as much memory as one
that already failed, nor what another worker is running (whose outcome is assumed to be a
failure until it is known, so workers spread below each other's probes).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from autotune.config.space import (
    PointKey,
    Space,
    canonical,
    canonical_value,
    point_key,
    same_value,
    step_of,
)
from autotune.config.studyfile import Scalar
from autotune.memory.model import SPIKE_RATIO, Forecast, MemoryModel, Setting, fit
from autotune.search.calibration import calibrate
from autotune.search.doubt import DOUBT_Z, REPEATS, doubt
from autotune.search.front import (
    FRONT_GAIN,
    SAME_TOKENS,
    ThroughputFit,
    dominated,
    fit_throughput,
    gain,
    no_effect,
)
from autotune.search.points import (
    CHUNK,
    FRACTION,
    HICACHE,
    MEMORY_PARAMS,
    REQUESTS,
    Point,
    Push,
    fmt,
    host_failure,
    needs_more,
    num,
    setting_of,
    tokens_of,
)

EXPLORE_FLOOR = 0.7
"""Exploring for throughput gives up at most this share of the best capacity: each more
max_running_requests at the highest fraction safe for it is a point of the capacity/throughput
front while it keeps this much."""
MAX_CANDIDATES = 4000
NEIGHBOURS = 2
"""Past MAX_CANDIDATES settings, axes other than the fraction keep this many values each side of
the reference launch's."""
FRONT_PROBE_P = 0.5
"""More max_running_requests at the best capacity is probed for throughput from this p(stable)
on, not only from `safe_p`: where the launches contradict the model its margins widen, and the
point of the front that holds the most capacity at the most requests would otherwise never be
measured. A probe that fails is the crash that tells the search its peak; the export takes only
what held."""
RECHECKS = 3
"""A best setting with a thin margin is run until it held this many times (or failed once)."""
HALFWAY_STEPS = 3.5
"""A safe setting this many fraction steps or more below a failure (or a thin hold) is not
stepped to but bisected past (`_halfway`)."""
SAME_CAPACITY = 0.002
"""Launches of one fraction differ by launch jitter (a few hundred tokens); this much is a tie."""


@dataclass(frozen=True)
class Goal:
    """What counts as stable and how bold to be."""

    min_headroom_gib: float = 0.0
    safe_p: float = 0.977
    """A setting is safe when it is stable with this probability (two standard deviations)."""
    probe_p: float = 0.25
    """An uncertain setting is worth a launch from this probability of being stable."""
    explore: bool = True
    """Whether throughput is an objective (explore requests and host cache at the edge)."""
    accept_p: float = 0.9
    """A launch that held counts as stable when the model expects it to hold again with this
    probability (a thin margin that held once is not stability)."""


@dataclass(frozen=True)
class Proposal:
    """What `plan` returns: the point to launch, the rule that chose it and why, `done` when nothing
    is left worth a launch, and the forecast and model behind it."""

    params: dict[str, Scalar]
    rule: str
    why: str
    done: str | None = None
    forecast: Forecast | None = None
    model: MemoryModel | None = field(default=None, compare=False)
    kappa: float = 1.0
    """How much wider than the model's own the margins were (`calibration`)."""


def plan(
    axes: Mapping[str, Sequence[Scalar]],
    finished: Sequence[Point],
    pending: Sequence[Mapping[str, Scalar]],
    goal: Goal,
    space: Space | None = None,
) -> Proposal:
    """The next setting to launch, given candidate values per searched parameter. Every point
    (the candidates, the finished launches, those running elsewhere) is taken in its canonical
    form in `space` (`config.space.canonical`) first, so what is taken, what runs and what to
    retry are told apart by the one identity of a point."""
    axes = {n: tuple(canonical_value(v, step_of(space, n)) for v in vs) for n, vs in axes.items()}
    names = sorted(axes)
    known = [
        dataclasses.replace(p, params=canonical(p.params, space))
        for p in finished
        if p.observation is not None
    ]
    pending = [canonical(p, space) for p in pending]
    if not any(p.observation.tokens for p in known if p.observation):
        return _without_model(axes, names, known, pending)
    return _Planner(axes, names, known, pending, goal).run()


# ---------------------------------------------------------------------------------------------
# Before any launch showed a KV pool


def _without_model(
    axes: Mapping[str, Sequence[Scalar]],
    names: Sequence[str],
    known: Sequence[Point],
    pending: Sequence[Mapping[str, Scalar]],
) -> Proposal:
    base: dict[str, Scalar] = {n: _start_value(n, axes[n]) for n in names}
    if known or pending:
        source = known[-1].params if known else pending[0]
        base.update({k: v for k, v in source.items() if k in axes and k != FRACTION})
    taken = {_key(p.params, names) for p in known if not _retry_once(p, known)}
    taken |= {_key(p, names) for p in pending}
    report = _not_memory(known)
    if report is not None:
        return Proposal(dict(base), "confirm", report, done=report)
    retry = next((p for p in reversed(known) if _retry_once(p, known)), None)
    if retry is not None and _key(retry.params, names) not in {_key(p, names) for p in pending}:
        params = {k: v for k, v in retry.params.items() if k in axes}
        return Proposal(params, "retry", _retry_why(retry))
    if FRACTION not in axes:
        return _untried(axes, names, base, taken, nothing_started=bool(known))
    fractions = sorted(float(v) for v in axes[FRACTION])
    if fractions and any(p.too_low or p.memory_failure for p in known):
        return _bracket(base, names, fractions, known, taken)
    params = dict(base)
    start = params.get(FRACTION)
    if isinstance(start, float | int) and not isinstance(start, bool):
        # nearest to the conservative start first, lower before higher
        for f in sorted(fractions, key=lambda f: (abs(f - float(start)), f)):
            params[FRACTION] = f
            if _key(params, names) not in taken:
                break
    return Proposal(params, "start", "no launch recorded yet: a conservative first setting")


FLOOR_SHARE = 0.1
"""Above a pool that found no room, the first launch leaves this share of the window between
the lowest fraction that holds a pool and 1 to the pool: the reserve keeps 90% of what the
weights left free for the request table, the workspaces, CUDA graphs and the peak."""


def _bracket(
    base: Mapping[str, Scalar],
    names: Sequence[str],
    fractions: Sequence[float],
    known: Sequence[Point],
    taken: set[PointKey],
) -> Proposal:
    """Nothing started yet, and the failures say which way: above every pool that found no room
    (the ledger's `1 − A/P` gives the lowest fraction that holds one, so one such failure is
    enough to jump there), below every launch that ran out of memory."""
    floor = max((f for p in known if (f := p.floor) is not None), default=None)
    high = [
        p.observation.setting.mem_fraction
        for p in known
        if p.memory_failure and p.observation is not None and host_failure(p.observation) is None
    ]
    ceiling = min(high, default=None)
    inside = [
        f
        for f in fractions
        if (floor is None or f > floor + 1e-9)
        and (ceiling is None or f < ceiling - 1e-9)
        and _key({**base, FRACTION: f}, names) not in taken
    ]
    if not inside:
        done = nothing_between(floor, ceiling, fractions, known)
        return Proposal(dict(base), "confirm", done, done=done)
    if floor is None:
        assert ceiling is not None
        pick = inside[len(inside) // 2]
        why = f"{FRACTION} {fmt(ceiling)} ran out of memory at startup; halfway down to {fmt(pick)}"
        return Proposal({**base, FRACTION: pick}, "down", why)
    target = floor + FLOOR_SHARE * (1.0 - floor)
    if ceiling is not None:
        target = min(target, (floor + ceiling) / 2)
    pick = next((f for f in inside if f >= target - 1e-9), inside[-1])
    low = max(p.observation.setting.mem_fraction for p in known if p.too_low and p.observation)
    why = (
        f"{FRACTION} {fmt(low)} left no room for the KV pool (the fraction was too low, not too "
        f"high): its ledger puts the lowest fraction that holds a pool at {floor:.4f}; up to "
        f"{fmt(pick)}, which keeps most of the memory the weights left for the reserve"
    )
    return Proposal({**base, FRACTION: pick}, "up", why)


def nothing_between(
    floor: float | None, ceiling: float | None, fractions: Sequence[float], known: Sequence[Point]
) -> str:
    """The closing reason when no fraction of the range is left, in the failures' own terms."""
    if floor is not None and ceiling is None:
        o = next(p.observation for p in known if p.too_low and p.observation)
        led = o.ledger
        left = (
            f": the weights leave {led.avail_after_weights_gib:.2f} of {led.p_gib:.2f} GiB free"
            if led.avail_after_weights_gib is not None and led.p_gib is not None
            else ""
        )
        return (
            f"no {FRACTION} in the range holds a KV pool{left}, which needs {FRACTION} above "
            f"{floor:.4f} (the highest searched is {fmt(max(fractions))}); raise the range's top, "
            "or spread the weights over more GPUs"
        )
    if ceiling is not None and floor is None:
        return f"even the lowest {FRACTION} ({fmt(min(fractions))}) runs out of memory"
    return (
        f"no {FRACTION} is left between {floor:.4f} (below it the KV pool finds no room) and "
        f"{fmt(ceiling)} (at and above it startup runs out of memory)"
    )


RETRIES = 1
"""A failure that is not about memory (a crash, a start error) is run once more at the same
setting: one fluke is not a fault of the setting."""
NOT_MEMORY_STREAK = 3
"""This many launches in a row that failed for reasons not about memory end the search."""


def _retry_once(p: Point, known: Sequence[Point]) -> bool:
    """A failure that says nothing about memory, at a setting not yet tried RETRIES more times."""
    if p.feasible or p.observation is None or p.push is not Push.NONE:
        return False
    mine = point_key(p.params)
    same = [q for q in known if point_key(q.params) == mine]
    return len(same) <= RETRIES and p is same[-1]


def _key(params: Mapping[str, Scalar], names: Iterable[str]) -> PointKey:
    """The identity of `params` on the searched `names` (`config.space.point_key`)."""
    return point_key(params).only(names)


def _retry_why(p: Point) -> str:
    o = p.observation
    reason = o.reason.split(":", 1)[0] if o and o.reason else (o.outcome if o else "failed")
    return (
        f"trial {p.number} failed for a reason that is not a memory setting ({reason}); the "
        "same setting once more, to tell a fluke from a fault"
    )


def _not_memory(known: Sequence[Point]) -> str | None:
    """The closing report when the latest launches all failed for reasons not about memory."""
    tail = list(known)[-NOT_MEMORY_STREAK:]
    if len(tail) < NOT_MEMORY_STREAK or not all(
        not p.feasible and p.observation is not None and p.push is Push.NONE for p in tail
    ):
        return None
    o = tail[-1].observation
    assert o is not None
    return (
        f"the last {NOT_MEMORY_STREAK} launches failed for reasons that are not a memory setting "
        f"(the latest: {o.reason or o.outcome}); read the server's log (`autotune ledger LOG`) "
        "before searching on"
    )


def _untried(
    axes: Mapping[str, Sequence[Scalar]],
    names: Sequence[str],
    base: dict[str, Scalar],
    taken: set[PointKey],
    *,
    nothing_started: bool,
) -> Proposal:
    """mem_fraction_static is not searched (fixed, or SGLang's own choice) and no launch showed a
    KV pool yet: the conservative start, then untried combinations, the least memory first."""
    if _key(base, names) not in taken:
        return Proposal(base, "start", "no launch recorded yet: a conservative first setting")
    ordered = [sorted(axes[n], key=_order) for n in names]
    for combo in itertools.product(*ordered):
        params = dict(zip(names, combo, strict=True))
        if _key(params, names) not in taken:
            why = "an untried combination, the least memory first"
            if nothing_started:
                why = f"nothing started yet at the fixed {FRACTION}; {why}"
            return Proposal(params, "down", why)
    if nothing_started:
        done = "no combination of the searched parameters starts"
        return Proposal(base, "confirm", "nothing starts", done=done)
    return Proposal(base, "start", "every combination is taken by another worker: the start again")


def _order(v: Scalar) -> tuple[str, Scalar]:
    return (str(type(v)), v)


def _start_value(name: str, values: Sequence[Scalar]) -> Scalar:
    ordered = sorted(values, key=_order)
    if name == FRACTION:
        return ordered[len(ordered) // 4]
    if name == HICACHE and 0 in ordered:
        return 0
    return ordered[len(ordered) // 2]


# ---------------------------------------------------------------------------------------------
# With a model


class _Planner:
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
        self.bounds = [p for p in known if p.memory_failure and not _contradicted(p, known)]
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
        """Failures that bound the search: each rules out every setting needing at least as
        much memory of its kind. A GPU-memory failure that a launch needing at least as much
        memory contradicts (it held) is noise of the peak, not a bound: it widens the model's
        margins instead (`calibration`)."""
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
            if p.feasible and p.observation and p.observation.tokens and not self._beaten(p)
        ]
        # stable: held, and the model (widened by its misses) expects it to hold again; one
        # stress phase that happened to pass at the edge is not stability
        stable = [p for p in held if self._proven(p)]
        if not stable:
            # what held REPEATS times is stable by measurement, whatever a doubted model says:
            # a study never ends with nothing kept when a setting held
            stable = [p for p in held if self._runs(p) >= REPEATS]
        self.best = _best_of(stable)
        self.cap = tokens_of(self.best) if self.best else 0
        unproven = [
            p for p in held if p not in stable and tokens_of(p) > (1 + SAME_CAPACITY) * self.cap
        ]
        self.thin = _best_of(unproven)
        """The most capacity that held but that the model does not call stable yet."""
        self.ref = self.best or self.thin or last
        ref_obs = self.ref.observation
        assert ref_obs is not None
        self.default_slots = ref_obs.slots
        self.default_chunk = ref_obs.chunk
        self.launched_gpu = [p.observation.setting for p in known if p.observation is not None]
        self.taken = {_key(p.params, names) for p in known if not _retry_once(p, known)}
        self.taken |= {_key(p, names) for p in pending}
        self.floor = max((f for p in known if (f := p.floor) is not None), default=None)
        """Below this fraction the KV pool finds no room (a launch's ledger said so)."""

    def _p(self, fc: Forecast) -> float:
        """p(stable) of a forecast, its margin widened by the model's misses (`calibration`),
        judged against a heavy tail where the launches contradict the model's (`doubt`)."""
        tail = self.doubt.p_above if self.doubt.tails else None
        return self.cal.p_stable(fc, self.goal.min_headroom_gib, tail)

    def _forecast(self, s: Setting) -> Forecast:
        return self.model.forecast(
            s, default_slots=self.default_slots, default_chunk=self.default_chunk
        )

    def _p_of(self, p: Point) -> float:
        assert p.observation is not None
        return self._p(self._forecast(p.observation.setting))

    def _proven(self, p: Point) -> bool:
        """A launch that held counts as stable while the model cannot judge it (no stress peak
        measured yet), or when it expects it to hold again with accept_p."""
        assert p.observation is not None
        fc = self._forecast(p.observation.setting)
        return fc.headroom is None or self._p(fc) >= self.goal.accept_p

    def _beaten(self, p: Point) -> bool:
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
            if _key(params, self.names) in self.taken:
                continue
            s = setting_of({**self.ref.params, **params})
            if s is None or self._ruled_out(s):
                continue
            fc = self.model.forecast(
                s, default_slots=self.default_slots, default_chunk=self.default_chunk
            )
            if fc.blocked is None and fc.p_start() >= 0.5:
                out.append((params, fc))
        return out

    def _ruled_out(self, s: Setting) -> bool:
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
                and _tokens_rank(other) > _tokens_rank_cap(self)
                and needs_more(s, other)
            ):
                return True
        return False

    # ---- the rules ---------------------------------------------------------------------------

    def run(self) -> Proposal:
        report = _not_memory(self.known)
        if report is not None:
            return self._stop(report)
        cands = self.candidates()
        g = self.goal
        scored = [(p, fc, self._p(fc)) for p, fc in cands]
        # better by at least half a step: launch jitter moves the pool by a few tokens; a
        # setting of the same GPU memory as one launched already (another host cache) teaches
        # nothing about the edge
        slope = self.model.tokens_slope or 0.0
        # more requests or a bigger chunk add no capacity, only peak and graph memory: the
        # capacity search keeps to the reference launch's demand or less (explore goes beyond)
        assert self.ref.observation is not None
        ref = self.ref.observation.setting
        better = [
            x
            for x in scored
            if _fc_tokens(x[1]) > self.cap + 0.5 * slope * self._step()
            and not any(_same_gpu(x[1].setting, s) for s in self.launched_gpu)
            and not _more_demand(x[1].setting, ref)
        ]
        if self.thin is not None:
            margin = self._margin(scored)
            if margin is not None:
                return margin
        safe = [x for x in better if x[2] >= g.safe_p]
        if safe:
            params, fc, p = max(
                safe,
                key=lambda x: (
                    _tokens_rank(x[1].setting),
                    -self._distance(x[0], demand=False),
                    x[2],
                ),
            )
            halfway = self._halfway(params, fc, better)
            if halfway is not None:
                return halfway
            edge = self._edge(params, fc, better)
            if edge is not None:
                return edge
            if self.best is None:
                rule = "down"
            else:
                rule = "jump" if self._steps_above_best(params) > 1 else "step"
            return self._proposal(params, fc, rule, f"p(stable) {p:.2f}")
        noise = self._noise_retry(scored)
        if noise is not None:
            return noise
        doubtful = [x for x in better if x[2] >= g.probe_p]
        if doubtful:
            params, fc, p = self._bisect(doubtful)
            return self._proposal(params, fc, "bisect", f"uncertain, p(stable) {p:.2f}")
        if self.best is None:
            viable = [x for x in scored if x[2] > 0.0]
            if viable:
                params, fc, p = max(
                    viable,
                    key=lambda x: (x[2] >= g.safe_p, x[2] >= g.probe_p, _fc_tokens(x[1]), x[2]),
                )
                return self._proposal(params, fc, "down", f"p(stable) {p:.2f}")
            kept = self._keep()
            if kept is not None:
                return kept
            return self._done("no setting left that the model expects to be stable")
        secure = self._secure(scored)
        if secure is not None:
            return secure
        below = self._below(scored)
        if below is not None:
            return below
        recheck = self._recheck()
        if recheck is not None:
            return recheck
        if g.explore:
            explored = self._explore(scored)
            if explored is not None:
                return explored
        return self._done(self._edge_summary(scored))

    def _halfway(
        self,
        top: Mapping[str, Scalar],
        safe: Forecast,
        better: list[tuple[dict[str, Scalar], Forecast, float]],
    ) -> Proposal | None:
        """The highest setting the model calls safe lies more than HALFWAY_STEPS below the
        lowest launch that failed on GPU memory, or held only with a thin margin: a miss has
        widened the model's margins (`calibration`), and climbing from there one safe step at a
        time costs a launch per step. A launch halfway between the two, of no more demand,
        halves that bracket instead, while the model gives it at least probe_p (the host cache
        and the other axes as the safe setting has them)."""
        f0 = safe.setting.mem_fraction
        step = self._step()
        above = [
            q.observation.setting.mem_fraction
            for q in self.known
            if q.observation is not None
            and (q is self.thin or (q.push is Push.LOWER and host_failure(q.observation) is None))
            and q.observation.setting.mem_fraction > f0 + HALFWAY_STEPS * step
        ]
        if not above:
            return None
        hi = min(above)
        mid = (f0 + hi) / 2
        inside = [
            x
            for x in better
            if x[2] >= self.goal.probe_p
            and f0 + 1.5 * step < x[1].setting.mem_fraction < hi - 1.5 * step
            and not _more_demand(x[1].setting, safe.setting)
            and self._besides_demand(x[0]) == self._besides_demand(top)
        ]
        if not inside:
            return None
        params, fc, p = _nearest(inside, mid, step)
        return self._proposal(
            params,
            fc,
            "bisect",
            f"the highest {FRACTION} the model calls safe is {fmt(f0)}, "
            f"{round((hi - f0) / step)} steps below {fmt(hi)} (failed or held thin): halfway, "
            f"p(stable) {p:.2f}",
        )

    def _edge(
        self,
        top: Mapping[str, Scalar],
        safe: Forecast,
        better: list[tuple[dict[str, Scalar], Forecast, float]],
    ) -> Proposal | None:
        """One fraction step above the highest safe setting, when the model gives it accept_p:
        if it holds it counts as stable, and the safe setting would only have been the launch
        before it. Launched first, it saves that launch when it holds and costs none when it
        fails (the safe setting is next either way). Same demand or less, the same host cache
        and other axes as the safe setting; only once a stress peak was measured (before that,
        the odds come from an OOM's floor, not from a fit)."""
        if safe.headroom is None:  # no stress peak measured: the odds are a guess
            return None
        f0 = safe.setting.mem_fraction
        step = self._step()
        above = [
            x
            for x in better
            if x[2] >= self.goal.accept_p
            and abs(x[1].setting.mem_fraction - (f0 + step)) < 0.25 * step
            and not _more_demand(x[1].setting, safe.setting)
            and self._besides_demand(x[0]) == self._besides_demand(top)
        ]
        if not above:
            return None
        params, fc, p = max(above, key=lambda x: x[2])
        return self._proposal(
            params,
            fc,
            "edge",
            f"one step above {fmt(f0)}, the highest {FRACTION} the model calls safe: "
            f"p(stable) {p:.2f}, enough to count as stable if it holds",
        )

    def _noise_retry(
        self, scored: list[tuple[dict[str, Scalar], Forecast, float]]
    ) -> Proposal | None:
        """A second chance for a failure above the best stable capacity that may be the peak's
        noise rather than the edge: one that a launch needing at least as much memory
        contradicts (it held), or a near miss (it served the whole workload, only with less
        headroom than required). A near miss first tries the same fraction with less demand;
        either runs once more while the model still gives it a chance."""
        for p in sorted(self.known, key=lambda q: -tokens_of(q)):
            o = p.observation
            if o is None or not p.memory_failure or tokens_of(p) <= self.cap:
                continue
            if host_failure(o) is not None:
                continue
            contradicted = p not in self.bounds
            near = _near_miss(p)
            if not (contradicted or near):
                continue
            if near and not contradicted:
                alt = self._less_demand(p, scored, why=f"trial {p.number} missed the headroom")
                if alt is not None:
                    return alt
            runs = sum(
                1
                for q in self.known
                if q.observation and _same_gpu(q.observation.setting, o.setting)
            )
            if runs > RETRIES:
                continue
            fc = self._forecast(o.setting)
            pr = self._p(fc)
            if pr < self.goal.probe_p:
                continue
            params = {k: v for k, v in p.params.items() if k in self.axes}
            if contradicted:
                held = next(
                    (
                        q
                        for q in self.known
                        if q.feasible
                        and q.observation
                        and needs_more(q.observation.setting, o.setting)
                    ),
                    None,
                )
                note = (
                    f"trial {p.number} failed where trial {held.number}, needing at least as "
                    "much memory, held: the peak's noise, not a bound"
                    if held is not None
                    else f"trial {p.number} ran out of memory above any peak its requests and "
                    "chunk measured elsewhere: a spike of the peak's tail, not the edge"
                )
            else:
                note = (
                    f"trial {p.number} served the workload with {o.headroom_gib:.2f} GiB left, "
                    "short of the required headroom: one near miss of a noisy peak is not a bound"
                )
            return self._proposal(params, fc, "retry", f"{note}; once more, p(stable) {pr:.2f}")
        return None

    def _margin(self, scored: list[tuple[dict[str, Scalar], Forecast, float]]) -> Proposal | None:
        """The most capacity held with a thin margin (`thin`, then the best while p(stable) is
        under safe_p): the same fraction with the least demand the space offers (fewest
        requests, smallest prefill chunk), which costs no capacity and buys margin, when it
        has not been tried and the model does not rule it out."""
        for target in (self.thin, self.best):
            if target is None or target.observation is None:
                continue
            if target is self.best and (
                self._p_of(target) >= self.goal.safe_p or self._held_with_less(target)
            ):
                continue
            proposal = self._less_demand(target, scored)
            if proposal is not None:
                return proposal
        return None

    def _held_with_less(self, target: Point) -> bool:
        """Whether a launch of `target`'s fraction and less demand held: its capacity is kept
        with more margin already, and less demand again buys nothing."""
        assert target.observation is not None
        s = target.observation.setting
        return any(
            q.feasible
            and q.observation is not None
            and abs(q.observation.setting.mem_fraction - s.mem_fraction) < 1e-9
            and _less_demand(q.observation.setting, s)
            and self._besides_demand(q.params) == self._besides_demand(target.params)
            for q in self.known
        )

    def _less_demand(
        self,
        target: Point,
        scored: list[tuple[dict[str, Scalar], Forecast, float]],
        why: str | None = None,
    ) -> Proposal | None:
        assert target.observation is not None
        s = target.observation.setting
        fewer = [
            x
            for x in scored
            if abs(x[1].setting.mem_fraction - s.mem_fraction) < 1e-9
            and _less_demand(x[1].setting, s)
            and self._besides_demand(x[0]) == self._besides_demand(target.params)
            and not any(_same_gpu(x[1].setting, o) for o in self.launched_gpu)
            and x[2] >= self.goal.probe_p
        ]
        if not fewer:
            return None
        params, fc, p = min(
            fewer,
            key=lambda x: (
                x[1].setting.max_running_requests or 0,
                x[1].setting.chunked_prefill_size or 0,
            ),
        )
        if why is None:
            q = self._p_of(target)
            why = f"trial {target.number} held with a thin margin (p(stable) {q:.2f})"
        return self._proposal(
            params,
            fc,
            "margin",
            f"{why}; the same fraction with less demand keeps its capacity with more headroom, "
            f"p(stable) {p:.2f}",
        )

    def _recheck(self) -> Proposal | None:
        """Run the best setting again while its margin is thin and it has held fewer than
        RECHECKS times: one lucky stress phase at the edge is not stability. Where the launches
        contradict the model (`doubt`), also while it has held fewer than REPEATS times, however
        wide the model says its margin is."""
        best = self.best
        if best is None or best.observation is None:
            return None
        margin = self._margin([(params, fc, self._p(fc)) for params, fc in self.candidates()])
        if margin is not None:
            return margin
        s = best.observation.setting
        fc = self.model.forecast(
            s, default_slots=self.default_slots, default_chunk=self.default_chunk
        )
        p = self._p(fc)
        runs = sum(
            1
            for q in self.known
            if q.feasible and q.observation and _same_gpu(q.observation.setting, s)
        )
        doubted = self.doubt.wrong and runs < REPEATS
        if not doubted and (p >= self.goal.safe_p or runs >= RECHECKS):
            return None
        params = {k: v for k, v in best.params.items() if k in self.axes}
        note = (
            f"held {runs} time(s), and the launches contradict the model: once more before it "
            f"counts, p(stable) {p:.2f}"
            if doubted and p >= self.goal.safe_p
            else f"held {runs} time(s) with a thin margin, p(stable) {p:.2f}"
        )
        return self._proposal(params, fc, "recheck", note)

    def _keep(self) -> Proposal | None:
        """Nothing is stable and no setting is left the model expects to be: the most capacity
        that held runs again (until it held REPEATS times, when it counts as stable), so the
        study does not end with nothing kept while a setting held."""
        target = self.thin
        if target is None or target.observation is None:
            return None
        params = {k: v for k, v in target.params.items() if k in self.axes}
        if _key(params, self.names) in {_key(p, self.names) for p in self.pending}:
            return None
        fc = self._forecast(target.observation.setting)
        return self._proposal(
            params,
            fc,
            "recheck",
            f"no setting the model expects to be stable is left, and trial {target.number} "
            f"held {self._runs(target)} time(s): once more, so that the study keeps a setting, "
            f"p(stable) {self._p(fc):.2f}",
        )

    def _runs(self, p: Point) -> int:
        """How many launches of `p`'s GPU setting held."""
        s = p.observation.setting if p.observation else None
        return sum(
            1
            for q in self.known
            if s is not None
            and q.feasible
            and q.observation
            and _same_gpu(q.observation.setting, s)
        )

    def _secure(self, scored: list[tuple[dict[str, Scalar], Forecast, float]]) -> Proposal | None:
        """When the model does not call the best setting safe (a thin margin that held: a world
        with heavier tails than its own, or a peak with a wide spread), the study holds the
        highest fraction the model does call safe for the best's own demand (its requests and
        prefill chunk) before it rechecks the best or spends launches on throughput: what an
        export can fall back on if the thin one proves to be luck, and the edge itself where
        the thin one fails more often than its launches showed."""
        best = self.best
        if best is None or best.observation is None or self._p_of(best) >= self.goal.safe_p:
            return None
        s = best.observation.setting

        def same_demand(o: Setting) -> bool:
            return not _more_demand(o, s) and not _less_demand(o, s)

        trusted = [
            tokens_of(p)
            for p in self.known
            if p.feasible
            and p.observation is not None
            and same_demand(p.observation.setting)
            and not self._beaten(p)
            and self._p_of(p) >= self.goal.safe_p
        ]
        floor = max(trusted, default=0)
        # a launch of more demand at a fraction, held and called stable, already holds what a
        # launch of the best's demand there would: the fallback is in hand (not where the
        # launches contradict the model: there one hold of more demand may be its luck, and
        # the fallback of less demand is the likelier to be stable)
        backing = [
            p.observation.setting
            for p in self.known
            if not self.doubt.wrong
            and p.feasible
            and p is not best
            and p.observation is not None
            and not self._beaten(p)
            and self._p_of(p) >= self.goal.accept_p
        ]
        safe = [
            x
            for x in scored
            if x[2] >= self.goal.safe_p
            and _fc_tokens(x[1]) > floor
            and same_demand(x[1].setting)
            and not any(_same_gpu(x[1].setting, o) for o in self.launched_gpu)
        ]
        if not safe:
            return None
        params, fc, p = max(safe, key=lambda x: (_fc_tokens(x[1]), -self._distance(x[0]), x[2]))
        if any(
            o.mem_fraction >= fc.setting.mem_fraction - 1e-9 and needs_more(o, fc.setting)
            for o in backing
        ):
            return None
        q = self._p_of(best)
        return self._proposal(
            params,
            fc,
            "secure",
            f"trial {best.number} held with a thin margin, p(stable) {q:.2f}: first the "
            "highest fraction the model calls safe for that demand, "
            f"p(stable) {p:.2f}",
        )

    def _below(self, scored: list[tuple[dict[str, Scalar], Forecast, float]]) -> Proposal | None:
        """Where the launches contradict the model (`doubt`), the step below the best at its
        demand or less, held before the search turns to throughput or ends: in such a world a
        few holds near the edge cannot tell a setting that passes 99% of stress phases from one
        that passes 92% (a heavy tail, spikes the launches never met), and a step of the
        fraction is about what that uncertainty spans. The best may be over the line; the step
        below is what an export can trust. Not needed where a launch of the best's demand or
        less already held within that step."""
        best = self.best
        if not self.doubt.wrong or best is None or best.observation is None:
            return None
        s = best.observation.setting
        step = self._step()
        low = s.mem_fraction - step - 1e-9

        def within(o: Setting) -> bool:
            return low <= o.mem_fraction < s.mem_fraction - 1e-9 and not _more_demand(o, s)

        if any(
            p.feasible and p.observation is not None and within(p.observation.setting)
            for p in self.known
        ):
            return None
        options = [
            x
            for x in scored
            if abs(x[1].setting.mem_fraction - (s.mem_fraction - step)) < 0.25 * step
            and not _more_demand(x[1].setting, s)
            and self._besides_demand(x[0]) == self._besides_demand(best.params)
            and x[2] >= self.goal.probe_p
        ]
        if not options:
            return None
        params, fc, p = max(options, key=lambda x: (x[2], -self._distance(x[0])))
        return self._proposal(
            params,
            fc,
            "secure",
            f"the launches contradict the model, and a few holds near the edge cannot tell a "
            f"setting that passes 99% of stress phases from one that passes 92%: the step below "
            f"trial {best.number}, p(stable) {p:.2f}, before the search ends",
        )

    def _bisect(
        self, doubtful: list[tuple[dict[str, Scalar], Forecast, float]]
    ) -> tuple[dict[str, Scalar], Forecast, float]:
        """The uncertain candidate nearest the middle of (best stable, lowest failure); of those
        at that fraction, the one most likely to hold: a probe for capacity gets the same tokens
        from any requests and chunk, and less demand leaves it more headroom."""
        near = min(self._distance(x[0], demand=False) for x in doubtful)
        same = [x for x in doubtful if self._distance(x[0], demand=False) == near]
        lo = (
            self.best.observation.setting.mem_fraction
            if self.best and self.best.observation
            else min(fc.setting.mem_fraction for _, fc, _ in same)
        )
        fails = [
            p.observation.setting.mem_fraction for p in self.bounds if p.observation is not None
        ]
        top = max(fc.setting.mem_fraction for _, fc, _ in same)
        hi = min([f for f in fails if f > lo], default=top + self._step())
        mid = (lo + hi) / 2
        return _nearest(same, mid, self._step())

    def _explore(self, scored: list[tuple[dict[str, Scalar], Forecast, float]]) -> Proposal | None:
        """One axis at a time from the fastest stable launch near the best capacity: more
        requests (at the highest fraction that stays safe for them), each other host-cache size
        and prefill chunk; a combination that already held is not tried again. Only a launch
        that can add a point to the capacity/throughput front (`search.front`): more requests
        where no candidate with more requests holds as much capacity and, once two request
        counts are measured, where the fitted throughput is FRONT_GAIN above every held launch
        of at least its capacity; another host cache or chunk until one probe showed the axis
        moves throughput or capacity by less than that."""
        axes = [n for n in (REQUESTS, HICACHE, CHUNK) if len(self.axes.get(n, ())) > 1]
        if not axes or self.best is None:
            return None
        near = [p for p in self.known if p.feasible and tokens_of(p) >= EXPLORE_FLOOR * self.cap]
        # the best capacity, unless a launch near it was clearly faster (not just noise)
        faster = max(near, key=lambda p: (p.throughput, tokens_of(p)))
        fastest = faster if faster.throughput > 1.02 * self.best.throughput else self.best
        thin = self._thin_front()
        below = self._front_below(thin, scored)
        if below is not None:
            return below
        # a thin hold that the step below its demand has answered is not a point of the front
        kept = [
            q
            for q in self.known
            if q.feasible and not (q in thin and self._lower_of_combo(q) is not None)
        ]
        held: dict[PointKey, int] = {}
        for q in kept:
            held[self._combo(q.params)] = max(held.get(self._combo(q.params), 0), tokens_of(q))
        measured = [(tokens_of(p), p.throughput) for p in kept if p.throughput > 0]
        law = fit_throughput(
            [
                (p.observation.slots, p.throughput)
                for p in self.known
                if p.feasible and p.observation is not None and p.observation.slots
            ]
        )
        for name in axes:
            # more requests from the most capacity (each a point of the front below it), the
            # other axes from the fastest launch
            origin = self.best if name == REQUESTS else fastest
            if name != REQUESTS and self._axis_done(name, fastest):
                continue
            options = []
            for params, fc, p in scored:
                if _fc_tokens(fc) < EXPLORE_FLOOR * self.cap:
                    continue
                at_best = name == REQUESTS and _fc_tokens(fc) >= (1 - SAME_TOKENS) * self.cap
                if p < (FRONT_PROBE_P if at_best else self.goal.safe_p):
                    continue
                # a combination that held is tried again only for more requests, at a fraction
                # its own measured peak now calls safe, for more capacity than it held (a point
                # of the front the first probe, judged from far, fell short of)
                was = held.get(self._combo(params))
                if was is not None and (
                    name != REQUESTS or _fc_tokens(fc) <= (1 + SAME_TOKENS) * was
                ):
                    continue
                diff = [
                    n
                    for n in self.names
                    if n != FRACTION and not same_value(params.get(n), origin.params.get(n))
                ]
                more = name != REQUESTS or num(params.get(name)) > num(origin.params.get(name))
                if diff == [name] and more:
                    options.append((params, fc, p))
            note = ""
            if name == REQUESTS:
                options = self._on_front(options, measured, law)
            if options:
                if name == REQUESTS:
                    params, fc, p = max(
                        options, key=lambda x: (_fc_tokens(x[1]), num(x[0].get(name)))
                    )
                else:  # the value farthest from the launch it departs from shows most
                    at = num(fastest.params.get(name))
                    params, fc, p = max(
                        options,
                        key=lambda x: (
                            abs(num(x[0].get(name)) - at),
                            -num(x[0].get(name)),
                            _fc_tokens(x[1]),
                        ),
                    )
                if name == REQUESTS and law is not None:
                    r = num(params.get(name))
                    t = law.at(r)
                    note = (
                        f"; predicted {t:,.0f} tok/s, "
                        f"{gain(_fc_tokens(fc), t, measured):+.0%} over every launch held with "
                        "as much capacity"
                    )
                return self._proposal(
                    params,
                    fc,
                    "explore",
                    f"capacity edge known; trying {name}={params.get(name)} for throughput "
                    f"(fastest so far trial {fastest.number}, {fastest.throughput:,.0f} tok/s)"
                    f"{note}",
                )
        return None

    def _thin_front(self) -> list[Point]:
        """Launches of another demand than the best's that held once but that the model does
        not expect to hold again (below accept_p, fewer than `REPEATS` holds): probes for the
        front, judged from far, that landed on its edge."""
        assert self.best is not None
        return [
            q
            for q in self.known
            if q.feasible
            and q.observation is not None
            and self._combo(q.params) != self._combo(self.best.params)
            and not self._proven(q)
            and self._runs(q) < REPEATS
        ]

    def _lower_of_combo(self, q: Point) -> Point | None:
        """A launch of `q`'s demand (its parameters besides the fraction) at a lower fraction."""
        assert q.observation is not None
        f = q.observation.setting.mem_fraction
        return next(
            (
                o
                for o in self.known
                if o.observation is not None
                and self._combo(o.params) == self._combo(q.params)
                and o.observation.setting.mem_fraction < f - 1e-9
            ),
            None,
        )

    def _front_below(
        self, thin: list[Point], scored: list[tuple[dict[str, Scalar], Forecast, float]]
    ) -> Proposal | None:
        """The highest fraction the model calls stable (accept_p) below a thin front probe, at
        its demand: the point of the front that demand holds, where the probe above it may not
        hold again."""
        for q in sorted(thin, key=lambda x: -tokens_of(x)):
            if self._lower_of_combo(q) is not None:
                continue
            options = [
                x
                for x in scored
                if self._combo(x[0]) == self._combo(q.params)
                and _fc_tokens(x[1]) < (1 - SAME_TOKENS) * tokens_of(q)
                and _fc_tokens(x[1]) >= EXPLORE_FLOOR * self.cap
                and x[2] >= self.goal.accept_p
            ]
            if options:
                params, fc, p = max(options, key=lambda x: _fc_tokens(x[1]))
                return self._proposal(
                    params,
                    fc,
                    "explore",
                    f"trial {q.number} held at its demand with a thin margin (p(stable) "
                    f"{self._p_of(q):.2f}); the highest {FRACTION} below it the model expects to "
                    f"hold, p(stable) {p:.2f}, for that point of the front",
                )
        return None

    def _on_front(
        self,
        options: list[tuple[dict[str, Scalar], Forecast, float]],
        measured: Sequence[tuple[int, float]],
        law: ThroughputFit | None,
    ) -> list[tuple[dict[str, Scalar], Forecast, float]]:
        """The more-requests candidates that can add a point to the front: not dominated by a
        candidate with more requests and as much predicted capacity, and (with a fitted law)
        predicted FRONT_GAIN faster than every held launch of at least their capacity."""
        pairs = [(num(x[0].get(REQUESTS)), _fc_tokens(x[1])) for x in options]
        kept = [
            x
            for x, (r, c) in zip(options, pairs, strict=True)
            if not dominated(r, c, pairs)
            and (law is None or gain(c, law.at(r), measured) >= FRONT_GAIN)
        ]
        return kept

    def _axis_done(self, name: str, fastest: Point) -> bool:
        """Whether the launches that departed from `fastest` in `name` alone (besides the
        fraction) showed the axis moves neither throughput nor capacity (`front.no_effect`)."""
        probes = [
            (tokens_of(p), p.throughput)
            for p in self.known
            if p.feasible
            and p is not fastest
            and [
                n
                for n in self.names
                if n != FRACTION and not same_value(p.params.get(n), fastest.params.get(n))
            ]
            == [name]
        ]
        return no_effect((tokens_of(fastest), fastest.throughput), probes)

    def _combo(self, params: Mapping[str, Scalar]) -> PointKey:
        """The point on the searched parameters other than the fraction."""
        return _key(params, self.names).without((FRACTION,))

    # ---- text ----------------------------------------------------------------------------

    def _proposal(self, params: dict[str, Scalar], fc: Forecast, rule: str, note: str) -> Proposal:
        where = self._where(params)
        best = (
            f"best stable so far {self.cap:,} tokens (trial {self.best.number})"
            if self.best
            else "nothing stable yet"
        )
        why = (
            f"{rule} to {where}: {fc.describe()}, {self.goal.min_headroom_gib:g} GiB required; "
            f"{note}{self._edge_text(fc)}{self.cal.describe()}{self.doubt.describe()}; {best}"
        )
        return Proposal(params, rule, why, forecast=fc, model=self.model, kappa=self.cal.kappa)

    def _edge_text(self, fc: Forecast) -> str:
        edge = self.model.oom_edge(fc, self.goal.min_headroom_gib)
        return f"; edge at {FRACTION} {edge.mean:.4f} ± {edge.sd:.4f}" if edge else ""

    def _done(self, summary: str) -> Proposal:
        ref = self.best or self.ref
        params = {k: v for k, v in ref.params.items() if k in self.axes}
        text = f"what is left to learn is smaller than one step: {summary}"
        if self.doubt.wrong:
            held = self.best is not None and self._runs(self.best) >= REPEATS
            head = (
                f"the best setting held {self._runs(self.best)} times"
                if held and self.best is not None
                else "nothing better is left to try"
            )
            wider = " with the wider margin the evidence asks for" if self.doubt.tails else ""
            text = f"{head}{wider}: {summary}"
            text += self.doubt.describe()
        return Proposal(
            params, "confirm", f"confirm trial {ref.number}: {text}", done=text, model=self.model
        )

    def _stop(self, report: str) -> Proposal:
        ref = self.best or self.ref
        params = {k: v for k, v in ref.params.items() if k in self.axes}
        return Proposal(params, "confirm", report, done=report, model=self.model)

    def _edge_summary(self, scored: list[tuple[dict[str, Scalar], Forecast, float]]) -> str:
        """Where the edge is, in words: what holds, what failed above it, what the model says
        of the next step."""
        assert self.best is not None and self.best.observation is not None
        best = self.best.observation
        s = best.setting
        text = f"{self._where(self.best.params)} holds {self.cap:,} tokens"
        if best.headroom_gib is not None:
            text += f" with {best.headroom_gib:.2f} GiB to spare under the stress peak"
        fails = [
            (q.observation.setting.mem_fraction, q.number, q) for q in self.bounds if q.observation
        ]
        above = [x for x in fails if x[0] > s.mem_fraction]
        if above:
            q = min(above)[2]
            text += f"; {self._where(q.params, against=self.best.params)} {_failure_words(q)}"
        step = [f for f in self._fractions() if f > s.mem_fraction + 1e-9]
        if step:
            nxt = Setting(step[0], s.max_running_requests, s.chunked_prefill_size, s.hicache_gb)
            fc = self.model.forecast(
                nxt, default_slots=self.default_slots, default_chunk=self.default_chunk
            )
            if fc.headroom is not None:
                p = self._p(fc)
                text += (
                    f"; the model puts {FRACTION}={fmt(step[0])} at headroom {fc.headroom} GiB "
                    f"(p(stable) {p:.2f}){self._edge_text(fc)}"
                )
        return text

    def _where(
        self, params: Mapping[str, Scalar], against: Mapping[str, Scalar] | None = None
    ) -> str:
        """`mem_fraction_static=0.9` plus the other parameters (only those that differ)."""
        others = [
            f"{n}={fmt(params.get(n))}"
            for n in self.names
            if n != FRACTION and (against is None or not same_value(params.get(n), against.get(n)))
        ]
        if FRACTION not in params:  # fixed, or SGLang's own choice
            return ", ".join(others) or "the fixed setting"
        head = f"{FRACTION}={fmt(params.get(FRACTION))}"
        return head + (f" ({', '.join(others)})" if others else "")

    def _fractions(self) -> list[float]:
        return sorted(num(v) for v in self.axes.get(FRACTION, ()))

    # ---- helpers -------------------------------------------------------------------------

    def _distance(self, params: Mapping[str, Scalar], demand: bool = True) -> int:
        """How many parameters other than the fraction differ from the reference launch (with
        `demand` False, nor max_running_requests and chunked_prefill_size)."""
        skip = (FRACTION,) if demand else (FRACTION, REQUESTS, CHUNK)
        return sum(
            not same_value(params.get(n), self.ref.params.get(n))
            for n in self.names
            if n not in skip
        )

    def _besides_demand(self, params: Mapping[str, Scalar]) -> PointKey:
        """The point less the fraction, max_running_requests and the prefill chunk: two points
        with equal ones differ at most in their GPU memory demand."""
        return _key(params, self.names).without((FRACTION, REQUESTS, CHUNK))

    def _step(self) -> float:
        fs = sorted(float(v) for v in self.axes.get(FRACTION, ()))
        return min((b - a for a, b in itertools.pairwise(fs)), default=0.01)

    def _steps_above_best(self, params: Mapping[str, Scalar]) -> int:
        f = params.get(FRACTION)
        if not isinstance(f, float | int) or self.best is None or self.best.observation is None:
            return 2
        return round((float(f) - self.best.observation.setting.mem_fraction) / self._step())


def _nearest(
    xs: Sequence[tuple[dict[str, Scalar], Forecast, float]], mid: float, step: float
) -> tuple[dict[str, Scalar], Forecast, float]:
    """The candidate whose fraction is nearest `mid` (to a thousandth of a step, so that two
    fractions either side of it tie), the likeliest to hold among those."""
    return min(xs, key=lambda x: (round(abs(x[1].setting.mem_fraction - mid) / step, 3), -x[2]))


def _near_miss(p: Point) -> bool:
    """Served the whole workload and kept some headroom, only less than required."""
    o = p.observation
    return (
        o is not None
        and o.outcome == "ok"
        and o.headroom_gib is not None
        and o.headroom_gib > 0
        and not o.feasible
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


def _spike(p: Point, known: Sequence[Point]) -> bool:
    """A runtime OOM above a peak its demand never came near: its forward needed more than the
    static free memory, over SPIKE_RATIO times the largest stress peak that launches of the same
    requests and chunk measured while they held. The first such OOM at a setting is a rare
    spike of the peak's tail, not the edge (the calibration still counts the miss)."""
    o = p.observation
    if o is None or o.outcome != "runtime_oom" or o.static_free_gib is None:
        return False
    same = [q.observation for q in known if q.observation is not None]
    if sum(1 for x in same if x.outcome == "runtime_oom" and _same_gpu(x.setting, o.setting)) > 1:
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


def _best_of(points: Sequence[Point]) -> Point | None:
    """The most capacity; among launches within launch jitter of it, the fastest."""
    top = max((tokens_of(p) for p in points), default=0)
    level = [p for p in points if tokens_of(p) >= top * (1 - SAME_CAPACITY)]
    return max(level, key=lambda p: (p.throughput, tokens_of(p)), default=None)


def _tokens_rank(s: Setting) -> float:
    return s.mem_fraction


def _tokens_rank_cap(planner: _Planner) -> float:
    if planner.best is None or planner.best.observation is None:
        return -1.0
    return planner.best.observation.setting.mem_fraction


def _fc_tokens(fc: Forecast) -> float:
    return fc.tokens.mean if fc.tokens is not None else 0.0


def _more_demand(a: Setting, b: Setting) -> bool:
    """a asks for more request slots or a bigger prefill chunk than b."""
    ra, rb = a.max_running_requests, b.max_running_requests
    ca, cb = a.chunked_prefill_size, b.chunked_prefill_size
    if ra is not None and rb is not None and ra > rb:
        return True
    return ca is not None and cb is not None and ca > cb


def _less_demand(a: Setting, b: Setting) -> bool:
    """a needs less transient and graph memory than b: no more requests and no bigger chunk,
    and less of one of them."""
    ra, rb = a.max_running_requests, b.max_running_requests
    ca, cb = a.chunked_prefill_size, b.chunked_prefill_size
    if ra is None or rb is None or ra > rb:
        return False
    if ca is not None and cb is not None and ca > cb:
        return False
    return ra < rb or (ca is not None and cb is not None and ca < cb)


def _same_gpu(a: Setting, b: Setting) -> bool:
    """Same GPU memory demand: fraction, requests and chunk (the host cache is host memory)."""
    return (
        abs(a.mem_fraction - b.mem_fraction) < 1e-9
        and a.max_running_requests == b.max_running_requests
        and a.chunked_prefill_size == b.chunked_prefill_size
    )


def _failure_words(q: Point) -> str:
    o = q.observation
    if o is None:
        return "failed"
    if o.outcome == "runtime_oom":
        return "ran out of GPU memory under load"
    if o.outcome == "startup_oom":
        return "ran out of GPU memory at startup"
    if o.outcome == "ok" and o.headroom_gib is not None:
        return f"kept only {o.headroom_gib:.2f} GiB under the stress peak"
    return f"failed ({o.outcome})"


def _window(values: list[Scalar], at: Scalar | None, width: int) -> list[Scalar]:
    """`values` within `width` places of `at` (the nearest value when `at` is not among them)."""
    if not values:
        return values
    idx = min(range(len(values)), key=lambda i: abs(num(values[i]) - num(at)))
    return values[max(0, idx - width) : idx + width + 1]
