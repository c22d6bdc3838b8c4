"""The capacity edge: where the next launch for more KV capacity goes.

Capacity is what the search is for, and each launch costs minutes of startup, so the launches
that find the edge are chosen by how much each one teaches about it: one step above the highest
safe setting when the model expects it to hold (`edge`), halfway to a failure far above rather
than one safe step at a time (`halfway`), the middle of the uncertain range when nothing better
is safe (`bisect`), and once more a failure that may have been the peak's noise rather than the
edge (`noise_retry`). The safe step itself, and the order in which these are asked, is
`search.planner`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from autotune.config.schema import Scalar
from autotune.memory.model import Forecast
from autotune.search.holding import with_less_demand
from autotune.search.points import (
    FRACTION,
    Point,
    Push,
    fmt,
    host_failure,
    more_demand,
    needs_more,
    same_gpu,
    tokens_of,
)
from autotune.search.proposal import Proposal
from autotune.search.retries import RETRIES
from autotune.search.state import PlanState, Scored
from autotune.search.words import propose

HALFWAY_STEPS = 3.5
"""A safe setting this many fraction steps or more below a failure (or a thin hold) is not
stepped to but bisected past (`halfway`)."""


def halfway(
    st: PlanState,
    top: Mapping[str, Scalar],
    safe: Forecast,
    better: list[Scored],
) -> Proposal | None:
    """The highest setting the model calls safe lies more than HALFWAY_STEPS below the
    lowest launch that failed on GPU memory, or held only with a thin margin: a miss has
    widened the model's margins (`calibration`), and climbing from there one safe step at a
    time costs a launch per step. A launch halfway between the two, of no more demand,
    halves that bracket instead, while the model gives it at least probe_p (the host cache
    and the other axes as the safe setting has them)."""
    f0 = safe.setting.mem_fraction
    step = st.grid_fraction_step()
    above = [
        q.observation.setting.mem_fraction
        for q in st.known
        if q.observation is not None
        and (q is st.thin or (q.push is Push.LOWER and host_failure(q.observation) is None))
        and q.observation.setting.mem_fraction > f0 + HALFWAY_STEPS * step
    ]
    if not above:
        return None
    hi = min(above)
    mid = (f0 + hi) / 2
    inside = _alongside(
        st,
        top,
        safe,
        better,
        st.goal.probe_p,
        lambda f: f0 + 1.5 * step < f < hi - 1.5 * step,
    )
    if not inside:
        return None
    params, fc, p = _nearest(inside, mid, step)
    return propose(
        st,
        params,
        fc,
        "bisect",
        f"the highest {FRACTION} the model calls safe is {fmt(f0)}, "
        f"{round((hi - f0) / step)} steps below {fmt(hi)} (failed or held thin): halfway, "
        f"p(stable) {p:.2f}",
    )


def edge(
    st: PlanState,
    top: Mapping[str, Scalar],
    safe: Forecast,
    better: list[Scored],
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
    step = st.grid_fraction_step()
    above = _alongside(
        st, top, safe, better, st.goal.accept_p, lambda f: abs(f - (f0 + step)) < 0.25 * step
    )
    if not above:
        return None
    params, fc, p = max(above, key=lambda x: x[2])
    return propose(
        st,
        params,
        fc,
        "edge",
        f"one step above {fmt(f0)}, the highest {FRACTION} the model calls safe: "
        f"p(stable) {p:.2f}, enough to count as stable if it holds",
    )


def noise_retry(st: PlanState, scored: list[Scored]) -> Proposal | None:
    """A second chance for a failure above the best stable capacity that may be the peak's
    noise rather than the edge: one that a launch needing at least as much memory
    contradicts (it held), or a near miss (it served the whole workload, only with less
    headroom than required). A near miss first tries the same fraction with less demand;
    either runs once more while the model still gives it a chance."""
    for p in sorted(st.known, key=lambda q: -tokens_of(q)):
        o = p.observation
        if o is None or not p.memory_failure or tokens_of(p) <= st.cap:
            continue
        if host_failure(o) is not None:
            continue
        contradicted = p not in st.bounds
        near = _near_miss(p)
        if not (contradicted or near):
            continue
        if near and not contradicted:
            alt = with_less_demand(st, p, scored, why=f"trial {p.number} missed the headroom")
            if alt is not None:
                return alt
        runs = sum(
            1 for q in st.known if q.observation and same_gpu(q.observation.setting, o.setting)
        )
        if runs > RETRIES:
            continue
        fc = st.forecast(o.setting)
        pr = st.p_stable(fc)
        if pr < st.goal.probe_p:
            continue
        params = {k: v for k, v in p.params.items() if k in st.axes}
        if contradicted:
            held = next(
                (
                    q
                    for q in st.known
                    if q.feasible and q.observation and needs_more(q.observation.setting, o.setting)
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
        return propose(st, params, fc, "retry", f"{note}; once more, p(stable) {pr:.2f}")
    return None


def bisect(st: PlanState, doubtful: list[Scored]) -> Scored:
    """The uncertain candidate nearest the middle of (best stable, lowest failure); of those
    at that fraction, the one most likely to hold: a probe for capacity gets the same tokens
    from any requests and chunk, and less demand leaves it more headroom."""
    near = min(st.distance(x[0], demand=False) for x in doubtful)
    same = [x for x in doubtful if st.distance(x[0], demand=False) == near]
    lo = (
        st.best.observation.setting.mem_fraction
        if st.best and st.best.observation
        else min(fc.setting.mem_fraction for _, fc, _ in same)
    )
    fails = [p.observation.setting.mem_fraction for p in st.bounds if p.observation is not None]
    top = max(fc.setting.mem_fraction for _, fc, _ in same)
    hi = min([f for f in fails if f > lo], default=top + st.grid_fraction_step())
    mid = (lo + hi) / 2
    return _nearest(same, mid, st.grid_fraction_step())


def _alongside(
    st: PlanState,
    top: Mapping[str, Scalar],
    safe: Forecast,
    better: list[Scored],
    least_p: float,
    at: Callable[[float], bool],
) -> list[Scored]:
    """The candidates of `better` that the model gives at least `least_p`, at a fraction `at`
    accepts, of no more demand than the safe setting and with the host cache and the other axes
    of `top` (the safe setting's parameters): the launches `halfway` and `edge` choose from."""
    return [
        x
        for x in better
        if x[2] >= least_p
        and at(x[1].setting.mem_fraction)
        and not more_demand(x[1].setting, safe.setting)
        and st.besides_demand(x[0]) == st.besides_demand(top)
    ]


def _nearest(xs: Sequence[Scored], mid: float, step: float) -> Scored:
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
