"""One run of a study on this worker: recover what a killed run left, then ask, launch, record and
tell until the budget is spent, keeping the operator's progress line current.

This is the composition root of `autotune run`: it joins the storage, the sampler, the workers'
coordinator, the trial runner and the progress line. Everything it writes lives under
`results/NAME/` (or --results-dir): `study.db`, and per trial `trials/NNNN/server.log` and
`trial.json`.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import random
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.config.schema import Constraint, Fixed, StudyConfig
from autotune.config.space import distributions, settings_for
from autotune.errors import HarnessError, UsageError
from autotune.logparse.outcome import Outcome
from autotune.masking import redact, redact_text
from autotune.record import internals, keys
from autotune.record.remedy import remedy
from autotune.record.seeds import origins, read_seeds, store_seeds
from autotune.record.stored import stored, study_record
from autotune.record.view import TrialView, view, views
from autotune.search.effective import duplicate_of
from autotune.server.hostcheck import hicache_refusal, host_bound, results_disk_problem
from autotune.server.hostmem import HostBound
from autotune.server.procs import writers
from autotune.sim.profiles import Profile, ProfileError, load_profile
from autotune.study.loop import (
    Interrupted,
    StorageFailed,
    baseline_first,
    patiently,
    prepare,
    run_loop,
)
from autotune.study.objectives import best_feasible_capacity
from autotune.study.progress import (
    Progress,
    Tally,
    finished_line,
    warnings_before_launch,
    workload_plan,
)
from autotune.study.records import (
    check_folders,
    claim,
    keep,
    keep_unlaunched,
    rebuild_command,
    reconcile,
    trial_dir,
)
from autotune.study.samplers import is_memory_sampler, make_sampler
from autotune.study.storage import (
    STORAGE_ERRORS,
    Worker,
    counted,
    first_line,
    open_study,
    recover,
    storage_failure,
)
from autotune.study.workers import (
    Coordinator,
    current_worker,
    drop_twice_queued,
    gpu_group,
    study_folder_of,
    worker_gpus,
    worker_seed,
)
from autotune.trial.plan import plan_trial
from autotune.trial.record import Result
from autotune.trial.run import run_trial
from autotune.trial.seam import Launcher
from autotune.trial.signals import STOP_SIGNALS
from autotune.trial.trialfile import read_record, rewrite_record, write_record


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
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    worker = current_worker(worker_gpus(cfg))
    study_folder = study_folder_of(folder, gpu_group(cfg.server.env))
    seed = worker_seed(cfg.sampler.seed, worker)
    sampler = make_sampler(dataclasses.replace(cfg.sampler, seed=seed))
    seeds = read_seeds(cfg)  # a bad seed log stops the run before the study is touched
    study = open_study(cfg, url, sampler, heartbeat=cfg.heartbeat)
    numbers = [t.number for t in study.get_trials(deepcopy=False)]
    check_folders(folder, numbers, rebuild_command(cfg.name, study_folder, url))
    store_seeds(study, cfg, seeds, distributions(cfg.search))
    night = _Night(cfg, folder, launcher, study, clock)
    night.start(stream, url, worker)
    coordinator = Coordinator(
        me=worker,
        search=cfg.search,
        heartbeat=cfg.heartbeat,
        limits=cfg.server.limits,
        clock=clock,
        notify=night.progress.message,
        rng=random.Random(seed),
        random_after_duplicate=not is_memory_sampler(cfg.sampler.name),
    )
    try:
        end = run_loop(
            study,
            cfg,
            run_one=night.run_one,
            n_trials=cfg.budget.n_trials,
            timeout_s=cfg.budget.timeout_s,
            clock=clock,
            worker=worker,
            on_told=night.on_told,
            coordinator=coordinator,
            storage_failed=night.storage_failed,
            note=lambda line: night.progress.message(f"warning: {line}"),
            records=folder / "trials",
            trial_s=night.trial_s,
        )
    except STORAGE_ERRORS as exc:
        raise storage_failure(exc, url, "failed") from exc
    except Interrupted as exc:
        night.progress.close()
        stream.write(
            f"autotune: {exc}; the trial is recorded as interrupted. "
            f"Run the same command to resume.\n"
        )
        return 130
    finally:
        night.progress.close()
    night.progress.message(_summary(cfg, end.why, study.get_trials(deepcopy=False)))
    return 0


_FINISHED = (TrialState.COMPLETE, TrialState.FAIL)
"""The trials a new point may be a duplicate of: those that ran (a skipped one has no ledger)."""


@dataclasses.dataclass(eq=False)
class _Night:
    """One run of the study on this worker: what a killed run left is recovered first, then each
    asked trial is planned, launched and recorded, and the operator's line kept up to date."""

    cfg: StudyConfig
    folder: Path
    launcher: Launcher
    study: optuna.Study
    clock: Callable[[], float]
    tally: Tally = dataclasses.field(init=False)
    progress: Progress = dataclasses.field(init=False, repr=False)
    """The operator's line, made by `start` (it writes to the stream `start` is given)."""
    shown_k: int = dataclasses.field(init=False, default=1)
    """"trial k of N" of the trial in progress."""
    url: str = dataclasses.field(init=False, default="")
    host: HostBound | None = dataclasses.field(init=False)
    """The host memory bound a trial's host cache is held to before its launch."""

    def __post_init__(self) -> None:
        self.tally = Tally(n_trials=self.cfg.budget.n_trials, plan=workload_plan(self.cfg.workload))
        self.host = host_bound(self.cfg)

    def start(self, stream: TextIO, url: str, worker: Worker) -> None:
        """Recover, queue the first points, count what is done, and say where the study is."""
        cfg, study = self.cfg, self.study
        self.url = url
        stopped = self.launcher.stop_orphans()

        def orphans(t: FrozenTrial) -> str:
            where = view(t).trial_dir
            if where is None or Path(str(where)).parent.parent == self.folder:
                return "; ".join(stopped) or _no_pidfile(where)
            return "its server, if one is left, is stopped when its own worker starts again"

        recovered = recover(study, host=worker.host, machine=worker.machine, stop_orphans=orphans)
        reconcile(self.folder, study.get_trials(deepcopy=False))
        queued = prepare(study, cfg)
        if queued:
            drop_twice_queued(study, cfg.search)
        elif baseline_first(study, cfg):
            recovered_note = "; the baseline goes first again"
        else:
            recovered_note = ""
        trials = study.get_trials(deepcopy=False)
        check = study_record(study).check
        if check is not None:  # `autotune check` timed the launch before the night
            self.tally.seed(check.phases)
            # and a round of each stress phase: the plan times its rounds as check's plan does
            ran = next((t for t in trials if t.number == check.trial), None)
            if ran is not None:
                checked = dict(view(ran).workload_phases)
                self.tally.plan = workload_plan(cfg.workload, checked)
        for t in trials:
            if t.state.is_finished():
                _tally_add(self.tally, t, timed=check is None or t.number != check.trial)
        deadline = self.clock() + cfg.budget.timeout_s if cfg.budget.timeout_s else None
        self.progress = Progress(stream, self.tally, clock=self.clock, deadline=deadline)
        self.shown_k = self.tally.done + 1
        self.progress.message(
            f"study {cfg.name}: {cfg.server.backend} backend, sampler {cfg.sampler.name}, "
            f"{counted(trials)}/{cfg.budget.n_trials} trials done, storage {redact(url)}"
            + (f"; recovered trials {recovered} left running by a killed run" if recovered else "")
            + (f"; stopped orphaned servers: {'; '.join(stopped)}" if stopped else "")
            + (f"; {queued} points queued" if queued else "")
            + ("" if queued else recovered_note)
        )
        for origin in origins(study):
            self.progress.message(f"the memory model starts from {origin}")
        for warning in warnings_before_launch(cfg, views(trials), _profile(cfg)):
            self.progress.message(f"warning: {warning}")

    def trial_s(self) -> float | None:
        """How long one trial takes, from the trials timed so far (and the check's launch);
        None while nothing is known."""
        est = self.tally.per_trial()
        return est[0] if est is not None else None

    def run_one(self, trial: optuna.trial.Trial) -> Result:
        """Launch the asked trial (unless the disk is full, or SGLang would run its point as a
        trial already measured: `search.effective`; or its host cache is over the host memory
        bound, `server.hostcheck.hicache_refusal`), record it."""
        cfg, folder = self.cfg, self.folder
        settings = settings_for(trial, cfg.search)
        measured = views(self.study.get_trials(deepcopy=False, states=_FINISHED))
        twin = duplicate_of(settings.params, measured, cfg.search)
        if twin is not None:
            return Result("fail", "skipped", twin.reason, None, {keys.RUNS_AS: twin.trial})
        full = results_disk_problem(folder)
        if full:
            return Result("fail", "harness_error", f"not launched: {full}", None, {}, fatal=full)
        refused = hicache_refusal(cfg, settings.params, self.host)
        if refused:  # the startup_oom SGLang would end it with, known without a launch
            self.shown_k = self.tally.done + 1
            return Result("fail", "startup_oom", f"not launched: {refused}", None, {})
        try:
            where = claim(folder, trial.number)
        except HarnessError as exc:
            why = f"not launched: {exc}"
            return Result("fail", "harness_error", why, None, {}, fatal=str(exc))
        plan = plan_trial(
            cfg,
            settings,
            number=trial.number,
            trial_dir=where,
            extra=self.launcher.extra_args(),
            stress_repeats=stored(internals.fresh(self.study, trial)).stress_repeats,
        )
        trial.set_user_attr(keys.TRIAL_DIR, str(plan.trial_dir))
        self.shown_k = self.tally.done + 1
        self.progress.trial_started(self.shown_k, trial.number, settings.params)
        grace = cfg.server.limits.stop_grace_s
        with _noting_stops(lambda: self.progress.stopping(grace)):
            record = run_trial(plan, self.launcher, clock=self.clock, phase=self.progress.phase)
        write_record(record, plan.trial_dir)
        return record.result()

    def storage_failed(self, failed: StorageFailed) -> Result:
        """The storage failed while `failed.trial` was RUNNING (a lock held past SQLite's busy
        timeout, a database restarting): once it answers again, the trial is recorded as a
        machine failure (`harness_error`, never a parameter result; trial.json agrees, with
        what it measured kept as `measured_outcome`) and its point is queued again. Raises
        HarnessError, one line, when the storage does not answer within the patience."""
        trial, number = failed.trial, failed.trial.number
        cause = redact_text(first_line(failed.cause), self.url)
        measured = failed.result.outcome if failed.result is not None else ""
        reason = f"the study storage failed while the trial ran: {cause}"
        if measured:
            reason += f" (it measured {measured}; its point runs again)"
        where = trial_dir(self.folder, number)
        record = read_record(where) if measured else None
        if record is not None:
            record.update(
                state="fail", outcome="harness_error", reason=reason, measured_outcome=measured
            )
        t0 = time.monotonic()
        if not _fail_patiently(self.study, trial, reason, record):
            raise HarnessError(
                f"the study storage {redact(self.url)} failed: {cause}; trial {number} could not "
                "be recorded (the next run marks it stale and runs its point again); once the "
                "storage answers, run the same command to resume (a storage that lost trials is "
                "refused, its trial folders are never written over)"
            )
        if record is not None:
            rewrite_record(where, record)
        self.progress.message(
            f"warning: trial {number}: {reason}; recorded as harness_error once the storage "
            f"answered again, {time.monotonic() - t0:.0f} s later"
        )
        attrs: dict[str, object] = {keys.RECORD: record} if record is not None else {}
        return Result("fail", "harness_error", reason, None, attrs)

    def on_told(self, t: FrozenTrial) -> None:
        if stored(t).trial_dir is not None:
            keep(trial_dir(self.folder, t.number), t)
        else:
            keep_unlaunched(self.folder, t)
        _tally_add(self.tally, t)
        self.progress.trial_finished(_finished(t, self.tally, self.shown_k))


def _fail_patiently(
    study: optuna.Study,
    trial: optuna.trial.Trial,
    reason: str,
    record: dict[str, object] | None,
) -> bool:
    """Fail `trial` as `harness_error` and queue its point again, retrying while the storage
    fails (`loop.patiently`); a trial some write already finished is left as it is. False when
    the storage never answered."""
    done = {"told": False, "queued": False}

    def attempt() -> None:
        if not done["told"]:
            if internals.fresh(study, trial).state.is_finished():
                done["queued"] = True  # finished by the write that failed, or another worker
            else:
                trial.set_user_attr(keys.OUTCOME, "harness_error")
                trial.set_user_attr(keys.REASON, reason)
                if record is not None:
                    trial.set_user_attr(keys.RECORD, record)
                study.tell(trial, state=TrialState.FAIL)
            done["told"] = True
        if not done["queued"]:
            if trial.params:
                study.enqueue_trial(dict(trial.params))
            done["queued"] = True

    try:
        patiently(attempt)
    except STORAGE_ERRORS:
        return False
    return True


@contextmanager
def _noting_stops(note: Callable[[], None]) -> Iterator[None]:
    """Call `note` when a stop signal (`STOP_SIGNALS`: Ctrl-C, SIGTERM, SIGHUP) arrives, then do
    what the handler in place does (stop the run); one that is ignored stays ignored, and outside
    the main thread there is nothing to wrap."""

    def chained(previous: object, default: Callable[[], None]) -> Callable[[int, object], None]:
        def handler(signum: int, frame: object) -> None:
            note()
            if callable(previous):
                previous(signum, frame)
            elif previous != signal.SIG_IGN:
                default()

        return handler

    def stop() -> None:
        raise KeyboardInterrupt

    try:
        previous = {s: h for s in STOP_SIGNALS if (h := signal.getsignal(s)) is not signal.SIG_IGN}
        for s, p in previous.items():
            signal.signal(s, chained(p, stop))
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        for s, p in previous.items():
            signal.signal(s, p)


def _profile(cfg: StudyConfig) -> Profile | None:
    """The simulator profile a rehearsal runs on (None on the real backend or when unreadable:
    the launch says why)."""
    if cfg.server.backend != "sim":
        return None
    try:
        return load_profile(cfg.server.sim_profile)
    except (ProfileError, OSError):
        return None


def _tally_add(tally: Tally, t: FrozenTrial, *, timed: bool = True) -> None:
    """Count a finished trial; with `timed` False (the check's launch, whose short workload is not
    the night's, and whose phases the tally was seeded with) its seconds are left out."""
    v = view(t)
    tally.add(
        counted=v.counted,
        feasible_capacity=(v.capacity_tokens or 0) if v.feasible else None,
        oom=v.ending.is_oom,
        phases=dict(v.phases) if timed else {},
        workload_phases=dict(v.workload_phases) if timed else {},
    )


def _finished(t: FrozenTrial, tally: Tally, k: int) -> str:
    v = view(t)
    reason = v.reason
    if v.ending is Outcome.OK and v.violated:  # what it broke, and the failed requests' first
        reason = f"broke {', '.join(v.violated)}"
        if Constraint.ERROR_RATE in v.violated and v.evidence:
            reason += f": {v.evidence[0]}"
    return finished_line(
        k=k,
        n=tally.n_trials,
        number=t.number,
        outcome=v.outcome,
        reason=reason,
        capacity=v.capacity_tokens,
        throughput=v.throughput_tok_s,
        headroom=v.free_at_peak_gib,
        feasible=v.feasible if v.state == "complete" else None,
        seconds=v.phases.get("total", 0.0),
    )


def _summary(cfg: StudyConfig, why: str, trials: list[FrozenTrial]) -> str:
    best = best_feasible_capacity(trials)
    seen = views(trials)
    ooms = sum(1 for v in seen if v.ending.is_oom)
    found = f"best feasible capacity {best:,} tokens" if best is not None else "no feasible trial"
    return (
        f"study {cfg.name} finished ({why}): {counted(trials)} trials, {ooms} OOM, {found}."
        f"{closing_reason(cfg, seen)} See `autotune status --study {cfg.name}`."
    )


def closing_reason(cfg: StudyConfig, trials: list[TrialView]) -> str:
    """The failure that left the study without a feasible setting (or its baseline failing) and
    the knob that would fix it, as a sentence; "" when the search found what it looked for."""
    failed = [t for t in trials if t.launched and t.counted and not t.feasible]
    if not failed:
        return ""
    searched = {p.name for p in cfg.search.params if not isinstance(p, Fixed)}
    baseline = {k: v for k, v in cfg.search.baseline.items() if k in searched}
    base = next(
        (t for t in failed if baseline and all(t.params.get(k) == v for k, v in baseline.items())),
        None,
    )
    past = any(t.feasible for t in trials)
    if base is None and past:
        return ""
    telling = _most_telling(failed)
    # with nothing feasible, what most failures share ended it, whatever the baseline did
    t = base if base is not None and (past or _cause(base) == _cause(telling)) else telling
    hint = remedy(t)
    if t.outcome == "ok" and t.violated:  # it served the load, out of bounds
        what = f"served the load but broke {', '.join(t.violated)}"
    else:
        what = "failed with " + (t.reason.split(":", 1)[0] if t.reason else t.outcome or t.kind)
    fix = f"; {hint}." if hint else "."
    if any(t.feasible for t in trials):  # the search got past a failing baseline
        return f" The baseline (trial {t.number}) {what}{fix}"
    who = f"the baseline (trial {t.number})" if t is base else f"trial {t.number}"
    return f" What ended it: {who} {what}{fix}"


def _cause(t: TrialView) -> str:
    """What a failed trial failed of: its cause, or the constraints a trial that served broke."""
    if t.outcome == "ok" and t.violated:
        return "broke " + ",".join(sorted(t.violated))
    return t.cause or t.outcome


def _most_telling(failed: list[TrialView]) -> TrialView:
    """The failure to name: the cause most trials share (ties: the latest), its latest trial."""
    causes = [_cause(t) for t in failed]
    top = max(reversed(causes), key=causes.count)  # the first maximum: the latest of a tie
    return [t for t in failed if _cause(t) == top][-1]


def _no_pidfile(where: object) -> str:
    """What recovery knows of a killed trial's server when no pidfile of this worker named one:
    none was launched, or its pidfile is gone; a process still writing its log is named (and
    left alone: without its pidfile nothing proves which processes are its)."""
    log = Path(str(where)) / "server.log" if where is not None else None
    if log is None or not log.exists():
        return "no server was launched"
    found = writers(log)
    if not found:
        return "no pidfile named its server and no process writes its server.log any more"
    pids = ", ".join(str(p.pid) for p in found)
    return (
        f"its pidfile was missing, so its server could not be stopped: pid {pids} still "
        f"writes its server.log and was left running (stop it by hand: kill {pids})"
    )


@contextmanager
def study_lock(folder: Path, *, wait: bool = False) -> Iterator[None]:
    """One command that launches servers per results folder (`run`, `confirm`): a second one
    would take the first one's server for an orphan. With `wait`, queue behind the holder
    instead of refusing. The lock dies with the process, so a SIGKILLed run never blocks."""
    path = folder / "run" / "autotune.lock"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(path, "a+")  # noqa: SIM115 - held open for the whole run
    except OSError as exc:
        raise UsageError(
            f"{folder} is not writable ({exc.strerror or exc}); fix its permissions or use "
            "another --results-dir"
        ) from None
    with lock as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            raise UsageError(
                f"{folder} is in use by a running autotune ({holder}); wait for it (--wait "
                "where the command has it), stop it, or use another --results-dir"
            ) from None
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()}\n")
        f.flush()
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
