"""The one place that touches Optuna's private API, behind a few small functions.

Optuna's public `Study`/`Trial` API cannot read a trial fresh from the storage by id, write an
attribute on a trial from inside a sampler, fail a trial by number, read an enqueued trial's
parameters, or list the trials whose heartbeat stopped. Samplers (`autotune.search`) and the
study loop and workers (`autotune.study`) need each of those; they call these functions, so an
Optuna upgrade that moves a private name is fixed here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import optuna
from optuna.storages import BaseStorage
from optuna.storages._heartbeat import BaseHeartbeat, is_heartbeat_enabled
from optuna.trial import FrozenTrial, TrialState

from autotune.record import keys

TrialLike = optuna.trial.Trial | FrozenTrial
__all__ = ["BaseHeartbeat", "TrialLike"]


def storage_of(study: optuna.Study) -> BaseStorage:
    return study._storage


def trial_id(trial: TrialLike) -> int:
    return int(trial._trial_id)


def fresh(study: optuna.Study, trial: TrialLike) -> FrozenTrial:
    """The trial as the storage holds it now (attributes a sampler wrote included)."""
    return study._storage.get_trial(trial_id(trial))


def set_user_attr(study: optuna.Study, trial: TrialLike, key: str, value: object) -> None:
    study._storage.set_trial_user_attr(trial_id(trial), key, value)


def set_system_attr(study: optuna.Study, trial: TrialLike, key: str, value: Any) -> None:
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
