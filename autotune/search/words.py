"""The planner's words: the why of every proposal and the closing reason of a search.

A study is read back by its trials' `search_why` and the `search_done` it ends with, so every
rule words its proposal the same way (`propose`: where it goes, the forecast, the rule's own
note, the edge the model sees, the calibration and the doubt, the best so far), and the end says
where the edge lies in the launches' own terms (`edge_summary`: what holds, what failed above
it, what the model says of the next step). The rules decide; this module only says, from the
same `PlanState` they decided from.
"""

from __future__ import annotations

from collections.abc import Mapping

from autotune.config.schema import Scalar
from autotune.config.space import same_value
from autotune.memory.model import Forecast, Setting
from autotune.search.doubt import REPEATS
from autotune.search.points import FRACTION, Point, fmt, num
from autotune.search.proposal import Proposal
from autotune.search.state import PlanState, Scored


def propose(
    st: PlanState,
    params: dict[str, Scalar],
    fc: Forecast,
    rule: str,
    note: str,
    repeats: int = 1,
) -> Proposal:
    """A launch of `params` by `rule`, with its why: where, the forecast, `note`, the edge the
    model sees, the widened margins and the doubt, and the best stable so far; `repeats` stress
    passes on the launch (each that holds is one hold)."""
    at = where(st, params)
    best = (
        f"best stable so far {st.cap:,} tokens (trial {st.best.number})"
        if st.best
        else "nothing stable yet"
    )
    why = (
        f"{rule} to {at}: {fc.describe()}, {st.goal.min_headroom_gib:g} GiB required; "
        f"{note}{_edge_text(st, fc)}{st.cal.describe()}{st.doubt.describe()}; {best}"
    )
    if repeats > 1:
        why += f"; its stress phases run {repeats} times on the launch, each pass one hold"
    return Proposal(
        params, rule, why, forecast=fc, model=st.model, kappa=st.cal.kappa, repeats=repeats
    )


def _edge_text(st: PlanState, fc: Forecast) -> str:
    edge = st.model.oom_edge(fc, st.goal.min_headroom_gib)
    return f"; edge at {FRACTION} {edge.mean:.4f} ± {edge.sd:.4f}" if edge else ""


def finish(st: PlanState, summary: str) -> Proposal:
    """The end of the search: confirm the best (or the reference launch), and say why nothing
    is left worth a launch (where the launches contradict the model, with the evidence)."""
    ref = st.best or st.ref
    params = {k: v for k, v in ref.params.items() if k in st.axes}
    text = f"what is left to learn is smaller than one step: {summary}"
    if st.doubt.wrong:
        held = st.best is not None and st.holds(st.best) >= REPEATS
        head = (
            f"the best setting held {st.holds(st.best)} times"
            if held and st.best is not None
            else "nothing better is left to try"
        )
        wider = " with the wider margin the evidence asks for" if st.doubt.tails else ""
        text = f"{head}{wider}: {summary}"
        text += st.doubt.describe()
    return Proposal(
        params, "confirm", f"confirm trial {ref.number}: {text}", done=text, model=st.model
    )


def stop(st: PlanState, report: str) -> Proposal:
    """The end of the search for a reason besides the edge (`report`), at the best launch."""
    ref = st.best or st.ref
    params = {k: v for k, v in ref.params.items() if k in st.axes}
    return Proposal(params, "confirm", report, done=report, model=st.model)


def edge_summary(st: PlanState, scored: list[Scored]) -> str:
    """Where the edge is, in words: what holds, what failed above it, what the model says
    of the next step."""
    assert st.best is not None and st.best.observation is not None
    best = st.best.observation
    s = best.setting
    text = f"{where(st, st.best.params)} holds {st.cap:,} tokens"
    if best.headroom_gib is not None:
        text += f" with {best.headroom_gib:.2f} GiB to spare under the stress peak"
    fails = [(q.observation.setting.mem_fraction, q.number, q) for q in st.bounds if q.observation]
    above = [x for x in fails if x[0] > s.mem_fraction]
    if above:
        q = min(above)[2]
        text += f"; {where(st, q.params, against=st.best.params)} {_failure_words(q)}"
    step = [f for f in _fractions(st) if f > s.mem_fraction + 1e-9]
    if step:
        nxt = Setting(step[0], s.max_running_requests, s.chunked_prefill_size, s.hicache_gb)
        fc = st.forecast(nxt)
        if fc.headroom is not None:
            p = st.p_stable(fc)
            text += (
                f"; the model puts {FRACTION}={fmt(step[0])} at headroom {fc.headroom} GiB "
                f"(p(stable) {p:.2f}){_edge_text(st, fc)}"
            )
    return text


def where(
    st: PlanState, params: Mapping[str, Scalar], against: Mapping[str, Scalar] | None = None
) -> str:
    """`mem_fraction_static=0.9` plus the other parameters (only those that differ)."""
    others = [
        f"{n}={fmt(params.get(n))}"
        for n in st.names
        if n != FRACTION and (against is None or not same_value(params.get(n), against.get(n)))
    ]
    if FRACTION not in params:  # fixed, or SGLang's own choice
        return ", ".join(others) or "the fixed setting"
    head = f"{FRACTION}={fmt(params.get(FRACTION))}"
    return head + (f" ({', '.join(others)})" if others else "")


def _fractions(st: PlanState) -> list[float]:
    return sorted(num(v) for v in st.axes.get(FRACTION, ()))


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
