"""`CapacityAwareSampler`: an Optuna sampler that spends restarts only where uncertainty is.

It proposes all searched parameters at once (relative sampling) from `planner.plan`, so it works
with any storage and any number of workers: everything it knows is read back from the study's
trials at each proposal — the ledgers, outcomes and stress peaks autotune records, and the
trials other workers are running. Each proposal records why as user attributes of the trial:
`search_rule` and `search_why` ("predicted 201,900 tokens, static free 3.10 ± 0.02 GiB, stress
peak 2.40 ± 0.20 GiB, ..."); the numbers behind it are kept in the system attribute
`capacity_aware:forecast`. Whether anything is left worth a launch at all (`nothing_left`) is
asked before `study.ask`, from the same planner and the same trials: Optuna cannot delete a
trial, so a decision not to launch must never create one.

Seed logs (`[search] seed_logs`, `record.seeds`) come first among the known points, numbered
−1, −2, …: the model and its bounds learn from them as from finished trials, and the why names
them ("seed 1 (server.log)"); they are never trials, so they are not counted, not in the trial
table and never the winner. Before any trial finished, a seeded study proposes from the space the
seeds were stored with, and reads the required headroom from them.

`mem_fraction_static` need not be searched: fixed in the study file, it is in every trial's
record and the model works on the other memory parameters at that fraction. Where the memory
model has nothing to act on (`fallback.why_random`), parameters are sampled at random.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from autotune.config.schema import Scalar
from autotune.memory.model import phi
from autotune.record import internals, keys
from autotune.record.seeds import Seeds, seeds_of
from autotune.record.stored import stored
from autotune.search.base import (
    DONE_ATTR,
    RULE_ATTR,
    WHY_ATTR,
    Ask,
    Known,
    MemorySampler,
    Param,
    record_rule,
)
from autotune.search.fallback import why_random
from autotune.search.planner import Goal, Proposal, plan
from autotune.search.points import MEMORY_PARAMS, Point
from autotune.search.records import (
    candidate_values,
    finished_points,
    learnt_space,
    pending_params,
    required_headroom,
    seed_names,
    seed_points,
    wants_throughput,
)

FORECAST_ATTR = keys.FORECAST
__all__ = [
    "DONE_ATTR",
    "FORECAST_ATTR",
    "RULE_ATTR",
    "WHY_ATTR",
    "CapacityAwareSampler",
    "record_rule",
    "search_done",
]


class CapacityAwareSampler(MemorySampler):
    """Learns SGLang's memory arithmetic from the trials and walks to the OOM edge with a margin.

    Args:
        seed: seeds the fallback for parameters the memory model does not know.
        min_headroom_gib: the headroom a stable setting must keep under the stress peak; by
            default read back from the trials' `headroom_gib` constraint (0 until one is seen).
        margin_sd: how many standard deviations of the prediction a proposal keeps in reserve.
        probe_p: the least probability of being stable that makes an uncertain setting worth
            a launch.
    """

    def __init__(
        self,
        *,
        seed: int | None = None,
        min_headroom_gib: float | None = None,
        margin_sd: float = 2.0,
        probe_p: float = 0.25,
    ) -> None:
        super().__init__(seed=seed)
        self._min_headroom = min_headroom_gib
        self._safe_p = phi(margin_sd)
        self._probe_p = probe_p
        self._last: Proposal | None = None

    @property
    def last_proposal(self) -> Proposal | None:
        """The latest proposal this instance made (for tests and the benchmark)."""
        return self._last

    def _runs_as_queued(self, trial: FrozenTrial, trials: Sequence[FrozenTrial]) -> bool:
        """An enqueued point (the baseline) before any trial finished: nothing to propose."""
        return bool(internals.fixed_params(trial)) and not any(
            t.state == TrialState.COMPLETE for t in trials
        )

    def _known(self, study: optuna.Study, trials: Sequence[FrozenTrial], number: int) -> Known:
        """The seeds (oldest), then the finished trials other than `number`."""
        seeds = seeds_of(study)
        return Known([*seed_points(seeds), *finished_points(trials, number)], seeds)

    def _choose(self, ask: Ask) -> Mapping[str, Scalar]:
        known = ask.known
        proposal = self._plan(
            ask.trials, known.points, ask.study, ask.trial.number, ask.space, known.seeds
        )
        self._record(ask.study, ask.trial, proposal, known.seeds)
        return proposal.params

    def nothing_left(self, study: optuna.Study) -> str | None:
        """Why nothing is left worth a launch (what is left to learn is smaller than one step,
        nothing starts, …), or None: the planner's verdict on the trial `study.ask()` would
        create next (the first queued point, else a new one), reached as `sample_relative`
        reaches it, but before the ask, so the decision leaves no trial behind."""
        trials = study.get_trials(deepcopy=False)
        queued = [t for t in trials if t.state == TrialState.WAITING]
        nxt = min(queued, key=lambda t: t.number) if queued else None
        number = nxt.number if nxt is not None else max((t.number for t in trials), default=-1) + 1
        search_space = learnt_space(study, number)
        if not search_space:
            return None
        started = any(t.state == TrialState.COMPLETE for t in trials)
        if nxt is not None and internals.fixed_params(nxt) and not started:
            return None  # a queued point (the baseline) before any trial: it runs
        known = self._known(study, trials, number)
        if why_random(search_space, trials, number, known.points) is not None:
            return None
        return self._plan(trials, known.points, study, number, search_space, known.seeds).done

    def _first_value(self, study: optuna.Study, trial: FrozenTrial, p: Param) -> Scalar | None:
        """The planner's conservative start for a memory parameter, random for any other."""
        if p.name not in MEMORY_PARAMS:
            return None
        trials = study.get_trials(deepcopy=False)
        known = self._known(study, trials, trial.number)
        space = {p.name: p.distribution}
        if why_random(space, trials, trial.number, known.points) is not None:
            return None
        return plan({p.name: p.values}, [], [], Goal(), space).params[p.name]

    def propose(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        search_space: dict[str, BaseDistribution],
    ) -> Proposal:
        """The planner's proposal for `trial`, from everything the study holds now."""
        trials = study.get_trials(deepcopy=False)
        known = self._known(study, trials, trial.number)
        return self._plan(trials, known.points, study, trial.number, search_space, known.seeds)

    def _plan(
        self,
        trials: Sequence[FrozenTrial],
        finished: Sequence[Point],
        study: optuna.Study,
        number: int,
        search_space: dict[str, BaseDistribution],
        seeds: Seeds | None,
    ) -> Proposal:
        axes = {name: candidate_values(d, name) for name, d in search_space.items()}
        headroom = self._min_headroom
        if headroom is None:
            headroom = required_headroom(trials)
        if headroom is None:
            headroom = seeds.min_headroom_gib if seeds is not None else 0.0
        goal = Goal(
            min_headroom_gib=headroom,
            safe_p=self._safe_p,
            probe_p=self._probe_p,
            explore=wants_throughput(study),
        )
        proposal = plan(axes, finished, pending_params(trials, number), goal, search_space)
        names = seed_names(seeds)
        if names:
            proposal = dataclasses.replace(
                proposal,
                why=_named(proposal.why, names),
                done=_named(proposal.done, names) if proposal.done else proposal.done,
            )
        self._last = proposal
        return proposal

    def _record(
        self, study: optuna.Study, trial: FrozenTrial, p: Proposal, seeds: Seeds | None
    ) -> None:
        record_rule(study, trial, p.rule, p.why, p.done)
        if p.repeats > 1 and not p.done:
            internals.set_user_attr(study, trial, keys.STRESS_REPEATS, p.repeats)
        if seeds is not None:
            origin = [s.origin for s in seeds.points]
            internals.set_user_attr(study, trial, keys.SEEDED_FROM, origin)
        fc = p.forecast
        if fc is not None:
            numbers: dict[str, float | str | None] = {
                "tokens": fc.tokens.mean if fc.tokens else None,
                "static_free_gib": fc.static_free.mean if fc.static_free else None,
                "static_free_sd": fc.static_free.sd if fc.static_free else None,
                "stress_peak_gib": fc.stress_peak.mean if fc.stress_peak else None,
                "stress_peak_sd": fc.stress_peak.sd if fc.stress_peak else None,
                "model": p.model.describe() if p.model else None,
                "kappa": p.kappa,
            }
            internals.set_system_attr(study, trial, FORECAST_ATTR, numbers)


_SEED_REF = re.compile(r"\btrial (-\d+)\b")


def _named(text: str, names: Mapping[int, str]) -> str:
    """'trial -1' (how the planner names a point) as the seed it is."""
    return _SEED_REF.sub(lambda m: names.get(int(m.group(1)), m.group(0)), text)


def search_done(trials: Sequence[FrozenTrial]) -> str | None:
    """Why the capacity-aware search has nothing left worth a launch, or None.

    Looks at the newest trial that carries a search rule; a run loop may stop on it.
    """
    for t in sorted(trials, key=lambda t: t.number, reverse=True):
        s = stored(t)
        if s.search_rule is not None:
            return s.search_done
    return None
