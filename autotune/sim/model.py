"""The pure model: SGLang 0.5.9's memory arithmetic, the runtime OOM rule and step times.

No I/O, no clocks: everything here is a function of a Profile, ServerSettings and a seed, so a
search strategy can evaluate thousands of settings in-process. Sizes follow reference §1 and §8:
P (free memory before weights, MIN over ranks), pool = avail after weights − P·(1 − f), cell bytes
by geometry, page rounding, the request table after profiling, then (≤0.5.13 order) workspaces,
target CUDA graphs, draft weights, draft KV and draft graphs out of the headroom. All GPU figures
are GiB (SGLang's "GB"); host-cache figures are decimal GB as SGLang prints them.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TypedDict

from autotune.sim.flags import ServerSettings
from autotune.sim.profiles import Attention, Profile

GiB = 1 << 30
MiB = 1 << 20
HOST_RESERVE_BYTES = 10 * GiB
CLIP_MAX_NEW_TOKENS = 4096
EAGER_DECODE_FACTOR = 1.25
SPEC_DEFAULT_MAX_RUNNING = 48
SPEC_DEFAULTS = (3, 1, 4)  # (num_steps, topk, num_draft_tokens) for DeepseekV3-style targets


@dataclass(frozen=True)
class StartupFailure:
    """Why startup fails and where: `kind` is stable, `stage` names the phase that fails."""

    kind: str  # weights_oom | kv_pool | alloc_oom | graph_capture_oom | host_memory |
    # host_oom_killer | hicache_too_small | pool_too_small | context_too_long | bad_tp
    stage: str  # init | weights | kv | workspace | graphs | draft_weights | draft_kv |
    # draft_graphs | hicache
    message: str
    tried_gib: float = 0.0
    free_gib: float = 0.0
    rank: int = 0


@dataclass(frozen=True)
class StartupPlan:
    """Every size SGLang computes at startup (per GPU, the minimum rank), up to any failure."""

    tp: int
    gpu_total_gib: float
    p_gib: float
    p_per_rank: tuple[float, ...]
    init_mem_usage_gib: float
    mem_fraction_static: float
    mem_fraction_auto: bool
    weights_gib: float
    chunked_prefill_size: int
    max_prefill_tokens: int
    cuda_graph_max_bs: int
    context_len: int
    page_size: int
    kv_dtype: str
    cell_bytes: int
    spec: bool
    avail_after_weights_gib: float | None = None
    profiled_tokens: int | None = None
    max_total_num_tokens: int | None = None
    max_total_tokens_capped: bool = False
    max_num_reqs: int | None = None
    req_to_token_gib: float | None = None
    kv_gib: float | None = None
    k_gib: float | None = None
    v_gib: float | None = None
    avail_after_pool_gib: float | None = None
    workspace_gib: float = 0.0
    capture_bs: tuple[int, ...] = ()
    avail_before_graphs_gib: float | None = None
    graph_gib: float | None = None
    avail_after_graphs_gib: float | None = None
    draft_weights_gib: float | None = None
    avail_after_draft_weights_gib: float | None = None
    draft_cell_bytes: int = 0
    draft_kv_gib: float | None = None
    draft_k_gib: float | None = None
    draft_v_gib: float | None = None
    avail_after_draft_pool_gib: float | None = None
    draft_capture_bs: tuple[int, ...] = ()
    draft_graph_gib: float | None = None
    avail_final_gib: float | None = None
    max_running_requests: int | None = None
    max_req_input_len: int | None = None
    host_cache_tokens: int | None = None
    host_cache_gb: float | None = None
    host_cache_per_token_bytes: int = 0
    spec_steps: int = 0
    spec_topk: int = 0
    spec_draft_tokens: int = 0
    failure: StartupFailure | None = None
    warnings: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return self.failure is None


def gpu_total_gib(profile: Profile) -> float:
    return profile.hardware.gpu_memory_mib / 1024.0


def gpu_class_defaults(gpu_mem_mib: int, tp: int) -> tuple[int, int]:
    """(chunked_prefill_size, cuda_graph_max_bs) from SGLang 0.5.9's GPU-class table."""
    gib = gpu_mem_mib / 1024.0
    table = [
        (20, 2048, 8, 8),
        (35, 2048, 24, 80),
        (60, 4096, 32, 160),
        (90, 8192, 256, 512),
        (160, 8192, 256, 512),
    ]
    for limit, chunk, small, large in table:
        if gib < limit:
            return chunk, (small if tp < 4 else large)
    return 16384, 512


def auto_mem_fraction(
    gpu_mem_mib: int,
    chunked_prefill_size: int,
    max_prefill_tokens: int,
    cuda_graph_max_bs: int,
    tp: int,
    pp: int = 1,
    spec_algorithm: str | None = None,
) -> float:
    """0.5.4–0.5.9 automatic mem_fraction_static (reference §2)."""
    if chunked_prefill_size > 0:
        reserved = 512 + max(chunked_prefill_size, 2048) * 1.5
    else:
        reserved = 512 + max(max_prefill_tokens, 2048) * 1.5
    reserved += cuda_graph_max_bs * 2 + tp * pp / 8 * 1024
    if gpu_mem_mib > 60 * 1024:
        reserved = max(reserved, 10240)
    if spec_algorithm in ("EAGLE", "EAGLE3", "NEXTN"):
        reserved += 2048
    elif spec_algorithm == "STANDALONE":
        reserved += 6144
    return round((gpu_mem_mib - reserved) / gpu_mem_mib, 3)


def kv_dtype_for(settings: ServerSettings, profile: Profile) -> tuple[str, int]:
    """(torch dtype name, bytes per element) for --kv-cache-dtype."""
    choice = settings.kv_cache_dtype
    if choice == "auto":
        if profile.model.kv_fp8_checkpoint:
            return "torch.float8_e4m3fn", 1
        choice = profile.model.dtype
    if choice in ("fp8_e4m3",):
        return "torch.float8_e4m3fn", 1
    if choice == "fp8_e5m2":
        return "torch.float8_e5m2", 1
    if choice == "fp4_e2m1":
        return "torch.float4_e2m1fn_x2", 0
    if choice in ("float16", "fp16", "half"):
        return "torch.float16", 2
    return "torch.bfloat16", 2


def cell_bytes(att: Attention, tp: int, elem: int) -> int:
    """Bytes of KV per token per GPU (0.5.9 get_cell_size_per_token). elem 0 means fp4."""
    if att.kind == "mla":
        dim = att.kv_lora_rank + att.qk_rope_head_dim
        if elem == 0:
            return (dim * att.layers * 2) // 2 + (dim // 16) * att.layers
        return dim * att.layers * elem
    heads = max(1, att.kv_heads // tp)
    v_dim = att.v_head_dim or att.head_dim
    if elem == 0:
        return heads * (att.head_dim + v_dim) * att.layers
    return heads * (att.head_dim + v_dim) * att.layers * elem


def host_bytes_per_token(att: Attention, tp: int, elem: int) -> int:
    """HiCache host pool bytes per token per rank (memory_pool_host.py)."""
    elem = max(elem, 1)
    if att.kind == "mla":
        return (att.kv_lora_rank + att.qk_rope_head_dim) * elem * att.layers
    heads = max(1, att.kv_heads // tp)
    return heads * att.head_dim * att.layers * elem * 2


def capture_batch_sizes(
    max_bs: int, spec: bool, req_pool_size: int, explicit: Sequence[int] | None = None
) -> tuple[int, ...]:
    """CUDA-graph batch sizes SGLang captures (0.5.9 server_args + cuda_graph_runner)."""
    if explicit:
        sizes = sorted(set(explicit))
    elif spec:
        sizes = (
            list(range(1, 9))
            + list(range(10, 33, 2))
            + list(range(40, 65, 4))
            + list(range(72, 257, 8))
            + list(range(272, max(max_bs, 272) + 1, 16))
        )
        sizes = [s for s in sizes if s <= max_bs]
    else:
        sizes = [
            1,
            2,
            4,
            8,
            12,
            *range(16, 257, 8),
            *range(272, 512, 16),
            *range(512, max_bs + 1, 32),
        ]
        sizes = [s for s in sizes if s <= max_bs]
    capped = [s for s in sizes if s <= req_pool_size]
    if sizes and max(sizes) > req_pool_size and req_pool_size not in capped:
        capped.append(req_pool_size)
    return tuple(sorted(capped))


def graph_memory_gib(profile: Profile, sizes: Sequence[int], tokens_per_bs: int) -> float:
    if not sizes:
        return 0.0
    g = profile.cuda_graph
    return (
        g.base_gib
        + g.mib_per_size * len(sizes) / 1024.0
        + g.mib_per_token * max(sizes) * tokens_per_bs / 1024.0
    )


def draft_graph_memory_gib(profile: Profile, sizes: Sequence[int], steps: int, topk: int) -> float:
    draft = profile.draft
    if draft is None or not sizes:
        return 0.0
    return draft.graph_base_gib + draft.graph_mib_per_token * max(sizes) * steps * topk / 1024.0


def _jitter(profile: Profile, seed: int) -> float:
    sigma = profile.variation.startup_mib
    if sigma <= 0:
        return 0.0
    return random.Random(seed * 7919 + 17).gauss(0.0, sigma) / 1024.0


def plan_startup(
    profile: Profile,
    settings: ServerSettings,
    *,
    foreign_gib: Sequence[float] = (),
    seed: int = 0,
) -> StartupPlan:
    """Every startup size SGLang 0.5.9 would compute, and the first failure if one occurs.

    `foreign_gib[i]` is memory other processes hold on the i-th GPU this server uses; it lowers
    that rank's P (the MIN over ranks is what counts).
    """
    tp = settings.tp_size
    total = gpu_total_gib(profile)
    overhead = profile.hardware.cuda_context_gib + _jitter(profile, seed)
    p_ranks = _free_per_rank(total, overhead, tp, foreign_gib)
    chunk, max_bs = _chunk_and_graph_bs(profile, settings)
    dtype_name, elem = kv_dtype_for(settings, profile)
    steps, topk, draft_tokens = _spec_shape(profile, settings)
    base = StartupPlan(
        tp=tp,
        gpu_total_gib=total,
        p_gib=min(p_ranks),
        p_per_rank=p_ranks,
        init_mem_usage_gib=overhead,
        mem_fraction_static=_mem_fraction(profile, settings, chunk, max_bs),
        mem_fraction_auto=settings.mem_fraction_static is None,
        weights_gib=profile.model.weights_gib * profile.model.weights_tp / tp,
        chunked_prefill_size=chunk,
        max_prefill_tokens=settings.max_prefill_tokens,
        cuda_graph_max_bs=max_bs,
        context_len=settings.context_length or profile.model.context_length,
        page_size=settings.page_size or 1,
        kv_dtype=dtype_name,
        cell_bytes=cell_bytes(profile.attention, tp, elem),
        spec=settings.spec,
        spec_steps=steps,
        spec_topk=topk,
        spec_draft_tokens=draft_tokens,
        warnings=_balance_warnings(p_ranks),
    )
    return _Planner(profile, settings, base).run()


def _free_per_rank(
    total: float, overhead: float, tp: int, foreign_gib: Sequence[float]
) -> tuple[float, ...]:
    """P on each rank: the GPU less the CUDA context and what foreign processes hold there."""
    return tuple(
        total - overhead - (foreign_gib[i] if i < len(foreign_gib) else 0.0) for i in range(tp)
    )


def _balance_warnings(p_ranks: tuple[float, ...]) -> tuple[str, ...]:
    """SGLang's warning when one rank has under 90% of another's free memory."""
    p = min(p_ranks)
    if not any(p < 0.9 * local for local in p_ranks):
        return ()
    worst = max(p_ranks)
    return (
        "The memory capacity is unbalanced. Some GPUs may be occupied by other processes. "
        f"min_per_gpu_memory={p}, local_gpu_memory={worst}, "
        f"local_gpu_memory * 0.9={worst * 0.9}",
    )


def _chunk_and_graph_bs(profile: Profile, settings: ServerSettings) -> tuple[int, int]:
    """(chunked_prefill_size, cuda_graph_max_bs): the flags, else the GPU-class defaults."""
    chunk_default, max_bs_default = gpu_class_defaults(
        profile.hardware.gpu_memory_mib, settings.tp_size
    )
    chunk = (
        settings.chunked_prefill_size
        if settings.chunked_prefill_size is not None
        else chunk_default
    )
    if settings.cuda_graph_bs:
        max_bs = max(settings.cuda_graph_bs)
    elif settings.cuda_graph_max_bs is not None:
        max_bs = settings.cuda_graph_max_bs
    else:
        max_bs = max_bs_default
    return chunk, max_bs


def _mem_fraction(profile: Profile, settings: ServerSettings, chunk: int, max_bs: int) -> float:
    """--mem-fraction-static as given, else SGLang's automatic choice."""
    if settings.mem_fraction_static is not None:
        return settings.mem_fraction_static
    return auto_mem_fraction(
        profile.hardware.gpu_memory_mib,
        chunk,
        settings.max_prefill_tokens,
        max_bs,
        settings.tp_size,
        settings.pp_size,
        settings.speculative_algorithm,
    )


def _spec_shape(profile: Profile, settings: ServerSettings) -> tuple[int, int, int]:
    """(num_steps, eagle_topk, num_draft_tokens) for speculative decoding; zeros without it."""
    if not settings.spec:
        return 0, 0, 0
    steps, topk, draft_tokens = SPEC_DEFAULTS
    if profile.draft is not None:
        d = profile.draft
        steps, topk, draft_tokens = d.num_steps, d.topk, d.draft_tokens
    steps = settings.speculative_num_steps or steps
    topk = settings.speculative_eagle_topk or topk
    if settings.speculative_num_steps or settings.speculative_eagle_topk:
        draft_tokens = steps * topk + 1
    draft_tokens = settings.speculative_num_draft_tokens or draft_tokens
    return steps, topk, draft_tokens


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
    avail_final_gib: float
    host_cache_per_token_bytes: int
    host_cache_tokens: int
    host_cache_gb: float


_Stage = Callable[[], StartupFailure | None]


class _Planner:
    """Walks the startup stages in SGLang's order, stopping at the first failure.

    Each stage records the sizes it computes in `sizes` and returns the failure that stops
    startup, if any; the plan is built once at the end, so a failed plan keeps exactly the sizes
    computed before the failure, as SGLang's log shows them. `avail` is the GPU memory still
    free after the stages so far; `tokens` and `reqs` are the token pool's and the request
    table's sizes once the pool is sized.
    """

    def __init__(self, profile: Profile, settings: ServerSettings, base: StartupPlan) -> None:
        self.profile = profile
        self.settings = settings
        self.base = base
        self.sizes: _Sizes = {}
        self.avail = 0.0
        self.tokens = 0
        self.reqs = 0

    def run(self) -> StartupPlan:
        stages: list[_Stage] = [
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
        return replace(self.base, **self.sizes, failure=failure)

    def _running_cap(self) -> int | None:
        """--max-running-requests, else 48 with speculative decoding, else None (automatic)."""
        if self.settings.max_running_requests is not None:
            return self.settings.max_running_requests
        if self.base.spec:
            return SPEC_DEFAULT_MAX_RUNNING
        return None

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

    def _load_weights(self) -> StartupFailure | None:
        b = self.base
        if b.weights_gib >= b.p_gib:
            return _oom("weights_oom", "weights", min(b.weights_gib, 1.0), b.p_gib, "weights")
        self.avail = b.p_gib - b.weights_gib
        self.sizes["avail_after_weights_gib"] = self.avail
        return None

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
        max_req_len = min(b.context_len - 1, n - 1)
        self.sizes.update(
            {
                "avail_after_pool_gib": avail,
                "max_running_requests": max_running,
                "max_req_input_len": max_req_len - 5,
            }
        )
        if max_req_len - 5 <= 0 or max_running <= 0:
            return StartupFailure("pool_too_small", "kv", "Memory pool size is too small")
        return None

    def _reserve_workspace(self) -> StartupFailure | None:
        work = self.profile.cuda_graph.workspace_gib
        self.sizes["workspace_gib"] = work
        if self.avail < work:
            return _oom("alloc_oom", "workspace", work, self.avail, "workspace")
        self.avail -= work
        self.sizes["avail_before_graphs_gib"] = self.avail
        return None

    def _capture_graphs(self) -> StartupFailure | None:
        """The target model's CUDA graphs (none with --disable-cuda-graph)."""
        b = self.base
        s = self.settings
        if s.disable_cuda_graph:
            self.sizes.update({"graph_gib": 0.0, "avail_after_graphs_gib": self.avail})
            return None
        sizes = capture_batch_sizes(b.cuda_graph_max_bs, b.spec, self.reqs, s.cuda_graph_bs)
        graph = graph_memory_gib(self.profile, sizes, b.spec_draft_tokens if b.spec else 1)
        self.sizes.update({"capture_bs": sizes, "graph_gib": graph})
        if graph > self.avail:
            tried = min(graph - self.avail + 0.25, graph)
            return _oom("graph_capture_oom", "graphs", tried, self.avail, "graph")
        self.avail -= graph
        self.sizes["avail_after_graphs_gib"] = self.avail
        return None

    def _draft_model(self) -> StartupFailure | None:
        """With speculative decoding, the draft model's weights, KV pool and CUDA graphs."""
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
        if weights > self.avail:
            tried = min(weights, 0.5)
            return _oom("weights_oom", "draft_weights", tried, self.avail, "draft weights")
        self.avail -= weights
        self.sizes["avail_after_draft_weights_gib"] = self.avail
        return None

    def _draft_pool(self) -> StartupFailure | None:
        draft = self.profile.draft
        dkv = (self.tokens + self.base.page_size) * self.sizes["draft_cell_bytes"] / GiB
        half = dkv / 2 if draft is not None and draft.attention.kind == "mha" else None
        self.sizes.update({"draft_kv_gib": dkv, "draft_k_gib": half, "draft_v_gib": half})
        if dkv > self.avail:
            return _oom("alloc_oom", "draft_kv", dkv, self.avail, "draft kv")
        self.avail -= dkv
        self.sizes["avail_after_draft_pool_gib"] = self.avail
        return None

    def _draft_graphs(self) -> StartupFailure | None:
        b = self.base
        sizes: tuple[int, ...] = ()
        dgraph = 0.0
        if not self.settings.disable_cuda_graph:
            sizes = self.sizes["capture_bs"]
            dgraph = draft_graph_memory_gib(self.profile, sizes, b.spec_steps, b.spec_topk)
        self.sizes.update({"draft_capture_bs": sizes, "draft_graph_gib": dgraph})
        if dgraph > self.avail:
            return _oom("graph_capture_oom", "draft_graphs", dgraph, self.avail, "draft graph")
        self.avail -= dgraph
        return None

    def _hicache(self) -> StartupFailure | None:
        """HiCache's host pool: its size, then SGLang's three ways of refusing it."""
        s = self.settings
        b = self.base
        n = self.tokens
        _, elem = kv_dtype_for(s, self.profile)
        spt = host_bytes_per_token(self.profile.attention, b.tp, elem)
        self.sizes["host_cache_per_token_bytes"] = spt
        if s.hicache_size > 0:
            tokens = int(s.hicache_size * 1e9 // spt)
        else:
            tokens = int(n * s.hicache_ratio)
        tokens = (tokens // b.page_size + 1) * b.page_size
        requested = tokens * spt
        self.sizes.update({"host_cache_tokens": tokens, "host_cache_gb": requested / 1e9})
        if tokens <= n:
            return StartupFailure(
                "hicache_too_small",
                "hicache",
                "The host memory should be larger than the device memory with the current protocol",
            )
        available = self.profile.hardware.host_ram_available_gb * 1e9 - HOST_RESERVE_BYTES
        return _host_memory_failure(requested, available, b.tp)


def _host_memory_failure(requested: float, available: float, tp: int) -> StartupFailure | None:
    """Too little host RAM: refused up front, or the OOM killer takes the ranks that don't fit."""
    if requested > available:
        return StartupFailure(
            "host_memory",
            "hicache",
            f"Not enough host memory available. Requesting {requested / 1e9:.2f} GB but "
            f"only have {available / 1e9:.2f} GB free. Please reduce the size of the "
            "hierarchical cache.",
        )
    ranks_fit = int(available // requested) if requested > 0 else tp
    if ranks_fit < tp:
        return StartupFailure(
            "host_oom_killer",
            "hicache",
            f"Rank {ranks_fit} scheduler is dead. Please check if there are relevant logs.",
            rank=ranks_fit,
        )
    return None


# ---------------------------------------------------------------------------------------------
# Runtime: transient peaks, the OOM rule, step times.


def transient_peak_gib(
    profile: Profile, prefill_tokens: int, decode_seqs: int, rng: random.Random | None = None
) -> float:
    """Activation peak of one forward (GiB per GPU), with run-to-run variation when rng is given."""
    act = profile.activation
    peak = (
        act.base_gib
        + prefill_tokens * act.prefill_mib_per_token / 1024.0
        + decode_seqs * act.decode_mib_per_seq / 1024.0
    )
    if rng is not None and act.variation > 0:
        peak *= max(0.0, 1.0 + rng.gauss(0.0, act.variation))
    return peak


def forward_ooms(plan: StartupPlan, peak_gib: float) -> bool:
    """SGLang OOMs when static memory + this forward's transient peak exceeds the GPU."""
    free = plan.avail_final_gib if plan.avail_final_gib is not None else 0.0
    return peak_gib > free


def prefill_time_s(profile: Profile, extend_tokens: int) -> float:
    t = profile.timing
    return (t.prefill_base_ms + extend_tokens * t.prefill_ms_per_token) / 1000.0


def decode_time_s(
    profile: Profile, batch: int, kv_tokens: int = 0, cuda_graph: bool = True
) -> float:
    t = profile.timing
    ms = (
        t.decode_base_ms
        + batch * t.decode_ms_per_seq
        + kv_tokens * t.decode_us_per_kv_token / 1000.0
    )
    return ms * (1.0 if cuda_graph else EAGER_DECODE_FACTOR) / 1000.0


def accept_length(profile: Profile, spec: bool) -> float:
    if not spec or profile.draft is None:
        return 1.0
    return profile.draft.accept_length


def decode_throughput(profile: Profile, batch: int, spec: bool, kv_tokens: int = 0) -> float:
    """Steady decode tokens/s for `batch` running sequences (no prefill interleaved)."""
    return batch * accept_length(profile, spec) / decode_time_s(profile, batch, kv_tokens)


@dataclass(frozen=True)
class Prediction:
    """In-process evaluation of one setting: sizes, the worst transient, and whether it OOMs."""

    plan: StartupPlan
    peak_gib: float
    runtime_oom: bool
    decode_tok_s: float


def predict(
    profile: Profile,
    settings: ServerSettings,
    *,
    prefill_tokens: int | None = None,
    decode_batch: int | None = None,
    seed: int = 0,
) -> Prediction:
    """Startup sizes plus the mean worst-case transient for a prefill chunk and a decode batch."""
    plan = plan_startup(profile, settings, seed=seed)
    chunk = plan.chunked_prefill_size if plan.chunked_prefill_size > 0 else plan.max_prefill_tokens
    tokens = prefill_tokens if prefill_tokens is not None else chunk
    bs = decode_batch if decode_batch is not None else (plan.max_running_requests or 1)
    peak = max(transient_peak_gib(profile, tokens, 0), transient_peak_gib(profile, 0, bs))
    oom = (not plan.ok) or forward_ooms(plan, peak)
    tput = decode_throughput(profile, max(1, bs), plan.spec) if plan.ok else 0.0
    return Prediction(plan, peak, oom, tput)
