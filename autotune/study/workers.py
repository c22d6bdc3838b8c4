"""Several workers, one study: who runs a trial, heartbeats, and failing dead workers' trials.

Workers on different machines, or on disjoint GPU groups of one machine, share a study through
one Optuna RDB storage (PostgreSQL normally); Optuna's database is the only coordinator. This
module adds what ask/tell leaves to autotune:

* identity: each trial records its worker (host, pid, process start, GPU group, machine id);
* heartbeats: while a worker runs a trial, a thread records Optuna's RDB heartbeat for it (the
  `trial_heartbeats` table, stamped with the database's clock, so the hosts' clocks do not
  matter) every `storage.heartbeat_s` seconds;
* reaping: before each ask a worker fails the RUNNING trials of dead workers (on another machine
  when their heartbeat is older than `storage.grace_s`, on its own machine as soon as their
  process is gone) and queues their points again. It never touches their servers: an orphaned
  server is stopped only by its own host, from the pidfiles its next `autotune run` reads;
* the budget: a worker does not ask while the trials other workers run already fill it; it
  waits, so that the last point of a worker that dies is still run. A trial that would overrun
  the budget, or repeat the parameters of a trial running elsewhere, is recorded as `skipped`
  instead of launched.
"""

from __future__ import annotations

import dataclasses
import fcntl
import logging
import os
import random
import threading
import time
import warnings
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from datetime import datetime
from pathlib import Path
from typing import IO

import optuna
from optuna.exceptions import StorageInternalError
from optuna.samplers import RandomSampler
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy.exc import SQLAlchemyError

from autotune.config.schema import Heartbeat, Limits, SearchConfig, StudyConfig
from autotune.config.space import (
    PointKey,
    Space,
    gpus_needed,
    point_key,
    same_point,
    settings_for,
)
from autotune.errors import UsageError
from autotune.record import internals
from autotune.record.internals import BaseHeartbeat
from autotune.record.stored import stored
from autotune.study.storage import Worker, counted, describe, fail, stale

log = logging.getLogger("autotune.study.workers")

MAX_DUPLICATE_SKIPS = 5
"""Asks in a row skipped as duplicates of running trials before the next one runs anyway."""
SKIPPED_SURPLUS = "not launched: trials running on other workers fill the budget"
"""Tries at opening the storage while other workers create Optuna's tables at the same time."""


# ------------------------------------------------------------------------------------------------
# Identity and per-worker settings
# ------------------------------------------------------------------------------------------------


def parse_gpus(text: str) -> str:
    """`--gpus 0,1,2,3` in canonical form; a UsageError names a malformed list."""
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() for p in parts) or len(set(map(int, parts))) != len(parts):
        raise UsageError(
            f"--gpus {text!r}: give distinct GPU indices separated by commas, e.g. 0,1,2,3"
        )
    return ",".join(str(int(p)) for p in parts)


def gpu_group(env: Mapping[str, str]) -> str:
    """The GPU group a worker's servers use: CUDA_VISIBLE_DEVICES, "" for all GPUs."""
    return env.get("CUDA_VISIBLE_DEVICES", "").strip()


def worker_gpus(cfg: StudyConfig) -> str:
    """The GPU group this worker's servers use: the study file's (or --gpus)
    CUDA_VISIBLE_DEVICES, else the environment's; "" for all of the machine's."""
    return gpu_group(cfg.server.env) or gpu_group(os.environ)


def worker_folder(study_folder: Path, gpus: str) -> Path:
    """Where a worker keeps its trials' logs, pidfiles and lock: the study folder, or one
    subfolder per GPU group so that workers on one machine never share them."""
    return study_folder / f"gpus-{gpus.replace(',', '-')}" if gpus else study_folder


def study_folder_of(folder: Path, gpus: str) -> Path:
    """The study folder a worker's folder (`worker_folder`) lies in."""
    return folder.parent if gpus and worker_folder(folder.parent, gpus) == folder else folder


GPU_LOCKS = "gpus"
"""The folder (under the study folder's `run/`) of the locks the study's workers on one machine
hold on their GPUs."""


@contextmanager
def gpu_claim(study_folder: Path, gpus: str, study: str) -> Iterator[None]:
    """Hold this worker's GPUs against the other workers of the study on this machine while it
    runs: two workers whose groups share a GPU would launch two servers on it, each sizing its
    KV pool from memory the other takes. A UsageError names the worker that holds a GPU first.

    Each GPU of the group is an exclusive lock (`run/gpus/gpu-N.lock`, the holder's pid and
    group written in it); a worker on all the machine's GPUs (no group) holds `all.lock`
    exclusively, and every group worker holds it shared. The locks die with their process, so a
    killed worker never blocks the next one."""
    folder = study_folder / "run" / GPU_LOCKS
    names = [g.strip() for g in gpus.split(",") if g.strip()]
    shown = f"--gpus {gpus}" if names else "all GPUs (no --gpus)"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"{study_folder} is not writable ({exc.strerror or exc}); fix its permissions or use "
            "another --results-dir"
        ) from None
    with ExitStack() as held:
        everything = held.enter_context(open(folder / "all.lock", "a+"))
        holder = _holder(everything, fcntl.LOCK_SH if names else fcntl.LOCK_EX)
        if holder is not None:
            raise UsageError(
                f"{shown}: another worker of study {study} runs on all this machine's GPUs "
                f"({holder}); give every worker on a machine a --gpus group of its own"
                if names
                else f"{shown}: workers of study {study} with --gpus groups run on this "
                "machine; give this worker a --gpus group of its own, apart from theirs"
            )
        if not names:
            _sign(everything, shown)
        for name in names:
            lock = held.enter_context(open(folder / f"gpu-{name}.lock", "a+"))
            holder = _holder(lock, fcntl.LOCK_EX)
            if holder is not None:
                raise UsageError(
                    f"{shown}: GPU {name} is in use by another worker of study {study} on this "
                    f"machine ({holder}); give each worker GPUs of its own"
                )
            _sign(lock, shown)
        yield


def _holder(lock: IO[str], mode: int) -> str | None:
    """Take `lock` in `mode` without waiting: None once it is held, else who holds it (the line
    its holder signed with `_sign`)."""
    try:
        fcntl.flock(lock, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        return lock.read().strip() or "another process"
    return None


def _sign(lock: IO[str], shown: str) -> None:
    lock.seek(0)
    lock.truncate()
    lock.write(f"pid {os.getpid()}, {shown}\n")
    lock.flush()


def with_worker_args(
    cfg: StudyConfig,
    *,
    gpus: str | None,
    port: int | None,
    heartbeat_s: int | None,
    grace_s: int | None,
) -> StudyConfig:
    """The study file with this worker's command-line settings applied."""
    server = cfg.server
    if port is not None:
        if not 0 < port < 65536:
            raise UsageError(f"--port {port}: use a TCP port from 1 to 65535")
        server = dataclasses.replace(server, port=port)
    if gpus is not None:
        group = parse_gpus(gpus)
        needed = gpus_needed(server.flags)
        if needed > len(group.split(",")):
            raise UsageError(
                f"--gpus {group}: the server needs {needed} GPUs (tp × pp × data-parallel "
                "replicas in server.flags); give a group that large"
            )
        server = dataclasses.replace(server, env={**server.env, "CUDA_VISIBLE_DEVICES": group})
    hb = cfg.heartbeat
    if heartbeat_s is not None:
        if heartbeat_s < 1:
            raise UsageError(f"--heartbeat-s {heartbeat_s}: must be ≥ 1 second")
        hb = dataclasses.replace(
            hb, interval_s=heartbeat_s, grace_s=max(hb.grace_s, 2 * heartbeat_s)
        )
    if grace_s is not None:
        if grace_s < 2 * hb.interval_s:
            raise UsageError(
                f"--grace-s {grace_s}: must be at least twice the heartbeat ({2 * hb.interval_s} s)"
            )
        hb = dataclasses.replace(hb, grace_s=grace_s)
    return dataclasses.replace(cfg, server=server, heartbeat=hb)


def machine_id() -> str:
    """Boot id and PID namespace: equal for processes that can see each other's pids."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        pidns = os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""
    return f"{boot[:8]}/{pidns.removeprefix('pid:').strip('[]')}"


HOST_ENV = "AUTOTUNE_WORKER_HOST"
"""Overrides the host name a worker records, where host names are not unique."""


def current_worker(gpus: str, env: Mapping[str, str] = os.environ) -> Worker:
    """This process as a worker of GPU group `gpus`, with the machine id, and the host name
    `AUTOTUNE_WORKER_HOST` gives where host names are not unique."""
    w = Worker.current()
    host = env.get(HOST_ENV, "").strip() or w.host
    return dataclasses.replace(w, host=host, gpus=gpus, machine=machine_id())


def worker_seed(seed: int, worker: Worker) -> int:
    """The sampler seed of one worker: the study's, mixed with the worker's host and GPU group,
    so that workers sharing a study do not draw the same points in lockstep (and one worker
    draws the same points again when it restarts)."""
    return (seed + zlib.crc32(f"{worker.host}/{worker.gpus}".encode())) % 2**31


# ------------------------------------------------------------------------------------------------
# Storage and heartbeats
# ------------------------------------------------------------------------------------------------


def drop_twice_queued(study: optuna.Study, space: Space | None = None) -> list[int]:
    """Workers that open a new study together each queue its first points (the baseline, the
    grid); keep the first of each queued point (the same point of `space`) and record the others
    as skipped."""
    seen: set[PointKey] = set()
    dropped = []
    for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number):
        if t.state != TrialState.WAITING:
            continue
        key = point_key(point(t), space)
        if key not in seen:
            seen.add(key)
            continue
        if fail(study, t.number, outcome="skipped", reason="not launched: queued twice"):
            dropped.append(t.number)
    return dropped


class Beat:
    """Records the heartbeat of one trial now and then every `interval_s`, from a thread."""

    def __init__(self, storage: BaseHeartbeat, trial_id: int, interval_s: float) -> None:
        self._storage = storage
        self._trial_id = trial_id
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        self.errors = 0

    def start(self) -> None:
        """Record the heartbeat now, then start the thread that records it every `interval_s`."""
        self._record()
        self._thread.start()

    def stop(self) -> None:
        """Stop the heartbeat thread and wait for it (bounded by one interval and a margin for a
        slow database)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self._interval_s + 30)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._record()

    def _record(self) -> None:
        try:
            self._storage.record_heartbeat(self._trial_id)
        except (SQLAlchemyError, StorageInternalError) as exc:  # the next beat may get through
            self.errors += 1
            log.warning("heartbeat of trial id %d not recorded: %s", self._trial_id, exc)


# ------------------------------------------------------------------------------------------------
# Judging the shared study (pure)
# ------------------------------------------------------------------------------------------------


def _order(t: FrozenTrial) -> tuple[datetime, int]:
    return (t.datetime_start or datetime.max, t.number)


def point(t: FrozenTrial) -> dict[str, object]:
    """The parameters a trial runs, or will run once suggested (an enqueued point)."""
    if t.params:
        return dict(t.params)
    return internals.fixed_params(t)


def running_before(trials: Sequence[FrozenTrial], trial: FrozenTrial) -> list[FrozenTrial]:
    """Other RUNNING trials that started before `trial` (they have the first claim)."""
    return [
        t
        for t in trials
        if t.state == TrialState.RUNNING and t.number != trial.number and _order(t) < _order(trial)
    ]


def surplus(trials: Sequence[FrozenTrial], trial: FrozenTrial, n_trials: int) -> bool:
    """Whether `trial` would overrun the budget: finished trials that count plus the trials
    started before it already make `n_trials`."""
    return counted(trials) + len(running_before(trials, trial)) >= n_trials


def duplicate_of(
    trials: Sequence[FrozenTrial], trial: FrozenTrial, space: Space | None = None
) -> FrozenTrial | None:
    """A trial started before `trial` and still running with the same parameters (the same
    point of `space`, `config.space.point_key`)."""
    mine = point(trial)
    if not mine:
        return None
    return next(
        (t for t in running_before(trials, trial) if same_point(point(t), mine, space)), None
    )


def max_wait_s(limits: Limits, heartbeat: Heartbeat) -> float:
    """The longest a worker waits for others' trials: one whole trial plus two grace periods."""
    return (
        limits.startup_s
        + limits.workload_s
        + limits.stop_grace_s
        + limits.release_s
        + 2 * heartbeat.grace_s
    )


# ------------------------------------------------------------------------------------------------
# The coordinator `autotune.study.storage.run_loop` calls
# ------------------------------------------------------------------------------------------------


class Coordinator:
    """One worker's side of a shared study (see the module docstring)."""

    def __init__(
        self,
        *,
        me: Worker,
        search: SearchConfig,
        heartbeat: Heartbeat,
        limits: Limits,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        now: Callable[[], datetime] = datetime.now,
        notify: Callable[[str], None] = lambda line: None,
        rng: random.Random | None = None,
        random_after_duplicate: bool = True,
    ) -> None:
        self.me = me
        self._rng = rng or random.Random(0)
        self._random_after_duplicate = random_after_duplicate
        self._search = search
        self._heartbeat = heartbeat
        self._max_wait_s = max_wait_s(limits, heartbeat)
        self._clock = clock
        self._sleep = sleep
        self._now = now
        self._notify = notify
        self._held_since: float | None = None
        self._beats: dict[int, Beat] = {}
        self._duplicates = 0
        self.reaped: list[int] = []
        self.skipped: list[int] = []

    def reap(self, study: optuna.Study) -> list[int]:
        """Fail the trials of dead workers and queue their points again; their numbers."""
        late = internals.stale_trial_ids(study)
        found = stale(
            study.get_trials(deepcopy=False),
            self.me,
            late,
            grace_s=self._heartbeat.grace_s,
            now=self._now(),
        )
        out = []
        for t, why in found:
            reason = (
                f"{why}; failed by {describe(self.me)}; "
                "its server, if one is left, is stopped by its own host"
            )
            if not fail(study, t.number, outcome="stale", reason=reason):
                continue  # another worker was first
            params = point(t)
            if params:
                study.enqueue_trial(params)
            out.append(t.number)
            self._notify(f"trial {t.number} failed as stale ({why}); its point is queued again")
        self.reaped += out
        return out

    def hold(
        self, trials: Sequence[FrozenTrial], n_trials: int, *, grid: bool = False
    ) -> str | None:
        """None: ask now. "": the trials running elsewhere fill the budget (or hold the last grid
        points); waited one heartbeat, look again. Otherwise why the wait has been too long."""
        running = sorted(t.number for t in trials if t.state == TrialState.RUNNING)
        queued = any(t.state == TrialState.WAITING for t in trials)
        full = counted(trials) + len(running) >= n_trials or (grid and not queued)
        if not running or not full:
            self._held_since = None
            return None
        now = self._clock()
        if self._held_since is None:
            self._held_since = now
            self._notify(f"waiting for trials {running} running on other workers")
        elif now - self._held_since > self._max_wait_s:
            return f"trials {running} still running on other workers after {self._max_wait_s:g} s"
        self._sleep(self._heartbeat.interval_s)
        return ""

    def ask(self, study: optuna.Study) -> optuna.trial.Trial:
        """`study.ask()` with the parameters chosen, and the trial's heartbeat started.

        Right after a proposal was skipped as a repeat of a running trial, the next one is a
        random point: a sampler that knows nothing of running trials would repeat itself.
        """

        sampler = study.sampler
        if self._duplicates and self._random_after_duplicate:
            study.sampler = RandomSampler(seed=self._rng.randrange(2**31))
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings(
                    "ignore", message="Heartbeat of storage", category=UserWarning
                )
                trial = study.ask()
            settings_for(trial, self._search)  # parameters are chosen now (TPE one by one)
        finally:
            study.sampler = sampler
        storage = internals.heartbeat_storage(study)
        if storage is not None:
            beat = Beat(storage, internals.trial_id(trial), self._heartbeat.interval_s)
            beat.start()
            self._beats[trial.number] = beat
        return trial

    def claim(self, study: optuna.Study, trial: optuna.trial.Trial, n_trials: int) -> str:
        """Empty to run `trial`; otherwise why it is skipped (a popped queued point goes back)."""
        trials = study.get_trials(deepcopy=False)
        mine = internals.fresh(study, trial)
        if surplus(trials, mine, n_trials):
            if internals.is_enqueued(mine) and point(mine):
                study.enqueue_trial(point(mine))
            self.skipped.append(trial.number)
            return SKIPPED_SURPLUS
        twin = duplicate_of(trials, mine, self._search)
        if twin is not None and self._duplicates < MAX_DUPLICATE_SKIPS:
            self._duplicates += 1
            self.skipped.append(trial.number)
            who = describe(Worker.from_dict(stored(twin).worker))
            return f"not launched: trial {twin.number} runs the same parameters ({who})"
        self._duplicates = 0
        return ""

    def release(self, trial: optuna.trial.Trial) -> None:
        """Stop the trial's heartbeat (it is about to be told)."""
        beat = self._beats.pop(trial.number, None)
        if beat is not None:
            beat.stop()
