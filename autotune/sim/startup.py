"""The startup sequence of one simulated SGLang server, and how it dies when a stage fails.

`StartupSequence` walks the StartupPlan stage by stage in SGLang 0.5.9's order, printing each
rank's lines and sleeping each phase's profile duration divided by --sim-time-scale (the printed
`elapsed=` values are the unscaled, real-world durations). A failing stage prints the scheduler's
exception and dies the SGLang way: the main process logs the SIGQUIT it got from the child and
SIGKILLs itself. GPU state files follow every allocation.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from typing import NoReturn

from autotune.sim import gpustate
from autotune.sim import logwriter as lw
from autotune.sim.faults import FaultSet
from autotune.sim.flags import CommandLine, ServerSettings
from autotune.sim.model import GiB, StartupPlan, plan_startup
from autotune.sim.profiles import Profile

DRAFT_ARCH = {
    "EAGLE3": "LlamaForCausalLMEagle3",
    "EAGLE": "LlamaForCausalLMEagle",
    "NEXTN": "DeepseekV3ForCausalLMNextN",
    "STANDALONE": "LlamaForCausalLM",
}


class StartupSequence:
    """Startup stages and startup deaths; the server process class builds on it."""

    cmd: CommandLine
    s: ServerSettings
    profile: Profile
    env: Mapping[str, str]
    faults: FaultSet
    log: lw.LogWriter
    scale: float
    pid: int
    gpus: list[int]
    writer: gpustate.GpuStateWriter | None
    plan: StartupPlan | None
    static_gib: float

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

    # ---- stages -------------------------------------------------------------------------------

    async def _startup(self) -> None:
        plan = self._make_plan()
        await self._init_distributed(plan)
        await self._model_weights(plan)
        await self._kv_pool(plan)
        await self._capture(plan, draft=False)
        if plan.spec:
            await self._draft(plan)
        self._log_summary(plan)
        if self.s.enable_hierarchical_cache:
            await self._hicache(plan)
        self.set_used(self._static_used(plan))

    def _make_plan(self) -> StartupPlan:
        """Print the server args, then plan startup against the GPU memory others hold now."""
        s = self.s
        self.log.main(f"server_args=ServerArgs({self._args_repr()})")
        if s.spec and s.max_running_requests is None:
            self.log.main(
                "Max running requests is reset to 48 for speculative decoding. You can override "
                "this by explicitly setting --max-running-requests."
            )
        foreign: list[float] = []
        if self.writer is not None:
            used = gpustate.foreign_used_bytes(self.writer.directory, self.gpus, self.pid)
            foreign = [b / GiB for b in used]
        plan = plan_startup(self.profile, s, foreign_gib=foreign, seed=self.cmd.sim.seed)
        self.plan = plan
        return plan

    async def _init_distributed(self, plan: StartupPlan) -> None:
        """The init stage; dies on a bad TP size (or too few GPUs) or too long a context."""
        s = self.s
        log = self.log
        st = self.profile.startup
        fail = plan.failure
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

    async def _model_weights(self, plan: StartupPlan) -> None:
        """The target model's weight load, between its begin and end lines."""
        self.log.every_rank(lambda r: lw.fmt_load_begin(plan.p_per_rank[r]))
        elapsed_w = await self._load_weights(plan)
        self.set_used(plan.init_mem_usage_gib + plan.weights_gib)
        self.log.every_rank(
            lambda r: lw.fmt_load_end(
                elapsed_w,
                self.profile.model.architecture,
                f"torch.{self.profile.model.dtype}",
                plan.p_per_rank[r] - plan.weights_gib,
                plan.weights_gib,
            )
        )

    async def _kv_pool(self, plan: StartupPlan) -> None:
        """The KV pool allocation, then the workspace (its failure ends the stage too)."""
        s = self.s
        log = self.log
        fail = plan.failure
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
        await self.phase(self.profile.startup.kv_alloc_s)
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
                list(range(s.tp_size)),
                lw.SCHEDULER_INIT_FRAMES,
                self.oom_text(fail.tried_gib, fail.free_gib),
            )

    def _log_summary(self, plan: StartupPlan) -> None:
        assert plan.max_total_num_tokens is not None
        assert plan.avail_final_gib is not None and plan.max_running_requests is not None
        self.log.rank(
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
