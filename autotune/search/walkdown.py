"""`WalkDownSampler`: the walk vLLM's auto_tune script does, as an Optuna sampler.

Start `mem_fraction_static` at the top of its range and step down one step after every launch that
fails (OOM at startup or under load, headroom too small) until one holds; then take the other
searched parameters' grid one combination at a time, each walking down from the fraction the
previous combination settled on. It learns nothing between steps, which is the point of having
it: the benchmark measures what the memory model saves over it.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler, RandomSampler
from optuna.trial import FrozenTrial

from autotune.search.capacity import record_rule
from autotune.search.points import FRACTION, Point, Scalar
from autotune.search.records import candidate_values, learnt_space, pending_params, point_of


class WalkDownSampler(BaseSampler):
    def __init__(self, *, seed: int | None = None) -> None:
        self._fallback = RandomSampler(seed=seed)

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return learnt_space(study, trial)

    def sample_relative(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        search_space: dict[str, BaseDistribution],
    ) -> dict[str, Any]:
        if not search_space:
            return {}
        axes = {n: candidate_values(d, n) for n, d in search_space.items()}
        finished = [
            p
            for t in study.get_trials(deepcopy=False)
            if t.number != trial.number and (p := point_of(t))
        ]
        pending = pending_params(study.get_trials(deepcopy=False), trial.number)
        params, rule, why = walk(axes, finished, pending)
        record_rule(study, trial, rule, why, done=why if rule == "confirm" else None)
        return {k: v for k, v in params.items() if k in search_space}

    def sample_independent(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        values = candidate_values(param_distribution, param_name)
        if param_name == FRACTION and values:
            return max(values)
        return self._fallback.sample_independent(study, trial, param_name, param_distribution)


def walk(
    axes: Mapping[str, Sequence[Scalar]],
    finished: Sequence[Point],
    pending: Sequence[Mapping[str, Scalar]] = (),
) -> tuple[dict[str, Scalar], str, str]:
    """(params, rule, why) for the next launch of the walk; what other workers run now is
    skipped, so several workers walk down side by side."""
    fractions = sorted(float(v) for v in axes.get(FRACTION, ()))
    others = [n for n in sorted(axes) if n != FRACTION]
    combos = [
        dict(zip(others, c, strict=True)) for c in itertools.product(*(axes[n] for n in others))
    ]
    if finished:
        first = {n: finished[0].params.get(n) for n in others}
        combos.sort(key=lambda c: c != first)
    start = fractions[-1] if fractions else None
    for combo in combos:
        here = [p for p in finished if all(_same(p.params.get(n), v) for n, v in combo.items())]
        failed = [float(p.params[FRACTION]) for p in here if not p.feasible]
        held = [float(p.params[FRACTION]) for p in here if p.feasible]
        nxt = start if not failed else max((f for f in fractions if f < min(failed)), default=None)
        running = {float(p[FRACTION]) for p in pending if _at(p, combo) and FRACTION in p}
        while nxt is not None and any(_same(nxt, f) for f in running):
            nxt = max((f for f in fractions if f < nxt), default=None)
        if nxt is None:
            continue
        if any(_same(nxt, f) for f in held) or (held and max(held) >= nxt):
            start = max(held)
            continue
        why = f"walk-down: {FRACTION}={nxt:g} " + (
            f"(one step below {min(failed):g}, which failed)" if failed else "(top of the range)"
        )
        return {**combo, FRACTION: nxt}, "walkdown", why
    best = max(
        (p for p in finished if p.feasible),
        key=lambda p: float(p.params.get(FRACTION, 0)),
        default=None,
    )
    params = (
        dict(best.params) if best else {**(combos[0] if combos else {}), FRACTION: fractions[0]}
    )
    return (
        {k: v for k, v in params.items() if k in axes},
        "confirm",
        "walk-down finished every combination",
    )


def _at(params: Mapping[str, Scalar], combo: Mapping[str, Scalar]) -> bool:
    return all(_same(params.get(n), v) for n, v in combo.items())


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        try:
            return abs(float(a) - float(b)) < 1e-9  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return False
    return a == b
