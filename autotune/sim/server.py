"""One simulated SGLang server process: GPU state, startup, serving, signals and death.

The startup stages live in `StartupSequence`; this module runs them, then the HTTP server and
the scheduler. Once uvicorn's lines are out, SIGTERM stops the server like uvicorn (exit 0) until
the first request (warm-up included); after it, like SGLang's TokenizerManager: drain, then
0.5.9 SIGKILLs itself (rc −9) while 0.5.23 shuts the schedulers down, stops uvicorn and exits 0.
A runtime OOM prints the scheduler's exception and the main process's SIGQUIT line, then SIGKILLs
the process, as SGLang's kill_process_tree does. A scheduler killed after startup (the
`oom-kill` fault) is noticed by 0.5.23's SubprocessWatchdog, which brings the tree down; 0.5.9
keeps serving HTTP with a dead scheduler. A port another process holds fails the bind as uvicorn
on uvloop does, and SGLang's warm-up thread then gives up and kills the tree (`_bind_failed`).
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import NoReturn

from aiohttp import web

from autotune.sim import faults as faultmod
from autotune.sim import gpustate
from autotune.sim.flags import CommandLine, ServerSettings
from autotune.sim.httpapi import ServerState, build_app
from autotune.sim.loglines import fmt_bind_failed, fmt_warmup_gave_up, fmt_watchdog_crash, lines_for
from autotune.sim.logwriter import LogWriter
from autotune.sim.memplan import StartupPlan
from autotune.sim.profiles import Profile
from autotune.sim.scheduler import Request, Scheduler
from autotune.sim.serverargs import resolved_args
from autotune.sim.sizing import GiB
from autotune.sim.startup import StartupSequence
from autotune.sim.tokens import encode
from autotune.sim.versions import get_version

DRAIN_POLL_S = 1.0
HEARTBEAT_S = 0.5
WATCHDOG_INTERVAL_S = 1.0


def visible_gpus(env: Mapping[str, str], tp: int, gpu_count: int) -> list[int]:
    """Simulated GPU indices this server uses (CUDA_VISIBLE_DEVICES, else 0..tp-1)."""
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None or raw.strip() == "":
        return list(range(min(tp, gpu_count))) if raw is None else []
    out = []
    for part in raw.split(","):
        part = part.strip()
        if part.isdigit() and int(part) < gpu_count:
            out.append(int(part))
        else:
            break
    return out[:tp]


class SimServer(StartupSequence):
    """Runs one server; never returns normally on SGLang's kill paths."""

    def __init__(
        self,
        cmd: CommandLine,
        profile: Profile,
        env: Mapping[str, str],
        log: LogWriter | None = None,
    ) -> None:
        self.cmd = cmd
        self.s: ServerSettings = cmd.settings
        self.profile = profile
        self.env = env
        self.faults = faultmod.resolve(cmd.sim)
        self.release = get_version(cmd.sim.version)
        self.lines = lines_for(self.release.name)
        self.timings: dict[str, float] = {}
        self.graph_times: dict[str, float] = {}
        self.argv = cmd.argv
        self.log = log or LogWriter(self.s.tp_size)
        self.scale = cmd.sim.time_scale
        self.pid = os.getpid()
        self.gpus = visible_gpus(env, self.s.tp_size, profile.hardware.gpu_count)
        self.writer: gpustate.GpuStateWriter | None = None
        self.plan: StartupPlan | None = None
        self.state: ServerState | None = None
        self.static_gib = 0.0
        self.runner: web.AppRunner | None = None
        self.stop_event: asyncio.Event | None = None
        self.exit_code = 0

    # ---- entry --------------------------------------------------------------------------------

    def run(self) -> int:
        """Run the server until it ends and return its exit code (130 on Ctrl-C, its GPU entry
        released); SGLang's kill paths end the process instead of returning."""
        if self.faults.ignore_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            asyncio.run(self._main())
        except KeyboardInterrupt:
            if self.writer is not None:
                self.writer.release()
            return 130
        return self.exit_code

    async def _main(self) -> None:
        heartbeat = None
        if self.cmd.sim.gpu_dir:
            directory = Path(self.cmd.sim.gpu_dir)
            try:
                directory.mkdir(parents=True, exist_ok=True)
            except OSError as exc:  # a full disk: the state files are written once it has room
                if exc.errno not in gpustate.DISK_FULL:
                    raise
            gpustate.prune(directory)
            total = self.profile.hardware.gpu_memory_mib * (1 << 20)
            gpustate.write_inventory(
                directory, dict.fromkeys(range(self.profile.hardware.gpu_count), total)
            )
            self.writer = gpustate.GpuStateWriter(
                directory, self.pid, dict.fromkeys(self.gpus, total), self.faults.hold_gpu_s
            )
            if self.faults.hold_gpu_s:
                heartbeat = asyncio.create_task(self._heartbeat())
        await self._startup()
        await self._serve()
        if heartbeat is not None:
            heartbeat.cancel()

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            if self.writer is not None:
                self.writer.heartbeat()

    # ---- startup ------------------------------------------------------------------------------

    async def _serve(self) -> None:
        plan = self.plan
        assert plan is not None
        self.stop_event = asyncio.Event()
        state = self._server_state(plan)
        self.state = state
        runner = await self._start_http(state)
        if not self.faults.ignore_sigterm:
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, self._sigterm)
        sched_task = asyncio.create_task(state.scheduler.run())
        await self.phase(self.profile.startup.server_start_s)
        if not self.s.skip_server_warmup:
            await self._warmup(state)
        state.status = "Up"
        self.log.main("The server is fired up and ready to roll!")
        killer = None
        if self.faults.oom_kill_after_s is not None:
            killer = asyncio.create_task(self._oom_kill(self.faults.oom_kill_after_s))
        await self.stop_event.wait()
        if killer is not None:
            killer.cancel()
        state.scheduler.stop()
        sched_task.cancel()
        await runner.cleanup()

    def _server_state(self, plan: StartupPlan) -> ServerState:
        """The scheduler around the plan, and what the HTTP side shares with this process."""
        s = self.s
        scheduler = Scheduler(
            self.profile,
            plan,
            seed=self.cmd.sim.seed,
            log=self.log,
            decode_log_interval=s.decode_log_interval,
            schedule_conservativeness=s.schedule_conservativeness,
            radix_cache=not s.disable_radix_cache,
            on_oom=self._runtime_oom,
            on_peak=self._on_peak,
            lines=self.lines,
        )
        return ServerState(
            settings=s,
            profile=self.profile,
            plan=plan,
            scheduler=scheduler,
            log=self.log,
            faults=self.faults.health_faults,
            on_first_request=self._first_request,
            release=self.release,
            resolved_args=resolved_args(self.release, s, plan, self.cmd.sim.seed),
            launch_command=" ".join(self.argv),
            startup_time=self.engine_startup_time(),
        )

    async def _start_http(self, state: ServerState) -> web.AppRunner:
        """Bind the HTTP server with uvicorn's lines; a port in use ends the process
        (`_bind_failed`)."""
        s = self.s
        runner = web.AppRunner(build_app(state), access_log=None, handle_signals=False)
        self.runner = runner
        await runner.setup()
        site = web.TCPSite(runner, s.host, s.port, reuse_address=True)
        self.log.uvicorn(f"Started server process [{self.pid}]")
        self.log.uvicorn("Waiting for application startup.")
        self.log.uvicorn("Application startup complete.")
        try:
            await site.start()
        except OSError as exc:
            await self._bind_failed(exc)
        self.log.uvicorn(f"Uvicorn running on http://{s.host}:{s.port} (Press CTRL+C to quit)")
        return runner

    async def _bind_failed(self, exc: OSError) -> NoReturn:
        """The port could not be bound (another process holds it), as SGLang behind uvicorn
        and uvloop ends: uvicorn's `Server.startup` logs the error (uvloop's `create_server`
        text: `[Errno 98] error while attempting to bind on address ('H', P): address already in
        use`), runs the lifespan shutdown and calls `sys.exit(1)`. SGLang's lifespan shutdown
        (`entrypoints/http_server.py`, `lifespan`) first joins its warm-up thread, which began
        before the bind and waits for `/model_info` on that port (`_execute_server_warmup`: 120
        tries a second apart, each up to 5 s), then gives up: `Initialization failed. warmup
        error: …` and `kill_process_tree(os.getpid())`, a SIGKILL of the whole server. With
        `--skip-server-warmup` there is no such thread: the shutdown completes and
        `launch_server.py`'s `finally: kill_process_tree(os.getpid(), include_parent=False)`
        leaves the process to exit 1. The warm-up's wait is scaled by the time scale."""
        s = self.s
        # asyncio's error already says "error while attempting to bind…"; uvloop words it once
        reason = os.strerror(exc.errno).lower() if exc.errno else str(exc)
        self.log.uvicorn(fmt_bind_failed(exc.errno, s.host, s.port, reason), level="ERROR")
        self.log.uvicorn("Waiting for application shutdown.")
        if s.skip_server_warmup:
            self.log.uvicorn("Application shutdown complete.")
            self.kill_tree(include_parent=False)
            self.die(1)
        answered = await self._someone_listens(s.host, s.port)
        per_try = 1.0 + (5.0 if answered else 0.0)  # a listener that never answers: read timeout
        await asyncio.sleep(120 * per_try / self.scale)
        self.log.main(fmt_warmup_gave_up(s.host, s.port, answered))
        self.kill_tree()
        self.die()

    @staticmethod
    async def _someone_listens(host: str, port: int) -> bool:
        """Whether a connection to `host:port` is accepted (the warm-up's request would then wait
        for an answer rather than be refused)."""
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 1.0)
        except (OSError, TimeoutError):
            return False
        writer.close()
        return True

    async def _warmup(self, state: ServerState) -> None:
        self.log.access("127.0.0.1:0", "GET", "/model_info", 200)
        self._first_request()
        req = Request("WARMUP", encode("The capital city of France is"), 8)
        state.scheduler.submit(req)
        while not req.finished:
            await req.event.wait()
            req.event.clear()
        await self.phase(self.profile.startup.warmup_s)
        self.log.access("127.0.0.1:0", "POST", "/generate", 200)

    def _first_request(self) -> None:
        if self.state is not None:
            self.state.first_request_seen = True

    def _on_peak(self, peak: float) -> None:
        """The GPU state shows the static memory plus what the allocator holds: the high-water
        mark of the forwards, or after a `/flush_cache` only the growth while serving."""
        if self.writer is not None:
            self.writer.set_all(int((self.static_gib + peak) * GiB))

    def _runtime_oom(self, kind: str, peak: float, free: float) -> None:
        tried = max(peak * 0.4, peak - free + 0.01)
        remaining = max(free - (peak - tried), 0.01)
        remaining = min(remaining, tried * 0.9)
        self.scheduler_exception(
            list(range(self.s.tp_size)), self.lines.run_frames, self.oom_text(tried, remaining)
        )
        self._sigquit_from_child()

    def _sigquit_from_child(self) -> NoReturn:
        """The main process's SIGQUIT handler: the running-phase one once a request installed it
        (warm-up included), else the launch-phase one; then the whole tree is killed."""
        if self.state is not None and self.state.first_request_seen:
            self.log.main(
                "SIGQUIT received. signum=None, frame=None. It usually means one child failed."
            )
        else:
            self.log.main(
                "Received sigquit from a child process. It usually means the child failed."
            )
        self.kill_tree()
        self.die()

    async def _oom_kill(self, after_s: float) -> None:
        """The `oom-kill` fault: the OS OOM killer SIGKILLs scheduler rank 0 while serving."""
        await asyncio.sleep(after_s)
        state = self.state
        assert state is not None
        if self.release.subprocess_watchdog:
            await asyncio.sleep(WATCHDOG_INTERVAL_S)
            self.log.main(fmt_watchdog_crash("scheduler_0", self.pid + 1, -9))
            self._sigquit_from_child()
        state.scheduler.stop()
        if self.writer is not None and self.gpus:
            used = int(self.static_gib * GiB)
            self.writer.set_used({g: (0 if i == 0 else used) for i, g in enumerate(self.gpus)})

    # ---- signals ------------------------------------------------------------------------------

    def _uvicorn_stop(self) -> None:
        """uvicorn's shutdown, then launch_server's `finally: kill_process_tree(...)`: exit 0."""
        self.log.uvicorn("Shutting down")
        self.log.uvicorn("Waiting for application shutdown.")
        self.log.uvicorn("Application shutdown complete.")
        self.log.uvicorn(f"Finished server process [{self.pid}]")
        self.kill_tree(include_parent=False)
        if self.writer is not None:
            self.writer.release()
        self.exit_code = 0
        if self.stop_event is not None:
            self.stop_event.set()

    def _sigterm(self) -> None:
        state = self.state
        if state is None or not state.first_request_seen:
            self._uvicorn_stop()
            return
        if state.status == "ShuttingDown":
            return
        self.log.main(
            "SIGTERM received. signum=15 frame=None. Draining requests and shutting down..."
        )
        unhealthy = state.status == "UnHealthy"
        forced = self.env.get("SGL_FORCE_SHUTDOWN") == "1"
        state.status = "ShuttingDown"
        if self.release.graceful_exit_code is not None:
            asyncio.get_running_loop().create_task(self._drain_and_stop(unhealthy, forced))
            return
        if unhealthy or forced:
            self.die()
        asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        state = self.state
        assert state is not None
        sch = state.scheduler
        for _ in range(100_000):
            if not sch.busy:
                break
            rids = [r.rid for r in list(sch.running) + list(sch.waiting) if not r.health]
            self.log.main(
                f"Gracefully exiting... Remaining number of requests {len(rids)}. "
                f"Remaining requests remaining_rids={rids}."
            )
            await asyncio.sleep(DRAIN_POLL_S)
        self.die()

    async def _drain_and_stop(self, unhealthy: bool, forced: bool) -> None:
        """0.5.23's sigterm_watchdog: drain (or force), ShutdownReq to the schedulers, then the
        uvicorn stop hook; the process exits with the release's graceful code."""
        state = self.state
        assert state is not None
        sch = state.scheduler
        await asyncio.sleep(DRAIN_POLL_S)
        if unhealthy:
            self.log.main("Signal SIGTERM received while health check failed. Force exiting.")
        elif forced:
            self.log.main("Signal SIGTERM received while force shutdown flag set. Force exiting.")
        else:
            for _ in range(100_000):
                rids = [r.rid for r in list(sch.running) + list(sch.waiting) if not r.health]
                self.log.main(
                    f"Gracefully exiting... Remaining number of requests {len(rids)}. "
                    f"Remaining requests remaining_rids={rids}."
                )
                if not sch.busy:
                    break
                await asyncio.sleep(DRAIN_POLL_S)
        sch.stop()
        self.kill_tree(include_parent=False)
        self._uvicorn_stop()
        code = self.release.graceful_exit_code
        self.exit_code = 0 if code is None else code
