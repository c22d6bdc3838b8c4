"""The startup memory plan: every size one SGLang launch computes, in its release's order.

No I/O, no clocks: `plan_startup` is a function of a Profile, ServerSettings, the simulated
release (`versions.SglangVersion`), the server's environment and a seed, so a search strategy
can evaluate thousands of settings in-process. P is the free memory before weights (MIN over
ranks); the pool is what is free after the weights − P·(1 − f), in cells of bytes per token,
page-rounded; then the request table and the pool, the workspaces and the CUDA graphs come out
of the headroom. The releases differ in order:

* 0.5.9: target weights, profile, target KV, workspaces, target graphs; then the draft's
  weights, KV and graphs, all out of the headroom.
* 0.5.23: target then draft weights (both in A), profile with the draft's layers folded into
  the cell (`int(cell · L_draft / L_target)`), request table with a padding row, target KV,
  draft KV, workspaces, target prefill graph, target decode/verify graph, draft prefill/decode/
  extend graphs; with SGLANG_ENABLE_POST_CAPTURE_KV_SIZING (MHA only) the pool is reserved as
  address space and sized after capture, keeping P·(1 − f) free.

It owns the order and the failures (the first stage that does not fit); the sizes settled before
the first stage (P on each rank, what the flags leave automatic) are `planbase`'s, the plan it
returns (`StartupPlan`, `StartupFailure`) is `startupplan`'s record, the per-quantity formulas it
applies are `sizing`'s, and what the planned server's forwards cost while it serves is
`runtime`'s. All
GPU figures are GiB (SGLang's "GB"); host-cache figures are decimal GB as SGLang prints them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, TypedDict

from autotune.sim.flags import ServerSettings
from autotune.sim.planbase import (
    IMBALANCE_ENV,
    base_plan,
    env_flag,
    imbalance_message,
    unbalanced_ranks,
)
from autotune.sim.profiles import Profile
from autotune.sim.sizing import (
    GiB,
    MiB,
    capture_batch_sizes,
    cell_bytes,
    draft_graph_memory_gib,
    graph_memory_gib,
    host_bytes_per_token,
    kv_dtype_for,
    kv_split_gib,
    prefill_graph_memory_gib,
    resolve_release,
)
from autotune.sim.startupplan import StartupFailure, StartupPlan
from autotune.sim.versions import SglangVersion

HOST_RESERVE_BYTES = 10 * GiB
SPEC_DEFAULT_MAX_RUNNING = 48
VMM_GRANULARITY = 2 * MiB  # CUDA VMM allocation granularity (post-capture KV backing)
HICACHE_AUTO_SLACK = 0.05


def plan_startup(
    profile: Profile,
    settings: ServerSettings,
    *,
    foreign_gib: Sequence[float] = (),
    seed: int = 0,
    version: SglangVersion | str | None = None,
    env: Mapping[str, str] | None = None,
) -> StartupPlan:
    """Every startup size the release would compute, and the first failure if one occurs.

    `version` defaults to the profile's `sglang_version`; `env` is the server's environment
    (SGLANG_ENABLE_POST_CAPTURE_KV_SIZING, SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK).
    `foreign_gib[i]` is memory other processes hold on the i-th GPU this server uses; it lowers
    that rank's P (the MIN over ranks is what counts).
    """
    release = resolve_release(version, profile)
    environ = env if env is not None else {}
    base = base_plan(profile, settings, release, environ, foreign_gib=foreign_gib, seed=seed)
    return _Planner(profile, settings, base, release, environ).run()


def _oom(kind: str, stage: str, tried: float, free: float, what: str) -> StartupFailure:
    return StartupFailure(kind, stage, what, tried_gib=tried, free_gib=max(free, 0.0))


class _Sizes(TypedDict, total=False):
    """The StartupPlan fields the stages compute, as far as startup got.

    mypy checks every key and type against StartupPlan where the plan is built from it.
    """

    avail_after_weights_gib: float
    profiled_tokens: int
    max_total_num_tokens: int
    max_total_tokens_capped: bool
    max_num_reqs: int
    req_to_token_gib: float
    kv_gib: float
    k_gib: float | None
    v_gib: float | None
    avail_after_pool_gib: float
    max_running_requests: int
    max_req_input_len: int
    workspace_gib: float
    avail_before_graphs_gib: float
    prefill_graph_gib: float
    avail_before_decode_graphs_gib: float
    capture_bs: tuple[int, ...]
    graph_gib: float
    avail_after_graphs_gib: float
    draft_weights_gib: float
    draft_cell_bytes: int
    avail_after_draft_weights_gib: float
    draft_kv_gib: float
    draft_k_gib: float | None
    draft_v_gib: float | None
    avail_after_draft_pool_gib: float
    draft_capture_bs: tuple[int, ...]
    draft_graph_gib: float
    draft_prefill_graph_gib: float
    draft_decode_graph_gib: float
    draft_extend_graph_gib: float
    post_capture_tokens: int
    post_capture_kv_gib: float
    avail_after_post_capture_gib: float
    avail_final_gib: float
    host_cache_per_token_bytes: int
    host_cache_tokens: int
    host_cache_gb: float
    host_budget_gb: float
    host_auto_ratio: tuple[float, float]
    host_headroom_gib: tuple[float, float]
    host_draft_tokens: int
    host_draft_gb: float


_Stage = Callable[[], StartupFailure | None]
_Left = Literal[
    "avail_before_graphs_gib",
    "avail_before_decode_graphs_gib",
    "avail_after_graphs_gib",
    "avail_after_draft_weights_gib",
    "avail_after_draft_pool_gib",
    "avail_final_gib",
]


@dataclass(eq=False)
class _Planner:
    """Walks the startup stages in the release's order, stopping at the first failure.

    Each stage records the sizes it computes in `sizes` and returns the failure that stops
    startup, if any; the plan is built once at the end, so a failed plan keeps exactly the sizes
    computed before the failure, as SGLang's log shows them. `avail` is the GPU memory still
    free after the stages so far; `tokens` and `reqs` are the token pool's and the request
    table's sizes once the pool is sized.
    """

    profile: Profile
    settings: ServerSettings
    base: StartupPlan
    release: SglangVersion
    env: Mapping[str, str]
    sizes: _Sizes = field(init=False, default_factory=_Sizes)
    notes: list[tuple[str, str]] = field(init=False, default_factory=list)
    warnings: list[str] = field(init=False)
    avail: float = field(init=False, default=0.0)
    tokens: int = field(init=False, default=0)
    reqs: int = field(init=False, default=0)
    backed_gib: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        self.warnings = list(self.base.warnings)

    def run(self) -> StartupPlan:
        stages: list[_Stage]
        if self.release.draft_before_profile:
            stages = [
                self._check_args,
                self._check_balance,
                self._load_weights,
                self._draft_weights_first,
                self._size_pool_folded,
                self._allocate_pool_padded,
                self._draft_pool_now,
                self._reserve_workspace,
                self._capture_prefill,
                self._capture_graphs,
                self._draft_graphs_by_phase,
                self._post_capture_resize,
            ]
        else:
            stages = [
                self._check_args,
                self._load_weights,
                self._size_pool,
                self._allocate_pool,
                self._reserve_workspace,
                self._capture_graphs,
                self._draft_model,
            ]
        if self.settings.enable_hierarchical_cache:
            stages.append(self._hicache)
        failure = None
        for stage in stages:
            failure = stage()
            if failure is not None:
                break
        return replace(
            self.base,
            **self.sizes,
            failure=failure,
            notes=tuple(self.notes),
            warnings=tuple(self.warnings),
        )

    def _take(
        self,
        gib: float,
        kind: str,
        stage: str,
        what: str,
        *,
        tried: float | None = None,
        left: _Left | None = None,
    ) -> StartupFailure | None:
        """Take `gib` out of what is free, recording what is left under `left`; or, when it does
        not fit, the OOM that stops startup (`tried`: what the allocator reports asking for, all
        of `gib` unless given)."""
        if gib > self.avail:
            return _oom(kind, stage, gib if tried is None else tried, self.avail, what)
        self.avail -= gib
        if left is not None:
            self.sizes[left] = self.avail
        return None

    def _take_graph(
        self, graph: float, stage: str, what: str, left: _Left
    ) -> StartupFailure | None:
        """A target CUDA graph's capture: when it does not fit, the allocator reports asking for
        what is missing plus a quarter GiB (at most the whole graph)."""
        tried = min(graph - self.avail + 0.25, graph)
        return self._take(graph, "graph_capture_oom", stage, what, tried=tried, left=left)

    def _running_cap(self) -> int | None:
        """--max-running-requests, else 48 with speculative decoding, else None (automatic)."""
        if self.settings.max_running_requests is not None:
            return self.settings.max_running_requests
        if self.base.spec:
            return SPEC_DEFAULT_MAX_RUNNING
        return None

    # ---- checks and weights -------------------------------------------------------------------

    def _check_args(self) -> StartupFailure | None:
        """What SGLang refuses before touching the GPU: TP size and context length."""
        s = self.settings
        prof = self.profile
        if s.tp_size > prof.hardware.gpu_count or s.tp_size <= 0:
            return StartupFailure(
                "bad_tp",
                "init",
                f"tp_size={s.tp_size} needs {s.tp_size} GPUs but the profile has "
                f"{prof.hardware.gpu_count}",
            )
        if self.base.context_len > prof.model.context_length:
            return StartupFailure(
                "context_too_long",
                "init",
                f"User-specified context_length ({self.base.context_len}) is greater than the "
                f"derived context_length ({prof.model.context_length}). This may lead to incorrect "
                "model outputs or CUDA errors. Note that the derived context_length may "
                "differ from max_position_embeddings in the model's config. To allow "
                "overriding this maximum, set the env var "
                "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1",
            )
        return None

    def _check_balance(self) -> StartupFailure | None:
        """0.5.23: a rank with > P/0.9 free raises (unless the env check is turned off)."""
        b = self.base
        ranks = unbalanced_ranks(b.p_per_rank) if b.tp > 1 else ()
        if not ranks:
            return None
        first = ranks[0]
        message = imbalance_message(b.p_gib, b.p_per_rank[first])
        if env_flag(self.env, IMBALANCE_ENV, True):
            return StartupFailure("tp_imbalance", "init", message, rank=first)
        self.notes.extend(("init", imbalance_message(b.p_gib, b.p_per_rank[r])) for r in ranks)
        return None

    def _load_weights(self) -> StartupFailure | None:
        b = self.base
        if b.weights_gib >= b.p_gib:
            return _oom("weights_oom", "weights", min(b.weights_gib, 1.0), b.p_gib, "weights")
        self.avail = b.p_gib - b.weights_gib
        self.sizes["avail_after_weights_gib"] = self.avail
        return None

    def _draft_weights_first(self) -> StartupFailure | None:
        """0.5.23: the draft's weights load right after the target's, before any profiling."""
        if not self.base.spec:
            return None
        return self._draft_weights()

    # ---- 0.5.9 pool -------------------------------------------------------------------------

    def _size_pool(self) -> StartupFailure | None:
        """Profile the KV pool (tokens, page-rounded) and the request table's row count."""
        b = self.base
        cap_tokens = self.settings.max_total_tokens
        rest = self.avail - b.p_gib * (1 - b.mem_fraction_static)
        profiled = int(rest * GiB) // b.cell_bytes if rest > 0 else 0
        cap = self._running_cap()
        reqs = cap if cap is not None else min(max(int(profiled / b.context_len * 512), 2048), 4096)
        self.sizes.update({"profiled_tokens": profiled, "max_num_reqs": reqs})
        n = profiled
        if cap_tokens is not None:
            n = min(n, cap_tokens)
            self.sizes["max_total_tokens_capped"] = cap_tokens < profiled
        n = n // b.page_size * b.page_size
        if n <= 0:
            return StartupFailure(
                "kv_pool",
                "kv",
                "Not enough memory. Please try to increase --mem-fraction-static. "
                f"Current value: self.server_args.mem_fraction_static={b.mem_fraction_static}",
            )
        self.tokens, self.reqs = n, reqs
        self.sizes["max_total_num_tokens"] = n
        return None

    def _allocate_pool(self) -> StartupFailure | None:
        """Allocate the request table and the KV pool; derive the running and input limits."""
        b = self.base
        n, r = self.tokens, self.reqs
        req_gib = r * (b.context_len + 4 + b.spec_draft_tokens) * 4 / GiB
        kv = (n + b.page_size) * b.cell_bytes / GiB
        half = kv / 2 if self.profile.attention.kind == "mha" else None
        self.sizes.update({"req_to_token_gib": req_gib, "kv_gib": kv, "k_gib": half, "v_gib": half})
        avail = self.avail - req_gib
        if avail < 0:
            return _oom("alloc_oom", "kv", req_gib, self.avail, "req_to_token")
        avail -= kv
        if avail < 0:
            return _oom("alloc_oom", "kv", kv, avail + kv, "kv")
        self.avail = avail
        cap = self._running_cap()
        max_running = min(n // 2 if cap is None else cap, r)
        return self._limits(max_running)

    def _limits(self, max_running: int) -> StartupFailure | None:
        b = self.base
        max_req_len = min(b.context_len - 1, self.tokens - 1)
        self.sizes.update(
            {
                "avail_after_pool_gib": self.avail,
                "max_running_requests": max_running,
                "max_req_input_len": max_req_len - 5,
            }
        )
        if max_req_len - 5 <= 0 or max_running <= 0:
            return StartupFailure("pool_too_small", "kv", "Memory pool size is too small")
        return None

    # ---- 0.5.23 pool ------------------------------------------------------------------------

    def _size_pool_folded(self) -> StartupFailure | None:
        """0.5.23 `_profile_available_bytes` and `calculate_pool_sizes` with the draft fold."""
        b = self.base
        rest = self.avail - b.p_gib * (1 - b.mem_fraction_static)
        if rest <= 0:
            minimum = 1 - self.avail / b.p_gib
            suggested = math.ceil(minimum * 1000) / 1000
            return StartupFailure(
                "kv_budget",
                "kv",
                "Loaded weights leave no GPU memory for the KV cache under "
                f"--mem-fraction-static={b.mem_fraction_static}. Raise --mem-fraction-static "
                f"above {suggested:.3f} (minimum viable = 1 - available/pre = {minimum:.4f}). "
                "If using speculative decoding, draft weights are now counted.",
            )
        profiled = int(rest * GiB) // b.sizing_cell_bytes // b.page_size * b.page_size
        self.sizes["profiled_tokens"] = profiled
        if profiled <= 0:
            return StartupFailure(
                "kv_pool", "kv", "Not enough memory. Please try to increase --mem-fraction-static."
            )
        n = profiled
        user = self.settings.max_total_tokens
        if user is not None:
            if user > profiled:
                self.notes.append(
                    (
                        "kv",
                        f"max_total_tokens={user} is larger than the profiled value {profiled}. "
                        "Use the profiled value instead.",
                    )
                )
            n = min(n, user) // b.page_size * b.page_size
            self.sizes["max_total_tokens_capped"] = user < profiled
        self.tokens = n
        self.reqs = self._resolve_max_num_reqs(n, "kv")
        self.sizes.update({"max_total_num_tokens": n, "max_num_reqs": self.reqs})
        return None

    def _resolve_max_num_reqs(self, tokens: int, stage: str) -> int:
        """0.5.23 `resolve_max_num_reqs` (one DP group)."""
        estimated = max(min(int(tokens / self.base.context_len * 512), 4096), 2048)
        cap = self._running_cap()
        if cap is None:
            return min(estimated, tokens // 2)
        requested = max(1, cap)
        reqs = min(requested, tokens // 2)
        if reqs < requested:
            self.notes.append(
                (
                    stage,
                    f"max_running_requests was reduced from the requested {requested} to {reqs} "
                    "(per dp worker) due to the available KV cache capacity.",
                )
            )
        return reqs

    def _allocate_pool_padded(self) -> StartupFailure | None:
        """The request table (with its padding row), then the target pool in its own geometry.

        With post-capture sizing the pool is address space only: one page per buffer is backed.
        """
        b = self.base
        n, r = self.tokens, self.reqs
        rows = r + self.release.req_pool_padding
        req_gib = rows * (b.context_len + 4 + b.spec_draft_tokens) * 4 / GiB
        _, elem = kv_dtype_for(self.settings, self.profile)
        att = self.profile.attention
        k, v = kv_split_gib(att, b.tp, elem, n + b.page_size)
        kv = k + (v or 0.0)
        self.sizes.update(
            {"req_to_token_gib": req_gib, "kv_gib": kv, "k_gib": k if v else None, "v_gib": v}
        )
        failure = self._take(req_gib, "alloc_oom", "kv", "req_to_token")
        if failure is not None:
            return failure
        used = kv
        if b.post_capture:
            buffers = 2 * att.layers if att.kind == "mha" else att.layers
            self.backed_gib = buffers * VMM_GRANULARITY / GiB
            used = self.backed_gib
        return self._take(used, "alloc_oom", "kv", "kv") or self._limits(r)

    def _draft_pool_now(self) -> StartupFailure | None:
        """0.5.23: the draft's pool follows the target's (same tokens, its own geometry)."""
        if not self.base.spec:
            return None
        return self._draft_pool()

    # ---- graphs -----------------------------------------------------------------------------

    def _reserve_workspace(self) -> StartupFailure | None:
        work = self.profile.cuda_graph.workspace_gib
        self.sizes["workspace_gib"] = work
        return self._take(
            work, "alloc_oom", "workspace", "workspace", left="avail_before_graphs_gib"
        )

    def _capture_prefill(self) -> StartupFailure | None:
        """0.5.23: the target's prefill graph (breakable backend), before decode."""
        tokens = self._prefill_tokens_fitting()
        graph = prefill_graph_memory_gib(self.profile, tokens)
        self.sizes["prefill_graph_gib"] = graph
        return self._take_graph(
            graph, "prefill_graphs", "prefill graph", "avail_before_decode_graphs_gib"
        )

    def _prefill_tokens_fitting(self) -> tuple[int, ...]:
        """The prefill token counts, cut to what the request table times the context holds."""
        limit = self.reqs * self.base.context_len
        return tuple(t for t in self.base.prefill_capture_tokens if t <= limit)

    def _capture_graphs(self) -> StartupFailure | None:
        """The target model's decode (or verify) CUDA graphs (none when disabled)."""
        b = self.base
        s = self.settings
        if s.decode_graph_disabled:
            self.sizes.update({"graph_gib": 0.0, "avail_after_graphs_gib": self.avail})
            return None
        sizes = capture_batch_sizes(b.cuda_graph_max_bs, b.spec, self.reqs, s.cuda_graph_bs)
        graph = graph_memory_gib(self.profile, sizes, b.spec_draft_tokens if b.spec else 1)
        self.sizes.update({"capture_bs": sizes, "graph_gib": graph})
        return self._take_graph(graph, "graphs", "graph", "avail_after_graphs_gib")

    # ---- draft ------------------------------------------------------------------------------

    def _draft_model(self) -> StartupFailure | None:
        """0.5.9: the draft model's weights, KV pool and CUDA graphs, out of the headroom."""
        if self.base.spec:
            failure = self._draft_weights() or self._draft_pool() or self._draft_graphs()
            if failure is not None:
                return failure
        self.sizes["avail_final_gib"] = self.avail
        return None

    def _draft_weights(self) -> StartupFailure | None:
        draft = self.profile.draft
        b = self.base
        if draft is None:
            weights, dcell = 0.0, 0
        else:
            weights = draft.weights_gib * draft.weights_tp / b.tp
            _, elem = kv_dtype_for(self.settings, self.profile)
            dcell = cell_bytes(draft.attention, b.tp, elem)
        self.sizes.update({"draft_weights_gib": weights, "draft_cell_bytes": dcell})
        return self._take(
            weights,
            "weights_oom",
            "draft_weights",
            "draft weights",
            tried=min(weights, 0.5),
            left="avail_after_draft_weights_gib",
        )

    def _draft_pool(self) -> StartupFailure | None:
        draft = self.profile.draft
        rows = self.tokens + self.base.page_size
        if self.release.draft_before_profile and draft is not None:
            _, elem = kv_dtype_for(self.settings, self.profile)
            dk, dv = kv_split_gib(draft.attention, self.base.tp, elem, rows)
            dkv, dk_or_none = dk + (dv or 0.0), (dk if dv is not None else None)
            half_v = dv
        else:
            dkv = rows * self.sizes["draft_cell_bytes"] / GiB
            half = dkv / 2 if draft is not None and draft.attention.kind == "mha" else None
            dk_or_none, half_v = half, half
        self.sizes.update({"draft_kv_gib": dkv, "draft_k_gib": dk_or_none, "draft_v_gib": half_v})
        return self._take(
            dkv, "alloc_oom", "draft_kv", "draft kv", left="avail_after_draft_pool_gib"
        )

    def _draft_graphs(self) -> StartupFailure | None:
        b = self.base
        sizes: tuple[int, ...] = ()
        dgraph = 0.0
        if not self.settings.decode_graph_disabled:
            sizes = self.sizes["capture_bs"]
            dgraph = draft_graph_memory_gib(self.profile, sizes, b.spec_steps, b.spec_topk)
        self.sizes.update({"draft_capture_bs": sizes, "draft_graph_gib": dgraph})
        return self._take(dgraph, "graph_capture_oom", "draft_graphs", "draft graph")

    def _draft_graphs_by_phase(self) -> StartupFailure | None:
        """0.5.23: the draft's prefill graph (every rank), then decode (steps > 1) and extend.

        Decode + extend together cost what 0.5.9's one draft graph cost: decode takes
        (steps − 1)/steps of it, extend 1/steps.
        """
        b = self.base
        if not b.spec:
            self.sizes["avail_final_gib"] = self.avail
            return None
        draft = self.profile.draft
        prefill = draft.prefill_graph_gib if draft and b.prefill_capture_tokens else 0.0
        sizes: tuple[int, ...] = ()
        total = 0.0
        if not self.settings.decode_graph_disabled:
            sizes = self.sizes.get("capture_bs", ())
            total = draft_graph_memory_gib(self.profile, sizes, b.spec_steps, b.spec_topk)
        steps = max(b.spec_steps, 1)
        decode = total * (steps - 1) / steps
        extend = total - decode
        self.sizes.update(
            {
                "draft_capture_bs": sizes,
                "draft_graph_gib": total,
                "draft_prefill_graph_gib": prefill,
                "draft_decode_graph_gib": decode,
                "draft_extend_graph_gib": extend,
            }
        )
        return self._take(
            prefill + total,
            "graph_capture_oom",
            "draft_graphs",
            "draft graph",
            left="avail_final_gib",
        )

    # ---- 0.5.23 post-capture sizing ---------------------------------------------------------

    def _post_capture_resize(self) -> StartupFailure | None:
        """SGLANG_ENABLE_POST_CAPTURE_KV_SIZING: size the pool from what capture left, keeping
        P·(1 − f) free; the pool only shrinks (kv_pool_runtime.compute_post_capture_kv_resize)."""
        b = self.base
        if not b.post_capture:
            return None
        headroom = b.p_gib * (1 - b.mem_fraction_static)
        if not self.settings.decode_graph_disabled and b.cuda_graph_max_bs < self.reqs:
            self.notes.append(
                (
                    "post_capture",
                    f"Post-capture KV sizing: decode CUDA graph max_bs={b.cuda_graph_max_bs} < "
                    f"max_running_requests={self.reqs}; reserving activation headroom",
                )
            )
            headroom = max(headroom, self._activation_reserve_mib() / 1024)
        budget = int(max(0.0, self.avail - headroom) * GiB) + int(self.backed_gib * GiB)
        n = budget // b.sizing_cell_bytes // b.page_size * b.page_size
        n = min(n, self.tokens)
        if n <= 0:
            return StartupFailure(
                "kv_pool",
                "post_capture",
                "Not enough memory. Please try to increase --mem-fraction-static.",
            )
        backed = self._backed_gib(n)
        self.avail -= backed - self.backed_gib
        reqs = min(self.reqs, self._resolve_max_num_reqs(n, "post_capture"))
        if reqs < self.reqs:
            self.notes.append(
                (
                    "post_capture",
                    f"Post-capture KV sizing: max_running_requests {self.reqs} -> {reqs}",
                )
            )
        self.tokens, self.reqs = n, reqs
        max_req_len = min(b.context_len - 1, n - 1)
        self.sizes.update(
            {
                "post_capture_tokens": n,
                "post_capture_kv_gib": backed,
                "avail_after_post_capture_gib": self.avail,
                "max_total_num_tokens": n,
                "max_running_requests": reqs,
                "max_req_input_len": max_req_len - 5,
                "avail_final_gib": self.avail,
            }
        )
        return None

    def _activation_reserve_mib(self) -> float:
        """0.5.23 `pre_capture_activation_reserve_mb`."""
        b = self.base
        tokens = (
            max(b.chunked_prefill_size, 2048)
            if b.chunked_prefill_size > 0
            else max(b.max_prefill_tokens, 2048)
        )
        reserve = 512 + tokens * 1.5 + b.tp * self.settings.pp_size / 8 * 1024
        if self.profile.hardware.gpu_memory_mib > 60 * 1024:
            reserve = max(reserve, 10 * 1024)
        return reserve

    def _backed_gib(self, tokens: int) -> float:
        """Bytes the VMM arena backs for `tokens`: each K/V buffer rounded up to a granule."""
        b = self.base
        att = self.profile.attention
        _, elem = kv_dtype_for(self.settings, self.profile)
        heads = max(1, att.kv_heads // b.tp)
        rows = tokens + b.page_size
        spans = [rows * heads * att.head_dim * max(elem, 1)] * att.layers
        spans += [rows * heads * (att.v_head_dim or att.head_dim) * max(elem, 1)] * att.layers
        granule = VMM_GRANULARITY
        return sum(-(-span // granule) * granule for span in spans) / GiB

    # ---- host cache -------------------------------------------------------------------------

    def _hicache(self) -> StartupFailure | None:
        """HiCache's host pool (and the draft's, 0.5.23): its size, then the release's refusals."""
        s = self.settings
        b = self.base
        n = self.tokens
        _, elem = kv_dtype_for(s, self.profile)
        spt = host_bytes_per_token(self.profile.attention, b.tp, elem)
        self.sizes["host_cache_per_token_bytes"] = spt
        available = self._host_available()
        auto = self.release.hicache_auto_size and s.hicache_size <= 0 and s.hicache_ratio is None
        if auto:
            return self._hicache_auto(available, spt)
        if s.hicache_size > 0:
            tokens = int(s.hicache_size * 1e9 // spt)
        else:
            ratio = s.hicache_ratio if s.hicache_ratio is not None else 2.0
            tokens = int(n * ratio)
        tokens = (tokens // b.page_size + 1) * b.page_size
        requested = tokens * spt
        self.sizes.update({"host_cache_tokens": tokens, "host_cache_gb": requested / 1e9})
        small = self._host_pool_size_check("kv", tokens)
        if small is not None:
            return small
        if not self.release.host_budget_per_rank:
            cgroup = self.profile.hardware.cgroup_memory_max_gib * GiB
            return _host_memory_failure(requested, available - HOST_RESERVE_BYTES, b.tp, cgroup)
        budget = (int(available) - HOST_RESERVE_BYTES) // b.tp
        self.sizes["host_budget_gb"] = budget / 1e9
        if requested > budget:
            return _host_refused(requested, budget)
        left = (int(available) - b.tp * requested - HOST_RESERVE_BYTES) // b.tp
        return self._draft_host_pool(tokens, left)

    def _host_available(self) -> float:
        """Host RAM a pool may be checked against, bytes: the profile's available RAM, bounded
        by the container's cgroup limit where the release reads it (0.5.23
        `mem_cache/host_memory.py: available_host_memory_bytes`; the simulated container's usage
        before the pools is taken as none, so its headroom is the limit)."""
        hw = self.profile.hardware
        host = hw.host_ram_available_gb * 1e9
        cgroup = hw.cgroup_memory_max_gib * GiB
        if cgroup <= 0 or not self.release.host_reads_cgroup:
            return host
        self.sizes["host_headroom_gib"] = (host / GiB, cgroup / GiB)
        return min(host, cgroup)

    def _host_pool_size_check(self, label: str, tokens: int) -> StartupFailure | None:
        """0.5.9 refuses a host pool not larger than the device pool; 0.5.23 warns."""
        if tokens > self.tokens:
            return None
        if self.release.host_pool_must_exceed_device:
            return StartupFailure(
                "hicache_too_small",
                "hicache",
                "The host memory should be larger than the device memory with the current protocol",
            )
        self.notes.append(
            (
                "hicache",
                f"HiCache {label} host pool ({tokens} tokens) is smaller than the device pool "
                f"({self.tokens} tokens);L2 cache effectiveness is reduced.Consider increasing "
                "--hicache-ratio (or --hicache-size) for higher L2 cache hit rate.",
            )
        )
        return None

    def _draft_host_pool(self, tokens: int, budget: int) -> StartupFailure | None:
        """0.5.23: the draft's host pool has the target host pool's token count."""
        draft = self.profile.draft
        if not (self.release.draft_host_pool and self.base.spec and draft is not None):
            return None
        _, elem = kv_dtype_for(self.settings, self.profile)
        requested = tokens * host_bytes_per_token(draft.attention, self.base.tp, elem)
        self.sizes.update({"host_draft_tokens": tokens, "host_draft_gb": requested / 1e9})
        if requested > budget:
            return _host_refused(requested, budget)
        return None

    def _hicache_auto(self, available: float, spt: int) -> StartupFailure | None:
        """0.5.23 auto-sizing: the ratio shrinks until the pools fit fraction × the rank's share."""
        s = self.settings
        b = self.base
        requested_ratio = 1.2 if s.hicache_host_memory_mode == "buffer_only" else 2.0
        fraction = s.hicache_host_memory_fraction
        fraction = 0.8 if fraction is None else fraction
        per_rank = (int(available) - HOST_RESERVE_BYTES) // b.tp
        budget = int(per_rank * fraction)
        device = int(((self.sizes.get("kv_gib") or 0.0) + (self.sizes.get("draft_kv_gib") or 0.0))
                     * GiB)  # fmt: skip
        ratio = min(requested_ratio, budget * (1 - HICACHE_AUTO_SLACK) / max(device, 1))
        if ratio <= 0:
            return StartupFailure(
                "host_memory",
                "hicache",
                "No host memory is left for HiCache after the 10 GiB reserve; set --hicache-ratio "
                "or --hicache-size explicitly.",
            )
        self.sizes.update(
            {"host_auto_ratio": (requested_ratio, ratio), "host_budget_gb": budget / 1e9}
        )
        tokens = (int(self.tokens * ratio) // b.page_size + 1) * b.page_size
        requested = tokens * spt
        self.sizes.update({"host_cache_tokens": tokens, "host_cache_gb": requested / 1e9})
        small = self._host_pool_size_check("kv", tokens)
        if small is not None:
            return small
        if requested > budget:
            return _host_refused(requested, budget)
        return self._draft_host_pool(tokens, budget - requested)


def _host_refused(requested: float, available: float) -> StartupFailure:
    return StartupFailure(
        "host_memory",
        "hicache",
        f"Not enough host memory available. Requesting {requested / 1e9:.2f} GB but "
        f"only have {available / 1e9:.2f} GB free. Please reduce the size of the "
        "hierarchical cache.",
    )


def _host_memory_failure(
    requested: float, available: float, tp: int, cgroup: float = 0.0
) -> StartupFailure | None:
    """0.5.9: too little host RAM is refused up front, or the OOM killer takes the ranks that
    don't fit (each rank checks against the whole box; the container's memory limit, `cgroup`
    bytes when one is set, is never read, and its OOM killer takes the rank that pins past it)."""
    if requested > available:
        return _host_refused(requested, available)
    ranks_fit = int(available // requested) if requested > 0 else tp
    if cgroup > 0 and requested > 0:
        ranks_fit = min(ranks_fit, int(cgroup // requested))
    if ranks_fit < tp:
        return StartupFailure(
            "host_oom_killer",
            "hicache",
            f"Rank {ranks_fit} scheduler is dead. Please check if there are relevant logs.",
            rank=ranks_fit,
        )
    return None
