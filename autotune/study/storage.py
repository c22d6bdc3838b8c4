"""The Optuna study a tuning run lives in: storage, samplers, resume, ask/tell.

autotune drives Optuna with ask/tell because it, not Optuna, owns each server's lifecycle.
Durability comes from the storage: every trial is told (and its record written) before the next
launch, so re-running the same command resumes. Optuna has no heartbeat for ask/tell with SQLite,
so trials left RUNNING by a killed autotune on this host are failed here on start, their orphaned
servers stopped, and their parameters enqueued again so the study loses no point.

Each trial carries its worker (host, pid, process start time) so that, with a shared database,
only the host that started a trial ever judges it stale or stops its server.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.samplers import BaseSampler
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy.exc import SQLAlchemyError

from autotune.config.space import grid
from autotune.config.studyfile import (
    Constraints,
    Fixed,
    Heartbeat,
    SamplerConfig,
    Scalar,
    SearchConfig,
    StudyConfig,
)
from autotune.errors import UsageError

if TYPE_CHECKING:
    from autotune.study.workers import Coordinator

STUDY_DB = "study.db"
NOT_COUNTED = frozenset({"interrupted", "stale", "skipped", "harness_error"})
"""Outcomes of trials autotune cut short or the machine failed (their points run again) or
that were never launched."""

log = logging.getLogger("autotune.study.storage")


# ------------------------------------------------------------------------------------------------
# Storage and samplers
# ------------------------------------------------------------------------------------------------


def default_storage_url(study_dir: Path) -> str:
    return f"sqlite:///{(study_dir / STUDY_DB).resolve()}"


def redact(url: str) -> str:
    """A storage URL fit for output: the password replaced by ***."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    creds, _, host = rest.rpartition("@")
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}" if ":" in creds else url


def redact_text(text: str, url: str) -> str:
    """`text` (an error message about `url`) with the URL's password replaced by ***."""
    creds = url.partition("://")[2].rpartition("@")[0]
    password = creds.partition(":")[2]
    return text.replace(password, "***") if password else text


def make_sampler(cfg: SamplerConfig) -> BaseSampler:
    """An Optuna sampler by name; `grid` is a seeded random sampler behind an enqueued grid."""
    factory = SAMPLER_FACTORIES.get(cfg.name)
    if factory is None:
        raise UsageError(
            f"--sampler {cfg.name}: unknown; use one of {', '.join(SAMPLER_FACTORIES)}"
        )
    return factory(cfg)


def _gp(cfg: SamplerConfig) -> BaseSampler:
    try:
        import scipy  # noqa: F401
        import torch  # noqa: F401
    except ImportError as exc:
        raise UsageError("--sampler gp needs torch and scipy installed; use tpe") from exc
    return optuna.samplers.GPSampler(seed=cfg.seed)


def _capacity(cfg: SamplerConfig) -> BaseSampler:
    from autotune.search import CapacityAwareSampler

    return CapacityAwareSampler(seed=cfg.seed)


def _walkdown(cfg: SamplerConfig) -> BaseSampler:
    from autotune.search import WalkDownSampler

    return WalkDownSampler(seed=cfg.seed)


SAMPLER_FACTORIES: dict[str, Callable[[SamplerConfig], BaseSampler]] = {
    "capacity": _capacity,
    "walkdown": _walkdown,
    "grid": lambda c: optuna.samplers.RandomSampler(seed=c.seed),
    "tpe": lambda c: optuna.samplers.TPESampler(seed=c.seed, n_startup_trials=4),
    "random": lambda c: optuna.samplers.RandomSampler(seed=c.seed),
    "gp": _gp,
    "nsga2": lambda c: optuna.samplers.NSGAIISampler(seed=c.seed),
}
"""Samplers selectable by name; later samplers register here."""


def open_study(
    cfg: StudyConfig,
    storage_url: str,
    sampler: BaseSampler,
    *,
    heartbeat: Heartbeat | None = None,
) -> optuna.Study:
    """Create the study or load it to resume; directions come from the objectives.

    With `heartbeat`, the storage records Optuna's RDB heartbeats (see `autotune.study.workers`).
    """
    directions = [optuna.study.StudyDirection.MAXIMIZE] * len(cfg.objectives)
    try:
        storage: str | BaseStorage = storage_url
        if heartbeat is not None:
            from autotune.study.workers import rdb_storage

            storage = rdb_storage(storage_url, heartbeat)
        study = optuna.create_study(
            study_name=cfg.name,
            storage=storage,
            sampler=sampler,
            directions=directions,
            load_if_exists=True,
        )
    except (ImportError, ValueError, SQLAlchemyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        first = redact_text(first, storage_url)
        raise UsageError(f"--storage {redact(storage_url)}: cannot open it ({first})") from exc
    stored = study.user_attrs.get("objectives")
    if stored is None:
        study.set_user_attr("objectives", list(cfg.objectives))
    elif list(stored) != list(cfg.objectives):
        raise UsageError(
            f"study {cfg.name} was created with objectives {stored}; "
            "use another --study name or --results-dir for different objectives"
        )
    return study


def load_existing(name: str, storage_url: str) -> optuna.Study:
    """Open a study read-only-style (for `status`); a clear error when it does not exist."""
    from autotune.study.workers import driver_url

    try:
        return optuna.load_study(study_name=name, storage=driver_url(storage_url))
    except (ImportError, ValueError, SQLAlchemyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        first = redact_text(first, storage_url)
        raise UsageError(f"--storage {redact(storage_url)}: cannot open it ({first})") from exc
    except KeyError as exc:
        raise UsageError(
            f"no study {name!r} in {redact(storage_url)}; run `autotune run --study {name}` first"
        ) from exc


# ------------------------------------------------------------------------------------------------
# Queue: baseline first, the grid, retries of interrupted points
# ------------------------------------------------------------------------------------------------


def prepare(study: optuna.Study, cfg: StudyConfig) -> int:
    """On a new study enqueue the baseline (and for `grid` every grid point); returns how many."""
    if study.get_trials(deepcopy=False):
        return 0
    queued: list[dict[str, Scalar]] = []
    searched = _searched_names(cfg.search)
    baseline = {k: v for k, v in cfg.search.baseline.items() if k in searched}
    if baseline:
        queued.append(baseline)
    if cfg.sampler.name == "grid":
        points = grid(cfg.search)
        if points is None:
            raise UsageError(
                "--sampler grid needs a step (or choices) on every searched parameter; "
                "add step = ... or use tpe"
            )
        queued += [p for p in sorted(points, key=_grid_order(cfg.search)) if p != baseline]
    for params in queued:
        study.enqueue_trial(dict(params))
    return len(queued)


def _searched_names(search: SearchConfig) -> set[str]:
    return {p.name for p in search.params if not isinstance(p, Fixed)}


def _grid_order(search: SearchConfig) -> Callable[[Mapping[str, Scalar]], tuple[str, ...]]:
    names = [p.name for p in search.params]

    def key(point: Mapping[str, Scalar]) -> tuple[str, ...]:
        return tuple(f"{point[n]!s:>20}" if n in point else "" for n in names)

    return key


# ------------------------------------------------------------------------------------------------
# Workers and stale trials
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Worker:
    """Who runs a trial: enough to tell, later, whether that process is still alive."""

    host: str
    pid: int
    start_ticks: int
    gpus: str = ""
    """The GPU group (CUDA_VISIBLE_DEVICES) its servers use; "" for all of the machine's."""
    machine: str = ""
    """Boot and PID-namespace id: tells two containers with one host name apart."""

    @staticmethod
    def current() -> Worker:
        return Worker(socket.gethostname(), os.getpid(), _start_ticks(os.getpid()))

    def to_dict(self) -> dict[str, object]:
        d: dict[str, object] = {"host": self.host, "pid": self.pid, "start_ticks": self.start_ticks}
        if self.gpus:
            d["gpus"] = self.gpus
        if self.machine:
            d["machine"] = self.machine
        return d

    @staticmethod
    def from_dict(d: object) -> Worker | None:
        if not isinstance(d, dict):
            return None
        try:
            return Worker(
                str(d["host"]),
                int(d["pid"]),
                int(d["start_ticks"]),
                str(d.get("gpus", "")),
                str(d.get("machine", "")),
            )
        except (KeyError, TypeError, ValueError):
            return None

    def same_machine(self, host: str, machine: str = "") -> bool:
        """Whether this worker ran on the machine named so (its processes are visible here)."""
        return self.host == host and (not machine or not self.machine or self.machine == machine)

    def alive(self) -> bool:
        """True when this worker's process still runs (same pid and same start time)."""
        return self.start_ticks == _start_ticks(self.pid) and self.start_ticks != -1


def _start_ticks(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return -1
    fields = stat.rpartition(")")[2].split()
    return -1 if fields[0] in ("Z", "X") else int(fields[19])


NO_WORKER_AFTER_S = 120.0
"""A RUNNING trial gets its worker recorded right after it is asked; one still without a worker
after this long was left by a process killed in between (younger ones may be another worker's)."""


def stale_trials(
    trials: Sequence[FrozenTrial], host: str, *, machine: str = "", now: datetime | None = None
) -> list[FrozenTrial]:
    """RUNNING trials started on `host` by a process that is gone (or with no worker recorded)."""
    now = now or datetime.now()
    out = []
    for t in trials:
        if t.state != TrialState.RUNNING:
            continue
        w = Worker.from_dict(t.user_attrs.get("worker"))
        if w is None:
            started = t.datetime_start
            if started is None or (now - started).total_seconds() > NO_WORKER_AFTER_S:
                out.append(t)
        elif w.same_machine(host, machine) and not w.alive():
            out.append(t)
    return out


def recover(
    study: optuna.Study,
    *,
    host: str,
    stop_orphans: Callable[[FrozenTrial], str],
    machine: str = "",
) -> list[int]:
    """Fail this host's stale RUNNING trials, stop their servers, enqueue their points again."""
    recovered = []
    for t in stale_trials(study.get_trials(deepcopy=False), host, machine=machine):
        reason = "autotune was killed mid-trial; " + (
            stop_orphans(t) or "no server was left running"
        )
        if not fail(study, t.number, outcome="stale", reason=reason):
            continue
        if t.params:
            study.enqueue_trial(dict(t.params))
        recovered.append(t.number)
        log.info("trial %d was left running by a killed autotune: %s", t.number, reason)
    return recovered


def fail(study: optuna.Study, number: int, *, outcome: str, reason: str) -> bool:
    """Fail a RUNNING trial with its outcome; False when another worker finished it first."""
    storage = study._storage
    trial_id = storage.get_trial_id_from_study_id_trial_number(study._study_id, number)
    try:
        storage.set_trial_user_attr(trial_id, "outcome", outcome)
        storage.set_trial_user_attr(trial_id, "reason", reason)
        return storage.set_trial_state_values(trial_id, state=TrialState.FAIL)
    except UpdateFinishedTrialError:
        return False


def counted(trials: Sequence[FrozenTrial]) -> int:
    """Trials that use up the budget: finished ones, except points autotune itself cut short."""
    return sum(
        1
        for t in trials
        if t.state == TrialState.COMPLETE
        or (t.state == TrialState.FAIL and t.user_attrs.get("outcome") not in NOT_COUNTED)
    )


# ------------------------------------------------------------------------------------------------
# Objectives and constraints (pure)
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Measured:
    """What a complete trial measured; None where the trial never got that far."""

    capacity_tokens: int
    throughput_tok_s: float
    oom: bool
    crashed: bool
    error_rate: float | None
    headroom_gib: float | None
    p99_ttft_ms: float | None
    p99_itl_ms: float | None


def objective_values(m: Measured, objectives: Sequence[str]) -> list[float]:
    table = {"capacity": float(m.capacity_tokens), "throughput": float(m.throughput_tok_s)}
    return [table[name] for name in objectives]


def constraint_values(m: Measured, c: Constraints) -> dict[str, float]:
    """One value per constraint, Optuna's convention: ≤ 0 satisfied, > 0 violated by that much.

    A trial that crashed before it could measure something violates that constraint too, so
    samplers learn the edge from crashes.
    """
    broken = m.oom or m.crashed
    out: dict[str, float] = {}
    if c.no_oom:
        out["oom"] = 1.0 if m.oom else 0.0
    out["crash"] = 1.0 if m.crashed and not m.oom else 0.0
    rate = m.error_rate if m.error_rate is not None else (1.0 if broken else 0.0)
    out["error_rate"] = rate - c.max_error_rate
    if c.min_headroom_gib > 0:
        headroom = m.headroom_gib if m.headroom_gib is not None else (0.0 if broken else None)
        out["headroom_gib"] = c.min_headroom_gib - headroom if headroom is not None else 0.0
    if c.max_p99_ttft_ms is not None:
        out["p99_ttft_ms"] = _over(m.p99_ttft_ms, c.max_p99_ttft_ms, broken)
    if c.max_p99_itl_ms is not None:
        out["p99_itl_ms"] = _over(m.p99_itl_ms, c.max_p99_itl_ms, broken)
    return out


def _over(value: float | None, limit: float, broken: bool) -> float:
    if value is None:
        return 1.0 if broken else 0.0
    return (value - limit) / limit


def feasible(t: FrozenTrial) -> bool:
    return t.state == TrialState.COMPLETE and all(v <= 0 for v in t.constraints.values())


def best_feasible_capacity(trials: Sequence[FrozenTrial]) -> int | None:
    caps = [int(t.user_attrs.get("capacity_tokens", 0)) for t in trials if feasible(t)]
    return max(caps) if caps else None


# ------------------------------------------------------------------------------------------------
# The ask/tell loop
# ------------------------------------------------------------------------------------------------

State = str  # "complete" | "fail" | "interrupted"


@dataclass(frozen=True)
class Result:
    """What one trial tells the study: its state, measurements and JSON-safe attributes."""

    state: State
    outcome: str
    reason: str
    measured: Measured | None
    attrs: Mapping[str, object]
    fatal: str = ""
    """Non-empty when the run must stop after this trial: `interrupted`, or why the machine is
    no longer fit for the next launch (a server that would not go away)."""
    end: str = ""
    """Non-empty when the study has nothing left worth a launch (the sampler says so); the loop
    records this trial and ends normally."""


class Interrupted(Exception):
    """The operator stopped the run (Ctrl-C or SIGTERM); the current trial is recorded."""


@dataclass(frozen=True)
class LoopEnd:
    why: str
    ran: int
    counted: int


MAX_CONSECUTIVE_FAILURES = 3
HARNESS_OUTCOMES = frozenset({"harness_error", "startup_error", "hang", "timeout", "unknown"})
"""Endings that, repeated, mean the machine or the study file is broken, not the parameters."""


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
) -> LoopEnd:
    """Ask, run, tell until `n_trials` trials count, the time is up or the grid is done.

    With a `coordinator` (several workers on one study, `autotune.study.workers`), stale trials of
    dead workers are failed before each ask, the loop waits while other workers' running trials
    fill the budget, and a trial that would overrun the budget or repeat a running point is
    recorded as skipped instead of launched.

    Raises `Interrupted` after recording the current trial when the operator stops the run, and
    `HarnessError` after several harness failures in a row (the machine, not the parameters).
    """
    from autotune.errors import HarnessError

    start = clock()
    ran = 0
    failures = 0
    while True:
        if coordinator is not None:
            coordinator.reap(study)
        trials = study.get_trials(deepcopy=False)
        done = counted(trials)
        if done >= n_trials:
            return LoopEnd("budget", ran, done)
        if timeout_s is not None and clock() - start >= timeout_s:
            return LoopEnd("timeout", ran, done)
        if coordinator is not None:
            held = coordinator.hold(trials, n_trials, grid=cfg.sampler.name == "grid")
            if held:  # waited too long for the other workers
                return LoopEnd(held, ran, done)
            if held is not None:  # waited one interval: look again
                continue
        if cfg.sampler.name == "grid" and not any(t.state == TrialState.WAITING for t in trials):
            return LoopEnd("grid done", ran, done)
        trial = coordinator.ask(study) if coordinator is not None else study.ask()
        skip = ""
        try:
            trial.set_user_attr("worker", worker.to_dict())
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
        if skip and result.state != "interrupted":
            continue
        ran += 1
        on_told(_frozen(study, trial))
        if result.state == "interrupted" or result.fatal == "interrupted":
            raise Interrupted(f"stopped by the operator during trial {trial.number}")
        if result.fatal:
            raise HarnessError(f"trial {trial.number}: {result.fatal}; stopping the study")
        if result.end:
            return LoopEnd(result.end, ran, counted(study.get_trials(deepcopy=False)))
        failures = failures + 1 if result.outcome in HARNESS_OUTCOMES else 0
        if failures >= MAX_CONSECUTIVE_FAILURES:
            raise HarnessError(
                f"{failures} trials in a row failed for reasons outside the parameters "
                f"(last: {result.reason}); see results/{cfg.name}/trials/"
            )


def _frozen(study: optuna.Study, trial: optuna.trial.Trial) -> FrozenTrial:
    return study._storage.get_trial(trial._trial_id)


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
    """Store one trial's result; the point of a trial that was interrupted or failed for the
    machine's sake (a harness error) is enqueued again, so the study loses no point."""
    trial.set_user_attr("outcome", result.outcome)
    trial.set_user_attr("reason", result.reason)
    for key, value in result.attrs.items():
        trial.set_user_attr(key, value)
    if result.state == "complete" and result.measured is not None:
        m = result.measured
        for key, value in constraint_values(m, cfg.constraints).items():
            trial.set_constraint(key, value)
        study.tell(trial, objective_values(m, cfg.objectives))
        return
    study.tell(trial, state=TrialState.FAIL)
    machine = result.outcome == "harness_error"  # the machine failed, not the parameters
    if (result.state == "interrupted" or machine) and trial.params:
        study.enqueue_trial(dict(trial.params))
