"""One simulated SGLang server: the main process's GPU state, startup, serving, signals and death,
over a tree of real child processes (`tree`: one scheduler per TP rank and a detokenizer).

The startup stages live in `StartupSequence`, the ways the tree dies in `deaths.ServerDeaths`;
this module runs them, then the HTTP server and the scheduler. Once uvicorn's lines are out,
SIGTERM stops the server like uvicorn (exit 0) until the first request (warm-up included); after
it, like SGLang's TokenizerManager: drain, then 0.5.9 SIGKILLs itself (rc −9) while 0.5.23
shuts the schedulers down, stops uvicorn and exits 0.
A runtime OOM makes every scheduler process print its exception and SIGQUIT the main process,
whose handler logs its SIGQUIT line, SIGKILLs the children and then itself, as SGLang's
kill_process_tree does. A scheduler process that dies after startup (the `oom-kill` and
`rank-dies` faults) is noticed by 0.5.23's SubprocessWatchdog (a poll of the children every
second), which logs it and SIGQUITs the main process; 0.5.9 keeps serving HTTP with a dead
scheduler, and where a batch was running its peers' watchdogs end the tree after
`--watchdog-timeout`. A port another process holds fails the bind as uvicorn
on uvloop does, and SGLang's warm-up thread then gives up and kills the tree (`_bind_failed`).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import NoReturn

from aiohttp import web

from autotune.sim import faults as faultmod
from autotune.sim import gpustate
from autotune.sim.flags import CommandLine, ServerSettings
from autotune.sim.httpapi import ServerState, build_app
from autotune.sim.loglines import (
    fmt_bind_failed,
    fmt_scheduler_watchdog,
    fmt_segfault,
    fmt_warmup_gave_up,
    fmt_watchdog_crash,
    lines_for,
)
from autotune.sim.logwriter import LogWriter
from autotune.sim.profiles import Profile
from autotune.sim.scheduler import Request, Scheduler
from autotune.sim.serverargs import resolved_args
from autotune.sim.sizing import GiB
from autotune.sim.startup import StartupSequence
from autotune.sim.startupplan import StartupPlan
from autotune.sim.tokens import encode
from autotune.sim.tree import STAMP, ProcessTree, RankMemory
from autotune.sim.versions import get_version

DRAIN_POLL_S = 1.0
HEARTBEAT_S = 0.5
FOREIGN_READ_S = 0.25
"""How often a serving server re-reads what other processes hold on its GPUs."""
WATCHDOG_INTERVAL_S = 1.0
"""SubprocessWatchdog's poll (utils/watchdog.py, `interval=1.0`), in real seconds."""
WATCHDOG_QUIT_S = 5.0
"""A scheduler's watchdog waits this long after its line before SIGQUIT (`time.sleep(5)`)."""
WATCHDOG_QUIT_MIN_S = 0.2
"""However fast the time scale, the wait stays long enough for every rank to be scheduled."""


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
        self.log.reworded = self.faults.reword_log
        self.scale = cmd.sim.time_scale
        self.pid = os.getpid()
        self.gpus = visible_gpus(env, self.s.tp_size, profile.hardware.gpu_count)
        self.tree = ProcessTree([])
        self.memory: RankMemory | None = None
        self.machine_dir = Path(cmd.sim.gpu_dir) if cmd.sim.gpu_dir else None
        self.running_phase = False
        self.stopping = False
        self.plan: StartupPlan | None = None
        self.state: ServerState | None = None
        self.static_gib = 0.0
        self._foreign_at_plan: list[float] = [0.0] * len(self.gpus)
        self._foreign_taken = 0.0
        self._foreign_read_at = float("-inf")
        self.runner: web.AppRunner | None = None
        self.stop_event: asyncio.Event | None = None
        self.exit_code = 0

    # ---- entry --------------------------------------------------------------------------------

    def run(self) -> int:
        """Start the tree (`ProcessTree.spawn`: the schedulers and the detokenizer, forked before
        the event loop exists), run the server until it ends and return its exit code (130 on
        Ctrl-C, its GPU entries released); SGLang's kill paths end the process instead of
        returning. However it returns, no child is left (launch_server's `finally:
        kill_process_tree(os.getpid(), include_parent=False)`)."""
        self.tree = ProcessTree.spawn(self.s.tp_size, orphan=self.faults.orphan_scheduler)
        if self.faults.ignore_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            asyncio.run(self._main())
        except KeyboardInterrupt:
            if self.memory is not None:
                self.memory.release()
            return 130
        finally:
            self.tree.kill(wait_s=5.0)
        return self.exit_code

    async def _main(self) -> None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGQUIT, self.sigquit_received)
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
            self.memory = RankMemory(directory, self.tree, self.gpus, total, self.faults.hold_gpu_s)
            if self.faults.hold_gpu_s:
                heartbeat = asyncio.create_task(self._heartbeat())
        await self._startup()
        await self._serve()
        if heartbeat is not None:
            heartbeat.cancel()

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            if self.memory is not None:
                self.memory.heartbeat()

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
        watchdog = None
        if self.release.subprocess_watchdog:
            watchdog = asyncio.create_task(self._subprocess_watchdog())
        await self.phase(self.profile.startup.server_start_s)
        if not self.s.skip_server_warmup:
            await self._warmup(state)
        state.status = "Up"
        self.log.main("The server is fired up and ready to roll!")
        killers = []
        if self.faults.oom_kill_after_s is not None:
            killers.append(asyncio.create_task(self._oom_kill(self.faults.oom_kill_after_s)))
        if self.faults.rank_dies_after_s is not None:
            killers.append(asyncio.create_task(self._rank_dies(self.faults.rank_dies_after_s)))
        await self.stop_event.wait()
        for task in (*killers, *([watchdog] if watchdog is not None else [])):
            task.cancel()
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
            foreign_gib=self._foreign_taken_gib if self.memory is not None else None,
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
        self.running_phase = True
        if self.state is not None:
            self.state.first_request_seen = True

    def _foreign_taken_gib(self) -> float:
        """The most GPU memory other processes took on one of this server's GPUs since its
        startup planned around what they held then (re-read at most every `FOREIGN_READ_S`)."""
        now = time.monotonic()
        if now - self._foreign_read_at < FOREIGN_READ_S:
            return self._foreign_taken
        self._foreign_read_at = now
        assert self.memory is not None
        ours = {self.pid, *self.tree.pids}
        used = gpustate.foreign_used_bytes(self.memory.directory, self.gpus, ours)
        rise = [b / GiB - before for b, before in zip(used, self._foreign_at_plan, strict=False)]
        self._foreign_taken = max([0.0, *rise])
        return self._foreign_taken

    def _on_peak(self, peak: float) -> None:
        """The GPU state shows the static memory plus what the allocator holds: the high-water
        mark of the forwards, or after a `/flush_cache` only the growth while serving."""
        if self.memory is not None:
            self.memory.set_all(int((self.static_gib + peak) * GiB))

    def _runtime_oom(self, kind: str, peak: float, free: float) -> None:
        """A forward ran out of GPU memory: every scheduler process prints torch's error and
        SIGQUITs the main process, whose handler (`sigquit_received`) ends the tree."""
        tried = max(peak * 0.4, peak - free + 0.01)
        remaining = max(free - (peak - tried), 0.01)
        remaining = min(remaining, tried * 0.9)
        self.scheduler_exception(
            list(range(self.s.tp_size)), self.lines.run_frames, self.oom_text(tried, remaining)
        )
        asyncio.get_running_loop().create_task(self.until_sigquit())

    async def _subprocess_watchdog(self) -> None:
        """0.5.23's `SubprocessWatchdog`, started once every scheduler reported ready: every
        second it looks at each child (the schedulers, then the detokenizer); the first that ended
        with a non-zero code is logged (`Subprocess scheduler_i (pid=P) crashed with exit code
        C. Triggering SIGQUIT for cleanup...`) and the main process SIGQUITs itself
        (`_check_processes`: `os.kill(os.getpid(), signal.SIGQUIT)`)."""
        while not self.stopping:
            await asyncio.sleep(WATCHDOG_INTERVAL_S)
            if self.stopping:
                return
            crashed = self.tree.crashed()
            if crashed:
                child = crashed[0]
                self.log.main(fmt_watchdog_crash(child.name, child.pid, child.exit_code or 0))
                os.kill(self.pid, signal.SIGQUIT)
                return

    async def _oom_kill(self, after_s: float) -> None:
        """The `oom-kill` fault: the OS OOM killer SIGKILLs scheduler rank 0's process while
        serving; its memory goes with it. 0.5.23's SubprocessWatchdog takes it from there;
        0.5.9 keeps its HTTP front, and the schedulers stop (rank 0 is the one that receives the
        requests), with the peers' watchdogs armed if a batch was running."""
        await asyncio.sleep(after_s)
        state = self.state
        assert state is not None
        busy = state.scheduler.busy
        state.scheduler.stop()
        self.tree.oom_killed(0)
        if not self.release.subprocess_watchdog and busy:
            self._arm_watchdogs([r for r in range(1, self.s.tp_size)])

    async def _rank_dies(self, after_s: float) -> None:
        """The `rank-dies` fault: the last TP rank's scheduler process dies of a segfault
        (faulthandler's lines, exit code -11) while its peers wait in the collective it never
        joins. 0.5.23's SubprocessWatchdog reports it; 0.5.9 has none, so the peers' scheduler
        watchdogs fire `--watchdog-timeout` after a batch began (at once if one runs)."""
        await asyncio.sleep(after_s)
        state = self.state
        assert state is not None
        rank = self.s.tp_size - 1
        state.scheduler.stop()  # every rank waits in the collective of the next forward
        self.tree.die(rank, signal.SIGSEGV, fmt_segfault())
        if self.release.subprocess_watchdog or rank == 0:
            return
        while not state.scheduler.busy:
            await asyncio.sleep(0.02)
        self._arm_watchdogs(list(range(rank)))

    def _arm_watchdogs(self, ranks: list[int]) -> None:
        """The scheduler watchdog of each of `ranks` (`WatchdogRaw`, active while a batch runs):
        after `--watchdog-timeout` (scaled) without a forward it logs `Scheduler watchdog timeout
        (…)` and, 5 s (scaled) later, SIGQUITs the main process."""
        text = fmt_scheduler_watchdog(self.s.watchdog_timeout)
        texts = {r: self.log.rank_text(r, text, stamp=STAMP) for r in ranks}
        after = self.s.watchdog_timeout / self.scale
        # every peer's line is out before the first SIGQUIT, as SGLang's 5 s make sure of
        self.tree.watchdog(texts, after, max(WATCHDOG_QUIT_S / self.scale, WATCHDOG_QUIT_MIN_S))

    # ---- signals ------------------------------------------------------------------------------

    def _uvicorn_stop(self) -> None:
        """uvicorn's shutdown, then launch_server's `finally: kill_process_tree(...)`: exit 0."""
        self.log.uvicorn("Shutting down")
        self.log.uvicorn("Waiting for application shutdown.")
        self.log.uvicorn("Application shutdown complete.")
        self.log.uvicorn(f"Finished server process [{self.pid}]")
        self.stopping = True
        self.kill_tree(include_parent=False)
        if self.memory is not None:
            self.memory.release()
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
            self.kill_tree()
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
        self.kill_tree()
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
        self.stopping = True
        self.kill_tree(include_parent=False)
        self._uvicorn_stop()
        code = self.release.graceful_exit_code
        self.exit_code = 0 if code is None else code
