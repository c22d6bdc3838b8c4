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

import dataclasses
import logging
import os
import socket
import sqlite3
import time
import warnings
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import optuna
import sqlalchemy
from optuna.exceptions import ExperimentalWarning, StorageInternalError, UpdateFinishedTrialError
from optuna.samplers import BaseSampler
from optuna.storages import BaseStorage, RDBStorage
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy.exc import IntegrityError, ProgrammingError, SQLAlchemyError

from autotune.config.schema import Heartbeat, StudyConfig
from autotune.errors import HarnessError, UsageError
from autotune.masking import redact, redact_text
from autotune.record import internals, keys
from autotune.record.stored import stored, study_record
from autotune.record.view import view
from autotune.study.objectives import metric_names

STUDY_DB = "study.db"
"""Outcomes of trials autotune cut short or the machine failed (their points run again) or
that were never launched."""

log = logging.getLogger("autotune.study.storage")


# ------------------------------------------------------------------------------------------------
# Storage and samplers
# ------------------------------------------------------------------------------------------------


STORAGE_ERRORS = (SQLAlchemyError, StorageInternalError)
"""What the study storage raises when it cannot be reached or is locked."""


def first_line(exc: BaseException) -> str:
    """The first line of a storage error; Optuna's own wrapper (`StorageInternalError: An
    exception is raised during the commit…`) gives way to the driver's error it wraps."""
    while isinstance(exc, StorageInternalError) and exc.__cause__ is not None:
        exc = exc.__cause__
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def storage_failure(exc: BaseException, url: str, doing: str) -> HarnessError:
    """One line for a storage that failed while autotune was `doing` something ("failed",
    "cannot be read"), the URL's password masked in the URL and in the driver's words."""
    words = redact_text(first_line(exc), url)
    return HarnessError(f"the study storage {redact(url)} {doing}: {words}")


def default_storage_url(study_dir: Path) -> str:
    """The SQLite storage in the study's folder (`results/NAME/study.db`), by absolute path so the
    URL means the same from any working directory."""
    return f"sqlite:///{(study_dir / STUDY_DB).resolve()}"


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
    check_sqlite(storage_url)
    try:
        storage: str | BaseStorage = storage_url
        if heartbeat is not None:
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
    stored = study_record(study).objectives
    if stored is not None and list(stored) != list(cfg.objectives):
        raise UsageError(
            f"study {cfg.name} was created with objectives {list(stored)}; "
            "use another --study name or --results-dir for different objectives"
        )
    _check_backend(study, cfg)
    if stored is None:
        study.set_user_attr(keys.OBJECTIVES, list(cfg.objectives))
    names = metric_names(cfg.objectives)
    if study.metric_names != names:  # a new study, or one created before names were set
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ExperimentalWarning)
            study.set_metric_names(names)
    if study_record(study).backend is None:
        study.set_user_attr(keys.BACKEND, cfg.server.backend)
    return study


def _check_backend(study: optuna.Study, cfg: StudyConfig) -> None:
    """A study holds the trials of one backend: rehearsal trials on the simulator must never
    join a real night's history (nor the memory model's fit), and the other way round."""
    backend = cfg.server.backend
    held = study_record(study).backend
    if held is None:  # a study from before backends were recorded: its trials tell
        backends = (stored(t).backend for t in study.get_trials(deepcopy=False))
        held = next((b for b in backends if b), None)
    if held is None or held == backend:
        return
    what = "simulator rehearsal" if held == "sim" else f"{held} backend"
    raise UsageError(
        f"study {cfg.name} holds trials of the {what}; a {backend} run would mix with them: "
        f"use another --study name, or --results-dir (e.g. --results-dir results/{backend})"
    )


OPTUNA_TABLES = frozenset({"version_info", "studies"})
"""Tables every Optuna RDB storage has; a SQLite file with tables but neither is something else."""


def check_sqlite(url: str) -> None:
    """Refuse a SQLite file that holds tables but is no Optuna storage (an application's own
    database given by mistake): Optuna would add its tables to it. The file is opened read-only
    and left byte for byte as it was; an empty or missing file, or another kind of URL, passes."""
    try:
        parsed = sqlalchemy.engine.make_url(driver_url(url))
    except (ValueError, SQLAlchemyError):
        return  # the opening names a malformed URL
    if parsed.get_backend_name() != "sqlite" or not parsed.database:
        return
    path = Path(parsed.database.removeprefix("file:"))
    if parsed.database == ":memory:" or not path.is_file() or path.stat().st_size == 0:
        return
    try:
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            rows = db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        finally:
            db.close()
    except sqlite3.Error as exc:
        raise UsageError(
            f"--storage {redact(url)}: cannot open it ({exc}); name an Optuna SQLite file "
            "or a new one"
        ) from None
    tables = sorted(str(r[0]) for r in rows if not str(r[0]).startswith("sqlite_"))
    if tables and not OPTUNA_TABLES & set(tables):
        shown = ", ".join(tables[:5]) + (", …" if len(tables) > 5 else "")
        raise UsageError(
            f"--storage {redact(url)}: {path} is a SQLite database but no Optuna storage "
            f"(its tables: {shown}; no version_info or studies table); it was left unchanged: "
            "name a new file or an Optuna storage"
        )


def probe_storage(url: str) -> None:
    """Connect to the storage at `url` once, writing nothing; a clear one-line error (password
    masked) when it cannot be reached or its driver is missing."""
    check_sqlite(url)
    try:
        engine = sqlalchemy.create_engine(driver_url(url))
        try:
            with engine.connect():
                pass
        finally:
            engine.dispose()
    except (ImportError, ValueError, SQLAlchemyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        first = redact_text(first, url)
        raise UsageError(f"--storage {redact(url)}: cannot open it ({first})") from exc


def load_existing(name: str, storage_url: str) -> optuna.Study:
    """Open a study read-only-style (for `status`); a clear error when it does not exist."""
    check_sqlite(storage_url)
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
        """This process as a worker: the host name, pid and process start time."""
        return Worker(socket.gethostname(), os.getpid(), _start_ticks(os.getpid()))

    def to_dict(self) -> dict[str, object]:
        """The worker as the trial's `worker` attribute stores it (GPU group and machine only when
        known)."""
        d: dict[str, object] = {"host": self.host, "pid": self.pid, "start_ticks": self.start_ticks}
        if self.gpus:
            d["gpus"] = self.gpus
        if self.machine:
            d["machine"] = self.machine
        return d

    @staticmethod
    def from_dict(d: object) -> Worker | None:
        """The worker a stored `worker` attribute names; None for anything malformed (an older or
        foreign record), which then counts as an unknown worker."""
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
    """RUNNING trials started on `host` by a process that is gone (or with no worker recorded):
    `stale` as judged by a run that shares the study with no other worker."""
    me = dataclasses.replace(Worker.current(), host=host, machine=machine)
    return [t for t, _ in stale(trials, me, (), grace_s=0, now=now or datetime.now())]


STALE_REASON = "autotune ended mid-trial without recording it (killed, or its storage failed)"
"""Why a trial a run left RUNNING is failed `stale` by the next run: autotune may have been
killed, or have exited on a storage it could no longer write (a full disk), before the trial's
end was recorded; the next run cannot tell which."""


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
        reason = f"{STALE_REASON}; " + (stop_orphans(t) or "no server was left running")
        if not fail(study, t.number, outcome="stale", reason=reason):
            continue
        if t.params:
            study.enqueue_trial(dict(t.params))
        recovered.append(t.number)
        log.info("trial %d was left running by an autotune that ended: %s", t.number, reason)
    return recovered


def fail(study: optuna.Study, number: int, *, outcome: str, reason: str) -> bool:
    """Fail a RUNNING trial with its outcome; False when another worker finished it first."""
    try:
        return internals.fail_by_number(study, number, {keys.OUTCOME: outcome, keys.REASON: reason})
    except UpdateFinishedTrialError:
        return False


def counted(trials: Sequence[FrozenTrial]) -> int:
    """Trials that use up the budget: finished ones, except points autotune itself cut short."""
    return sum(1 for t in trials if view(t).counted)


# ------------------------------------------------------------------------------------------------
# Objectives and constraints (pure)
# ------------------------------------------------------------------------------------------------


# ------------------------------------------------------------------------------------------------
# The ask/tell loop
# ------------------------------------------------------------------------------------------------


"""Endings that, repeated, mean the machine or the study file is broken, not the parameters."""


def driver_url(url: str) -> str:
    """The URL SQLAlchemy opens: `postgres://` (as some hosts print it) is `postgresql://`,
    which SQLAlchemy 2.1 opens with psycopg 3 (`pip install 'autotune[postgres]'`)."""
    scheme, sep, rest = url.partition("://")
    return f"postgresql://{rest}" if sep and scheme == "postgres" else url


def rdb_storage(url: str, heartbeat: Heartbeat) -> RDBStorage:
    """Optuna's RDB storage with heartbeats on; connections are checked before use, since a
    worker may sit idle for an hour while its server runs."""
    engine_kwargs: dict[str, object] = {} if url.startswith("sqlite") else {"pool_pre_ping": True}
    for attempt in range(CREATE_ATTEMPTS):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ExperimentalWarning)
                return RDBStorage(
                    driver_url(url),
                    engine_kwargs=dict(engine_kwargs),
                    heartbeat_interval=heartbeat.interval_s,
                    grace_period=heartbeat.grace_s,
                )
        except (IntegrityError, ProgrammingError):
            # workers starting together race to create Optuna's tables; the loser retries
            if attempt == CREATE_ATTEMPTS - 1:
                raise
            time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


CREATE_ATTEMPTS = 5


def describe(w: Worker | None) -> str:
    """A worker for a message: `host pid N, GPUs 0,1`."""
    if w is None:
        return "an unknown worker"
    return f"{w.host} pid {w.pid}, GPUs {w.gpus or 'all'}"


def stale(
    trials: Sequence[FrozenTrial],
    me: Worker,
    late: Collection[int],
    *,
    grace_s: int,
    now: datetime,
) -> list[tuple[FrozenTrial, str]]:
    """RUNNING trials whose worker is dead, each with why.

    `late` holds the ids of trials whose heartbeat is older than the grace period. A worker on
    this machine is judged by its process (alive means not stale, whatever its heartbeat); one
    elsewhere by its heartbeat.
    """
    out = []
    for t in trials:
        if t.state != TrialState.RUNNING:
            continue
        w = Worker.from_dict(stored(t).worker)
        if w == me:
            continue
        if w is not None and w.same_machine(me.host, me.machine):
            if not w.alive():
                out.append((t, f"its worker ({describe(w)}) is gone"))
            continue
        if internals.trial_id(t) in late:
            out.append((t, f"no heartbeat from its worker ({describe(w)}) for over {grace_s} s"))
        elif w is None and _age_s(t, now) > NO_WORKER_AFTER_S:
            out.append((t, "its worker died before recording itself"))
    return out


def _age_s(t: FrozenTrial, now: datetime) -> float:
    return (now - t.datetime_start).total_seconds() if t.datetime_start else 0.0
