"""The startup sequence of one simulated SGLang server, stage by stage.

`StartupSequence` walks the StartupPlan stage by stage in the simulated release's order (see
`memplan`), printing each rank's lines in that release's text (`loglines.lines_for`) and sleeping
each phase's profile duration divided by --sim-time-scale (the printed `elapsed=` values are the
unscaled, real-world durations). A failing stage prints the scheduler's exception and dies the
SGLang way, by the paths of `deaths.ServerDeaths` (the scheduler's traceback and SIGQUIT, the
main process's SIGQUIT line and `kill_process_tree`; a scheduler the OS OOM killer takes, reported
by the main process, which exits 1). GPU state files follow every allocation.

The one file SGLang writes of its own at startup is the Triton JIT's kernel cache (the first
decode graph capture compiles the kernels and Triton stores them under `TRITON_CACHE_DIR`, else
`~/.triton/cache`). The simulator compiles nothing, but where `TRITON_CACHE_DIR` is set it
writes one kernel there the way Triton's `FileCacheManager.put` does (a temporary file, then a
rename), so a full (or unwritable) cache disk fails the capture as it fails SGLang:
`Capture cuda graph failed: [Errno 28] No space left on device`. Without `TRITON_CACHE_DIR` it
writes nothing outside what it is told (`--sim-gpu-dir`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
from collections.abc import Mapping, Sequence
from typing import NoReturn

from autotune.sim import gpustate, tracebacks
from autotune.sim.deaths import ServerDeaths
from autotune.sim.faults import FaultSet
from autotune.sim.flags import CommandLine, ServerSettings
from autotune.sim.loglines import (
    CaptureShape,
    KvAllocation,
    fmt_hicache,
    fmt_hicache_auto,
    fmt_hicache_headroom,
    fmt_init_begin,
    fmt_init_end,
    fmt_kv_allocated,
    fmt_load_begin,
    fmt_load_end,
    fmt_pool_below_context,
    fmt_pool_end,
    fmt_post_capture,
)
from autotune.sim.memplan import plan_startup
from autotune.sim.planbase import unbalanced_ranks
from autotune.sim.serverargs import args_repr, resolved_args
from autotune.sim.sizing import GiB
from autotune.sim.startupplan import GRAPH_PHASES, StartupFailure, StartupPlan

DRAFT_ARCH = {
    "EAGLE3": "LlamaForCausalLMEagle3",
    "EAGLE": "LlamaForCausalLMEagle",
    "NEXTN": "DeepseekV3ForCausalLMNextN",
    "STANDALONE": "LlamaForCausalLM",
}
LAUNCH_WARNING = (
    "/usr/local/lib/python3.12/dist-packages/sglang/launch_server.py:71: UserWarning: "
    "'python -m sglang.launch_server' is still supported, but 'sglang serve' is the recommended "
    "entrypoint.\n  Example: sglang serve --model-path <model> [options]\n  warnings.warn("
)
PREFILL_GRAPH_OFF = (
    "Disable prefill CUDA graph because cuda_graph_config resolved prefill.backend='disabled' "
    "(e.g. via --cuda-graph-backend-prefill=disabled or auto-disable rules)."
)
TOKENIZER_OVERHEAD_S = 1.5
KERNEL_BYTES = 256 << 10
"""The size of the one compiled kernel written to the Triton cache (a fused-MoE cubin)."""


class StartupSequence(ServerDeaths):
    """Startup stages, dying by `ServerDeaths` where one fails; the server process class builds
    on it."""

    cmd: CommandLine
    s: ServerSettings
    env: Mapping[str, str]
    faults: FaultSet
    scale: float
    gpus: list[int]
    static_gib: float
    timings: dict[str, float]
    graph_times: dict[str, float]
    argv: Sequence[str]

    async def phase(self, seconds: float) -> float:
        """Sleep a startup phase; returns the real-world duration it stands for."""
        real = seconds * self.faults.startup_factor
        await asyncio.sleep(real / self.scale)
        return real

    def set_used(self, gib: float) -> None:
        """Set the static GPU use of every rank to `gib` and write it to the GPU state, as an
        allocation shows on nvidia-smi."""
        self.static_gib = gib
        if self.memory is not None:
            self.memory.set_all(int(gib * GiB))

    async def graph_oom(self, fail: StartupFailure | None, stage: str, duration: float) -> None:
        """Where `fail` is in the graph capture `stage` (prefill or draft graphs): die 30% into
        its `duration` of torch's out-of-memory error under the capture frames."""
        if fail is not None and fail.stage == stage:
            await self.phase(duration * 0.3)
            await self.crash_startup(
                list(range(self.s.tp_size)),
                (*self.lines.init_frames, *self.lines.graph_frames),
                self.oom_text(fail.tried_gib, fail.free_gib),
            )

    # ---- stages -------------------------------------------------------------------------------

    async def _startup(self) -> None:
        plan = self._make_plan()
        await self._init_distributed(plan)
        await self._model_weights(plan)
        if self.release.draft_before_profile:
            if plan.spec:
                await self._draft_weights(plan)
            await self._kv_pool(plan)
            await self._capture_prefill(plan)
            await self._capture(plan, draft=False)
            if plan.spec:
                await self._draft_graphs(plan)
            await self._post_capture(plan)
        else:
            await self._kv_pool(plan)
            await self._capture(plan, draft=False)
            if plan.spec:
                await self._draft(plan)
        self._log_summary(plan)
        if self.s.enable_hierarchical_cache:
            await self._hicache(plan)
        self.set_used(self._static_used(plan))
        self._log_startup_timings()

    def _make_plan(self) -> StartupPlan:
        """Print the server args, then plan startup against the GPU memory others hold now."""
        s = self.s
        foreign: list[float] = []
        if self.memory is not None:
            ours = {self.pid, *self.tree.pids}
            used = gpustate.foreign_used_bytes(self.memory.directory, self.gpus, ours)
            foreign = [b / GiB for b in used]
        self._foreign_at_plan = foreign or [0.0] * len(self.gpus)
        plan = plan_startup(
            self.profile,
            s,
            foreign_gib=foreign,
            seed=self.cmd.sim.seed,
            version=self.release,
            env=self.env,
        )
        self.plan = plan
        if self.release.server_args_dict:
            if s.spec and s.max_running_requests is None:
                self._spec_warning()
            self.log.main(f"server_args={resolved_args(self.release, s, plan, self.cmd.sim.seed)}")
        else:
            self.log.main(f"server_args=ServerArgs({args_repr(s)})")
            if s.spec and s.max_running_requests is None:
                self._spec_warning()
        return plan

    def _spec_warning(self) -> None:
        self.log.main(
            "Max running requests is reset to 48 for speculative decoding. You can override "
            "this by explicitly setting --max-running-requests."
        )

    async def _init_distributed(self, plan: StartupPlan) -> None:
        """The init stage; dies on a bad TP size (or too few GPUs), unbalanced free memory
        (0.5.23) or too long a context."""
        s = self.s
        log = self.log
        st = self.profile.startup
        fail = plan.failure
        log.every_rank(self.lines.init_begin())
        if (fail is not None and fail.kind == "bad_tp") or len(self.gpus) < s.tp_size:
            await self.phase(st.init_distributed_s * 0.1)
            await self.crash_startup(
                [len(self.gpus)] if len(self.gpus) < s.tp_size else [0],
                self.lines.init_frames,
                "RuntimeError: CUDA error: invalid device ordinal\nCUDA kernel errors might be "
                "asynchronously reported at some other API call, so the stacktrace below might be "
                "incorrect.",
            )
        elapsed = await self.phase(st.init_distributed_s)
        self.timings["init"] = elapsed
        self.set_used(plan.init_mem_usage_gib)
        log.every_rank(self.lines.init_end(elapsed, plan.init_mem_usage_gib))
        if fail is not None and fail.kind == "tp_imbalance":
            ranks = unbalanced_ranks(plan.p_per_rank)
            final = f"RuntimeError: {fail.message}"
            await self.crash_startup(ranks, self.lines.init_frames, final)
        for w in plan.warnings:
            log.rank(0, w)
        for note in plan.notes_at("init"):
            log.rank(0, note)
        baseline = self.lines.memory_baseline(0.0)
        if baseline is not None:
            log.every_rank(baseline)
        if fail is not None and fail.kind == "context_too_long":
            await self.crash_startup([0], self.lines.init_frames, f"ValueError: {fail.message}")

    async def _model_weights(self, plan: StartupPlan) -> None:
        """The target model's weight load, between its begin and end lines."""
        self.log.every_rank(lambda r: self.lines.load_begin(plan.p_per_rank[r]))
        elapsed_w = await self._load_weights(plan)
        self.timings["load_weight"] = elapsed_w
        self.set_used(plan.init_mem_usage_gib + plan.weights_gib)
        self.log.every_rank(
            lambda r: self.lines.load_end(
                elapsed_w,
                self.profile.model.architecture,
                f"torch.{self.profile.model.dtype}",
                self.profile.model.quant,
                plan.p_per_rank[r] - plan.weights_gib,
                plan.weights_gib,
            )
        )

    async def _draft_weights(self, plan: StartupPlan) -> None:
        """0.5.23: the draft's baseline and weight load, right after the target's."""
        log = self.log
        baseline = self.lines.memory_baseline(0.0)
        if baseline is not None:
            log.every_rank(baseline)
        log.every_rank(lambda r: self.lines.load_begin(plan.p_per_rank[r] - plan.weights_gib))
        elapsed = await self.phase(self.profile.startup.draft_load_s)
        self.timings["load_weight"] = self.timings.get("load_weight", 0.0) + elapsed
        fail = plan.failure
        if fail is not None and fail.stage == "draft_weights":
            await self.crash_startup(
                list(range(self.s.tp_size)),
                (*self.lines.init_frames, *self.lines.load_frames),
                self.oom_text(fail.tried_gib, fail.free_gib),
            )
        assert plan.draft_weights_gib is not None and plan.avail_after_draft_weights_gib is not None
        algo = self.s.speculative_algorithm or "EAGLE3"
        drop = plan.p_gib - plan.avail_after_draft_weights_gib
        log.every_rank(
            lambda r: self.lines.load_end(
                elapsed,
                DRAFT_ARCH.get(algo, "LlamaForCausalLMEagle3"),
                f"torch.{self.profile.model.dtype}",
                "",
                plan.p_per_rank[r] - drop,
                plan.draft_weights_gib or 0.0,
            )
        )
        self.set_used(plan.init_mem_usage_gib + drop)

    async def _kv_pool(self, plan: StartupPlan) -> None:
        """The KV pool allocation (0.5.23: then the draft's), then the workspace (its failure
        ends the stage too)."""
        s = self.s
        log = self.log
        fail = plan.failure
        kv_dtype = self.lines.kv_dtype(plan.kv_dtype)
        if kv_dtype is not None:
            log.rank(0, kv_dtype)
        if (
            not self.release.draft_before_profile
            and s.max_total_tokens is not None
            and plan.profiled_tokens is not None
            and s.max_total_tokens > plan.profiled_tokens
        ):
            log.rank(
                0,
                f"max_total_tokens={s.max_total_tokens} is larger than the profiled value "
                f"{plan.profiled_tokens}. Use the profiled value instead.",
            )
        elapsed = await self.phase(self.profile.startup.kv_alloc_s)
        self.timings["kv_cache_allocation"] = elapsed
        if fail is not None and fail.stage == "kv":
            await self._fail_pool(fail.kind, fail.message, fail.tried_gib, fail.free_gib)
        for note in plan.notes_at("kv"):
            log.every_rank(note)
        assert plan.max_total_num_tokens is not None and plan.avail_after_pool_gib is not None
        tokens = plan.profiled_tokens if plan.post_capture else plan.max_total_num_tokens
        log.every_rank(
            self.lines.kv_allocated(
                KvAllocation(
                    tokens or 0,
                    plan.kv_gib,
                    plan.k_gib,
                    plan.v_gib,
                    plan.kv_dtype,
                    plan.post_capture,
                )
            )
        )
        log.every_rank(self.lines.pool_end(plan.avail_after_pool_gib))
        self.set_used(plan.init_mem_usage_gib + plan.p_gib - plan.avail_after_pool_gib)
        if self.release.draft_before_profile and plan.spec:
            await self._draft_pool(plan)
        if fail is not None and fail.stage == "workspace":
            await self.crash_startup(
                list(range(s.tp_size)),
                self.lines.init_frames,
                self.oom_text(fail.tried_gib, fail.free_gib),
            )

    async def _draft_pool(self, plan: StartupPlan) -> None:
        """The draft's KV pool (same token count, its own geometry) and its pool-end line."""
        fail = plan.failure
        await self.phase(self.profile.startup.kv_alloc_s * 0.2)
        if fail is not None and fail.stage == "draft_kv":
            await self.crash_startup(
                list(range(self.s.tp_size)),
                (*self.lines.init_frames, *self.lines.pool_frames[:1]),
                self.oom_text(fail.tried_gib, fail.free_gib),
            )
        assert plan.max_total_num_tokens is not None and plan.avail_after_draft_pool_gib is not None
        tokens = plan.profiled_tokens if plan.post_capture else plan.max_total_num_tokens
        self.log.every_rank(
            self.lines.kv_allocated(
                KvAllocation(
                    tokens or 0,
                    plan.draft_kv_gib,
                    plan.draft_k_gib,
                    plan.draft_v_gib,
                    plan.kv_dtype,
                )
            )
        )
        self.log.every_rank(self.lines.pool_end(plan.avail_after_draft_pool_gib))
        self.set_used(plan.init_mem_usage_gib + plan.p_gib - plan.avail_after_draft_pool_gib)

    def _log_summary(self, plan: StartupPlan) -> None:
        assert plan.max_total_num_tokens is not None
        assert plan.avail_final_gib is not None and plan.max_running_requests is not None
        if self.release.pool_below_context_warning and plan.max_total_num_tokens < plan.context_len:
            self.log.rank(0, fmt_pool_below_context(plan.max_total_num_tokens, plan.context_len))
        self.log.rank(
            0,
            self.lines.summary(
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
        if self.faults.crash_mid_load or self.faults.oom_kill_startup:
            await self.phase(st.weight_load_s / 2)
            self.log.raw(
                f"Loading safetensors checkpoint shards:  50% Completed | {shards // 2}/{shards}"
            )
            if self.faults.oom_kill_startup:
                await self.scheduler_died(0)
            await self.crash_startup(
                [0],
                (*self.lines.init_frames, *self.lines.load_frames),
                "safetensors_rust.SafetensorError: Error while deserializing header: "
                "MetadataIncompleteBuffer",
            )
        fail = plan.failure
        if fail is not None and fail.stage == "weights":
            await self.phase(st.weight_load_s * 0.9)
            await self.crash_startup(
                list(range(self.s.tp_size)),
                (*self.lines.init_frames, *self.lines.load_frames),
                self.oom_text(fail.tried_gib, fail.free_gib),
            )
        elapsed_w = await self.phase(st.weight_load_s)
        secs = int(elapsed_w)
        self.log.raw(
            f"Loading safetensors checkpoint shards: 100% Completed | {shards}/{shards} "
            f"[{secs // 60:02d}:{secs % 60:02d}<00:00, {shards / max(elapsed_w, 1e-3):.2f}it/s]"
        )
        return elapsed_w

    async def _fail_pool(self, kind: str, message: str, tried: float, free: float) -> NoReturn:
        ranks = list(range(self.s.tp_size))
        lines = self.lines
        frames = (*lines.init_frames, *lines.pool_frames)
        if kind == "kv_budget":
            budget = (*frames, *lines.budget_frames)
            await self.crash_startup(ranks, budget, f"ValueError: {message}")
        if kind == "kv_pool":
            tokens = (*frames, *lines.tokens_frames)
            await self.crash_startup(ranks, tokens, f"RuntimeError: {message}")
        if kind == "pool_too_small":
            await self.crash_startup([0], lines.init_frames, f"AssertionError: {message}")
        await self.crash_startup(ranks, frames, self.oom_text(tried, free))

    async def _capture_prefill(self, plan: StartupPlan) -> None:
        """0.5.23: the target's prefill CUDA graph (or the line saying it is off)."""
        log = self.log
        tokens = tuple(
            t
            for t in plan.prefill_capture_tokens
            if t <= (plan.max_num_reqs or 0) * plan.context_len
        )
        if not tokens:
            log.every_rank(PREFILL_GRAPH_OFF)
            return
        before = plan.avail_before_graphs_gib
        assert before is not None
        shape = CaptureShape(tokens=tokens)
        log.every_rank(self.lines.capture_begin(before, "target", "prefill", shape))
        duration = self.profile.startup.prefill_graph_capture_s
        await self.graph_oom(plan.failure, "prefill_graphs", duration)
        elapsed = await self.phase(duration)
        self.graph_times["prefill"] = elapsed
        graph = plan.prefill_graph_gib or 0.0
        after = before - graph
        log.raw(self.lines.capture_bar(tokens, after, elapsed, "prefill"))
        log.every_rank(self.lines.capture_end(elapsed, graph, after, "target", "prefill", shape))
        self.set_used(plan.init_mem_usage_gib + plan.p_gib - after)

    async def _capture(self, plan: StartupPlan, draft: bool) -> None:
        log = self.log
        st = self.profile.startup
        fail = plan.failure
        stage = "draft_graphs" if draft else "graphs"
        sizes = plan.draft_capture_bs if draft else plan.capture_bs
        if draft:
            before = plan.avail_after_draft_pool_gib
        elif self.release.prefill_graphs:
            before = plan.avail_before_decode_graphs_gib
        else:
            before = plan.avail_before_graphs_gib
        if self.s.decode_graph_disabled:
            return
        assert before is not None
        phase = "verify" if plan.spec else "decode"
        shape = CaptureShape(bs=tuple(sizes), per_req=plan.spec_draft_tokens if plan.spec else 1)
        log.every_rank(self.lines.capture_begin(before, "target", phase, shape))
        bs_line = self.lines.capture_bs(sizes)
        if bs_line is not None:
            log.rank(0, bs_line)
        duration = st.draft_graph_capture_s if draft else st.graph_capture_s
        cache_error = None if draft else self._kernel_cache()
        if cache_error is not None:
            await self.phase(duration * 0.1)
            final = (
                f"Exception: Capture cuda graph failed: {cache_error}\n{self.lines.capture_advice}"
            )
            graph_frames = (*self.lines.init_frames, *self.lines.graph_frames)
            await self.crash_startup(list(range(self.s.tp_size)), graph_frames, final)
        if fail is not None and fail.stage == stage:
            await self.phase(duration * 0.3)
            err = self.oom_text(fail.tried_gib, fail.free_gib)
            cause = err.split(": ", 1)[1]
            final = f"Exception: Capture cuda graph failed: {cause}\n{self.lines.capture_advice}"
            frames: tracebacks.Frames = (*self.lines.init_frames, *self.lines.graph_frames)
            if self.release.prefill_graphs:
                frames = (*frames, *tracebacks.DECODE_GRAPH_FRAMES_0523)
            await self.crash_startup(list(range(self.s.tp_size)), frames, final)
        elapsed = await self.phase(duration)
        self.graph_times["target_verify" if plan.spec else "decode"] = elapsed
        graph = (plan.draft_graph_gib if draft else plan.graph_gib) or 0.0
        after = before - graph
        log.raw(self.lines.capture_bar(sizes, after, elapsed, "decode"))
        log.every_rank(self.lines.capture_end(elapsed, graph, after, "target", phase, shape))
        self.set_used(plan.init_mem_usage_gib + plan.p_gib - after)

    def _kernel_cache(self) -> OSError | None:
        """Store the compiled kernel in `TRITON_CACHE_DIR` (when set) as Triton's file cache
        does; the error a full or unwritable disk gives, or None."""
        root = self.env.get("TRITON_CACHE_DIR")
        if not root:
            return None
        folder = os.path.join(root, "sim-fused-moe")
        tmp = os.path.join(folder, f"tmp.pid_{self.pid}.fused_moe_kernel.cubin")
        try:
            os.makedirs(folder, exist_ok=True)
            with open(tmp, "wb") as fh:
                fh.write(b"\0" * KERNEL_BYTES)
            os.replace(tmp, os.path.join(folder, "fused_moe_kernel.cubin"))
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            return exc
        return None

    async def _draft(self, plan: StartupPlan) -> None:
        """0.5.9: the draft model after the target's graphs (weights, KV, graphs)."""
        log = self.log
        st = self.profile.startup
        fail = plan.failure
        ranks = list(range(self.s.tp_size))
        assert plan.avail_after_graphs_gib is not None
        log.every_rank(fmt_init_begin())
        log.every_rank(fmt_init_end(0.0, 0.0))
        log.every_rank(fmt_load_begin(plan.avail_after_graphs_gib))
        elapsed = await self.phase(st.draft_load_s)
        if fail is not None and fail.stage == "draft_weights":
            await self.crash_startup(
                ranks,
                (*tracebacks.SCHEDULER_INIT_FRAMES, *tracebacks.LOAD_FRAMES),
                self.oom_text(fail.tried_gib, fail.free_gib),
            )
        assert plan.draft_weights_gib is not None and plan.avail_after_draft_weights_gib is not None
        algo = self.s.speculative_algorithm or "EAGLE3"
        log.every_rank(
            fmt_load_end(
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
            await self.crash_startup(
                ranks,
                (*tracebacks.SCHEDULER_INIT_FRAMES, *tracebacks.POOL_FRAMES[:1]),
                self.oom_text(fail.tried_gib, fail.free_gib),
            )
        assert plan.max_total_num_tokens is not None and plan.avail_after_draft_pool_gib is not None
        log.every_rank(
            fmt_kv_allocated(
                KvAllocation(
                    plan.max_total_num_tokens, plan.draft_kv_gib, plan.draft_k_gib, plan.draft_v_gib
                )
            )
        )
        log.every_rank(fmt_pool_end(plan.avail_after_draft_pool_gib))
        self.set_used(plan.init_mem_usage_gib + plan.p_gib - plan.avail_after_draft_pool_gib)
        await self._capture(plan, draft=True)

    async def _draft_graphs(self, plan: StartupPlan) -> None:
        """0.5.23: the draft's prefill graph (every rank), then decode and extend (TP0 only)."""
        log = self.log
        st = self.profile.startup
        fail = plan.failure
        assert plan.avail_after_graphs_gib is not None
        avail = plan.avail_after_graphs_gib
        parts: list[tuple[str, float, CaptureShape, bool]] = []
        if plan.prefill_capture_tokens:
            limit = (plan.max_num_reqs or 0) * plan.context_len
            tokens = tuple(t for t in plan.prefill_capture_tokens if t <= limit)
            prefill = plan.draft_prefill_graph_gib or 0.0
            parts.append(("prefill", prefill, CaptureShape(tokens=tokens), True))
        if not self.s.decode_graph_disabled:
            bs = tuple(plan.draft_capture_bs)
            decode = CaptureShape(bs=bs, per_req=plan.spec_topk)
            extend = CaptureShape(bs=bs, per_req=plan.spec_draft_tokens)
            if plan.spec_steps > 1:
                parts.append(("decode", plan.draft_decode_graph_gib or 0.0, decode, False))
            parts.append(("extend", plan.draft_extend_graph_gib or 0.0, extend, False))
        duration = st.draft_graph_capture_s / max(len(parts), 1)
        for phase, gib, shape, every in parts:
            emit = log.every_rank if every else (lambda text: log.rank(0, text))
            emit(self.lines.capture_begin(avail, "draft", phase, shape))
            await self.graph_oom(fail, "draft_graphs", duration)
            elapsed = await self.phase(duration)
            self.graph_times[f"draft_{phase}"] = elapsed
            avail -= gib
            emit(self.lines.capture_end(elapsed, gib, avail, "draft", phase, shape))
            self.set_used(plan.init_mem_usage_gib + plan.p_gib - avail)

    async def _post_capture(self, plan: StartupPlan) -> None:
        """0.5.23 SGLANG_ENABLE_POST_CAPTURE_KV_SIZING: the pool sized after capture."""
        if not plan.post_capture:
            return
        fail = plan.failure
        for note in plan.notes_at("post_capture"):
            self.log.every_rank(note)
        if fail is not None and fail.stage == "post_capture":
            await self.crash_startup(
                list(range(self.s.tp_size)),
                (*self.lines.init_frames, *self.lines.tokens_frames[-1:]),
                f"RuntimeError: {fail.message}",
            )
        assert plan.post_capture_tokens is not None
        assert plan.avail_after_post_capture_gib is not None
        for line in fmt_post_capture(
            plan.post_capture_tokens,
            plan.kv_dtype,
            plan.post_capture_kv_gib or 0.0,
            plan.avail_after_post_capture_gib,
        ):
            self.log.every_rank(line)

    async def _hicache(self, plan: StartupPlan) -> None:
        fail = plan.failure
        gb = (plan.host_cache_gb or 0.0) + (plan.host_draft_gb or 0.0)
        await self.phase(self.profile.startup.hicache_s_per_gb * gb)
        self.timings["hicache"] = self.profile.startup.hicache_s_per_gb * gb
        ranks = list(range(self.s.tp_size))
        lines = self.lines
        if self.release.host_budget_per_rank:
            self._hicache_lines(plan)
            if fail is not None:
                await self.crash_startup(ranks, lines.hicache_frames, f"ValueError: {fail.message}")
            return
        if fail is None:
            self.log.every_rank(fmt_hicache(plan.host_cache_gb or 0.0))
            return
        if fail.kind == "host_oom_killer":
            for r in range(fail.rank):
                self.log.rank(r, fmt_hicache(plan.host_cache_gb or 0.0))
            await self.scheduler_died(fail.rank)
        if fail.kind == "hicache_too_small":
            await self.crash_startup(ranks, lines.hicache_frames, f"AssertionError: {fail.message}")
        await self.crash_startup(ranks, lines.hicache_frames, f"ValueError: {fail.message}")

    def _hicache_lines(self, plan: StartupPlan) -> None:
        """0.5.23's host-pool lines on every rank, as far as allocation got: the cgroup's
        headroom when one bounds the host (once for auto-sizing, else before each pool)."""
        log = self.log
        headroom = plan.host_headroom_gib
        if headroom is not None and plan.host_auto_ratio is not None:
            log.every_rank(fmt_hicache_headroom(*headroom))
        if plan.host_auto_ratio is not None and plan.host_budget_gb is not None:
            requested, ratio = plan.host_auto_ratio
            device = (plan.kv_gib or 0.0) + (plan.draft_kv_gib or 0.0)
            fraction = self.s.hicache_host_memory_fraction
            log.every_rank(
                fmt_hicache_auto(
                    requested,
                    ratio,
                    plan.host_budget_gb * 1e9 / GiB,
                    0.8 if fraction is None else fraction,
                    plan.tp,
                    device * ratio,
                )
            )
        for note in plan.notes_at("hicache"):
            log.every_rank(note)
        fail = plan.failure
        explicit = plan.host_auto_ratio is None
        if headroom is not None and explicit and plan.host_cache_tokens is not None:
            log.every_rank(fmt_hicache_headroom(*headroom))
        if plan.host_cache_tokens is None or (fail is not None and plan.host_draft_gb is None):
            return
        log.every_rank(self.lines.hicache(plan.host_cache_gb or 0.0, plan.host_cache_tokens))
        if headroom is not None and explicit and plan.host_draft_gb is not None:
            log.every_rank(fmt_hicache_headroom(*headroom))
        if plan.host_draft_gb is not None and fail is None:
            log.every_rank(
                self.lines.hicache(plan.host_draft_gb, plan.host_draft_tokens or 0, "draft")
            )

    def _log_startup_timings(self) -> None:
        """0.5.23's main-process `Engine startup timings` line (the MAX over ranks)."""
        timings = self.startup_timings()
        line = self.lines.startup_timings(timings, self.graph_phase_times())
        if line is not None:
            self.log.main(line)

    def graph_phase_times(self) -> dict[str, float]:
        """Seconds each CUDA-graph phase took (0 for a phase not captured), for 0.5.23's `Engine
        startup timings` line and `/server_info`."""
        return {phase: self.graph_times.get(phase, 0.0) for phase in GRAPH_PHASES}

    def startup_timings(self) -> dict[str, float]:
        """The engine-level startup_time dict (seconds, real-world)."""
        t = self.timings
        graphs = sum(self.graph_phase_times().values())
        e2e = sum(t.values()) + graphs
        return {
            "load_weight": t.get("load_weight", 0.0),
            "kv_cache_allocation": t.get("kv_cache_allocation", 0.0),
            "scheduler_e2e": e2e,
            "tokenizer_e2e": e2e + TOKENIZER_OVERHEAD_S,
        }

    def engine_startup_time(self) -> dict[str, object]:
        """0.5.23's engine-level startup_time dict, in `build_engine_startup_time`'s key order."""
        t = self.startup_timings()
        return {
            "load_weight": t["load_weight"],
            "kv_cache_allocation": t["kv_cache_allocation"],
            "scheduler_e2e": t["scheduler_e2e"],
            "cuda_graph": self.graph_phase_times(),
            "tokenizer_e2e": t["tokenizer_e2e"],
        }

    def launch_command(self) -> str:
        """The command line the server was started with, shell-quoted."""
        return shlex.join(self.argv)
