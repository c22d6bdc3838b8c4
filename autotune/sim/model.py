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
from collections.abc import Sequence
from dataclasses import dataclass, field

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
    hw = profile.hardware
    tp = settings.tp_size
    total = gpu_total_gib(profile)
    overhead = profile.hardware.cuda_context_gib + _jitter(profile, seed)
    p_ranks = tuple(
        total - overhead - (foreign_gib[i] if i < len(foreign_gib) else 0.0) for i in range(tp)
    )
    p = min(p_ranks)
    warnings: list[str] = []
    if any(p < 0.9 * local for local in p_ranks):
        worst = max(p_ranks)
        warnings.append(
            "The memory capacity is unbalanced. Some GPUs may be occupied by other processes. "
            f"min_per_gpu_memory={p}, local_gpu_memory={worst}, "
            f"local_gpu_memory * 0.9={worst * 0.9}"
        )
    chunk_default, max_bs_default = gpu_class_defaults(hw.gpu_memory_mib, tp)
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
    auto = settings.mem_fraction_static is None
    f = (
        auto_mem_fraction(
            hw.gpu_memory_mib,
            chunk,
            settings.max_prefill_tokens,
            max_bs,
            tp,
            settings.pp_size,
            settings.speculative_algorithm,
        )
        if settings.mem_fraction_static is None
        else settings.mem_fraction_static
    )
    ctx = settings.context_length or profile.model.context_length
    page = settings.page_size or 1
    dtype_name, elem = kv_dtype_for(settings, profile)
    cell = cell_bytes(profile.attention, tp, elem)
    spec = settings.spec
    steps, topk, draft_tokens = SPEC_DEFAULTS
    if profile.draft is not None:
        d = profile.draft
        steps, topk, draft_tokens = d.num_steps, d.topk, d.draft_tokens
    if spec:
        steps = settings.speculative_num_steps or steps
        topk = settings.speculative_eagle_topk or topk
        if settings.speculative_num_steps or settings.speculative_eagle_topk:
            draft_tokens = steps * topk + 1
        draft_tokens = settings.speculative_num_draft_tokens or draft_tokens
    weights = profile.model.weights_gib * profile.model.weights_tp / tp
    base = StartupPlan(
        tp=tp,
        gpu_total_gib=total,
        p_gib=p,
        p_per_rank=p_ranks,
        init_mem_usage_gib=overhead,
        mem_fraction_static=f,
        mem_fraction_auto=auto,
        weights_gib=weights,
        chunked_prefill_size=chunk,
        max_prefill_tokens=settings.max_prefill_tokens,
        cuda_graph_max_bs=max_bs,
        context_len=ctx,
        page_size=page,
        kv_dtype=dtype_name,
        cell_bytes=cell,
        spec=spec,
        spec_steps=steps if spec else 0,
        spec_topk=topk if spec else 0,
        spec_draft_tokens=draft_tokens if spec else 0,
        warnings=tuple(warnings),
    )
    return _Planner(profile, settings, base).run()


class _Planner:
    """Walks the startup stages in SGLang's order, stopping at the first failure."""

    def __init__(self, profile: Profile, settings: ServerSettings, base: StartupPlan) -> None:
        self.profile = profile
        self.settings = settings
        self.v: dict[str, object] = dict(base.__dict__)
        self.base = base

    def _done(self, failure: StartupFailure | None = None) -> StartupPlan:
        self.v["failure"] = failure
        return StartupPlan(**self.v)  # type: ignore[arg-type]

    def _oom(self, kind: str, stage: str, tried: float, free: float, what: str) -> StartupPlan:
        return self._done(
            StartupFailure(kind, stage, what, tried_gib=tried, free_gib=max(free, 0.0))
        )

    def run(self) -> StartupPlan:
        b = self.base
        s = self.settings
        prof = self.profile
        if s.tp_size > prof.hardware.gpu_count or s.tp_size <= 0:
            return self._done(
                StartupFailure(
                    "bad_tp",
                    "init",
                    f"tp_size={s.tp_size} needs {s.tp_size} GPUs but the profile has "
                    f"{prof.hardware.gpu_count}",
                )
            )
        if b.context_len > prof.model.context_length:
            return self._done(
                StartupFailure(
                    "context_too_long",
                    "init",
                    f"User-specified context_length ({b.context_len}) is greater than the derived "
                    f"context_length ({prof.model.context_length}). This may lead to incorrect "
                    "model outputs or CUDA errors. Note that the derived context_length may "
                    "differ from max_position_embeddings in the model's config. To allow "
                    "overriding this maximum, set the env var "
                    "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1",
                )
            )
        if b.weights_gib >= b.p_gib:
            return self._oom("weights_oom", "weights", min(b.weights_gib, 1.0), b.p_gib, "weights")
        a = b.p_gib - b.weights_gib
        self.v["avail_after_weights_gib"] = a
        rest = a - b.p_gib * (1 - b.mem_fraction_static)
        profiled = int(rest * GiB) // b.cell_bytes if rest > 0 else 0
        self.v["profiled_tokens"] = profiled
        if s.max_running_requests is not None:
            mrr: int | None = s.max_running_requests
        elif b.spec:
            mrr = SPEC_DEFAULT_MAX_RUNNING
        else:
            mrr = None
        r = mrr if mrr is not None else min(max(int(profiled / b.context_len * 512), 2048), 4096)
        n = profiled
        if s.max_total_tokens is not None:
            if s.max_total_tokens > profiled:
                self.v["max_total_tokens_capped"] = False
            n = min(n, s.max_total_tokens)
            self.v["max_total_tokens_capped"] = s.max_total_tokens < profiled
        n = n // b.page_size * b.page_size
        self.v["max_num_reqs"] = r
        if n <= 0:
            return self._done(
                StartupFailure(
                    "kv_pool",
                    "kv",
                    "Not enough memory. Please try to increase --mem-fraction-static. "
                    f"Current value: self.server_args.mem_fraction_static={b.mem_fraction_static}",
                )
            )
        self.v["max_total_num_tokens"] = n
        req_gib = r * (b.context_len + 4 + b.spec_draft_tokens) * 4 / GiB
        self.v["req_to_token_gib"] = req_gib
        rows = n + b.page_size
        kv = rows * b.cell_bytes / GiB
        self.v["kv_gib"] = kv
        if self.profile.attention.kind == "mha":
            self.v["k_gib"] = kv / 2
            self.v["v_gib"] = kv / 2
        avail = a - req_gib
        if avail < 0:
            return self._oom("alloc_oom", "kv", req_gib, a, "req_to_token")
        avail -= kv
        if avail < 0:
            return self._oom("alloc_oom", "kv", kv, avail + kv, "kv")
        self.v["avail_after_pool_gib"] = avail
        max_running = min(n // 2 if mrr is None else mrr, r)
        self.v["max_running_requests"] = max_running
        max_req_len = min(b.context_len - 1, n - 1)
        self.v["max_req_input_len"] = max_req_len - 5
        if max_req_len - 5 <= 0 or max_running <= 0:
            return self._done(
                StartupFailure("pool_too_small", "kv", "Memory pool size is too small")
            )
        work = prof.cuda_graph.workspace_gib
        self.v["workspace_gib"] = work
        if avail < work:
            return self._oom("alloc_oom", "workspace", work, avail, "workspace")
        avail -= work
        self.v["avail_before_graphs_gib"] = avail
        if not s.disable_cuda_graph:
            sizes = capture_batch_sizes(b.cuda_graph_max_bs, b.spec, r, s.cuda_graph_bs)
            self.v["capture_bs"] = sizes
            graph = graph_memory_gib(prof, sizes, b.spec_draft_tokens if b.spec else 1)
            self.v["graph_gib"] = graph
            if graph > avail:
                return self._oom(
                    "graph_capture_oom", "graphs", min(graph - avail + 0.25, graph), avail, "graph"
                )
            avail -= graph
        else:
            self.v["graph_gib"] = 0.0
        self.v["avail_after_graphs_gib"] = avail
        if b.spec:
            failed = self._draft(avail, n)
            if failed is not None:
                return failed
            avail = float(self.v["avail_final_gib"])  # type: ignore[arg-type]
        else:
            self.v["avail_final_gib"] = avail
        if s.enable_hierarchical_cache:
            failed = self._hicache(n)
            if failed is not None:
                return failed
        return self._done()

    def _draft(self, avail: float, n: int) -> StartupPlan | None:
        draft = self.profile.draft
        b = self.base
        if draft is None:
            weights, dcell = 0.0, 0
        else:
            weights = draft.weights_gib * draft.weights_tp / b.tp
            _, elem = kv_dtype_for(self.settings, self.profile)
            dcell = cell_bytes(draft.attention, b.tp, elem)
        self.v["draft_weights_gib"] = weights
        self.v["draft_cell_bytes"] = dcell
        if weights > avail:
            return self._oom(
                "weights_oom", "draft_weights", min(weights, 0.5), avail, "draft weights"
            )
        avail -= weights
        self.v["avail_after_draft_weights_gib"] = avail
        dkv = (n + b.page_size) * dcell / GiB
        self.v["draft_kv_gib"] = dkv
        if draft is not None and draft.attention.kind == "mha":
            self.v["draft_k_gib"] = dkv / 2
            self.v["draft_v_gib"] = dkv / 2
        if dkv > avail:
            return self._oom("alloc_oom", "draft_kv", dkv, avail, "draft kv")
        avail -= dkv
        self.v["avail_after_draft_pool_gib"] = avail
        sizes: tuple[int, ...] = ()
        dgraph = 0.0
        if not self.settings.disable_cuda_graph:
            sizes = tuple(self.v["capture_bs"])  # type: ignore[arg-type]
            dgraph = draft_graph_memory_gib(self.profile, sizes, b.spec_steps, b.spec_topk)
        self.v["draft_capture_bs"] = sizes
        self.v["draft_graph_gib"] = dgraph
        if dgraph > avail:
            return self._oom("graph_capture_oom", "draft_graphs", dgraph, avail, "draft graph")
        avail -= dgraph
        self.v["avail_final_gib"] = avail
        return None

    def _hicache(self, n: int) -> StartupPlan | None:
        s = self.settings
        b = self.base
        _, elem = kv_dtype_for(s, self.profile)
        spt = host_bytes_per_token(self.profile.attention, b.tp, elem)
        self.v["host_cache_per_token_bytes"] = spt
        if s.hicache_size > 0:
            tokens = int(s.hicache_size * 1e9 // spt)
        else:
            tokens = int(n * s.hicache_ratio)
        tokens = (tokens // b.page_size + 1) * b.page_size
        self.v["host_cache_tokens"] = tokens
        requested = tokens * spt
        self.v["host_cache_gb"] = requested / 1e9
        if tokens <= n:
            return self._done(
                StartupFailure(
                    "hicache_too_small",
                    "hicache",
                    "The host memory should be larger than the device memory with the current "
                    "protocol",
                )
            )
        available = self.profile.hardware.host_ram_available_gb * 1e9 - HOST_RESERVE_BYTES
        if requested > available:
            return self._done(
                StartupFailure(
                    "host_memory",
                    "hicache",
                    f"Not enough host memory available. Requesting {requested / 1e9:.2f} GB but "
                    f"only have {available / 1e9:.2f} GB free. Please reduce the size of the "
                    "hierarchical cache.",
                )
            )
        ranks_fit = int(available // requested) if requested > 0 else b.tp
        if ranks_fit < b.tp:
            return self._done(
                StartupFailure(
                    "host_oom_killer",
                    "hicache",
                    f"Rank {ranks_fit} scheduler is dead. Please check if there are relevant logs.",
                    rank=ranks_fit,
                )
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
