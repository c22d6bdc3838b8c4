"""The ask/run/tell loop: the queue (baseline first, the grid), the budget, the stop rules, and
telling each trial's result to the study.

The search's own stop (the capacity-aware sampler finds nothing left worth a launch) is asked
before each `study.ask`, never inside it: Optuna creates the trial before its sampler proposes,
and cannot delete one, so a decision taken inside the ask would leave a FAIL trial that never
ran. The stop is recorded on the study instead (`keys.SEARCH_DONE`), with its reason and the
trial count, and the run's closing line says it."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.samplers import BaseSampler
from optuna.trial import FrozenTrial, TrialState

from autotune.config.schema import Fixed, Scalar, SearchConfig, StudyConfig
from autotune.config.space import grid, point_key
from autotune.errors import HarnessError, UsageError
from autotune.logparse.outcome import Outcome
from autotune.record import internals, keys
from autotune.record.remedy import remedy
from autotune.record.seeds import seeded_baseline
from autotune.record.stored import stored, study_record
from autotune.record.view import view
from autotune.search.capacity import CapacityAwareSampler
from autotune.study.objectives import constraint_values, objective_values
from autotune.study.progress import duration
from autotune.study.samplers import reads_seed_logs
from autotune.study.storage import STORAGE_ERRORS, Worker, counted, first_line
from autotune.study.workers import Coordinator
from autotune.trial.record import Result
from autotune.trial.signals import first_received

log = logging.getLogger(__name__)


def prepare(study: optuna.Study, cfg: StudyConfig) -> int:
    """On a new study enqueue the baseline (and for `grid` every grid point); returns how many.

    A seed log of the baseline's own setting (`record.seeds`) has measured it already: the
    samplers that learn from seeds (`samplers.reads_seed_logs`) then start from the seed and the
    baseline is not launched first (it is still the study's baseline for every review)."""
    if study.get_trials(deepcopy=False):
        return 0
    queued: list[dict[str, Scalar]] = []
    searched = _searched_names(cfg.search)
    baseline = {k: v for k, v in cfg.search.baseline.items() if k in searched}
    if baseline:
        study.set_user_attr(keys.BASELINE, dict(baseline))
        seeded = reads_seed_logs(cfg.sampler.name) and seeded_baseline(study, baseline)
        if not seeded:
            queued.append(baseline)
    if cfg.sampler.name == "grid":
        points = grid(cfg.search)
        if points is None:
            raise UsageError(
                "--sampler grid needs a step (or choices) on every searched parameter; "
                "add step = ... or use tpe"
            )
        first = point_key(baseline, cfg.search)
        ordered = sorted(points, key=_grid_order(cfg.search))
        queued += [p for p in ordered if point_key(p, cfg.search) != first]
    for params in queued:
        study.enqueue_trial(dict(params))
    return len(queued)


def baseline_first(study: optuna.Study, cfg: StudyConfig) -> bool:
    """Put the baseline back at the head of the queue when a run cut it short (Ctrl-C, or a
    killed autotune) and its point was queued again behind the others: the operator's setting is
    measured first on resume, as on the first night. True when the queue was reordered."""
    held = study_record(study).baseline
    searched = _searched_names(cfg.search)
    baseline = (
        dict(held)
        if held is not None
        else {k: v for k, v in cfg.search.baseline.items() if k in searched}
    )
    if not baseline:
        return False
    trials = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)

    point = point_key(baseline, cfg.search)

    def runs_baseline(params: Mapping[str, object]) -> bool:
        return point.within(point_key(params, cfg.search))

    for t in trials:
        if t.state.is_finished() and runs_baseline(t.params):
            outcome = Outcome.of(stored(t).outcome or "")
            if t.state == TrialState.COMPLETE or outcome.counted:
                return False  # the baseline was measured already
    waiting = [t for t in trials if t.state == TrialState.WAITING]
    points = [internals.fixed_params(t) for t in waiting]
    at = next((i for i, p in enumerate(points) if runs_baseline(p)), None)
    if at is None or at == 0:
        return False
    order = [points[at], *points[:at], *points[at + 1 :]]
    for t, was, now in zip(waiting, points, order, strict=True):
        if was != now:
            internals.set_fixed_params(study, t, now)
    return True


def _searched_names(search: SearchConfig) -> set[str]:
    return {p.name for p in search.params if not isinstance(p, Fixed)}


def _grid_order(search: SearchConfig) -> Callable[[Mapping[str, Scalar]], tuple[str, ...]]:
    names = [p.name for p in search.params]

    def key(point: Mapping[str, Scalar]) -> tuple[str, ...]:
        return tuple(f"{point[n]!s:>20}" if n in point else "" for n in names)

    return key


MAX_REPEATED_POINTS = 25
"""Proposals in a row skipped because SGLang would run them as a measured trial
(`search.effective`) before the search is taken to have nothing new left: a skipped trial does
not count toward the budget, so a sampler stuck on clamped points would otherwise never stop."""


class Interrupted(Exception):
    """The operator stopped the run (Ctrl-C or SIGTERM); the current trial is recorded."""


STORAGE_PATIENCE_S = 120.0
"""How long the loop keeps trying a storage that fails (a lock past SQLite's busy timeout, a
PostgreSQL restart) before the run stops."""


class StorageFailed(Exception):
    """The study storage failed while `trial` was asked and not yet told (RUNNING); `result`
    is what the trial measured, None when it failed before it ran."""

    def __init__(self, trial: optuna.trial.Trial, result: Result | None, cause: Exception):
        super().__init__(str(cause))
        self.trial = trial
        self.result = result
        self.cause = cause


StorageHandler = Callable[[StorageFailed], Result]
"""Records a trial the storage failed on as a machine failure once the storage answers again
(the runner: `autotune.study.runner`); raises HarnessError when it never does."""

T = TypeVar("T")


def patiently(
    call: Callable[[], T],
    *,
    patience_s: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    note: Callable[[str], None] = lambda line: None,
) -> T:
    """`call()`, tried again while the storage fails, for up to `patience_s`; the last error
    is raised after that (default STORAGE_PATIENCE_S). `note` hears one line the first time
    it fails."""
    deadline = clock() + (STORAGE_PATIENCE_S if patience_s is None else patience_s)
    first = True
    while True:
        try:
            return call()
        except STORAGE_ERRORS as exc:
            if clock() >= deadline:
                raise
            if first:
                note(f"the study storage failed ({first_line(exc)}); trying again")
                first = False
            sleep(1.0)


@dataclass(frozen=True)
class LoopEnd:
    """Why the loop stopped (`budget`, `timeout`, `grid done`, `search done: …`, a wait for other
    workers given up), with the trials this run ran and the trials counted in all."""

    why: str
    ran: int
    counted: int


MAX_CONSECUTIVE_FAILURES = 3


def run_loop(
    study: optuna.Study,
    cfg: StudyConfig,
    *,
    run_one: Callable[[optuna.trial.Trial], Result],
    n_trials: int,
    timeout_s: float | None,
    clock: Callable[[], float],
    worker: Worker,
    on_told: Callable[[FrozenTrial], None] = lambda t: None,
    coordinator: Coordinator | None = None,
    storage_failed: StorageHandler | None = None,
    note: Callable[[str], None] = lambda line: None,
    records: Path | None = None,
    trial_s: Callable[[], float | None] = lambda: None,
) -> LoopEnd:
    """Ask, run, tell until `n_trials` trials count, the time is up or the grid is done.

    With `timeout_s`, no trial starts that would end after it: `trial_s` says how long one
    takes (the trials timed so far; None while unknown), so the GPUs are free at the deadline
    rather than one trial's length after it.

    With a `coordinator` (several workers on one study, `autotune.study.workers`), stale trials of
    dead workers are failed before each ask, the loop waits while other workers' running trials
    fill the budget, and a trial that would overrun the budget or repeat a running point is
    recorded as skipped instead of launched.

    With `storage_failed`, a storage that fails is waited for (up to STORAGE_PATIENCE_S)
    between trials, and a trial in flight when it fails is handed to `storage_failed`, which
    records it as a machine failure; the loop then goes on.

    Raises `Interrupted` after recording the current trial when the operator stops the run, and
    `HarnessError` after several harness failures in a row (the machine, not the parameters),
    naming `records`, the folder of the trials' logs and records, when given.
    """

    start = clock()
    ran = 0
    failures = 0
    repeats = 0

    def budget() -> LoopEnd | str:
        return _budget_left(
            study, cfg, n_trials, timeout_s, clock() - start, ran, coordinator, trial_s()
        )

    while True:
        if first_received() is not None:  # a stop whose exception was lost (trial.run)
            raise Interrupted("stopped by the operator between trials")
        stop = budget() if storage_failed is None else patiently(budget, note=note)
        if isinstance(stop, LoopEnd):
            return stop
        if stop == "again":
            continue
        done = (
            nothing_left(study)
            if storage_failed is None
            else patiently(lambda: nothing_left(study), note=note)
        )
        if done:
            return search_done(study, done, ran)
        try:
            trial, result, skipped = _run_asked(
                study, cfg, run_one, n_trials, worker, coordinator, patient=bool(storage_failed)
            )
        except StorageFailed as failed:
            if storage_failed is None:
                raise failed.cause from None
            trial, result, skipped = failed.trial, storage_failed(failed), False
            if failed.result is not None and not result.fatal:
                # the trial stopped the run (a full disk, an interrupt, a server that would
                # not go away): still so when its tell failed and it was recorded afterwards
                was = failed.result
                fatal = was.fatal or ("interrupted" if was.state == "interrupted" else "")
                result = replace(result, fatal=fatal)
        if skipped and result.state != "interrupted":
            continue
        ran += 1
        frozen = _frozen if storage_failed is None else _patient_frozen(note)
        on_told(frozen(study, trial))
        if result.state == "interrupted" or result.fatal == "interrupted":
            raise Interrupted(f"stopped by the operator during trial {trial.number}")
        if result.fatal:
            raise HarnessError(f"trial {trial.number}: {result.fatal}; stopping the study")
        repeats = repeats + 1 if result.outcome == Outcome.SKIPPED else 0
        if repeats >= MAX_REPEATED_POINTS:
            why = f"the last {repeats} points SGLang would run as trials already measured"
            return search_done(study, why, ran)
        failures = failures + 1 if Outcome.of(result.outcome).machine_suspect else 0
        if failures >= MAX_CONSECUTIVE_FAILURES:
            hint = remedy(view(_frozen(study, trial)))
            raise HarnessError(
                f"{failures} trials in a row failed for reasons outside the parameters "
                f"(last: {result.reason})"
                + (f"; what would fix it: {hint}" if hint else "")
                + (f"; see {records}/" if records is not None else "")
            )


def nothing_left(study: optuna.Study, sampler: BaseSampler | None = None) -> str:
    """Why the study's sampler (or `sampler`) finds nothing left worth a launch, asked before
    the next `study.ask` ("" when it finds something, or cannot tell: only the capacity-aware
    search says so)."""
    sampler = sampler or study.sampler
    if not isinstance(sampler, CapacityAwareSampler):
        return ""
    return sampler.nothing_left(study) or ""


def search_done(study: optuna.Study, why: str, ran: int = 0) -> LoopEnd:
    """Record the search's stop on the study (`keys.SEARCH_DONE`: the reason, the trials that
    count and the last trial it saw) and end the loop; no trial is created for it."""
    trials = study.get_trials(deepcopy=False)
    done = counted(trials)
    last = max((t.number for t in trials if t.state != TrialState.WAITING), default=-1)
    study.set_user_attr(keys.SEARCH_DONE, {"reason": why, "trials": done, "last_trial": last})
    return LoopEnd(f"search done: {why}", ran, done)


def _budget_left(
    study: optuna.Study,
    cfg: StudyConfig,
    n_trials: int,
    timeout_s: float | None,
    elapsed_s: float,
    ran: int,
    coordinator: Coordinator | None,
    trial_s: float | None = None,
) -> LoopEnd | str:
    """Why the loop ends now (a `LoopEnd`), "again" to look once more after waiting for other
    workers, or "" to ask the next trial. A trial of `trial_s` seconds that would end after
    `timeout_s` does not start."""
    if coordinator is not None:
        coordinator.reap(study)
    trials = study.get_trials(deepcopy=False)
    done = counted(trials)
    if done >= n_trials:
        return LoopEnd("budget", ran, done)
    if timeout_s is not None and elapsed_s >= timeout_s:
        return LoopEnd("timeout", ran, done)
    if timeout_s is not None and trial_s is not None and elapsed_s + trial_s > timeout_s:
        why = (
            f"timeout: the next trial would end after it (a trial takes about "
            f"{duration(trial_s)}, {duration(timeout_s - elapsed_s)} left)"
        )
        return LoopEnd(why, ran, done)
    if coordinator is not None:
        held = coordinator.hold(trials, n_trials, grid=cfg.sampler.name == "grid")
        if held:  # waited too long for the other workers
            return LoopEnd(held, ran, done)
        if held is not None:  # waited one interval: look again
            return "again"
    if cfg.sampler.name == "grid" and not any(t.state == TrialState.WAITING for t in trials):
        return LoopEnd("grid done", ran, done)
    return ""


def _run_asked(
    study: optuna.Study,
    cfg: StudyConfig,
    run_one: Callable[[optuna.trial.Trial], Result],
    n_trials: int,
    worker: Worker,
    coordinator: Coordinator | None,
    *,
    patient: bool = False,
) -> tuple[optuna.trial.Trial, Result, bool]:
    """Ask a trial, run it (or skip it when another worker has it covered) and tell the study;
    the trial, its result and whether it was skipped. With `patient`, an ask the storage fails
    is tried again (a trial it created before failing has no worker yet, and is failed as
    stale by the next reap); a failure once the trial is asked raises `StorageFailed`."""

    def ask() -> optuna.trial.Trial:
        return coordinator.ask(study) if coordinator is not None else study.ask()

    trial = patiently(ask) if patient else ask()
    skip = ""
    result: Result | None = None
    try:  # from here on the trial is RUNNING: a storage failure must not leave it so
        try:
            trial.set_user_attr(keys.WORKER, worker.to_dict())
            if coordinator is not None:
                skip = coordinator.claim(study, trial, n_trials)
            result = Result("fail", "skipped", skip, None, {}) if skip else run_one(trial)
        except KeyboardInterrupt:
            result = Result("interrupted", "interrupted", "stopped by the operator", None, {})
        finally:
            if coordinator is not None:
                coordinator.release(trial)
        if not _tell_unless_finished(study, trial, result, cfg):
            log.warning(
                "trial %d was failed by another worker while it ran (its heartbeat was late); "
                "its record stays in its trial folder",
                trial.number,
            )
    except STORAGE_ERRORS as exc:
        raise StorageFailed(trial, result, exc) from exc
    return trial, result, bool(skip)


def _frozen(study: optuna.Study, trial: optuna.trial.Trial) -> FrozenTrial:
    return internals.fresh(study, trial)


def _patient_frozen(
    note: Callable[[str], None],
) -> Callable[[optuna.Study, optuna.trial.Trial], FrozenTrial]:
    def frozen(study: optuna.Study, trial: optuna.trial.Trial) -> FrozenTrial:
        return patiently(lambda: internals.fresh(study, trial), note=note)

    return frozen


def _tell_unless_finished(
    study: optuna.Study, trial: optuna.trial.Trial, result: Result, cfg: StudyConfig
) -> bool:
    """`tell`; False when the trial was already finished (another worker judged it stale)."""
    try:
        tell(study, trial, result, cfg)
    except (UpdateFinishedTrialError, ValueError):
        if not _frozen(study, trial).state.is_finished():
            raise
        return False
    return True


def tell(study: optuna.Study, trial: optuna.trial.Trial, result: Result, cfg: StudyConfig) -> None:
    """Store one trial's result: its attributes (the record's figures flat besides the nested
    record, `Result.attrs_to_store`) and, for a complete trial, its constraints in both of Optuna's
    forms (`internals.constraint_attrs`) and its objective values. The point of a trial that was
    interrupted or cut short by the machine or from outside (`Outcome.requeued`) is enqueued
    again, so the study loses no point."""
    trial.set_user_attr(keys.OUTCOME, result.outcome)
    trial.set_user_attr(keys.REASON, result.reason)
    for key, value in result.attrs_to_store.items():
        trial.set_user_attr(key, value)
    if result.state == "complete" and result.measured is not None:
        m = result.measured
        internals.set_constraints(study, trial, constraint_values(m, cfg.constraints))
        study.tell(trial, objective_values(m, cfg.objectives))
        return
    study.tell(trial, state=TrialState.FAIL)
    if (result.state == "interrupted" or Outcome.of(result.outcome).requeued) and trial.params:
        study.enqueue_trial(dict(trial.params))
