"""`autotune run`: the overnight study loop, from a study file to a finished Optuna study.

This is the composition root: it resolves the study file and overrides, opens the storage,
recovers what a killed run left behind, then asks, runs and tells until the budget is spent.
Everything it writes lives under `results/NAME/` (or --results-dir): `study.db`, and per trial
`trials/NNNN/server.log` and `trial.json`.
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import os
import random
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

import optuna
from optuna.exceptions import StorageInternalError
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy.exc import SQLAlchemyError

from autotune.cli.progress import Progress, Tally, finished_line
from autotune.config.space import server_argv, settings_for
from autotune.config.studyfile import SAMPLERS, StudyConfig, find_study_file, load_study
from autotune.errors import HarnessError, UsageError
from autotune.server.hostcheck import results_disk_problem
from autotune.study.storage import (
    Interrupted,
    Result,
    best_feasible_capacity,
    counted,
    default_storage_url,
    feasible,
    make_sampler,
    open_study,
    prepare,
    recover,
    redact,
    redact_text,
    run_loop,
)
from autotune.trial.run import Launcher, TrialPlan, run_trial, write_record

PACKAGE_CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "run",
        help="run (or resume) a study: launch, load and record servers until the budget is spent",
        description="Run a study; re-running the same command resumes it.",
    )
    add_study_args(p)
    p.add_argument("--backend", choices=("sim", "sglang"), help="override server.backend")
    p.add_argument("--n-trials", type=int, metavar="N", help="trials to finish (budget.n_trials)")
    p.add_argument("--timeout", type=float, metavar="SECONDS", help="no new trial after this long")
    p.add_argument(
        "--sampler", metavar="NAME", help=f"override sampler.name ({', '.join(SAMPLERS)})"
    )
    w = p.add_argument_group("workers sharing one study (see docs/workers.md)")
    w.add_argument(
        "--gpus",
        metavar="LIST",
        help="this worker's GPU group, e.g. 0,1,2,3 (CUDA_VISIBLE_DEVICES)",
    )
    w.add_argument("--port", type=int, metavar="N", help="this worker's server port (server.port)")
    w.add_argument(
        "--heartbeat-s", type=int, metavar="S", help="heartbeat interval (storage.heartbeat_s)"
    )
    w.add_argument(
        "--grace-s",
        type=int,
        metavar="S",
        help="fail another worker's trial after this long without its heartbeat (storage.grace_s)",
    )
    p.set_defaults(handler=handle)


def add_study_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--study", metavar="NAME", help="configs/NAME.toml; also the results folder")
    p.add_argument(
        "--config", type=Path, metavar="PATH", help="study file (default configs/NAME.toml)"
    )
    p.add_argument(
        "--storage", metavar="URL", help="Optuna storage URL (default results/NAME/study.db)"
    )
    p.add_argument(
        "--results-dir",
        type=Path,
        metavar="DIR",
        default=Path("results"),
        help="where the study's folder NAME/ goes (default results)",
    )


def resolve_config(args: argparse.Namespace) -> StudyConfig:
    """The study file named by --config or --study, with the command line's overrides applied."""
    if args.config is None and not args.study:
        raise UsageError("name a study: --study NAME (configs/NAME.toml) or --config PATH")
    path = args.config or find_study_file(args.study, [Path("configs"), PACKAGE_CONFIGS])
    cfg = load_study(path, name=args.study or None)
    backend = getattr(args, "backend", None)
    if backend:
        cfg = dataclasses.replace(cfg, server=dataclasses.replace(cfg.server, backend=backend))
    sampler = getattr(args, "sampler", None)
    if sampler:
        if sampler not in SAMPLERS:
            raise UsageError(f"--sampler {sampler}: unknown; use one of {', '.join(SAMPLERS)}")
        cfg = dataclasses.replace(cfg, sampler=dataclasses.replace(cfg.sampler, name=sampler))
    n_trials = getattr(args, "n_trials", None)
    if n_trials is not None:
        if n_trials < 1:
            raise UsageError(f"--n-trials {n_trials}: must be ≥ 1")
        cfg = dataclasses.replace(cfg, budget=dataclasses.replace(cfg.budget, n_trials=n_trials))
    timeout = getattr(args, "timeout", None)
    if timeout is not None:
        if not timeout > 0:
            raise UsageError(f"--timeout {timeout:g}: must be > 0 seconds")
        cfg = dataclasses.replace(cfg, budget=dataclasses.replace(cfg.budget, timeout_s=timeout))
    return cfg


def study_dir(cfg: StudyConfig, results_dir: Path) -> Path:
    return results_dir / cfg.name


def storage_url(args: argparse.Namespace, cfg: StudyConfig, folder: Path) -> str:
    return str(args.storage or cfg.storage or default_storage_url(folder))


def handle(args: argparse.Namespace) -> int:
    from autotune.study.workers import gpu_group, with_worker_args, worker_folder

    cfg = with_worker_args(
        resolve_config(args),
        gpus=args.gpus,
        port=args.port,
        heartbeat_s=args.heartbeat_s,
        grace_s=args.grace_s,
    )
    from autotune.server.hostcheck import check_host

    check_host(cfg)
    study_folder = study_dir(cfg, args.results_dir)
    url = storage_url(args, cfg, study_folder)
    folder = worker_folder(study_folder, gpu_group(cfg.server.env))
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"--results-dir {args.results_dir}: cannot create {folder}: {exc}"
        ) from exc
    from autotune.trial.run import live_launcher

    with study_lock(folder):
        launcher = live_launcher(cfg, folder)
        with _stop_signals():
            return run(cfg, folder, url, launcher, sys.stdout)


def run(
    cfg: StudyConfig,
    folder: Path,
    url: str,
    launcher: Launcher,
    stream: TextIO,
    *,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Run the study to its end; 0 when done, 130 when the operator stopped it."""
    from autotune.study.workers import (
        Coordinator,
        current_worker,
        drop_twice_queued,
        gpu_group,
        worker_seed,
    )

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    worker = current_worker(gpu_group(cfg.server.env) or gpu_group(os.environ))
    seed = worker_seed(cfg.sampler.seed, worker)
    sampler = make_sampler(dataclasses.replace(cfg.sampler, seed=seed))
    study = open_study(cfg, url, sampler, heartbeat=cfg.heartbeat)
    stopped = launcher.stop_orphans()
    note = "; ".join(stopped) or "no server was left running"

    def orphans(t: FrozenTrial) -> str:
        where = t.user_attrs.get("trial_dir")
        if where is None or Path(str(where)).parent.parent == folder:
            return note
        return "its server, if one is left, is stopped when its own worker starts again"

    recovered = recover(study, host=worker.host, machine=worker.machine, stop_orphans=orphans)
    queued = prepare(study, cfg)
    if queued:
        drop_twice_queued(study)
    trials = study.get_trials(deepcopy=False)
    deadline = clock() + cfg.budget.timeout_s if cfg.budget.timeout_s else None
    tally = Tally(n_trials=cfg.budget.n_trials)
    for t in trials:
        if t.state.is_finished():
            _tally_add(tally, t)
    progress = Progress(stream, tally, clock=clock, deadline=deadline)
    progress.message(
        f"study {cfg.name}: {cfg.server.backend} backend, sampler {cfg.sampler.name}, "
        f"{counted(trials)}/{cfg.budget.n_trials} trials done, storage {redact(url)}"
        + (f"; recovered trials {recovered} left running by a killed run" if recovered else "")
        + (f"; stopped orphaned servers: {'; '.join(stopped)}" if stopped else "")
        + (f"; {queued} points queued" if queued else "")
    )

    shown_k = [tally.done + 1]  # "trial k of N" of the trial in progress
    coordinator = Coordinator(
        me=worker,
        search=cfg.search,
        heartbeat=cfg.heartbeat,
        limits=cfg.server.limits,
        clock=clock,
        notify=progress.message,
        rng=random.Random(seed),
        random_after_duplicate=cfg.sampler.name not in ("capacity", "walkdown"),
    )

    def run_one(trial: optuna.trial.Trial) -> Result:
        settings = settings_for(trial, cfg.search)
        done = sampler_done(study, trial)
        if done:
            return Result("fail", "skipped", f"not launched: {done}", None, {}, end=done)
        full = results_disk_problem(folder)
        if full:
            return Result("fail", "harness_error", f"not launched: {full}", None, {}, fatal=full)
        port = cfg.server.port or free_port(cfg.server.host)
        argv = server_argv(
            cfg.server, settings, backend=cfg.server.backend, extra=launcher.extra_args()
        )
        plan = TrialPlan(
            number=trial.number,
            params=settings.params,
            argv=tuple(argv),
            env=dict(cfg.server.env),
            host=cfg.server.host,
            port=port,
            trial_dir=trial_dir(folder, trial.number),
            limits=cfg.server.limits,
            backend=cfg.server.backend,
        )
        trial.set_user_attr("trial_dir", str(plan.trial_dir))
        shown_k[0] = tally.done + 1
        progress.trial_started(shown_k[0], trial.number, settings.params)
        record = run_trial(plan, launcher, clock=clock, phase=progress.phase)
        write_record(record, plan.trial_dir)
        return record.result()

    def on_told(t: FrozenTrial) -> None:
        _tally_add(tally, t)
        progress.trial_finished(_finished(t, tally, shown_k[0]))

    try:
        end = run_loop(
            study,
            cfg,
            run_one=run_one,
            n_trials=cfg.budget.n_trials,
            timeout_s=cfg.budget.timeout_s,
            clock=clock,
            worker=worker,
            on_told=on_told,
            coordinator=coordinator,
        )
    except (SQLAlchemyError, StorageInternalError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        first = redact_text(first, url)
        raise HarnessError(f"the study storage {redact(url)} failed: {first}") from exc
    except Interrupted as exc:
        progress.close()
        stream.write(
            f"autotune: {exc}; the trial is recorded as interrupted. "
            f"Run the same command to resume.\n"
        )
        return 130
    finally:
        progress.close()
    trials = study.get_trials(deepcopy=False)
    progress.message(_summary(cfg, end.why, trials))
    return 0


def sampler_done(study: optuna.Study, trial: optuna.trial.Trial) -> str:
    """Why the sampler, while proposing `trial`, found nothing left worth a launch ("" if not).

    Samplers that can tell (the capacity-aware search) say so in a user attribute of the trial
    they were asked for; that trial is then recorded as skipped instead of launched.
    """
    try:
        from autotune.search.capacity import DONE_ATTR, CapacityAwareSampler
    except ImportError:
        return ""
    if not isinstance(study.sampler, CapacityAwareSampler):
        return ""  # the others never say so; spare the storage a read
    done = study._storage.get_trial(trial._trial_id).user_attrs.get(DONE_ATTR)
    return f"search done: {done}" if done else ""


def _tally_add(tally: Tally, t: FrozenTrial) -> None:
    record = t.user_attrs.get("record")
    phases = record.get("phases", {}) if isinstance(record, dict) else {}
    tally.add(
        counted=counted([t]) == 1,
        feasible_capacity=int(t.user_attrs.get("capacity_tokens", 0)) if feasible(t) else None,
        oom=t.user_attrs.get("outcome", "") in ("startup_oom", "runtime_oom"),
        phases=phases if isinstance(phases, dict) else {},
    )


def _finished(t: FrozenTrial, tally: Tally, k: int) -> str:
    a = t.user_attrs
    record = a.get("record") if isinstance(a.get("record"), dict) else {}
    assert isinstance(record, dict)
    total = record.get("phases", {}).get("total", 0.0)
    return finished_line(
        k=k,
        n=tally.n_trials,
        number=t.number,
        outcome=str(a.get("outcome", "")),
        reason=str(a.get("reason", "")),
        capacity=int(a.get("capacity_tokens", 0) or 0),
        throughput=float(a.get("throughput_tok_s", 0.0) or 0.0),
        headroom=a.get("headroom_gib"),
        feasible=feasible(t) if t.state == TrialState.COMPLETE else None,
        seconds=float(total or 0.0),
    )


def _summary(cfg: StudyConfig, why: str, trials: list[FrozenTrial]) -> str:
    best = best_feasible_capacity(trials)
    ooms = sum(1 for t in trials if t.user_attrs.get("outcome") in ("startup_oom", "runtime_oom"))
    found = f"best feasible capacity {best:,} tokens" if best is not None else "no feasible trial"
    return (
        f"study {cfg.name} finished ({why}): {counted(trials)} trials, {ooms} OOM, {found}. "
        f"See `autotune status --study {cfg.name}`."
    )


def trial_dir(folder: Path, number: int) -> Path:
    return folder / "trials" / f"{number:04d}"


def free_port(host: str) -> int:
    """A port the OS says is free now (bind to 0); the server binds it moments later."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@contextmanager
def study_lock(folder: Path) -> Iterator[None]:
    """One run per results folder: a second one would take the first one's server for an
    orphan. The lock dies with the process, so a SIGKILLed run never blocks the next."""
    path = folder / "run" / "autotune.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            raise UsageError(
                f"{folder} is in use by a running autotune ({holder}); wait for it, stop it, "
                "or use another --results-dir"
            ) from None
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()}\n")
        f.flush()
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextmanager
def _stop_signals() -> Iterator[None]:
    """Ctrl-C (SIGINT) and `systemctl stop` (SIGTERM) stop the run cleanly: the trial is
    recorded first. SIGINT is handled even when the shell started us with it ignored (a
    background job), so `kill -INT` always works."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = {
        signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler),
        signal.SIGTERM: signal.signal(signal.SIGTERM, interrupt),
    }
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
