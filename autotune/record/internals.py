"""The one place that touches Optuna's private API, behind a few small functions.

Optuna's public `Study`/`Trial` API cannot read a trial fresh from the storage by id, write an
attribute on a trial from inside a sampler, fail a trial by number, read an enqueued trial's
parameters, tell whether a distribution holds a value, list the trials whose heartbeat stopped,
or store a trial's constraints in both of the forms Optuna's readers take. Samplers
(`autotune.search`) and the study loop and workers (`autotune.study`) need each of those; they
call these functions, so an Optuna upgrade that moves a private name is fixed here and nowhere
else (`tests/test_architecture.py` fails on a private Optuna name used anywhere else).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.storages._heartbeat import BaseHeartbeat, is_heartbeat_enabled
from optuna.study._constrained_optimization import _CONSTRAINTS_KEY
from optuna.trial import FrozenTrial, TrialState

from autotune.record import keys

TrialLike = optuna.trial.Trial | FrozenTrial
__all__ = ["BaseHeartbeat", "TrialLike"]


def holds(dist: BaseDistribution, value: Any) -> bool:
    """Whether `dist` holds `value` (Optuna's own check, private on its distributions); a value
    of the wrong type is not held."""
    try:
        return bool(dist._contains(dist.to_internal_repr(value)))
    except (TypeError, ValueError):
        return False


def trial_id(trial: TrialLike) -> int:
    """The storage's id of `trial` (not its number): what the storage's own calls take."""
    return int(trial._trial_id)


def fresh(study: optuna.Study, trial: TrialLike) -> FrozenTrial:
    """The trial as the storage holds it now (attributes a sampler wrote included)."""
    return study._storage.get_trial(trial_id(trial))


def set_user_attr(study: optuna.Study, trial: TrialLike, key: str, value: object) -> None:
    """Write a user attribute on `trial` straight to the storage: a sampler holds a `FrozenTrial`,
    which cannot write one itself."""
    study._storage.set_trial_user_attr(trial_id(trial), key, value)


def set_system_attr(study: optuna.Study, trial: TrialLike, key: str, value: Any) -> None:
    """Write a system attribute on `trial` straight to the storage, as `set_user_attr` does a user
    one."""
    study._storage.set_trial_system_attr(trial_id(trial), key, value)


def fail_by_number(study: optuna.Study, number: int, attrs: Mapping[str, object]) -> bool:
    """Set `attrs` on trial `number` and fail it; False when it was finished already
    (`UpdateFinishedTrialError` comes through from the storage)."""
    storage = study._storage
    tid = storage.get_trial_id_from_study_id_trial_number(study._study_id, number)
    for key, value in attrs.items():
        storage.set_trial_user_attr(tid, key, value)
    return bool(storage.set_trial_state_values(tid, state=TrialState.FAIL))


def fixed_params(t: FrozenTrial) -> dict[str, object]:
    """The parameters an enqueued trial was queued with ({} when none)."""
    fixed = t.system_attrs.get(keys.FIXED_PARAMS)
    return dict(fixed) if isinstance(fixed, Mapping) else {}


def set_fixed_params(study: optuna.Study, t: FrozenTrial, params: Mapping[str, Any]) -> None:
    """Change the point a WAITING trial is queued with (reorders the queue without new trials)."""
    study._storage.set_trial_system_attr(t._trial_id, keys.FIXED_PARAMS, dict(params))


def is_enqueued(t: FrozenTrial) -> bool:
    """Whether the trial was queued with a fixed point (`enqueue_trial`) rather than sampled."""
    return keys.FIXED_PARAMS in t.system_attrs


def heartbeat_storage(study: optuna.Study) -> BaseHeartbeat | None:
    """The study's storage when it records heartbeats, else None."""
    storage = study._storage
    if isinstance(storage, BaseHeartbeat) and is_heartbeat_enabled(storage):
        return storage
    return None


def stale_trial_ids(study: optuna.Study) -> set[int]:
    """Ids of RUNNING trials whose heartbeat is older than the grace period."""
    storage = heartbeat_storage(study)
    return set(storage._get_stale_trial_ids(study._study_id)) if storage is not None else set()


CONSTRAINT_PREFIX = f"{_CONSTRAINTS_KEY}:"
"""Optuna's system attribute of one named constraint (`trial.set_constraint`)."""


def constraint_attrs(values: Mapping[str, float]) -> dict[str, Any]:
    """A trial's constraints (≤ 0 satisfied) as the system attributes to store, in both forms
    Optuna's readers take: one `constraints:<name>` each (what `trial.set_constraint` writes and
    autotune reads back by name) and the list under `constraints`, in the order of the names
    sorted (what a `constraints_func` sampler writes, and the only form Optuna Dashboard's
    serializer reads: without it the dashboard draws an out-of-memory trial as feasible, on the
    Pareto front). Optuna's own readers (`FrozenTrial.constraints`) see both; the values are the
    same, so feasibility is."""
    named: dict[str, Any] = {CONSTRAINT_PREFIX + k: float(v) for k, v in values.items()}
    return {**named, _CONSTRAINTS_KEY: [float(values[k]) for k in sorted(values)]}


def set_constraints(study: optuna.Study, trial: TrialLike, values: Mapping[str, float]) -> None:
    """Store `values` on a trial not yet told (`constraint_attrs`)."""
    for key, value in constraint_attrs(values).items():
        study._storage.set_trial_system_attr(trial_id(trial), key, value)


def constraints(t: FrozenTrial) -> dict[str, float]:
    """The trial's named constraints (≤ 0 satisfied). A trial that has only the list form (a
    sampler with `constraints_func`) gives them numbered, as Optuna does (`"0"`, `"1"`, …)."""
    named = {
        k[len(CONSTRAINT_PREFIX) :]: float(v)
        for k, v in t.system_attrs.items()
        if k.startswith(CONSTRAINT_PREFIX) and isinstance(v, int | float)
    }
    return named if named else dict(t.constraints)
