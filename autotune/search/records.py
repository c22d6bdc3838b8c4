"""Reading what trials recorded into the planner's terms, and the search space into candidates.

A finished trial becomes a point from its view (`autotune.record.view`), which holds what it
stored (`autotune.record.stored`: outcome, reason, headroom, throughput, the record's params,
ledger, evidence and stress peak, Optuna's constraints, ≤ 0 satisfied); nothing here reads an
attribute by its name. Nothing here knows about the simulator.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.search_space import intersection_search_space
from optuna.trial import FrozenTrial, TrialState

from autotune.config.schema import Scalar
from autotune.config.space import fraction_step, snap
from autotune.memory.model import Observation
from autotune.record.seeds import Seed, Seeds, seeds_of
from autotune.record.stored import Stored, stored, study_record
from autotune.record.stored import required_headroom as stored_headroom
from autotune.record.view import TrialView, view
from autotune.search.points import FRACTION, Point, setting_of

MAX_INT_CANDIDATES = 24


def trial_params(t: FrozenTrial, s: Stored | None = None) -> dict[str, Scalar]:
    """Every parameter the trial ran with: recorded (fixed ones too), enqueued, then sampled
    (`s`: the trial's attributes when read already)."""
    s = stored(t) if s is None else s
    params: dict[str, Scalar] = dict(s.params)
    params.update(s.queued)  # type: ignore[arg-type]
    params.update(t.params)
    return params


def observation_of(v: TrialView, params: Mapping[str, Scalar]) -> Observation | None:
    """What a finished trial taught about memory, as the memory model reads it: from the record
    as written (`TrialView.stored`: the reason and evidence unmasked, the stress peak as the
    probe saw it), feasible when it completed within every constraint. None without a numeric
    fraction. The search and the report's model curve both read trials through it."""
    setting = setting_of(params)
    if setting is None:
        return None
    s = v.stored
    return Observation(
        setting=setting,
        ledger=v.ledger,
        outcome=v.outcome,
        stress_peak_gib=s.stress_peak_gib,
        headroom_gib=s.headroom_gib,
        feasible=v.state == "complete" and all(c <= 0 for c in s.constraints.values()),
        reason=" ".join([s.reason or "", *s.evidence]),
        growth_gib=s.growth_gib,
    )


def point_of(t: FrozenTrial) -> Point | None:
    """A finished trial in the planner's terms, from its view; None when it says nothing about
    memory (`observation_of`)."""
    if t.state not in (TrialState.COMPLETE, TrialState.FAIL):
        return None
    v = view(t)
    s = v.stored
    if t.state == TrialState.FAIL and not v.ending.is_parameter_result:
        return None
    params = trial_params(t, s)
    obs = observation_of(v, params)
    if obs is None:
        return None
    return Point(
        number=t.number,
        params=params,
        observation=obs,
        throughput=s.throughput_tok_s or 0.0,
        violated=frozenset(v.violated),
        repeats=s.stress_repeats,
    )


def seed_point(s: Seed) -> Point | None:
    """A seed log (`record.seeds`) in the planner's terms, numbered below every trial (−1, −2,
    …): the observation a finished trial of that start would give, never a trial itself."""
    setting = setting_of(s.params)
    if setting is None:
        return None
    obs = Observation(
        setting=setting,
        ledger=s.ledger,
        outcome=s.outcome,
        stress_peak_gib=s.stress_peak_gib,
        headroom_gib=s.headroom_gib,
        feasible=s.feasible,
        reason=s.reason,
    )
    return Point(number=-s.index, params=dict(s.params), observation=obs, violated=s.violated)


def seed_points(seeds: Seeds | None) -> list[Point]:
    """The study's seeds (`record.seeds.seeds_of`) as points, before every trial (they are older
    than the study)."""
    if seeds is None:
        return []
    return [p for s in seeds.points if (p := seed_point(s)) is not None]


def seed_names(seeds: Seeds | None) -> dict[int, str]:
    """Point number → how a seed is named in a proposal's why ("seed 1 (server.log)")."""
    return {-s.index: s.name for s in seeds.points} if seeds else {}


def finished_points(trials: Sequence[FrozenTrial], current: int) -> list[Point]:
    """The finished trials other than `current` that say something about memory, oldest first."""
    return [p for t in trials if t.number != current and (p := point_of(t))]


def pending_params(trials: Sequence[FrozenTrial], current: int) -> list[dict[str, Scalar]]:
    """Parameters of trials other workers run now (or that wait in the queue), and of points
    skipped because SGLang runs them as a measured trial (`search.effective`): none of them is
    proposed again."""
    out = []
    for t in trials:
        if t.number == current:
            continue
        live = t.state in (TrialState.RUNNING, TrialState.WAITING)
        if not live and (t.state != TrialState.FAIL or stored(t).runs_as is None):
            continue
        params = trial_params(t)
        if params:
            out.append(params)
    return out


def required_headroom(trials: Sequence[FrozenTrial]) -> float | None:
    """The study's min_headroom_gib as the search holds it: read back from the trials'
    constraints, never below 0."""
    need = stored_headroom(trials)
    return max(need, 0.0) if need is not None else None


def wants_throughput(study: optuna.Study) -> bool:
    """Whether the study maximises throughput too (its objectives as stored, else whether it
    has more than one direction)."""
    objectives = study_record(study).objectives
    if objectives is not None:
        return "throughput" in objectives
    return len(study.directions) > 1


def learnt_space(study: optuna.Study, current: int) -> dict[str, BaseDistribution]:
    """The searched parameters (more than one value) seen in finished trials, or, before any
    finished, the space the study's seeds were stored with (`record.seeds`), else the trials
    other workers are running (other than trial number `current`)."""
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    seeds = seeds_of(study)
    if done:
        space = intersection_search_space(done)
    elif seeds is not None and seeds.space:
        space = dict(seeds.space)
    else:
        running = [
            t
            for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            if t.number != current and t.distributions
        ]
        space = _intersection([t.distributions for t in running])
    return {k: d for k, d in space.items() if not d.single()}


def _intersection(spaces: Sequence[Mapping[str, BaseDistribution]]) -> dict[str, BaseDistribution]:
    if not spaces:
        return {}
    return {k: d for k, d in spaces[0].items() if all(s.get(k) == d for s in spaces[1:])}


def candidate_values(dist: BaseDistribution, name: str) -> tuple[Scalar, ...]:
    """The values worth considering for one parameter, in order."""
    if isinstance(dist, CategoricalDistribution):
        return tuple(dist.choices)  # type: ignore[arg-type]
    if isinstance(dist, IntDistribution):
        values = list(range(dist.low, dist.high + 1, dist.step))
        if len(values) > MAX_INT_CANDIDATES:
            values = _spread(values, dist.log)
        return tuple(values)
    if isinstance(dist, FloatDistribution):
        return _float_values(dist, name)
    return ()


def _float_values(dist: FloatDistribution, name: str) -> tuple[float, ...]:
    """The step's grid; without a step, MAX_INT_CANDIDATES values spread evenly (evenly in the
    logarithm for a log range), or for mem_fraction_static the lattice of `space.fraction_step`;
    each value snapped (`space.snap`) as a trial's value is."""
    lo, hi = dist.low, dist.high
    step = fraction_step({name: dist}) if name == FRACTION else dist.step
    if step is None:
        n = MAX_INT_CANDIDATES - 1
        if dist.log:
            ratio = math.log(hi / lo)
            values = [lo * math.exp(ratio * i / n) for i in range(n + 1)]
        else:
            values = [lo + (hi - lo) * i / n for i in range(n + 1)]
    else:
        n = math.floor((hi - lo) / step + 1e-9)
        values = [lo + i * step for i in range(n + 1)]
    return tuple(sorted({min(max(snap(v, step), lo), hi) for v in values}))


def _spread(values: list[int], log: bool) -> list[int]:
    n = MAX_INT_CANDIDATES
    if log and values[0] > 0:
        lo, hi = math.log(values[0]), math.log(values[-1])
        picks = {round(math.exp(lo + (hi - lo) * i / (n - 1))) for i in range(n)}
    else:
        picks = {values[round(i * (len(values) - 1) / (n - 1))] for i in range(n)}
    allowed = set(values)
    return sorted(min(allowed, key=lambda v: abs(v - p)) for p in picks)
