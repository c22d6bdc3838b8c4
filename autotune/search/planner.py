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

The rules live in modules of their own, each over the one reading of the launches that
`search.state.PlanState` makes: before any launch showed a KV pool `search.start` (and
`search.retries` for failures not about memory), the capacity edge `search.edge`, holding the
best with a margin `search.holding`, throughput `search.explore`, and the words of every
proposal and of the end `search.words`. This module asks them in order (`_run`): the order is
the search's policy, and reading it in one place is reading the search.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from autotune.config.schema import Scalar
from autotune.config.space import Space, canonical, canonical_value, step_of
from autotune.search import edge, explore, holding, words
from autotune.search.points import Point, more_demand, same_gpu
from autotune.search.proposal import Goal, Proposal
from autotune.search.retries import not_memory
from autotune.search.start import without_model
from autotune.search.state import PlanState, fc_tokens, tokens_rank

__all__ = ["Goal", "Proposal", "plan"]


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
        return without_model(axes, names, known, pending)
    return _run(PlanState(axes, names, known, pending, goal))


def _run(st: PlanState) -> Proposal:
    """The first rule, in the search's order, that has a launch to propose (or the end)."""
    report = not_memory(st.known)
    if report is not None:
        return words.stop(st, report)
    cands = st.candidates()
    g = st.goal
    scored = [(p, fc, st.p_stable(fc)) for p, fc in cands]
    # better by at least half a step: launch jitter moves the pool by a few tokens; a
    # setting of the same GPU memory as one launched already (another host cache) teaches
    # nothing about the edge
    slope = st.model.tokens_slope or 0.0
    # more requests or a bigger chunk add no capacity, only peak and graph memory: the
    # capacity search keeps to the reference launch's demand or less (explore goes beyond)
    assert st.ref.observation is not None
    ref = st.ref.observation.setting
    better = [
        x
        for x in scored
        if fc_tokens(x[1]) > st.cap + 0.5 * slope * st.grid_fraction_step()
        and not any(same_gpu(x[1].setting, s) for s in st.launched_gpu)
        and not more_demand(x[1].setting, ref)
    ]
    if st.thin is not None:
        margin = holding.margin(st, scored)
        if margin is not None:
            return margin
    safe = [x for x in better if x[2] >= g.safe_p]
    if safe:
        params, fc, p = max(
            safe,
            key=lambda x: (
                tokens_rank(x[1].setting),
                -st.distance(x[0], demand=False),
                x[2],
            ),
        )
        halfway = edge.halfway(st, params, fc, better)
        if halfway is not None:
            return halfway
        above = edge.edge(st, params, fc, better)
        if above is not None:
            return above
        if st.best is None:
            rule = "down"
        elif st.steps_above_best(params) > 1:
            rule = "jump"
        else:
            rule = "step"
        return words.propose(st, params, fc, rule, f"p(stable) {p:.2f}")
    noise = edge.noise_retry(st, scored)
    if noise is not None:
        return noise
    doubtful = [x for x in better if x[2] >= g.probe_p]
    if doubtful:
        params, fc, p = edge.bisect(st, doubtful)
        return words.propose(st, params, fc, "bisect", f"uncertain, p(stable) {p:.2f}")
    if st.best is None:
        viable = [x for x in scored if x[2] > 0.0]
        if viable:
            params, fc, p = max(
                viable,
                key=lambda x: (x[2] >= g.safe_p, x[2] >= g.probe_p, fc_tokens(x[1]), x[2]),
            )
            return words.propose(st, params, fc, "down", f"p(stable) {p:.2f}")
        kept = holding.keep(st)
        if kept is not None:
            return kept
        return words.finish(st, "no setting left that the model expects to be stable")
    secure = holding.secure(st, scored)
    if secure is not None:
        return secure
    below = holding.below(st, scored)
    if below is not None:
        return below
    recheck = holding.recheck(st)
    if recheck is not None:
        return recheck
    if g.explore:
        explored = explore.explore(st, scored)
        if explored is not None:
            return explored
    return words.finish(st, words.edge_summary(st, scored))
