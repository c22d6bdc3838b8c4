"""The live launcher: `trial.seam`'s `Launcher` implemented with the real server lifecycle
(`autotune.server.lifecycle.Server`) and workload driver (`autotune.loadgen.run_workload`), the
one place a trial calls them. SGLang runs with NVML as its GPU probe, the simulator with its
GPU-state folder.

Kept apart from the trial's control flow (`trial.run`) and its decisions (`trial.judge`), which
are tested with fakes of the seam; this module is what those fakes stand for.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path

from autotune.config.schema import Limits, StudyConfig
from autotune.errors import HarnessError
from autotune.loadgen import Activity, ServerFacts, Target, WorkloadSpec, run_workload
from autotune.loadgen.apis import api_named
from autotune.logparse.outcome import STOPPED_FROM_OUTSIDE, Outcome
from autotune.masking import scrub_file
from autotune.server import pidfile
from autotune.server.gpu import GpuProbe, NvmlProbe, SimProbe, foreign_holders, visible_devices
from autotune.server.health import flush_cache
from autotune.server.launchspec import LaunchSpec
from autotune.server.lifecycle import Server
from autotune.server.teardown import stop_orphans
from autotune.sim.gpustate import kernel_log
from autotune.trial.gpuwatch import HEADROOM_POLL_S, FreeMemoryWatch, settled_usage
from autotune.trial.growth import footprint_growth_gib, least_used
from autotune.trial.judge import refusal, request_errors
from autotune.trial.plan import TrialPlan
from autotune.trial.seam import Load, ServerRun, Startup, Stop
from autotune.trial.stopwatch import StopWatch

FLUSH_READINGS = 2
"""Flushes (each followed by a settled reading) per measurement of the flushed footprint."""
FOREIGN_GPU = "foreign_gpu"
"""The cause of a machine error where a process autotune did not start took memory on the
server's GPUs while it started or served (`trial.gpuwatch.FreeMemoryWatch.intruders`)."""


def live_launcher(cfg: StudyConfig, study_dir: Path) -> LiveLauncher:
    """Servers for real: SGLang with NVML, or the simulator with its GPU-state folder; a
    `workload.api` no registered API answers to is refused here, before anything is launched."""

    api_named(cfg.workload.api)
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
        kernel_log=kernel_log(gpu_dir) if sim else None,
    )


def _installed_sglang() -> str | None:
    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None


@dataclass(eq=False, kw_only=True)
class LiveLauncher:
    """`Launcher` over `autotune.server.lifecycle.Server` and `autotune.loadgen.run_workload`.

    It owns what every launch of the study shares: the workload and time limits, the run folder
    the pidfiles go in, the GPU probe, the flags added to every launch (`extra`), the installed
    SGLang version (recorded when a server does not report its own), the study's name and the
    GPUs it may use; the API key is read from the workload once, and kept out of the repr."""

    workload: WorkloadSpec
    limits: Limits
    run_dir: Path
    probe: GpuProbe
    extra: tuple[str, ...]
    version: str | None
    study: str = ""
    devices: tuple[int, ...] | None = None
    kernel_log: Path | None = None
    """The simulated machine's kernel log (None: the host's own kernel)."""
    _api_key: str | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._api_key = self.workload.api_key()

    def extra_args(self) -> tuple[str, ...]:
        """The flags added to every launch (the simulator's GPU-state folder), as the launcher was
        given them."""
        return self.extra

    def stop_orphans(self) -> list[str]:
        """Stop the servers a killed autotune left under the run folder (their pidfiles), mask their
        logs, and wait for their GPUs to be free before the first launch; one line per server
        handled."""

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
        """Launch `plan`'s server through the lifecycle, with the API key, the study's time limits
        and the foreign-GPU policy (wait when `foreign_wait_s` allows it, else refuse)."""

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
            kernel_log=self.kernel_log,
        )
        return _LiveRun(Server.launch(spec, self.probe), self, plan.stress_repeats)


class _LiveRun:
    def __init__(self, server: Server, launcher: LiveLauncher, stress_repeats: int = 1) -> None:
        self.server = server
        self.launcher = launcher
        self.stress_repeats = stress_repeats

    def wait_ready(self) -> Startup:
        """The start, watched for GPU memory another process takes meanwhile: it moves the free
        memory SGLang sizes the KV pool from (or ends the start), so the start is then a machine
        error whatever it printed, and the point runs again."""
        devices = self.server.spec.devices()
        with FreeMemoryWatch(self.launcher.probe, devices, self.server.own_pids) as watch:
            r = self.server.wait_ready()
        version = r.server_info.get("version") if r.server_info else None
        started = Startup(
            outcome=str(r.outcome),
            cause=r.cause,
            evidence=r.evidence,
            ledger=r.ledger.to_dict(),
            seconds=r.seconds,
            sglang_version=str(version) if version else self.launcher.version,
        )
        intruders = watch.intruders(while_="the server started")
        if not intruders:
            return started
        ended = f"the start then ended: {r.outcome}" + (f" ({r.cause})" if r.cause else "")
        return replace(
            started,
            outcome=str(Outcome.MACHINE_ERROR),
            cause=FOREIGN_GPU,
            evidence=(*intruders, ended, *r.evidence),
        )

    def drive(self, ledger: Mapping[str, object]) -> Load:
        """The study's workload, its stress phases run as many times as the plan asks, within
        `workload_s` for each pass (the limit watches for a workload that never ends)."""
        workload, limit_s = self.launcher.workload.stress_passes(
            self.launcher.limits.workload_s, self.stress_repeats
        )
        return self.drive_workload(ledger, workload, limit_s)

    def rest(self) -> str:
        """The server brought to rest between two workloads on one launch: alive, its cache
        flushed (`/flush_cache`, asked again while requests drain: `server.health.flush_cache`)
        and its GPUs' usage settled (`trial.gpuwatch.settled_usage`); "" at rest, else why not."""
        death = self.server.check_alive()
        if death is not None:
            return f"the server ended ({death.outcome})"
        spec = self.server.spec
        answer = flush_cache(self.server.base_url, spec.api_key, spec.health_timeout_s)
        if not answer.ok:
            return f"/flush_cache answered {answer.status or 'nothing'}: {answer.detail}"
        if settled_usage(self.launcher.probe, spec.devices()) is None:
            return "the GPU probe could not be read"
        return ""

    def drive_workload(
        self, ledger: Mapping[str, object], workload: WorkloadSpec, limit_s: float
    ) -> Load:
        facts = ServerFacts.from_ledger(ledger)
        target = Target(self.server.base_url, self.launcher._api_key)
        before = self._flushed_usage()
        t0 = time.monotonic()
        activity = Activity()

        def is_dead() -> str | None:
            reason = self.server.dead_reason(activity.owed_s(), streamed=activity.streamed())
            if reason is None and time.monotonic() - t0 > limit_s:
                return f"workload ran past server.limits.workload_s ({limit_s:g} s)"
            return reason

        ours = self.server.own_pids
        with (
            FreeMemoryWatch(self.launcher.probe, self.server.spec.devices(), ours) as watch,
            StopWatch(ours()) as stops,
        ):
            result = run_workload(
                workload,
                target,
                facts,
                is_dead=is_dead,
                activity=activity,
                headroom=lambda: watch.min_free_gib,
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
        intruders = watch.intruders(while_="the workload ran")
        if intruders:
            # another process took memory on the server's GPUs: the free memory, the peak and
            # any death under load are not the parameters' own, so the point runs again
            ended = (f"the server then ended: {death.outcome} ({death.cause})",) if death else ()
            return replace(
                load,
                outcome=str(Outcome.MACHINE_ERROR),
                cause=FOREIGN_GPU,
                evidence=(*intruders, *ended, *(death.evidence if death else ())),
            )
        stopped = stops.stops()
        if stopped and death is None:
            # the server was paused from outside and resumed: it lived, but every figure the
            # workload measured holds the pause, so the point runs again
            return replace(
                load,
                outcome=str(Outcome.DISTURBED),
                cause=STOPPED_FROM_OUTSIDE,
                evidence=(*stopped, *request_errors(overall)),
            )
        if death is not None:
            return replace(
                load, outcome=str(death.outcome), cause=death.cause, evidence=death.evidence
            )
        if result.died is not None:
            return replace(
                load, outcome="timeout", cause="workload", evidence=(result.died.reason,)
            )
        refused = refusal(overall, pool_limits_input=facts.pool_limits_input)
        if refused is not None:
            return replace(
                load, outcome=str(Outcome.REFUSED), cause=refused[0], evidence=refused[1]
            )
        return replace(load, evidence=request_errors(overall))

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
            reading = settled_usage(self.launcher.probe, spec.devices())
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
