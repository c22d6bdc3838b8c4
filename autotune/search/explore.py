"""Exploring for throughput: the launches that can add a point to the capacity/throughput front.

Once the capacity edge is known to one step, every further launch is for throughput, and on a
real box each costs half an hour; so only a launch that can change the front is worth one
(`search.front` says which can). From the best capacity, more max_running_requests at the
highest fraction safe for them, one count at a time; from the fastest launch near it, one probe
of another host cache and of another prefill chunk, the axis left once its probe moved nothing.
A probe of more requests that held with a thin margin is answered first by the highest fraction
below it the model expects to hold at that demand, the point of the front that demand really
holds; until then the thin hold does not stand for that point.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from autotune.config.schema import Scalar
from autotune.config.space import PointKey, same_value
from autotune.search.doubt import REPEATS
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
    REQUESTS,
    Point,
    key_of,
    num,
    tokens_of,
)
from autotune.search.proposal import Proposal
from autotune.search.state import PlanState, Scored, fc_tokens
from autotune.search.words import propose

EXPLORE_FLOOR = 0.7
"""Exploring for throughput gives up at most this share of the best capacity: each more
max_running_requests at the highest fraction safe for it is a point of the capacity/throughput
front while it keeps this much."""
FRONT_PROBE_P = 0.5
"""More max_running_requests at the best capacity is probed for throughput from this p(stable)
on, not only from `safe_p`: where the launches contradict the model its margins widen, and the
point of the front that holds the most capacity at the most requests would otherwise never be
measured. A probe that fails is the crash that tells the search its peak; the export takes only
what held."""


def explore(st: PlanState, scored: list[Scored]) -> Proposal | None:
    """One axis at a time from the fastest stable launch near the best capacity: more
    requests (at the highest fraction that stays safe for them), each other host-cache size
    and prefill chunk; a combination that already held is not tried again. Only a launch
    that can add a point to the capacity/throughput front (`search.front`): more requests
    where no candidate with more requests holds as much capacity and, once two request
    counts are measured, where the fitted throughput is FRONT_GAIN above every held launch
    of at least its capacity; another host cache or chunk until one probe showed the axis
    moves throughput or capacity by less than that."""
    axes = [n for n in (REQUESTS, HICACHE, CHUNK) if len(st.axes.get(n, ())) > 1]
    if not axes or st.best is None:
        return None
    near = [p for p in st.known if p.feasible and tokens_of(p) >= EXPLORE_FLOOR * st.cap]
    # the best capacity, unless a launch near it was clearly faster (not just noise)
    faster = max(near, key=lambda p: (p.throughput, tokens_of(p)))
    fastest = faster if faster.throughput > 1.02 * st.best.throughput else st.best
    thin = _thin_front(st)
    below = _front_below(st, thin, scored)
    if below is not None:
        return below
    # a thin hold that the step below its demand has answered is not a point of the front
    kept = [
        q for q in st.known if q.feasible and not (q in thin and _lower_of_combo(st, q) is not None)
    ]
    held: dict[PointKey, int] = {}
    for q in kept:
        held[_combo(st, q.params)] = max(held.get(_combo(st, q.params), 0), tokens_of(q))
    measured = [(tokens_of(p), p.throughput) for p in kept if p.throughput > 0]
    law = fit_throughput(
        [
            (p.observation.slots, p.throughput)
            for p in st.known
            if p.feasible and p.observation is not None and p.observation.slots
        ]
    )
    for name in axes:
        # more requests from the most capacity (each a point of the front below it), the
        # other axes from the fastest launch
        origin = st.best if name == REQUESTS else fastest
        if name != REQUESTS and _axis_done(st, name, fastest):
            continue
        options = []
        for params, fc, p in scored:
            if fc_tokens(fc) < EXPLORE_FLOOR * st.cap:
                continue
            at_best = name == REQUESTS and fc_tokens(fc) >= (1 - SAME_TOKENS) * st.cap
            if p < (FRONT_PROBE_P if at_best else st.goal.safe_p):
                continue
            # a combination that held is tried again only for more requests, at a fraction
            # its own measured peak now calls safe, for more capacity than it held (a point
            # of the front the first probe, judged from far, fell short of)
            was = held.get(_combo(st, params))
            if was is not None and (name != REQUESTS or fc_tokens(fc) <= (1 + SAME_TOKENS) * was):
                continue
            diff = [
                n
                for n in st.names
                if n != FRACTION and not same_value(params.get(n), origin.params.get(n))
            ]
            more = name != REQUESTS or num(params.get(name)) > num(origin.params.get(name))
            if diff == [name] and more:
                options.append((params, fc, p))
        note = ""
        if name == REQUESTS:
            options = _on_front(options, measured, law)
        if options:
            if name == REQUESTS:
                params, fc, p = max(options, key=lambda x: (fc_tokens(x[1]), num(x[0].get(name))))
            else:  # the value farthest from the launch it departs from shows most
                at = num(fastest.params.get(name))
                params, fc, p = max(
                    options,
                    key=lambda x: (
                        abs(num(x[0].get(name)) - at),
                        -num(x[0].get(name)),
                        fc_tokens(x[1]),
                    ),
                )
            if name == REQUESTS and law is not None:
                r = num(params.get(name))
                t = law.at(r)
                note = (
                    f"; predicted {t:,.0f} tok/s, "
                    f"{gain(fc_tokens(fc), t, measured):+.0%} over every launch held with "
                    "as much capacity"
                )
            return propose(
                st,
                params,
                fc,
                "explore",
                f"capacity edge known; trying {name}={params.get(name)} for throughput "
                f"(fastest so far trial {fastest.number}, {fastest.throughput:,.0f} tok/s)"
                f"{note}",
            )
    return None


def _thin_front(st: PlanState) -> list[Point]:
    """Launches of another demand than the best's that held once but that the model does
    not expect to hold again (below accept_p, fewer than `REPEATS` holds): probes for the
    front, judged from far, that landed on its edge."""
    assert st.best is not None
    return [
        q
        for q in st.known
        if q.feasible
        and q.observation is not None
        and _combo(st, q.params) != _combo(st, st.best.params)
        and not st.proven(q)
        and st.holds(q) < REPEATS
    ]


def _lower_of_combo(st: PlanState, q: Point) -> Point | None:
    """A launch of `q`'s demand (its parameters besides the fraction) at a lower fraction."""
    assert q.observation is not None
    f = q.observation.setting.mem_fraction
    return next(
        (
            o
            for o in st.known
            if o.observation is not None
            and _combo(st, o.params) == _combo(st, q.params)
            and o.observation.setting.mem_fraction < f - 1e-9
        ),
        None,
    )


def _front_below(st: PlanState, thin: list[Point], scored: list[Scored]) -> Proposal | None:
    """The highest fraction the model calls stable (accept_p) below a thin front probe, at
    its demand: the point of the front that demand holds, where the probe above it may not
    hold again."""
    for q in sorted(thin, key=lambda x: -tokens_of(x)):
        if _lower_of_combo(st, q) is not None:
            continue
        options = [
            x
            for x in scored
            if _combo(st, x[0]) == _combo(st, q.params)
            and fc_tokens(x[1]) < (1 - SAME_TOKENS) * tokens_of(q)
            and fc_tokens(x[1]) >= EXPLORE_FLOOR * st.cap
            and x[2] >= st.goal.accept_p
        ]
        if options:
            params, fc, p = max(options, key=lambda x: fc_tokens(x[1]))
            return propose(
                st,
                params,
                fc,
                "explore",
                f"trial {q.number} held at its demand with a thin margin (p(stable) "
                f"{st.p_stable_of(q):.2f}); the highest {FRACTION} below it the model expects to "
                f"hold, p(stable) {p:.2f}, for that point of the front",
            )
    return None


def _on_front(
    options: list[Scored],
    measured: Sequence[tuple[int, float]],
    law: ThroughputFit | None,
) -> list[Scored]:
    """The more-requests candidates that can add a point to the front: not dominated by a
    candidate with more requests and as much predicted capacity, and (with a fitted law)
    predicted FRONT_GAIN faster than every held launch of at least their capacity."""
    pairs = [(num(x[0].get(REQUESTS)), fc_tokens(x[1])) for x in options]
    kept = [
        x
        for x, (r, c) in zip(options, pairs, strict=True)
        if not dominated(r, c, pairs)
        and (law is None or gain(c, law.at(r), measured) >= FRONT_GAIN)
    ]
    return kept


def _axis_done(st: PlanState, name: str, fastest: Point) -> bool:
    """Whether the launches that departed from `fastest` in `name` alone (besides the
    fraction) showed the axis moves neither throughput nor capacity (`front.no_effect`)."""
    probes = [
        (tokens_of(p), p.throughput)
        for p in st.known
        if p.feasible
        and p is not fastest
        and [
            n
            for n in st.names
            if n != FRACTION and not same_value(p.params.get(n), fastest.params.get(n))
        ]
        == [name]
    ]
    return no_effect((tokens_of(fastest), fastest.throughput), probes)


def _combo(st: PlanState, params: Mapping[str, Scalar]) -> PointKey:
    """The point on the searched parameters other than the fraction."""
    return key_of(params, st.names).without((FRACTION,))
