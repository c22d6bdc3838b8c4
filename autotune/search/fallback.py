"""When the memory searches have nothing to act on: independent random sampling.

Both samplers know only the memory parameters (`MEMORY_PARAMS`) and learn only from the records
autotune's trials keep. A search space without any of those parameters, or a study whose
finished trials the memory model cannot read (no trial records a `mem_fraction_static`, because
SGLang chose it), is still a valid study: they then sample every parameter independently at
random, and say so in the trial's `search_rule` ("random") and `search_why`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler
from optuna.trial import FrozenTrial, TrialState

from autotune.record import internals
from autotune.search.points import FRACTION, MEMORY_PARAMS, Point

RANDOM_RULE = "random"


def why_random(
    search_space: Mapping[str, BaseDistribution],
    trials: Sequence[FrozenTrial],
    current: int,
    finished: Sequence[Point],
) -> str | None:
    """Why the memory search cannot propose `search_space` for trial `current`, or None when
    it can. `finished` are the points read from `trials` (`records.finished_points`)."""
    if not any(n in MEMORY_PARAMS for n in search_space):
        return f"no memory parameter searched ({', '.join(MEMORY_PARAMS)}): random"
    complete = any(t.state == TrialState.COMPLETE and t.number != current for t in trials)
    if complete and not finished:
        return f"no finished trial records {FRACTION}, so the memory model learns nothing: random"
    return None


def sample_randomly(
    sampler: BaseSampler,
    study: optuna.Study,
    trial: FrozenTrial,
    search_space: Mapping[str, BaseDistribution],
) -> dict[str, Any]:
    """Every parameter of `search_space`, drawn independently by `sampler`."""
    return {
        name: sampler.sample_independent(study, trial, name, dist)
        for name, dist in search_space.items()
    }


def contained(
    params: Mapping[str, Any], search_space: Mapping[str, BaseDistribution]
) -> dict[str, Any]:
    """The values of `params` that their distribution in `search_space` holds (a value from an
    older trial may lie outside a range that changed since); Optuna samples the rest
    independently."""
    out = {}
    for name, value in params.items():
        dist = search_space.get(name)
        if dist is None:
            continue
        if internals.holds(dist, value):
            out[name] = value
    return out
