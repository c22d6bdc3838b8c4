"""The startup plan as data: every size one SGLang launch computed, and where it failed.

`StartupPlan` is the record `memplan.plan_startup` builds and everything after startup reads: the
stages that print it (`startup`), the ServerArgs and `/server_info` it fills in (`serverargs`,
`httpapi`), the serving loop it bounds (`scheduler`), the forward costs computed from it
(`runtime`), and the harness's benchmark stand-in. It is kept apart from the planner so that its
readers depend on the record's shape only, not on the release's order of stages that fills it.
`StartupFailure` says which stage did not fit and why; `GRAPH_PHASES` names the CUDA-graph
phases the plan's graph memory and the startup's capture times are reported by.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autotune.sim.versions import SglangVersion, get_version

GRAPH_PHASES = (
    "prefill",
    "decode",
    "target_verify",
    "draft_prefill",
    "draft_decode",
    "draft_extend",
)
"""SGLang 0.5.23's CUDA-graph memory phases (`model_executor/graph_memory_usage.py`), in its
order: the keys of `StartupPlan.graph_phases` and of the capture times the server reports."""


@dataclass(frozen=True)
class StartupFailure:
    """Why startup fails and where: `kind` is stable, `stage` names the phase that fails."""

    kind: str  # weights_oom | kv_budget | kv_pool | alloc_oom | graph_capture_oom | host_memory |
    # host_oom_killer | hicache_too_small | pool_too_small | context_too_long | bad_tp |
    # tp_imbalance
    stage: str  # init | weights | kv | workspace | prefill_graphs | graphs | draft_weights |
    # draft_kv | draft_graphs | post_capture | hicache
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
    version: str = "0.5.9"
    sizing_cell_bytes: int = 0
    """Bytes per token the pool is sized with: the cell plus the draft fold (0.5.23)."""
    post_capture: bool = False
    prefill_capture_tokens: tuple[int, ...] = ()
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
    prefill_graph_gib: float | None = None
    avail_before_decode_graphs_gib: float | None = None
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
    draft_prefill_graph_gib: float | None = None
    draft_decode_graph_gib: float | None = None
    draft_extend_graph_gib: float | None = None
    post_capture_tokens: int | None = None
    post_capture_kv_gib: float | None = None
    avail_after_post_capture_gib: float | None = None
    avail_final_gib: float | None = None
    max_running_requests: int | None = None
    max_req_input_len: int | None = None
    host_cache_tokens: int | None = None
    host_cache_gb: float | None = None
    host_cache_per_token_bytes: int = 0
    host_budget_gb: float | None = None
    host_auto_ratio: tuple[float, float] | None = None
    """(requested, chosen) ratio when HiCache auto-sizing picked it (0.5.23)."""
    host_headroom_gib: tuple[float, float] | None = None
    """(host available, cgroup headroom) GiB when 0.5.23 read a cgroup limit (the profile's
    `cgroup_memory_max_gib`): its `HiCache memory headroom` line."""
    host_draft_tokens: int | None = None
    host_draft_gb: float | None = None
    spec_steps: int = 0
    spec_topk: int = 0
    spec_draft_tokens: int = 0
    failure: StartupFailure | None = None
    warnings: tuple[str, ...] = field(default=())
    notes: tuple[tuple[str, str], ...] = field(default=())
    """(stage, warning) lines SGLang prints along the way (the stage says where)."""

    @property
    def ok(self) -> bool:
        """Whether every stage fitted: the server comes up."""
        return self.failure is None

    @property
    def release(self) -> SglangVersion:
        """The simulated release the plan was made for, whose rules its sizes follow."""
        return get_version(self.version)

    def notes_at(self, stage: str) -> tuple[str, ...]:
        """The lines SGLang prints at `stage` (`init`, `kv`, …), in order."""
        return tuple(text for where, text in self.notes if where == stage)

    def graph_phases(self) -> dict[str, float]:
        """GiB of CUDA-graph memory by SGLang 0.5.23's phase names (target + draft)."""
        verify = "target_verify" if self.spec else "decode"
        phases = dict.fromkeys(GRAPH_PHASES, 0.0)
        phases["prefill"] = self.prefill_graph_gib or 0.0
        phases[verify] = self.graph_gib or 0.0
        phases["draft_prefill"] = self.draft_prefill_graph_gib or 0.0
        phases["draft_decode"] = self.draft_decode_graph_gib or 0.0
        phases["draft_extend"] = self.draft_extend_graph_gib or 0.0
        return phases
