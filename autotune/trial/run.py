"""One trial end to end: launch → ready → ledger → workload → metrics → teardown → a record.

The orchestration here is pure control flow over a small seam (`Launcher` / `ServerRun`), so it is
tested with fakes; `LiveLauncher`, at the end of this module, implements the seam with the real
server lifecycle (`autotune.server`) and workload driver (`autotune.loadgen`), the one place
they are called. What a trial's ending means is decided here, once:

* the parameters broke the server (OOM at startup or under load, a crash): a COMPLETE trial with
  violated constraints and the capacity it measured (0 if none), so samplers learn the edge;
* the harness or the machine failed (hang, phase timeout, a launch error), or the server was
  ended from outside (`killed`) or by its host (`machine_error`: a full disk, its port taken): a
  FAILED trial with its reason, the exit status and who sent the signal (`exit_code`,
  `exit_signal`, `sender`, from `autotune.server.deaths`);
* the operator pressed Ctrl-C (or sent SIGTERM, or the terminal hung up: `trial.signals`): the
  server is stopped cleanly (a second signal cannot cut the teardown short) and the trial is
  recorded as interrupted;
* autotune itself was paused (SIGSTOP, a suspend) through the trial: what it measured is not
  the server's, and the trial is `disturbed` (`autotune.trial.clockwatch`).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import Protocol

from autotune import __version__
from autotune.config.space import Settings, address_flags, server_argv
from autotune.config.studyfile import Limits, Scalar, StudyConfig
from autotune.errors import HarnessError
from autotune.loadgen import Activity, ServerFacts, Target, WorkloadSpec, run_workload
from autotune.logparse.ledger import build_ledger
from autotune.logparse.lines import parse_lines
from autotune.logparse.outcome import Outcome, signal_name
from autotune.masking import scrub_file
from autotune.record import keys
from autotune.server import pidfile
from autotune.server.gpu import GpuProbe, NvmlProbe, SimProbe, foreign_holders, visible_devices
from autotune.server.health import flush_cache
from autotune.server.lifecycle import LaunchSpec, Server
from autotune.server.preflight import free_port
from autotune.server.teardown import stop_orphans
from autotune.trial import signals
from autotune.trial.clockwatch import ClockWatch
from autotune.trial.growth import footprint_growth_gib, least_used
from autotune.trial.record import Measured, Result
from autotune.trial.signals import STOP_SIGNALS

FATAL_TEARDOWN = "teardown"
INTERRUPT = "interrupted"
"""`fatal` value of a finished trial during whose teardown the operator asked to stop."""


@dataclass(frozen=True)
class TrialPlan:
    """Everything needed to run one trial; paths are inside the study's results folder."""

    number: int
    params: Mapping[str, Scalar]
    argv: tuple[str, ...]
    env: Mapping[str, str]
    host: str
    port: int
    trial_dir: Path
    limits: Limits
    backend: str

    @property
    def log_path(self) -> Path:
        return self.trial_dir / "server.log"


def plan_trial(
    cfg: StudyConfig,
    settings: Settings,
    *,
    number: int,
    trial_dir: Path,
    extra: Sequence[str] = (),
) -> TrialPlan:
    """The plan for one launch of `settings` under the study `cfg`: the command line (with the
    launcher's `extra` arguments), the environment, a port (the fixed one, or one free now)."""
    argv = server_argv(cfg.server, settings, backend=cfg.server.backend, extra=extra)
    return TrialPlan(
        number=number,
        params=settings.params,
        argv=tuple(argv),
        env=dict(cfg.server.env),
        host=cfg.server.host,
        port=cfg.server.port or free_port(cfg.server.host),
        trial_dir=trial_dir,
        limits=cfg.server.limits,
        backend=cfg.server.backend,
    )


@dataclass(frozen=True)
class Startup:
    """How the server start ended. `outcome` is an `autotune.logparse.outcome.Outcome` value."""

    outcome: str
    cause: str = ""
    evidence: tuple[str, ...] = ()
    ledger: Mapping[str, object] = field(default_factory=dict)
    seconds: float = 0.0
    sglang_version: str | None = None


@dataclass(frozen=True)
class Load:
    """How the workload went. `outcome` is `ready` when the server survived it."""

    outcome: str
    cause: str = ""
    evidence: tuple[str, ...] = ()
    summary: Mapping[str, object] = field(default_factory=dict)
    throughput_tok_s: float = 0.0
    error_rate: float | None = None
    p99_ttft_ms: float | None = None
    p99_itl_ms: float | None = None
    min_free_gib: float | None = None
    seconds: float = 0.0
    stress_peak_gib: float | None = None
    """GPU memory in use at its peak under load minus what was in use when the load began."""
    growth_gib: float | None = None
    """GPU memory in use after the load minus before it, each read right after `/flush_cache`
    gave the allocator's cached blocks back (`autotune.trial.growth`); None when not measured."""


@dataclass(frozen=True)
class Stop:
    """The teardown: `clean` when every process is gone and the GPU memory came back."""

    clean: bool
    reason: str = ""
    seconds: float = 0.0
    waited: tuple[str, ...] = ()
    """What the teardown waited for (processes after SIGKILL, GPU memory), for the record."""
    log_notes: tuple[str, ...] = ()
    """What happened to the server's log file itself (truncated, deleted and written back)."""
    exit_code: int | None = None
    """The server's main process's return code (negative: the signal that ended it)."""
    sender: str = ""
    """Who sent that signal (`autotune.server.deaths`: autotune, oom_killer, outside, "")."""
    host: tuple[str, ...] = ()
    """What stood in the server's way on the host when it died (a full disk, its port taken)."""


class ServerRun(Protocol):
    """One launched server."""

    def wait_ready(self) -> Startup: ...

    def drive(self, ledger: Mapping[str, object]) -> Load: ...

    def stop(self) -> Stop: ...


class Launcher(Protocol):
    """Starts servers; raises `HarnessError` (or `OSError`) when the machine cannot."""

    def launch(self, plan: TrialPlan) -> ServerRun: ...

    def extra_args(self) -> tuple[str, ...]:
        """Flags the backend adds to every launch (the simulator's GPU-state folder)."""
        ...

    def stop_orphans(self) -> list[str]:
        """Stop servers a killed autotune left running; one line per server handled."""
        ...


@dataclass(frozen=True)
class TrialRecord:
    """What trial.json holds and what the study is told."""

    number: int
    state: str  # complete | fail | interrupted
    outcome: str
    reason: str
    params: Mapping[str, Scalar]
    argv: tuple[str, ...]
    ledger: Mapping[str, object]
    workload: Mapping[str, object]
    capacity_tokens: int
    throughput_tok_s: float
    headroom_gib: float | None
    error_rate: float | None
    p99_ttft_ms: float | None
    p99_itl_ms: float | None
    evidence: tuple[str, ...]
    phases: Mapping[str, float]
    log_path: str
    autotune_version: str
    sglang_version: str | None
    host: str
    backend: str
    fatal: str = ""
    stress_peak_gib: float | None = None
    teardown: tuple[str, ...] = ()
    """What the teardown waited for, and how long each process took to go."""
    log_notes: tuple[str, ...] = ()
    """What happened to server.log itself while the server ran (rotated, deleted)."""
    growth_gib: float | None = None
    """How far the server's footprint grew over the workload, read after flushing the cache
    before and after it (`autotune.trial.growth`); None when a flush or the probe failed."""
    exit_code: int | None = None
    """The server's main process's return code (negative: killed by that signal)."""
    exit_signal: str = ""
    """The signal that ended it (`SIGKILL`), "" when it exited or was never launched."""
    sender: str = ""
    """Who sent that signal: `autotune` (our stop), `oom_killer`, `outside`, "" (none or the
    server itself; `autotune.server.deaths`)."""
    host_state: tuple[str, ...] = ()
    """What stood in the server's way on the host when it died (a full disk, its port held by
    another process)."""

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["argv"] = list(self.argv)
        d["evidence"] = list(self.evidence)
        d["teardown"] = list(self.teardown)
        d["log_notes"] = list(self.log_notes)
        d["host_state"] = list(self.host_state)
        d[keys.GROWTH] = self.growth_gib  # the field bears the key's name
        return d

    def measured(self) -> Measured | None:
        if self.state != "complete":
            return None
        return Measured(
            capacity_tokens=self.capacity_tokens,
            throughput_tok_s=self.throughput_tok_s,
            oom=Outcome.of(self.outcome).is_oom,
            crashed=Outcome.of(self.outcome).is_crash,
            error_rate=self.error_rate,
            headroom_gib=self.headroom_gib,
            p99_ttft_ms=self.p99_ttft_ms,
            p99_itl_ms=self.p99_itl_ms,
        )

    def result(self) -> Result:
        """The study's view: few flat attributes for tables, the whole record under `record`."""
        attrs: dict[str, object] = {
            keys.CAPACITY: self.capacity_tokens,
            keys.THROUGHPUT: self.throughput_tok_s,
            keys.HEADROOM: self.headroom_gib,
            keys.RECORD: _json_safe(self.to_dict()),
        }
        if self.exit_code is not None:
            attrs[keys.EXIT_CODE] = self.exit_code
            attrs[keys.EXIT_SIGNAL] = self.exit_signal
            attrs[keys.SENDER] = self.sender
        return Result(self.state, self.outcome, self.reason, self.measured(), attrs, self.fatal)


Phase = Callable[[str], None]
_BY_OPERATOR = "stopped by the operator"
REASON_CHARS = 160


def run_trial(
    plan: TrialPlan,
    launcher: Launcher,
    *,
    clock: Callable[[], float],
    phase: Phase,
    watch: ClockWatch | None = None,
) -> TrialRecord:
    """Run one trial; never raises for what the server or the machine did. autotune's own clock
    is watched meanwhile (`watch`, a `ClockWatch` by default): a trial it was paused through is
    `disturbed` (`_disturbed`)."""
    with watch or ClockWatch() as seen:
        record = _run_trial(plan, launcher, clock=clock, phase=seen.following(phase))
    return _disturbed(record, seen, plan.limits.pause_s)


def _disturbed(record: TrialRecord, watch: ClockWatch, limit_s: float) -> TrialRecord:
    """A trial during whose launch, startup or workload autotune was paused more than `limit_s`
    in all is a FAIL `disturbed`, whatever the server or the watchdogs said (a stall or a phase
    limit run out while autotune was stopped is not the server's): its point runs again, and its
    reason gives the pause and what was measured. An interrupted trial stays interrupted."""
    why = watch.disturbance(limit_s)
    if not why or record.state == "interrupted":
        return record
    measured = record.reason or record.outcome  # a reason starts with its outcome
    if record.outcome == "ok":
        measured = f"ok, {record.throughput_tok_s:,.0f} tok/s"
    reason = f"{why}; the measurement is not the server's (it measured {measured})"
    return replace(record, state="fail", outcome=str(Outcome.DISTURBED), reason=reason)


def _run_trial(
    plan: TrialPlan, launcher: Launcher, *, clock: Callable[[], float], phase: Phase
) -> TrialRecord:
    private_dir(plan.trial_dir)
    phases: dict[str, float] = {}
    startup: Startup | None = None
    load: Load | None = None
    stop: Stop | None = None
    harness_error = ""
    interrupted = False
    t0 = clock()
    phase("launch")
    try:
        server = launcher.launch(plan)
    except (HarnessError, OSError) as exc:
        return _record(plan, "fail", "harness_error", f"launch failed: {exc}", phases=phases)
    except KeyboardInterrupt:
        return _record(plan, "interrupted", "interrupted", _BY_OPERATOR, phases=phases)
    phases["launch"] = clock() - t0
    try:
        phase("startup")
        startup = server.wait_ready()
        phases["startup"] = startup.seconds
        if startup.outcome == "ready":
            phase("workload")
            load = server.drive(startup.ledger)
            phases["workload"] = load.seconds
    except KeyboardInterrupt:
        interrupted = True
    except (HarnessError, OSError) as exc:
        harness_error = str(exc)
    finally:
        phase("teardown")
        with _signals_deferred() as pending:
            stop = server.stop()
        phases["teardown"] = stop.seconds
    phases["total"] = clock() - t0
    record = _judge(plan, startup, load, interrupted, harness_error, phases)
    record = replace(
        record,
        teardown=stop.waited,
        log_notes=stop.log_notes,
        exit_code=stop.exit_code,
        exit_signal=signal_name(stop.exit_code),
        sender=stop.sender,
        host_state=stop.host,
    )
    if not stop.clean:
        record = replace(record, fatal=f"{FATAL_TEARDOWN}: {stop.reason}")
    elif pending and record.state != "interrupted":
        record = replace(record, fatal=INTERRUPT)
    return record


def _judge(
    plan: TrialPlan,
    startup: Startup | None,
    load: Load | None,
    interrupted: bool,
    harness_error: str,
    phases: dict[str, float],
) -> TrialRecord:
    base = _record(plan, "fail", "", "", phases=phases)
    if startup is not None:
        base = replace(base, ledger=dict(startup.ledger), sglang_version=startup.sglang_version)
    if interrupted:  # the trial keeps the ledger it measured: its pool was real
        ledger = dict(startup.ledger) if startup is not None else _ledger_so_far(plan.log_path)
        return replace(
            base,
            state="interrupted",
            outcome="interrupted",
            reason=_BY_OPERATOR,
            ledger=ledger,
            capacity_tokens=_int(ledger.get("max_total_num_tokens")),
        )
    if harness_error:
        return replace(base, outcome="harness_error", reason=harness_error)
    assert startup is not None
    capacity = _int(startup.ledger.get("max_total_num_tokens"))
    if startup.outcome != "ready":
        state = "complete" if Outcome.of(startup.outcome).is_parameter_result else "fail"
        return replace(
            base,
            state=state,
            outcome=startup.outcome,
            reason=_reason(startup.outcome, startup.cause, startup.evidence),
            capacity_tokens=capacity,
            evidence=startup.evidence,
        )
    assert load is not None
    headroom = load.min_free_gib
    if headroom is None:
        headroom = _float(startup.ledger.get("avail_after_graphs_gib"))
    # Only a server that lived through the workload survived it: autotune never stops one while
    # it serves, so a `stopped` here (a SIGTERM it did not send) is no survival.
    survived = load.outcome == "ready"
    return replace(
        base,
        state="complete" if survived or Outcome.of(load.outcome).is_parameter_result else "fail",
        outcome="ok" if survived else load.outcome,
        reason="" if survived else _reason(load.outcome, load.cause, load.evidence),
        capacity_tokens=capacity,
        workload=dict(load.summary),
        throughput_tok_s=load.throughput_tok_s,
        headroom_gib=headroom,
        error_rate=load.error_rate,
        p99_ttft_ms=load.p99_ttft_ms,
        p99_itl_ms=load.p99_itl_ms,
        evidence=load.evidence,
        stress_peak_gib=load.stress_peak_gib,
        growth_gib=load.growth_gib,
    )


def _record(
    plan: TrialPlan, state: str, outcome: str, reason: str, *, phases: Mapping[str, float]
) -> TrialRecord:
    return TrialRecord(
        number=plan.number,
        state=state,
        outcome=outcome,
        reason=reason,
        params=dict(plan.params),
        argv=(*plan.argv, *address_flags(plan.host, plan.port)),
        ledger={},
        workload={},
        capacity_tokens=0,
        throughput_tok_s=0.0,
        headroom_gib=None,
        error_rate=None,
        p99_ttft_ms=None,
        p99_itl_ms=None,
        evidence=(),
        phases=dict(phases),
        log_path=str(plan.log_path),
        autotune_version=__version__,
        sglang_version=None,
        host=socket.gethostname(),
        backend=plan.backend,
    )


def _ledger_so_far(log_path: Path) -> dict[str, object]:
    """What the log of a start cut short showed of the ledger ({} when it cannot be read)."""
    try:
        with open(log_path, encoding="utf-8", errors="replace", newline="\n") as fh:
            return build_ledger(parse_lines(fh).events).to_dict()
    except OSError:
        return {}


def _reason(outcome: str, cause: str, evidence: tuple[str, ...]) -> str:
    """One line: the outcome, its cause and the start of the deciding log line."""
    text = outcome + (f" ({cause})" if cause else "")
    if not evidence:
        return text
    line = evidence[0] if len(evidence[0]) <= REASON_CHARS else evidence[0][:REASON_CHARS] + "…"
    return f"{text}: {line}"


def _int(v: object) -> int:
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0


def _float(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def private_dir(folder: Path) -> None:
    """Create a trial folder readable by its owner only (0o700), its `trials/` parent too: the
    server's log and the record hold the command line and what the server printed."""
    folder.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder.mkdir(mode=0o700, exist_ok=True)
    os.chmod(folder, 0o700)


def write_record(record: TrialRecord, trial_dir: Path) -> Path:
    """trial.json (owner-only), written atomically (a crash leaves the old file or the new one,
    never half)."""
    return _write_json(_json_safe(record.to_dict()), trial_dir)


def read_record(trial_dir: Path) -> dict[str, object] | None:
    """trial.json as written, None when there is none (or it cannot be read)."""
    try:
        data = json.loads((trial_dir / "trial.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def rewrite_record(trial_dir: Path, record: Mapping[str, object]) -> Path:
    """Replace trial.json with `record` (a dict read with `read_record` and changed)."""
    return _write_json(_json_safe(record), trial_dir)


def _write_json(data: object, trial_dir: Path) -> Path:
    path = trial_dir / "trial.json"
    tmp = path.with_suffix(".json.tmp")
    try:
        private_dir(trial_dir)
        text = json.dumps(data, indent=2, sort_keys=True) + "\n"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        tmp.replace(path)
    except OSError as exc:
        raise HarnessError(f"cannot write {path}: {exc.strerror or exc}") from exc
    return path


def _json_safe(value: object) -> object:
    """Plain JSON types only; NaN and infinities become None (Optuna's storage rejects them)."""
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


@contextmanager
def _signals_deferred() -> Iterator[list[int]]:
    """Hold the stop signals while the server is being stopped; the list says if any came."""
    pending: list[int] = []

    def hold(signum: int, frame: object) -> None:
        pending.append(signum)
        signals.received(signum)

    try:
        previous = {
            s: signal.signal(s, hold)
            for s in STOP_SIGNALS
            if signal.getsignal(s) is not signal.SIG_IGN
        }
    except ValueError:  # not the main thread: nothing to defer
        yield pending
        return
    try:
        yield pending
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


# ------------------------------------------------------------------------------------------------
# The real seam: the server lifecycle (`autotune.server`) and the workload driver (`loadgen`)
# ------------------------------------------------------------------------------------------------

HEADROOM_POLL_S = 0.2
PROBE_ERRORS = (HarnessError, OSError, ValueError)
"""What a GPU probe's snapshot raises when it cannot be read: that sample is missing."""
SETTLE_S = 1.0
"""How long a reading after `/flush_cache` may take to settle: NVML follows the driver at once;
the simulator's GPU-state file is written beside the HTTP answer."""
SETTLE_POLL_S = 0.05
FLUSH_READINGS = 2
"""Flushes (each followed by a settled reading) per measurement of the flushed footprint."""


def live_launcher(cfg: StudyConfig, study_dir: Path) -> LiveLauncher:
    """Servers for real: SGLang with NVML, or the simulator with its GPU-state folder."""

    sim = cfg.server.backend == "sim"
    gpu_dir = study_dir / "sim-gpu"
    probe: GpuProbe = SimProbe(gpu_dir) if sim else NvmlProbe()
    return LiveLauncher(
        workload=cfg.workload,
        limits=cfg.server.limits,
        run_dir=study_dir / "run",
        probe=probe,
        extra=("--sim-gpu-dir", str(gpu_dir)) if sim else (),
        version=None if sim else _installed_sglang(),
        devices=visible_devices({**os.environ, **cfg.server.env}),
        study=cfg.name,
    )


def _installed_sglang() -> str | None:
    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None


class LiveLauncher:
    """`Launcher` over `autotune.server.lifecycle.Server` and `autotune.loadgen.run_workload`."""

    def __init__(
        self,
        *,
        workload: WorkloadSpec,
        limits: Limits,
        run_dir: Path,
        probe: GpuProbe,
        extra: tuple[str, ...],
        version: str | None,
        study: str = "",
        devices: tuple[int, ...] | None = None,
    ) -> None:
        self.workload = workload
        self.devices = devices
        self.limits = limits
        self.run_dir = run_dir
        self.probe = probe
        self._extra = extra
        self._version = version
        self.study = study
        self._api_key = workload.api_key()

    def extra_args(self) -> tuple[str, ...]:
        return self._extra

    def stop_orphans(self) -> list[str]:

        records = [record for _, record in pidfile.records(self.run_dir)]
        lines = stop_orphans(
            self.run_dir, grace_s=self.limits.stop_grace_s, release_s=self.limits.release_s
        )
        for record in records:
            self.scrub(Path(record.log_path))
        if records:
            self._wait_gpus_free()
        return lines

    def _wait_gpus_free(self) -> None:
        """After stopping orphans, give their GPU memory the release time a trial's teardown
        gets (a driver frees a killed process's memory with a lag); if it stays held, the first
        launch's check names the holder."""

        deadline = time.monotonic() + self.limits.release_s
        while time.monotonic() < deadline:
            try:
                if not foreign_holders(self.probe.snapshot(), (), self.devices):
                    return
            except (HarnessError, OSError):
                return
            time.sleep(HEADROOM_POLL_S)

    def scrub(self, log: Path) -> None:
        """Mask the API key in a stopped server's log (SGLang prints it with its arguments)."""

        if self._api_key:
            scrub_file(log, self._api_key)

    def launch(self, plan: TrialPlan) -> ServerRun:

        key = ("--api-key", self._api_key) if self._api_key else ()
        spec = LaunchSpec(
            argv=(*plan.argv, *key),
            log_path=plan.log_path,
            run_dir=self.run_dir,
            host=plan.host,
            port=plan.port,
            env=dict(plan.env),
            api_key=self._api_key,
            study=self.study,
            startup_s=self.limits.startup_s,
            stall_s=self.limits.stall_s,
            stop_grace_s=self.limits.stop_grace_s,
            release_s=self.limits.release_s,
            foreign_gpu="wait" if self.limits.foreign_wait_s > 0 else "refuse",
            foreign_wait_s=self.limits.foreign_wait_s,
        )
        return _LiveRun(Server.launch(spec, self.probe), self)


class _LiveRun:
    def __init__(self, server: Server, launcher: LiveLauncher) -> None:
        self.server = server
        self.launcher = launcher

    def wait_ready(self) -> Startup:
        r = self.server.wait_ready()
        version = r.server_info.get("version") if r.server_info else None
        return Startup(
            outcome=str(r.outcome),
            cause=r.cause,
            evidence=r.evidence,
            ledger=r.ledger.to_dict(),
            seconds=r.seconds,
            sglang_version=str(version) if version else self.launcher._version,
        )

    def drive(self, ledger: Mapping[str, object]) -> Load:
        facts = ServerFacts.from_ledger(ledger)
        target = Target(self.server.base_url, self.launcher._api_key)
        limit_s = self.launcher.limits.workload_s
        before = self._flushed_usage()
        t0 = time.monotonic()
        activity = Activity()

        def is_dead() -> str | None:
            reason = self.server.dead_reason(activity.owed_s())
            if reason is None and time.monotonic() - t0 > limit_s:
                return f"workload ran past server.limits.workload_s ({limit_s:g} s)"
            return reason

        with _FreeMemoryWatch(self.launcher.probe, self.server.spec.devices()) as watch:
            result = run_workload(
                self.launcher.workload, target, facts, is_dead=is_dead, activity=activity
            )
        seconds = time.monotonic() - t0
        death = self.server.check_alive()
        after = None
        if death is None and result.died is None and before is not None:
            after = self._flushed_usage()
        overall = result.overall
        load = Load(
            "ready",
            summary=result.to_dict(),
            throughput_tok_s=float(overall.output_throughput),
            error_rate=overall.error_rate,
            p99_ttft_ms=overall.ttft_ms.p99 if overall.ttft_ms else None,
            p99_itl_ms=overall.itl_ms.p99 if overall.itl_ms else None,
            min_free_gib=watch.min_free_gib,
            seconds=seconds,
            stress_peak_gib=watch.peak_gib,
            growth_gib=footprint_growth_gib(before, after),
        )
        if death is not None:
            return replace(
                load, outcome=str(death.outcome), cause=death.cause, evidence=death.evidence
            )
        if result.died is not None:
            return replace(
                load, outcome="timeout", cause="workload", evidence=(result.died.reason,)
            )
        return load

    def _flushed_usage(self) -> dict[int, int] | None:
        """Memory in use on the server's GPUs right after `/flush_cache` gave the allocator's
        cached blocks back (GPU index -> bytes), the least of `FLUSH_READINGS` flushes (a health
        check's forward may land between a flush and its reading); None when a flush was refused
        or failed, or the probe could not be read. Never raises: the trial goes on without it."""
        spec = self.server.spec
        readings = []
        for _ in range(FLUSH_READINGS):
            if not flush_cache(self.server.base_url, spec.api_key, spec.health_timeout_s).ok:
                return None
            reading = _settled_usage(self.launcher.probe, spec.devices())
            if reading is None:
                return None
            readings.append(reading)
        return least_used(readings)

    def stop(self) -> Stop:
        t = self.server.stop()
        self.launcher.scrub(self.server.spec.log_path)
        return Stop(
            clean=t.clean,
            reason="; ".join(t.problems),
            seconds=t.seconds,
            waited=t.waited,
            log_notes=self.server.log.notes,
            exit_code=t.exit_code,
            sender=t.sender,
            host=t.host,
        )


def _settled_usage(probe: GpuProbe, devices: tuple[int, ...] | None) -> dict[int, int] | None:
    """Bytes in use per selected GPU once two successive readings agree (or `SETTLE_S` passed);
    None when the probe cannot be read."""
    deadline = time.monotonic() + SETTLE_S
    last: dict[int, int] | None = None
    while True:
        try:
            snapshot = probe.snapshot()
        except PROBE_ERRORS:
            return None
        now = {g.index: g.used for g in snapshot if devices is None or g.index in devices}
        if now == last or time.monotonic() >= deadline:
            return now
        last = now
        time.sleep(SETTLE_POLL_S)


class _FreeMemoryWatch:
    """Samples the GPU probe in a thread; `min_free_gib` is the least free memory seen on the
    server's GPUs (those it holds memory on) while the workload ran: the measured headroom."""

    def __init__(self, probe: GpuProbe, devices: tuple[int, ...] | None) -> None:
        self._probe = probe
        self._devices = devices
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="headroom", daemon=True)
        self.min_free_gib: float | None = None
        self._first_used: dict[int, int] = {}
        self._max_used: dict[int, int] = {}

    @property
    def peak_gib(self) -> float | None:
        """The transient peak: the most memory in use minus what was in use at the start."""
        rises = [self._max_used[i] - first for i, first in self._first_used.items()]
        return max(rises) / 2**30 if rises else None

    def __enter__(self) -> _FreeMemoryWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            self._sample()
            if self._stop.wait(HEADROOM_POLL_S):
                return

    def _sample(self) -> None:
        try:
            snapshot = self._probe.snapshot()
        except PROBE_ERRORS:
            return
        gpus = [g for g in snapshot if self._devices is None or g.index in self._devices]
        busy = [g for g in gpus if g.used > 0] or gpus
        for g in busy:
            self._first_used.setdefault(g.index, g.used)
            self._max_used[g.index] = max(self._max_used.get(g.index, 0), g.used)
        if busy:
            free = min(g.free for g in busy) / 2**30
            self.min_free_gib = free if self.min_free_gib is None else min(self.min_free_gib, free)
