"""One simulated SGLang server process: startup sequence, serving, signals and death.

The startup walks the StartupPlan stage by stage, printing SGLang 0.5.9's lines per rank and
sleeping each phase's profile duration divided by --sim-time-scale; the printed `elapsed=` values
are the unscaled (real-world) durations. A failing stage prints the scheduler's exception and
dies the way SGLang does (SIGQUIT path: the main process SIGKILLs itself). Once uvicorn's lines
are out, SIGTERM stops the server like uvicorn (exit 0) until the first request (warm-up
included); after it, like SGLang's TokenizerManager: drain, then SIGKILL itself.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NoReturn

from aiohttp import web

from autotune.sim import faults as faultmod
from autotune.sim import gpustate
from autotune.sim import logwriter as lw
from autotune.sim.flags import CommandLine, ServerSettings
from autotune.sim.httpapi import ServerState, build_app
from autotune.sim.model import GiB, StartupPlan, plan_startup
from autotune.sim.profiles import Profile
from autotune.sim.scheduler import Request, Scheduler
from autotune.sim.tokens import encode

DRAIN_POLL_S = 1.0
HEARTBEAT_S = 0.5
DRAFT_ARCH = {
    "EAGLE3": "LlamaForCausalLMEagle3",
    "EAGLE": "LlamaForCausalLMEagle",
    "NEXTN": "DeepseekV3ForCausalLMNextN",
    "STANDALONE": "LlamaForCausalLM",
}


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


class SimServer:
    """Runs one server; never returns normally on SGLang's kill paths."""

    def __init__(
        self,
        cmd: CommandLine,
        profile: Profile,
        env: Mapping[str, str],
        log: lw.LogWriter | None = None,
    ) -> None:
        self.cmd = cmd
        self.s: ServerSettings = cmd.settings
        self.profile = profile
        self.env = env
        self.faults = faultmod.resolve(cmd.sim)
        self.log = log or lw.LogWriter(self.s.tp_size)
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

    # ---- helpers ------------------------------------------------------------------------------

    async def phase(self, seconds: float) -> float:
        """Sleep a startup phase; returns the real-world duration it stands for."""
        real = seconds * self.faults.startup_factor
        await asyncio.sleep(real / self.scale)
        return real

    def set_used(self, gib: float) -> None:
        self.static_gib = gib
        if self.writer is not None:
            self.writer.set_all(int(gib * GiB))

    def die(self, code: int | None = None) -> NoReturn:
        """End like SGLang's kill_process_tree: SIGKILL ourselves (or exit with `code`)."""
        if self.writer is not None:
            self.writer.release()
        sys.stdout.flush()
        sys.stderr.flush()
        if code is not None:
            os._exit(code)
        os.kill(self.pid, signal.SIGKILL)
        os._exit(137)  # not reached

    def scheduler_exception(
        self, ranks: Sequence[int], frames: Sequence[tuple[str, int, str, str]], final: str
    ) -> None:
        for r in ranks:
            self.log.rank(r, "Scheduler hit an exception: " + lw.traceback_block(frames, final))

    def crash_startup(
        self, ranks: Sequence[int], frames: Sequence[tuple[str, int, str, str]], final: str
    ) -> NoReturn:
        self.scheduler_exception(ranks, frames, final)
        self.log.main("Received sigquit from a child process. It usually means the child failed.")
        self.die()

    def oom_text(self, tried: float, free: float) -> str:
        total = self.profile.hardware.gpu_memory_mib / 1024
        in_use = total - free
        graphs = self.plan.graph_gib if self.plan and self.plan.graph_gib else 0.0
        return lw.fmt_oom_error(tried, total, free, in_use, graphs)

    # ---- entry --------------------------------------------------------------------------------

    def run(self) -> int:
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
            directory.mkdir(parents=True, exist_ok=True)
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

    async def _startup(self) -> None:
        s = self.s
        st = self.profile.startup
        log = self.log
        log.main(f"server_args=ServerArgs({self._args_repr()})")
        if s.spec and s.max_running_requests is None:
            log.main(
                "Max running requests is reset to 48 for speculative decoding. You can override "
                "this by explicitly setting --max-running-requests."
            )
        foreign: list[float] = []
        if self.writer is not None:
            used = gpustate.foreign_used_bytes(self.writer.directory, self.gpus, self.pid)
            foreign = [b / GiB for b in used]
        plan = plan_startup(self.profile, s, foreign_gib=foreign, seed=self.cmd.sim.seed)
        self.plan = plan
        fail = plan.failure
        ranks = list(range(s.tp_size))
        log.every_rank(lw.fmt_init_begin())
        if (fail is not None and fail.kind == "bad_tp") or len(self.gpus) < s.tp_size:
            await self.phase(st.init_distributed_s * 0.1)
            self.crash_startup(
                [len(self.gpus)] if len(self.gpus) < s.tp_size else [0],
                lw.SCHEDULER_INIT_FRAMES,
                "RuntimeError: CUDA error: invalid device ordinal\nCUDA kernel errors might be "
                "asynchronously reported at some other API call, so the stacktrace below might be "
                "incorrect.",
            )
        elapsed = await self.phase(st.init_distributed_s)
        self.set_used(plan.init_mem_usage_gib)
        log.every_rank(lw.fmt_init_end(elapsed, plan.init_mem_usage_gib))
        for w in plan.warnings:
            log.rank(0, w)
        if fail is not None and fail.kind == "context_too_long":
            self.crash_startup([0], lw.SCHEDULER_INIT_FRAMES, f"ValueError: {fail.message}")
        log.every_rank(lambda r: lw.fmt_load_begin(plan.p_per_rank[r]))
        elapsed_w = await self._load_weights(plan)
        used_base = plan.init_mem_usage_gib
        self.set_used(used_base + plan.weights_gib)
        log.every_rank(
            lambda r: lw.fmt_load_end(
                elapsed_w,
                self.profile.model.architecture,
                f"torch.{self.profile.model.dtype}",
                plan.p_per_rank[r] - plan.weights_gib,
                plan.weights_gib,
            )
        )
        log.rank(0, f"Using KV cache dtype: {plan.kv_dtype}")
        if (
            s.max_total_tokens is not None
            and plan.profiled_tokens is not None
            and s.max_total_tokens > plan.profiled_tokens
        ):
            log.rank(
                0,
                f"max_total_tokens={s.max_total_tokens} is larger than the profiled value "
                f"{plan.profiled_tokens}. Use the profiled value instead.",
            )
        await self.phase(st.kv_alloc_s)
        if fail is not None and fail.stage == "kv":
            self._fail_pool(fail.kind, fail.message, fail.tried_gib, fail.free_gib)
        assert plan.max_total_num_tokens is not None and plan.avail_after_pool_gib is not None
        log.every_rank(
            lw.fmt_kv_allocated(plan.max_total_num_tokens, plan.kv_gib, plan.k_gib, plan.v_gib)
        )
        log.every_rank(lw.fmt_pool_end(plan.avail_after_pool_gib))
        self.set_used(plan.init_mem_usage_gib + plan.p_gib - plan.avail_after_pool_gib)
        if fail is not None and fail.stage == "workspace":
            self.crash_startup(
                ranks, lw.SCHEDULER_INIT_FRAMES, self.oom_text(fail.tried_gib, fail.free_gib)
            )
        await self._capture(plan, draft=False)
        if plan.spec:
            await self._draft(plan)
        assert plan.avail_final_gib is not None and plan.max_running_requests is not None
        log.rank(
            0,
            lw.fmt_summary(
                plan.max_total_num_tokens,
                plan.chunked_prefill_size,
                plan.max_prefill_tokens,
                plan.max_running_requests,
                plan.context_len,
                plan.avail_final_gib,
            ),
        )
        if s.enable_hierarchical_cache:
            await self._hicache(plan)
        self.set_used(self._static_used(plan))

    def _static_used(self, plan: StartupPlan) -> float:
        final = plan.avail_final_gib or 0.0
        return plan.init_mem_usage_gib + plan.p_gib - final

    async def _load_weights(self, plan: StartupPlan) -> float:
        st = self.profile.startup
        shards = 64
        self.log.raw(
            f"Loading safetensors checkpoint shards:   0% Completed | 0/{shards} [00:00<?, ?it/s]"
        )
        if self.faults.hang_weight_load:
            await asyncio.Event().wait()
        if self.faults.crash_mid_load:
            await self.phase(st.weight_load_s / 2)
            self.log.raw(
                f"Loading safetensors checkpoint shards:  50% Completed | {shards // 2}/{shards}"
            )
            self.crash_startup(
                [0],
                (*lw.SCHEDULER_INIT_FRAMES, *lw.LOAD_FRAMES),
                "safetensors_rust.SafetensorError: Error while deserializing header: "
                "MetadataIncompleteBuffer",
            )
        fail = plan.failure
        if fail is not None and fail.stage == "weights":
            await self.phase(st.weight_load_s * 0.9)
            self.crash_startup(
                list(range(self.s.tp_size)),
                (*lw.SCHEDULER_INIT_FRAMES, *lw.LOAD_FRAMES),
                self.oom_text(fail.tried_gib, fail.free_gib),
            )
        elapsed_w = await self.phase(st.weight_load_s)
        secs = int(elapsed_w)
        self.log.raw(
            f"Loading safetensors checkpoint shards: 100% Completed | {shards}/{shards} "
            f"[{secs // 60:02d}:{secs % 60:02d}<00:00, {shards / max(elapsed_w, 1e-3):.2f}it/s]"
        )
        return elapsed_w

    def _fail_pool(self, kind: str, message: str, tried: float, free: float) -> NoReturn:
        ranks = list(range(self.s.tp_size))
        frames = (*lw.SCHEDULER_INIT_FRAMES, *lw.POOL_FRAMES)
        if kind == "kv_pool":
            self.crash_startup(ranks, frames, f"RuntimeError: {message}")
        if kind == "pool_too_small":
            self.crash_startup([0], lw.SCHEDULER_INIT_FRAMES, f"AssertionError: {message}")
        self.crash_startup(ranks, frames, self.oom_text(tried, free))

    async def _capture(self, plan: StartupPlan, draft: bool) -> None:
        log = self.log
        st = self.profile.startup
        fail = plan.failure
        stage = "draft_graphs" if draft else "graphs"
        sizes = plan.draft_capture_bs if draft else plan.capture_bs
        before = plan.avail_after_draft_pool_gib if draft else plan.avail_before_graphs_gib
        if self.s.disable_cuda_graph:
            return
        assert before is not None
        log.every_rank(lw.fmt_capture_begin(before))
        log.rank(0, lw.fmt_capture_bs(sizes))
        duration = st.draft_graph_capture_s if draft else st.graph_capture_s
        if fail is not None and fail.stage == stage:
            await self.phase(duration * 0.3)
            err = self.oom_text(fail.tried_gib, fail.free_gib)
            cause = err.split(": ", 1)[1]
            final = f"Exception: Capture cuda graph failed: {cause}\n{lw.CAPTURE_ADVICE}"
            self.crash_startup(
                list(range(self.s.tp_size)), (*lw.SCHEDULER_INIT_FRAMES, *lw.GRAPH_FRAMES), final
            )
        elapsed = await self.phase(duration)
        graph = (plan.draft_graph_gib if draft else plan.graph_gib) or 0.0
        after = before - graph
        log.raw(lw.fmt_capture_bar(sizes, after, elapsed))
        log.every_rank(lw.fmt_capture_end(elapsed, graph, after))
        self.set_used(plan.init_mem_usage_gib + plan.p_gib - after)

    async def _draft(self, plan: StartupPlan) -> None:
        log = self.log
        st = self.profile.startup
        fail = plan.failure
        ranks = list(range(self.s.tp_size))
        assert plan.avail_after_graphs_gib is not None
        log.every_rank(lw.fmt_init_begin())
        log.every_rank(lw.fmt_init_end(0.0, 0.0))
        log.every_rank(lw.fmt_load_begin(plan.avail_after_graphs_gib))
        elapsed = await self.phase(st.draft_load_s)
        if fail is not None and fail.stage == "draft_weights":
            self.crash_startup(
                ranks,
                (*lw.SCHEDULER_INIT_FRAMES, *lw.LOAD_FRAMES),
                self.oom_text(fail.tried_gib, fail.free_gib),
            )
        assert plan.draft_weights_gib is not None and plan.avail_after_draft_weights_gib is not None
        algo = self.s.speculative_algorithm or "EAGLE3"
        log.every_rank(
            lw.fmt_load_end(
                elapsed,
                DRAFT_ARCH.get(algo, "LlamaForCausalLMEagle3"),
                f"torch.{self.profile.model.dtype}",
                plan.avail_after_draft_weights_gib,
                plan.draft_weights_gib,
            )
        )
        self.set_used(plan.init_mem_usage_gib + plan.p_gib - plan.avail_after_draft_weights_gib)
        log.rank(0, f"Using KV cache dtype: {plan.kv_dtype}")
        await self.phase(st.kv_alloc_s * 0.2)
        if fail is not None and fail.stage == "draft_kv":
            self.crash_startup(
                ranks,
                (*lw.SCHEDULER_INIT_FRAMES, *lw.POOL_FRAMES[:1]),
                self.oom_text(fail.tried_gib, fail.free_gib),
            )
        assert plan.max_total_num_tokens is not None and plan.avail_after_draft_pool_gib is not None
        log.every_rank(
            lw.fmt_kv_allocated(
                plan.max_total_num_tokens, plan.draft_kv_gib, plan.draft_k_gib, plan.draft_v_gib
            )
        )
        log.every_rank(lw.fmt_pool_end(plan.avail_after_draft_pool_gib))
        self.set_used(plan.init_mem_usage_gib + plan.p_gib - plan.avail_after_draft_pool_gib)
        await self._capture(plan, draft=True)

    async def _hicache(self, plan: StartupPlan) -> None:
        fail = plan.failure
        gb = plan.host_cache_gb or 0.0
        await self.phase(self.profile.startup.hicache_s_per_gb * gb)
        ranks = list(range(self.s.tp_size))
        if fail is None:
            self.log.every_rank(lw.fmt_hicache(gb))
            return
        if fail.kind == "host_oom_killer":
            for r in range(fail.rank):
                self.log.rank(r, lw.fmt_hicache(gb))
            self.log.main(
                f"Rank {fail.rank} scheduler is dead. Please check if there are relevant logs."
            )
            self.log.main("Exit code: -9")
            self.log.raw(
                lw.traceback_block(
                    (
                        (
                            "/usr/local/lib/python3.12/dist-packages/sglang/srt/entrypoints/engine.py",
                            892,
                            "_wait_for_scheduler_ready",
                            "data = scheduler_pipe_readers[i].recv()",
                        ),
                    ),
                    "EOFError",
                )
            )
            self.die(1)
        if fail.kind == "hicache_too_small":
            self.crash_startup(
                ranks,
                (*lw.SCHEDULER_INIT_FRAMES[:2], *lw.HICACHE_FRAMES),
                f"AssertionError: {fail.message}",
            )
        self.crash_startup(
            ranks,
            (*lw.SCHEDULER_INIT_FRAMES[:2], *lw.HICACHE_FRAMES),
            f"ValueError: {fail.message}",
        )

    def _args_repr(self) -> str:
        parts = []
        for k, v in self.s.__dict__.items():
            if k == "noted":
                continue
            parts.append(f"{k}={v!r}")
        parts.extend(f"{k}={v!r}" for k, v in self.s.noted.items())
        return ", ".join(parts)

    # ---- serving ------------------------------------------------------------------------------

    async def _serve(self) -> None:
        plan = self.plan
        assert plan is not None
        s = self.s
        loop = asyncio.get_running_loop()
        self.stop_event = asyncio.Event()
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
        )
        state = ServerState(
            settings=s,
            profile=self.profile,
            plan=plan,
            scheduler=scheduler,
            log=self.log,
            faults=self.faults.health_faults,
            on_first_request=self._first_request,
        )
        self.state = state
        app = build_app(state)
        self.runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self.runner.setup()
        site = web.TCPSite(self.runner, s.host, s.port, reuse_address=True)
        self.log.uvicorn(f"Started server process [{self.pid}]")
        self.log.uvicorn("Waiting for application startup.")
        self.log.uvicorn("Application startup complete.")
        try:
            await site.start()
        except OSError as exc:
            self.log.uvicorn(
                f"[Errno {exc.errno}] error while attempting to bind on address "
                f"('{s.host}', {s.port}): {exc.strerror.lower() if exc.strerror else exc}",
                level="ERROR",
            )
            self.die(1)
        self.log.uvicorn(f"Uvicorn running on http://{s.host}:{s.port} (Press CTRL+C to quit)")
        if not self.faults.ignore_sigterm:
            loop.add_signal_handler(signal.SIGTERM, self._sigterm)
        sched_task = asyncio.create_task(scheduler.run())
        await self.phase(self.profile.startup.server_start_s)
        if not s.skip_server_warmup:
            await self._warmup(state)
        state.status = "Up"
        self.log.main("The server is fired up and ready to roll!")
        await self.stop_event.wait()
        scheduler.stop()
        sched_task.cancel()
        await self.runner.cleanup()

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
        if self.writer is not None:
            self.writer.set_all(int((self.static_gib + peak) * GiB))

    def _runtime_oom(self, kind: str, peak: float, free: float) -> None:
        tried = max(peak * 0.4, peak - free + 0.01)
        remaining = max(free - (peak - tried), 0.01)
        remaining = min(remaining, tried * 0.9)
        self.scheduler_exception(
            list(range(self.s.tp_size)), lw.RUN_FRAMES, self.oom_text(tried, remaining)
        )
        self.log.main(
            "SIGQUIT received. signum=None, frame=None. It usually means one child failed."
        )
        self.die()

    # ---- signals ------------------------------------------------------------------------------

    def _sigterm(self) -> None:
        state = self.state
        if state is None or not state.first_request_seen:
            self.log.uvicorn("Shutting down")
            self.log.uvicorn("Waiting for application shutdown.")
            self.log.uvicorn("Application shutdown complete.")
            self.log.uvicorn(f"Finished server process [{self.pid}]")
            if self.writer is not None:
                self.writer.release()
            self.exit_code = 0
            if self.stop_event is not None:
                self.stop_event.set()
            return
        if state.status == "ShuttingDown":
            return
        self.log.main(
            "SIGTERM received. signum=15 frame=None. Draining requests and shutting down..."
        )
        skip_drain = state.status == "UnHealthy" or self.env.get("SGL_FORCE_SHUTDOWN") == "1"
        state.status = "ShuttingDown"
        if skip_drain:
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
