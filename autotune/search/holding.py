"""Holding the best with a margin: what the search does once a setting held but thinly.

A launch that held once at the edge is not stability: with heavy-tailed peaks a setting can pass
three stress phases and still fail one launch in six. Before the search ends or spends launches
on throughput, it makes what it would export trustworthy, cheapest first: the same fraction with
less demand, which keeps the capacity and buys headroom (`margin`); the highest fraction the
model calls safe at the best's own demand, what an export falls back on (`secure`); where the
launches contradict the model, the step below the best (`below`); the best again until it held
often enough (`recheck`); and with nothing stable at all, the most capacity that held once more,
so that a study never ends with nothing kept (`keep`).
"""

from __future__ import annotations

from autotune.memory.model import Setting
from autotune.search.doubt import REPEATS
from autotune.search.points import (
    Point,
    key_of,
    less_demand,
    more_demand,
    needs_more,
    same_gpu,
    tokens_of,
)
from autotune.search.proposal import Proposal
from autotune.search.state import PlanState, Scored, fc_tokens
from autotune.search.words import propose

RECHECKS = 3
"""A best setting with a thin margin is run until it held this many times (or failed once)."""


def margin(st: PlanState, scored: list[Scored]) -> Proposal | None:
    """The most capacity held with a thin margin (`thin`, then the best while p(stable) is
    under safe_p): the same fraction with the least demand the space offers (fewest
    requests, smallest prefill chunk), which costs no capacity and buys margin, when it
    has not been tried and the model does not rule it out."""
    for target in (st.thin, st.best):
        if target is None or target.observation is None:
            continue
        if target is st.best and (
            st.p_stable_of(target) >= st.goal.safe_p or _held_with_less(st, target)
        ):
            continue
        proposal = with_less_demand(st, target, scored)
        if proposal is not None:
            return proposal
    return None


def _held_with_less(st: PlanState, target: Point) -> bool:
    """Whether a launch of `target`'s fraction and less demand held: its capacity is kept
    with more margin already, and less demand again buys nothing."""
    assert target.observation is not None
    s = target.observation.setting
    return any(
        q.feasible
        and q.observation is not None
        and abs(q.observation.setting.mem_fraction - s.mem_fraction) < 1e-9
        and less_demand(q.observation.setting, s)
        and st.besides_demand(q.params) == st.besides_demand(target.params)
        for q in st.known
    )


def with_less_demand(
    st: PlanState,
    target: Point,
    scored: list[Scored],
    why: str | None = None,
) -> Proposal | None:
    """`target`'s fraction with the least demand the space offers (fewest requests, then the
    smallest chunk) that is untried and that the model gives at least probe_p, the host cache
    and the other axes as `target` has them; `why` says what calls for it (by default, the
    thin margin `target` held with)."""
    assert target.observation is not None
    s = target.observation.setting
    fewer = [
        x
        for x in scored
        if abs(x[1].setting.mem_fraction - s.mem_fraction) < 1e-9
        and less_demand(x[1].setting, s)
        and st.besides_demand(x[0]) == st.besides_demand(target.params)
        and not any(same_gpu(x[1].setting, o) for o in st.launched_gpu)
        and x[2] >= st.goal.probe_p
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
        q = st.p_stable_of(target)
        why = f"trial {target.number} held with a thin margin (p(stable) {q:.2f})"
    return propose(
        st,
        params,
        fc,
        "margin",
        f"{why}; the same fraction with less demand keeps its capacity with more headroom, "
        f"p(stable) {p:.2f}",
    )


def recheck(st: PlanState) -> Proposal | None:
    """Run the best setting again while its margin is thin and it has held fewer than
    RECHECKS times: one lucky stress phase at the edge is not stability. Where the launches
    contradict the model (`doubt`), also while it has held fewer than REPEATS times, however
    wide the model says its margin is. The holds still wanting, up to RECHECKS, are the
    launch's stress passes (`Proposal.repeats`): one launch, not one per hold."""
    best = st.best
    if best is None or best.observation is None:
        return None
    less = margin(st, [(params, fc, st.p_stable(fc)) for params, fc in st.candidates()])
    if less is not None:
        return less
    fc = st.forecast(best.observation.setting)
    p = st.p_stable(fc)
    runs = st.holds(best)
    doubted = st.doubt.wrong and runs < REPEATS
    if not doubted and (p >= st.goal.safe_p or runs >= RECHECKS):
        return None
    params = {k: v for k, v in best.params.items() if k in st.axes}
    note = (
        f"held {runs} time(s), and the launches contradict the model: once more before it "
        f"counts, p(stable) {p:.2f}"
        if doubted and p >= st.goal.safe_p
        else f"held {runs} time(s) with a thin margin, p(stable) {p:.2f}"
    )
    # a stress pass costs a minute where a launch costs its startup: the recheck asks for every
    # hold the thin rule could still want (RECHECKS ≥ REPEATS), not only the one wanted now
    return propose(st, params, fc, "recheck", note, repeats=max(1, RECHECKS - runs))


def keep(st: PlanState) -> Proposal | None:
    """Nothing is stable and no setting is left the model expects to be: the most capacity
    that held runs again (until it held REPEATS times, when it counts as stable), so the
    study does not end with nothing kept while a setting held."""
    target = st.thin
    if target is None or target.observation is None:
        return None
    params = {k: v for k, v in target.params.items() if k in st.axes}
    if key_of(params, st.names) in {key_of(p, st.names) for p in st.pending}:
        return None
    fc = st.forecast(target.observation.setting)
    held = st.holds(target)
    return propose(
        st,
        params,
        fc,
        "recheck",
        f"no setting the model expects to be stable is left, and trial {target.number} "
        f"held {held} time(s): once more, so that the study keeps a setting, "
        f"p(stable) {st.p_stable(fc):.2f}",
        repeats=max(1, REPEATS - held),
    )


def secure(st: PlanState, scored: list[Scored]) -> Proposal | None:
    """When the model does not call the best setting safe (a thin margin that held: a world
    with heavier tails than its own, or a peak with a wide spread), the study holds the
    highest fraction the model does call safe for the best's own demand (its requests and
    prefill chunk) before it rechecks the best or spends launches on throughput: what an
    export can fall back on if the thin one proves to be luck, and the edge itself where
    the thin one fails more often than its launches showed."""
    best = st.best
    if best is None or best.observation is None or st.p_stable_of(best) >= st.goal.safe_p:
        return None
    s = best.observation.setting

    def same_demand(o: Setting) -> bool:
        return not more_demand(o, s) and not less_demand(o, s)

    trusted = [
        tokens_of(p)
        for p in st.known
        if p.feasible
        and p.observation is not None
        and same_demand(p.observation.setting)
        and not st.beaten(p)
        and st.p_stable_of(p) >= st.goal.safe_p
    ]
    floor = max(trusted, default=0)
    # a launch of more demand at a fraction, held and called stable, already holds what a
    # launch of the best's demand there would: the fallback is in hand (not where the
    # launches contradict the model: there one hold of more demand may be its luck, and
    # the fallback of less demand is the likelier to be stable)
    backing = [
        p.observation.setting
        for p in st.known
        if not st.doubt.wrong
        and p.feasible
        and p is not best
        and p.observation is not None
        and not st.beaten(p)
        and st.p_stable_of(p) >= st.goal.accept_p
    ]
    safe = [
        x
        for x in scored
        if x[2] >= st.goal.safe_p
        and fc_tokens(x[1]) > floor
        and same_demand(x[1].setting)
        and not any(same_gpu(x[1].setting, o) for o in st.launched_gpu)
    ]
    if not safe:
        return None
    params, fc, p = max(safe, key=lambda x: (fc_tokens(x[1]), -st.distance(x[0]), x[2]))
    if any(
        o.mem_fraction >= fc.setting.mem_fraction - 1e-9 and needs_more(o, fc.setting)
        for o in backing
    ):
        return None
    q = st.p_stable_of(best)
    return propose(
        st,
        params,
        fc,
        "secure",
        f"trial {best.number} held with a thin margin, p(stable) {q:.2f}: first the "
        "highest fraction the model calls safe for that demand, "
        f"p(stable) {p:.2f}",
    )


def below(st: PlanState, scored: list[Scored]) -> Proposal | None:
    """Where the launches contradict the model (`doubt`), the step below the best at its
    demand or less, held before the search turns to throughput or ends: in such a world a
    few holds near the edge cannot tell a setting that passes 99% of stress phases from one
    that passes 92% (a heavy tail, spikes the launches never met), and a step of the
    fraction is about what that uncertainty spans. The best may be over the line; the step
    below is what an export can trust. Not needed where a launch of the best's demand or
    less already held within that step."""
    best = st.best
    if not st.doubt.wrong or best is None or best.observation is None:
        return None
    s = best.observation.setting
    step = st.grid_fraction_step()
    low = s.mem_fraction - step - 1e-9

    def within(o: Setting) -> bool:
        return low <= o.mem_fraction < s.mem_fraction - 1e-9 and not more_demand(o, s)

    if any(
        p.feasible and p.observation is not None and within(p.observation.setting) for p in st.known
    ):
        return None
    options = [
        x
        for x in scored
        if abs(x[1].setting.mem_fraction - (s.mem_fraction - step)) < 0.25 * step
        and not more_demand(x[1].setting, s)
        and st.besides_demand(x[0]) == st.besides_demand(best.params)
        and x[2] >= st.goal.probe_p
    ]
    if not options:
        return None
    params, fc, p = max(options, key=lambda x: (x[2], -st.distance(x[0])))
    return propose(
        st,
        params,
        fc,
        "secure",
        f"the launches contradict the model, and a few holds near the edge cannot tell a "
        f"setting that passes 99% of stress phases from one that passes 92%: the step below "
        f"trial {best.number}, p(stable) {p:.2f}, before the search ends",
    )
