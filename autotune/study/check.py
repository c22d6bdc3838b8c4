"""`autotune check`: everything a night depends on, read once before the night, go or no-go.

One launch of the study's baseline point, with a short load (`check_workload`: one short closed
loop and one stress round), between the same preflight `run` does before its first launch
(`server.hostcheck.check_host`: SGLang, model paths, flags, GPUs, the host cache against host
RAM) and the same teardown. On the way it reads each thing the night depends on, one `Row`
each:

* the SGLang version and the log format its lines follow (`logparse.semantics`);
* every ledger field the search and the memory arithmetic read (`SEARCH_FIELDS`), on every rank
  for the lines each rank prints (`logparse.accounting.rank_ledgers`);
* every HTTP route autotune uses answering with the shape autotune reads
  (`server.endpoints.check_endpoints`), and the workload's API under the short load;
* GPU memory before the launch, after startup and after the teardown, and how long the release
  took;
* host RAM for the largest host cache, free disk for the logs of the whole budget (the check's
  own log, its serving part scaled to the study's workload, times the trial budget).

The launch is the study's baseline trial, asked, run and told as `run` does (`study.loop`), so
the night does not launch it again; its launch, startup and teardown seconds are stored on the
study (`keys.CHECK`), from which `run`'s progress line takes its ETA before its own first trial.
The night's plan (phases, launches, the confirm soak, hours) is the review's
(`review.checktable`), from the `CheckReport` this returns.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import optuna
from optuna.trial import TrialState

from autotune.config.schema import HICACHE, Fixed, StudyConfig
from autotune.config.space import distributions, point_key, settings_for
from autotune.config.workload import LengthDist, Phase, Poisson, Steady, Stress, WorkloadSpec
from autotune.errors import AutotuneError, UsageError
from autotune.logparse.accounting import rank_ledgers
from autotune.logparse.ledger import Ledger
from autotune.logparse.lines import parse_lines
from autotune.logparse.outcome import Outcome
from autotune.record import internals, keys
from autotune.record.seeds import read_seeds, store_seeds
from autotune.record.stored import CheckTimings, stored, study_record
from autotune.record.view import view
from autotune.server.endpoints import Endpoint, check_endpoints
from autotune.server.gpu import GpuMemory, GpuProbe, foreign_holders, visible_devices
from autotune.server.hostcheck import (
    check_host,
    hicache_candidates,
    host_bound,
)
from autotune.server.hostmem import HostBound
from autotune.server.preflight import check_no_server_running, check_port
from autotune.study.loop import baseline_first, prepare, tell
from autotune.study.readings import (
    CheckReport,
    DiskFree,
    Row,
    disk_row,
    endpoint_rows,
    gpu_rows,
    gpu_text,
    launch_rows,
    ledger_rows,
    version_rows,
)
from autotune.study.records import claim, keep
from autotune.study.samplers import make_sampler
from autotune.study.storage import open_study
from autotune.study.workers import current_worker, worker_gpus
from autotune.trial.plan import TrialPlan, plan_trial
from autotune.trial.run import run_trial
from autotune.trial.seam import Launcher, Load, ServerRun, Startup, Stop
from autotune.trial.trialfile import write_record

CHECK_STEADY_S = {"sim": 3.0, "sglang": 60.0}
"""How long the check's closed loop sends, by backend: a few seconds on the simulator, a minute
on the real box (the stress round and the drain come on top)."""
CHECK_CONCURRENCY = 8
"""At most this many requests at once in the check's closed loop."""
CHECK_OUTPUT_TOKENS = 16
"""Each request of the check asks for at most this many tokens: the check proves the routes and
reads the memory, it does not measure the night's throughput."""
CHECK_INPUT_TOKENS = 2048
"""Each prompt of the check's closed loop is at most this long (and sessions are left out): the
closed loop proves the routes; the stress round, kept whole, measures the peak."""
CHECK_DRAIN_S = 30.0
CHECK_REQUEST_TIMEOUT_S = 120.0
CHECK_WORKLOAD_S = 300.0
"""The check's workload may run at most this long (`server.limits.workload_s`)."""


HostProbe = Callable[[], HostBound | None]


def disk_free_bytes(folder: Path) -> int:
    """Bytes free to an unprivileged writer under `folder` (statvfs)."""
    st = os.statvfs(folder)
    return st.f_bavail * st.f_frsize


def check_workload(spec: WorkloadSpec, backend: str) -> WorkloadSpec:
    """The check's short load: one closed loop of at most `CHECK_CONCURRENCY` clients for
    `CHECK_STEADY_S` seconds, then one round of the study's stress phase (its first, or a default
    one), each request at most `CHECK_OUTPUT_TOKENS` long, each closed-loop prompt at most
    `CHECK_INPUT_TOKENS`, no sessions; the study's API and stress shape otherwise."""
    steady = [p for p in spec.phases if isinstance(p, Steady | Poisson)]
    busiest = max(
        (p.concurrency for p in steady if isinstance(p, Steady)), default=CHECK_CONCURRENCY
    )
    first = next((p for p in spec.phases if isinstance(p, Steady | Poisson)), None)
    out_len = _capped(spec.output_len)
    phases: list[Phase] = [
        Steady(
            name="check",
            concurrency=min(busiest, CHECK_CONCURRENCY),
            duration_s=CHECK_STEADY_S.get(backend, CHECK_STEADY_S["sglang"]),
            input_len=_capped(first.input_len, CHECK_INPUT_TOKENS)
            if first is not None and first.input_len
            else None,
            output_len=_capped(first.output_len) if first and first.output_len else out_len,
        )
    ]
    stress = next((p for p in spec.phases if isinstance(p, Stress)), None)
    phases.append(
        dataclasses.replace(
            stress,
            rounds=1,
            output_len=min(stress.output_len, CHECK_OUTPUT_TOKENS),
            timeout_s=min(stress.timeout_s, CHECK_WORKLOAD_S),
        )
        if stress is not None
        else Stress("stress", rounds=1, output_len=4, timeout_s=CHECK_WORKLOAD_S)
    )
    return dataclasses.replace(
        spec,
        phases=tuple(phases),
        input_len=_capped(spec.input_len, CHECK_INPUT_TOKENS),
        output_len=out_len,
        sessions=None,
        drain_timeout_s=min(spec.drain_timeout_s, CHECK_DRAIN_S),
        request_timeout_s=min(spec.request_timeout_s, CHECK_REQUEST_TIMEOUT_S),
    )


def _capped(dist: LengthDist, cap: int = CHECK_OUTPUT_TOKENS) -> LengthDist:
    """`dist`, or a fixed length of at most `cap` tokens when it reaches above `cap`."""
    if dist.high <= cap:
        return dist
    return LengthDist.fixed(min(max(int(dist.mean) or dist.low, 1), cap))


def check_config(cfg: StudyConfig) -> StudyConfig:
    """The study as the check launches it: its workload the short one, its workload limit
    `CHECK_WORKLOAD_S` at most."""
    limits = dataclasses.replace(
        cfg.server.limits, workload_s=min(cfg.server.limits.workload_s, CHECK_WORKLOAD_S)
    )
    return dataclasses.replace(
        cfg,
        workload=check_workload(cfg.workload, cfg.server.backend),
        server=dataclasses.replace(cfg.server, limits=limits),
    )


LauncherFactory = Callable[[StudyConfig, Path], Launcher]


def run_check(
    cfg: StudyConfig,
    folder: Path,
    url: str,
    launcher_factory: LauncherFactory,
    probe_of: Callable[[Launcher], GpuProbe | None],
    *,
    disk_free: DiskFree = disk_free_bytes,
    host: HostProbe | None = None,
    clock: Callable[[], float] = time.monotonic,
    preflighted: CheckReport | None = None,
) -> CheckReport:
    """Preflight (unless `preflighted` holds its go rows already), one launch of the baseline
    with the short load, teardown: every reading as a `Row`. Raises `UsageError` (bad input:
    exit 2) for a study whose baseline was measured already; a reading that fails is a no-go
    row, never an exception."""
    report = preflighted if preflighted is not None else preflight(cfg, host=host, clock=clock)
    t0 = clock() - report.wall_s
    rows = report.rows
    if not report.go:
        return report
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    seeds = read_seeds(cfg)  # a bad seed log is bad input, before the study is touched
    study = open_study(cfg, url, make_sampler(cfg.sampler))
    store_seeds(study, cfg, seeds, distributions(cfg.search))
    done = _measured_baseline(study, cfg)
    if done is not None:
        raise UsageError(
            f"study {cfg.name} has its baseline measured already (trial {done}); `autotune "
            "check` runs before a study's first launch: check with another --results-dir"
        )
    short = check_config(cfg)
    launcher = launcher_factory(short, folder)
    probe = probe_of(launcher)
    devices = _devices(cfg)
    before = _snapshot(probe)
    if not _gpus_before(before, devices, rows) or not _port(cfg, folder, rows):
        report.wall_s = clock() - t0
        return report
    _queue_baseline(study, cfg)
    trial = study.ask()
    trial.set_user_attr(keys.WORKER, current_worker(worker_gpus(cfg)).to_dict())
    trial.set_user_attr(keys.SHORT_LOAD, True)
    settings = settings_for(trial, cfg.search)
    where = claim(folder, trial.number)
    plan = plan_trial(
        short, settings, number=trial.number, trial_dir=where, extra=launcher.extra_args()
    )
    trial.set_user_attr(keys.TRIAL_DIR, str(plan.trial_dir))
    watched = _Watching(launcher, probe, cfg.workload.api_key())
    try:
        record = run_trial(plan, watched, clock=clock, phase=lambda name: None)
    except BaseException:
        study.tell(trial, state=TrialState.FAIL)
        raise
    write_record(record, plan.trial_dir)
    result = record.result()
    tell(study, trial, result, cfg)
    frozen = internals.fresh(study, trial)
    keep(plan.trial_dir, frozen)
    v = view(frozen)
    report.trial = v
    report.workload_phases = dict(stored(frozen).workload_phases)
    log_bytes = _size(plan.log_path)
    phases = record.phases
    timings = CheckTimings(
        trial=trial.number,
        launch_s=float(phases.get("launch", 0.0)),
        startup_s=float(phases.get("startup", 0.0)),
        teardown_s=float(phases.get("teardown", 0.0)),
        log_bytes=log_bytes,
    )
    if record.state == "complete" or "startup" in phases:
        study.set_user_attr(keys.CHECK, timings.to_dict())
        report.timings = timings
    report.trials = [view(t) for t in study.get_trials(deepcopy=False) if t.state.is_finished()]
    launch_rows(rows, record.state, record.outcome, record.reason, v, trial.number)
    ledger = Ledger.from_dict(record.ledger)
    version_rows(rows, record.sglang_version, ledger, watched.startup)
    ledger_rows(rows, ledger, _ranks_of(plan.log_path), cfg)
    endpoint_rows(rows, watched.endpoints, v, cfg)
    gpu_rows(rows, before, watched.after_startup, watched.after_stop, watched.stop, devices)
    disk_row(rows, cfg, folder, log_bytes, watched.log_at_ready, report.workload_phases, disk_free)
    report.wall_s = clock() - t0
    return report


def _queue_baseline(study: optuna.Study, cfg: StudyConfig) -> None:
    """Queue the study's first points as `run` would (`loop.prepare`), with the baseline first;
    the baseline also where a seed log of its setting would have let `run` skip it (the check
    launches it all the same)."""
    prepare(study, cfg)
    if baseline_first(study, cfg):
        return
    searched = {p.name for p in cfg.search.params if not isinstance(p, Fixed)}
    baseline = {k: v for k, v in cfg.search.baseline.items() if k in searched}
    waiting = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.WAITING]
    first = internals.fixed_params(waiting[0]) if waiting else {}
    if baseline and not (
        first and point_key(baseline, cfg.search).within(point_key(first, cfg.search))
    ):
        study.enqueue_trial(dict(baseline))
        order = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.WAITING]
        points = [internals.fixed_params(t) for t in order]
        for t, now in zip(order, [points[-1], *points[:-1]], strict=True):
            internals.set_fixed_params(study, t, now)


def _measured_baseline(study: optuna.Study, cfg: StudyConfig) -> int | None:
    """The number of a finished trial that measured the baseline point, None when none did."""
    held = study_record(study).baseline
    baseline = dict(held) if held else dict(cfg.search.baseline)
    if not baseline:
        return None
    point = point_key(baseline, cfg.search)
    for t in study.get_trials(deepcopy=False):
        if not t.state.is_finished() or not point.within(point_key(t.params, cfg.search)):
            continue
        if t.state == TrialState.COMPLETE or Outcome.of(stored(t).outcome or "").counted:
            return t.number
    return None


# -- preflight -----------------------------------------------------------------------------------


def preflight(
    cfg: StudyConfig, *, host: HostProbe | None = None, clock: Callable[[], float] = time.monotonic
) -> CheckReport:
    """The check's first rows: `run`'s preflight and the host cache's bound, read without
    writing anything, so a no-go here leaves the results folder as it was."""
    t0 = clock()
    report = CheckReport()
    _preflight(cfg, report.rows, host)
    report.wall_s = clock() - t0
    return report


def _preflight(cfg: StudyConfig, rows: list[Row], host: HostProbe | None) -> None:
    """`run`'s preflight (`check_host`) and the host cache against the host memory bound
    (`server.hostcheck.host_bound`: host RAM within the container's cgroup), as rows; a no-go
    row ends them."""
    bound = host() if host is not None else host_bound(cfg)
    try:
        notes = check_host(cfg, host=lambda: bound)
    except AutotuneError as exc:
        text = str(exc)
        what = "host RAM for the host cache" if "host memory bound" in text else "preflight"
        reason, _, fix = text.rpartition(". Lower ") if "Lower " in text else ("", "", "")
        if not reason:
            reason, _, fix = text.rpartition("; ")
        else:
            fix = "lower " + fix
        rows.append(Row(what, reason or text, False, fix if reason else ""))
        return
    ram_notes = [n for n in notes if "host memory bound" in n]
    other = [n for n in notes if n not in ram_notes]
    rows.append(
        Row(
            "preflight (SGLang, model paths, flags, GPUs)",
            "passed" + (f"; {'; '.join(other)}" if other else ""),
        )
    )
    sizes = hicache_candidates(cfg)
    baseline = cfg.search.baseline.get(HICACHE, dict(cfg.server.flags).get(HICACHE))
    if not sizes:
        rows.append(Row("host RAM for the host cache", "no host cache asked for"))
    elif bound is None:
        rows.append(Row("host RAM for the host cache", "host RAM unreadable: not checked"))
    elif isinstance(baseline, int | float) and not bound.fits(float(baseline)):
        refusal = bound.refusal(float(baseline), HICACHE)
        reason, _, fix = refusal.rpartition(". Lower ")
        rows.append(Row("host RAM for the host cache", reason, False, "lower " + fix))
        return
    else:
        fit = [x for x in sizes if bound.fits(float(x))]
        over = [x for x in sizes if not bound.fits(float(x))]
        limit = (
            f"the bound of {bound.per_rank_gb:.1f} GB per rank ({bound.source()}, less the "
            f"10 GiB reserve, ÷ {bound.ranks} ranks)"
        )
        value = (
            f"up to {max(fit):g} GB per rank asked, within {limit}"
            if fit and not over
            else f"{', '.join(f'{x:g}' for x in fit) or 'none'} GB per rank within {limit}; "
            f"{', '.join(f'{x:g}' for x in over)} GB over it: those trials are refused before "
            "launch"
        )
        rows.append(Row("host RAM for the host cache", value))


def _devices(cfg: StudyConfig) -> tuple[int, ...] | None:
    return visible_devices({**os.environ, **cfg.server.env})


def _snapshot(probe: GpuProbe | None) -> list[GpuMemory] | None:
    if probe is None:
        return None
    try:
        return probe.snapshot()
    except (AutotuneError, OSError):
        return None


def _gpus_before(
    before: list[GpuMemory] | None, devices: tuple[int, ...] | None, rows: list[Row]
) -> bool:
    if before is None:
        rows.append(
            Row(
                "GPU memory before the launch",
                "the GPU probe cannot be read",
                False,
                "run on the GPU box, or rehearse with --backend sim",
            )
        )
        return False
    foreign = foreign_holders(before, (), devices)
    if foreign:
        rows.append(
            Row(
                "GPU memory before the launch",
                f"held by processes autotune did not start: {'; '.join(foreign)}",
                False,
                "stop them (they would shrink the KV pool), then check again",
            )
        )
        return False
    rows.append(Row("GPU memory before the launch", gpu_text(before, devices)))
    return True


def _port(cfg: StudyConfig, folder: Path, rows: list[Row]) -> bool:
    try:
        check_no_server_running(folder / "run")
        if cfg.server.port:
            check_port(cfg.server.host, cfg.server.port)
    except AutotuneError as exc:
        reason, _, fix = str(exc).rpartition("; ")
        rows.append(Row("server port", reason or str(exc), False, fix if reason else ""))
        return False
    port = f"{cfg.server.port} free" if cfg.server.port else "a free one per launch"
    rows.append(Row("server port", f"{cfg.server.host}:{port}"))
    return True


# -- the launch ----------------------------------------------------------------------------------


class _Watching:
    """The launcher, with the readings of the check taken on the way: GPU memory after startup
    and after the teardown, every route once the server is ready, the log's size at ready."""

    def __init__(self, inner: Launcher, probe: GpuProbe | None, api_key: str | None) -> None:
        self.inner = inner
        self.probe = probe
        self.api_key = api_key
        self.startup: Startup | None = None
        self.after_startup: list[GpuMemory] | None = None
        self.after_stop: list[GpuMemory] | None = None
        self.stop: Stop | None = None
        self.endpoints: list[Endpoint] = []
        self.log_at_ready: int | None = None

    def launch(self, plan: TrialPlan) -> ServerRun:
        """Launch through the inner launcher; the handle takes the readings."""
        return _WatchedRun(self.inner.launch(plan), self, plan)

    def extra_args(self) -> tuple[str, ...]:
        """The inner launcher's extra flags."""
        return self.inner.extra_args()

    def stop_orphans(self) -> list[str]:
        """The inner launcher's orphan stop."""
        return self.inner.stop_orphans()


class _WatchedRun:
    def __init__(self, run: ServerRun, watch: _Watching, plan: TrialPlan) -> None:
        self.run = run
        self.watch = watch
        self.plan = plan

    def wait_ready(self) -> Startup:
        startup = self.run.wait_ready()
        w = self.watch
        w.startup = startup
        if startup.outcome == "ready":
            w.log_at_ready = _size(self.plan.log_path)
            w.after_startup = _snapshot(w.probe)
            host = f"[{self.plan.host}]" if ":" in self.plan.host else self.plan.host
            w.endpoints = check_endpoints(f"http://{host}:{self.plan.port}", w.api_key)
        return startup

    def drive(self, ledger: Mapping[str, object]) -> Load:
        return self.run.drive(ledger)

    def stop(self) -> Stop:
        stop = self.run.stop()
        self.watch.stop = stop
        self.watch.after_stop = _snapshot(self.watch.probe)
        return stop


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


def _ranks_of(log: Path) -> dict[str, Ledger]:
    try:
        with log.open(errors="replace") as fh:
            return rank_ledgers(parse_lines(fh).events)
    except OSError:
        return {}
