"""Reading what trials recorded into the planner's terms, and the search space into candidates.

A trial's record is what `autotune.trial.run` stores as user attributes: `outcome`, `reason`,
`headroom_gib`, `throughput_tok_s` and the whole `record` (params, ledger, outcome, the stress
peak when measured). Constraints are Optuna's, read by name (`internals.constraints`, ≤ 0
satisfied). Nothing here knows about the simulator.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.search_space import intersection_search_space
from optuna.trial import FrozenTrial, TrialState

from autotune.config.studyfile import Scalar
from autotune.logparse.ledger import Ledger
from autotune.logparse.outcome import Outcome
from autotune.memory.model import Observation
from autotune.record import internals, keys
from autotune.record.seeds import Seed, Seeds, seeds_of
from autotune.search.points import FRACTION, Point, setting_of

CONTINUOUS_FRACTION_STEP = 0.005
MAX_INT_CANDIDATES = 24


def _record(t: FrozenTrial) -> Mapping[str, Any]:
    rec = t.user_attrs.get(keys.RECORD)
    return rec if isinstance(rec, Mapping) else {}


def trial_params(t: FrozenTrial) -> dict[str, Scalar]:
    """Every parameter the trial ran with: recorded (fixed ones too), enqueued, then sampled."""
    params: dict[str, Scalar] = {}
    recorded = _record(t).get("params")
    if isinstance(recorded, Mapping):
        params.update(recorded)
    params.update(internals.fixed_params(t))  # type: ignore[arg-type]
    params.update(t.params)
    return params


def is_feasible(t: FrozenTrial) -> bool:
    constraints = internals.constraints(t)
    return t.state == TrialState.COMPLETE and all(v <= 0 for v in constraints.values())


def _float(v: object) -> float | None:
    if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    return None


def point_of(t: FrozenTrial) -> Point | None:
    """A finished trial in the planner's terms; None when it says nothing about memory."""
    outcome = str(t.user_attrs.get(keys.OUTCOME, _record(t).get("outcome", "")))
    if t.state == TrialState.FAIL and not Outcome.of(outcome).is_parameter_result:
        return None
    if t.state not in (TrialState.COMPLETE, TrialState.FAIL):
        return None
    params = trial_params(t)
    setting = setting_of(params)
    if setting is None:
        return None
    rec = _record(t)
    led = rec.get("ledger")
    ledger = Ledger.from_dict(led) if isinstance(led, Mapping) else Ledger()
    peak = _float(rec.get("stress_peak_gib", t.user_attrs.get(keys.STRESS_PEAK)))
    reason = " ".join(
        [str(t.user_attrs.get(keys.REASON, "")), *[str(e) for e in rec.get("evidence", ()) or ()]]
    )
    obs = Observation(
        setting=setting,
        ledger=ledger,
        outcome=outcome,
        stress_peak_gib=peak,
        headroom_gib=_float(t.user_attrs.get(keys.HEADROOM)),
        feasible=is_feasible(t),
        reason=reason,
    )
    return Point(
        number=t.number,
        params=params,
        observation=obs,
        throughput=_float(t.user_attrs.get(keys.THROUGHPUT)) or 0.0,
        violated=frozenset(k for k, v in internals.constraints(t).items() if v > 0),
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
    """Parameters of trials other workers run now (or that wait in the queue)."""
    out = []
    for t in trials:
        if t.number == current or t.state not in (TrialState.RUNNING, TrialState.WAITING):
            continue
        params = trial_params(t)
        if params:
            out.append(params)
    return out


def required_headroom(trials: Sequence[FrozenTrial]) -> float | None:
    """The study's min_headroom_gib, read back from a constraint: value = required − measured."""
    for t in trials:
        c = internals.constraints(t).get("headroom_gib")
        h = _float(t.user_attrs.get(keys.HEADROOM))
        if c is not None and h is not None:
            return max(round(c + h, 6), 0.0)
    return None


def wants_throughput(study: optuna.Study) -> bool:
    objectives = study.user_attrs.get(keys.OBJECTIVES)
    if isinstance(objectives, list):
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
    logarithm for a log range), or CONTINUOUS_FRACTION_STEP for mem_fraction_static."""
    lo, hi = dist.low, dist.high
    step = dist.step or (CONTINUOUS_FRACTION_STEP if name == FRACTION else None)
    if step is None:
        n = MAX_INT_CANDIDATES - 1
        if dist.log:
            ratio = math.log(hi / lo)
            values = [lo * math.exp(ratio * i / n) for i in range(n + 1)]
        else:
            values = [lo + (hi - lo) * i / n for i in range(n + 1)]
    else:
        n = math.floor((hi - lo) / step + 1e-9)
        digits = max(0, -math.floor(math.log10(step)) + 2)
        values = [round(lo + i * step, digits) for i in range(n + 1)]
    return tuple(sorted({min(max(v, lo), hi) for v in values}))


def _spread(values: list[int], log: bool) -> list[int]:
    n = MAX_INT_CANDIDATES
    if log and values[0] > 0:
        lo, hi = math.log(values[0]), math.log(values[-1])
        picks = {round(math.exp(lo + (hi - lo) * i / (n - 1))) for i in range(n)}
    else:
        picks = {values[round(i * (len(values) - 1) / (n - 1))] for i in range(n)}
    allowed = set(values)
    return sorted(min(allowed, key=lambda v: abs(v - p)) for p in picks)
