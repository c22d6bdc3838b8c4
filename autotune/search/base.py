"""`MemorySampler`: what the capacity-aware search and the walk-down share as Optuna samplers.

Both propose every searched parameter at once (relative sampling) over the space learnt from the
study's trials (`records.learnt_space`), reading everything they know back from the trials at
each proposal, so they work with any storage and any number of workers. Both sample at random
where the memory parameters give nothing to act on (`fallback.why_random`), and both say why a
point was chosen in the trial's user attributes `search_rule` and `search_why` (and
`search_done` once nothing is left worth a launch), written by `record_rule` and read back by
`capacity.search_done`.

A subclass says what it knows (`_known`: the known points, and the seed logs they include) and
how it chooses a point from that (`_choose`, which records its rule); it may run a queued point
as it is (`_runs_as_queued`) and give the first value of a parameter outside the learnt space
(`_first_value`). The ask, the random fallback and what is kept of a proposal are here, once.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler, RandomSampler
from optuna.trial import FrozenTrial

from autotune.config.schema import Scalar
from autotune.record import internals, keys
from autotune.record.seeds import Seeds
from autotune.search.fallback import RANDOM_RULE, contained, sample_randomly, why_random
from autotune.search.points import Point
from autotune.search.records import candidate_values, learnt_space

WHY_ATTR = keys.SEARCH_WHY
RULE_ATTR = keys.SEARCH_RULE
DONE_ATTR = keys.SEARCH_STOP


@dataclass(frozen=True)
class Known:
    """What one proposal is made from: the known points (seeds first, then the finished trials
    other than the one proposed for) and the seed logs among them (None without seeds)."""

    points: list[Point]
    seeds: Seeds | None = None


@dataclass(frozen=True)
class Ask:
    """One proposal being made: the study, the trial it is for, the study's trials now, what the
    sampler knows, and the space proposed in."""

    study: optuna.Study
    trial: FrozenTrial
    trials: Sequence[FrozenTrial]
    known: Known
    space: dict[str, BaseDistribution]


@dataclass(frozen=True)
class Param:
    """One parameter sampled on its own: its name, its distribution and its candidate values
    (never empty)."""

    name: str
    distribution: BaseDistribution
    values: Sequence[Scalar]


class MemorySampler(BaseSampler, ABC):
    """An Optuna sampler of the memory parameters: relative sampling over the learnt space,
    random where the memory model has nothing to act on, the rule and why of every point kept
    in its trial.

    Args:
        seed: seeds the random fallback.
    """

    def __init__(self, *, seed: int | None = None) -> None:
        self._fallback = RandomSampler(seed=seed)

    def reseed_rng(self) -> None:
        """Reseed the random fallback, as Optuna's `BaseSampler.reseed_rng` asks of a sampler
        (parallel jobs call it so that they do not draw alike)."""
        self._fallback.reseed_rng()

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        """The space learnt from the study's trials (`records.learnt_space`): every searched
        parameter is proposed at once."""
        return learnt_space(study, trial.number)

    def sample_relative(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        search_space: dict[str, BaseDistribution],
    ) -> dict[str, Any]:
        """The next point: none for a queued trial the sampler runs as queued, random where the
        memory parameters give nothing to act on (`fallback.why_random`), else the subclass's
        choice, kept within the space."""
        if not search_space:
            return {}
        trials = study.get_trials(deepcopy=False)
        if self._runs_as_queued(trial, trials):
            return {}
        known = self._known(study, trials, trial.number)
        why = why_random(search_space, trials, trial.number, known.points)
        if why is not None:
            record_rule(study, trial, RANDOM_RULE, why)
            return sample_randomly(self._fallback, study, trial, search_space)
        params = self._choose(Ask(study, trial, trials, known, search_space))
        return contained(params, search_space)

    def sample_independent(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        """A parameter outside the learnt space (the very first trial without a baseline): the
        sampler's own first value for it where it has one, else random."""
        values = candidate_values(param_distribution, param_name)
        if values:
            first = self._first_value(study, trial, Param(param_name, param_distribution, values))
            if first is not None:
                return first
        return self._fallback.sample_independent(study, trial, param_name, param_distribution)

    def _runs_as_queued(self, trial: FrozenTrial, trials: Sequence[FrozenTrial]) -> bool:
        """Whether `trial` is a queued point that runs as it is, with nothing proposed for it
        (nothing is recorded then either); never, unless a sampler says so."""
        return False

    @abstractmethod
    def _known(self, study: optuna.Study, trials: Sequence[FrozenTrial], number: int) -> Known:
        """What the sampler knows when it proposes for trial `number`."""

    @abstractmethod
    def _choose(self, ask: Ask) -> Mapping[str, Scalar]:
        """The point for `ask.trial`, its rule and why recorded (`record_rule`); what `ask.space`
        does not hold is dropped, and Optuna samples it independently."""

    def _first_value(self, study: optuna.Study, trial: FrozenTrial, p: Param) -> Scalar | None:
        """The first value of parameter `p` outside the learnt space, or None to sample it at
        random."""
        return None


def record_rule(
    study: optuna.Study, trial: FrozenTrial, rule: str, why: str, done: str | None = None
) -> None:
    """The rule that chose `trial`'s point and why (and, when `done` says so, that the search
    has finished) as the trial's user attributes."""
    internals.set_user_attr(study, trial, RULE_ATTR, rule)
    internals.set_user_attr(study, trial, WHY_ATTR, why)
    if done:
        internals.set_user_attr(study, trial, DONE_ATTR, done)
