"""The memory ledger of one server start: where each GiB of a GPU went (`Ledger`), and SGLang's
graph memory phases (`GRAPH_PHASES`) its `graph_phases` are keyed by.

Two readers fill it: `logparse.accounting` from the server's log (`build_ledger`; each rank
apart: `rank_ledgers`) and `logparse.serverinfo` from `/server_info` (`ledger_from_server_info`,
with `cross_check` naming the fields on which the two disagree). A trial records its ledger
(`to_dict`, read back by `from_dict`); the memory model, the search and every review surface read
its fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

GRAPH_PHASES = (
    "prefill",
    "decode",
    "target_verify",
    "draft_prefill",
    "draft_decode",
    "draft_extend",
)
"""SGLang's graph memory phases (`model_executor/graph_memory_usage.py`), in its order."""
DRAFT_PHASES = frozenset(p for p in GRAPH_PHASES if p.startswith("draft_"))


@dataclass(frozen=True)
class Ledger:
    """Sizes in GiB per GPU unless named `_gb` (decimal, host memory) or counted in tokens."""

    p_gib: float | None = None
    weights_gib: float | None = None
    avail_after_weights_gib: float | None = None
    max_total_num_tokens: int | None = None
    kv_gib: float | None = None
    kv_dtype: str | None = None
    draft_weights_gib: float | None = None
    draft_kv_gib: float | None = None
    req_to_token_gib: float | None = None
    avail_after_pool_gib: float | None = None
    graph_gib: float | None = None
    draft_graph_gib: float | None = None
    avail_after_graphs_gib: float | None = None
    available_gpu_mem_gib: float | None = None
    host_cache_gb: float | None = None
    host_cache_tokens: int | None = None
    max_running_requests: int | None = None
    chunked_prefill_size: int | None = None
    max_prefill_tokens: int | None = None
    context_len: int | None = None
    model_type: str | None = None
    ranks: int | None = None
    # Which rules the figures follow, and what the log showed besides the sizes above.
    semantics: str | None = None
    semantics_from: str | None = None
    sglang_version: str | None = None
    graph_phases: dict[str, float] | None = field(default=None, hash=False)
    """Graph memory per SGLang phase (target + draft, max over ranks), GiB."""
    graph_max_bs: int | None = None
    """The largest decode (or verify) batch captured."""
    prefill_graph_max_tokens: int | None = None
    kv_va_gib: float | None = None
    """Post-capture sizing: the address space first reserved for the pool (not memory)."""
    swa_kv_gib: float | None = None
    """A hybrid sliding-window pool's SWA half, part of `kv_gib` (which holds both halves: SGLang
    sizes each full token's cell with `swa_full_tokens_ratio` of an SWA cell)."""
    swa_tokens: int | None = None
    aux_kv_gib: float | None = None
    mamba_gib: float | None = None
    """A hybrid linear-attention model's Mamba state pool: conv and SSM states, and with
    speculative decoding their intermediate caches (`Mamba Cache is allocated`). SGLang carves it
    from the KV budget `A − P·(1 − f)` before the KV pool (0.5.9
    `model_runner_kv_cache_mixin.py` `handle_max_mamba_cache`, 0.5.23
    `mem_cache/kv_cache_configurator.py`): by default `mamba_full_memory_ratio/(1 + ratio)` of
    it."""
    canary_gib: float | None = None
    draft_host_cache_gb: float | None = None
    host_free_gb: float | None = None
    """The host-memory error's "only have Y GB free" (per rank in 0.5.23, the machine's before)."""
    host_requested_gb: float | None = None
    host_budget_gb: float | None = None
    """0.5.23 auto-sizing: one rank's host budget, `(available − 10 GiB) ÷ ranks`, decimal GB."""
    host_ranks: int | None = None
    host_available_gib: float | None = None
    """0.5.23's `HiCache memory headroom: host H GiB, cgroup C GiB` (printed when a memory cgroup
    limits the server, `mem_cache/host_memory.py`): H, the host's available RAM."""
    cgroup_headroom_gib: float | None = None
    """C of that line: what the container's memory limit leaves, the bound when below H."""
    mem_fraction_static: float | None = None
    page_size: int | None = None
    tp_size: int | None = None
    pp_size: int | None = None
    dp_size: int | None = None
    speculative_algorithm: str | None = None
    speculative_num_draft_tokens: int | None = None
    max_total_tokens_cap: int | None = None
    """`--max-total-tokens` as the server_args line shows it."""
    hicache_ratio: float | None = None
    hicache_size_gb: float | None = None
    startup_timings: dict[str, float] | None = field(default=None, hash=False)
    """`Engine startup timings (s)` (0.5.18+): load_weight, kv_cache_allocation, scheduler_e2e,
    tokenizer_e2e and `cuda_graph.<phase>`, seconds."""
    # What the trial asked for, beside what SGLang ran (`logparse.clamps` compares them).
    requested_max_running_requests: int | None = None
    """`--max-running-requests` as the `server_args=` line shows it (0.5.23 prints the resolved
    value: 48 with speculative decoding); else the `requested` of the line that lowered it."""
    max_running_requests_rule: str | None = None
    """Which line lowered the request slots: `kv_capacity` (0.5.23 `max_running_requests was
    reduced from the requested R to E (per dp worker) due to the available KV cache capacity.`,
    `mem_cache/kv_cache_configurator.py` `resolve_max_num_reqs`), `post_capture` (`Post-capture
    KV sizing: max_running_requests R -> E`, `model_runner_components/kv_pool_runtime.py`
    `compute_post_capture_kv_resize`) or `spec_reset` (0.5.9 `Max running requests is reset to
    48 for speculative decoding`, `server_args.py`)."""
    requested_cuda_graph_max_bs: int | None = None
    """`--cuda-graph-max-bs` as the `server_args=` line shows it (0.5.9 `cuda_graph_max_bs`,
    0.5.23 `cuda_graph_max_bs_decode`); None when SGLang chose it."""
    requested_context_length: int | None = None
    """`--context-length` as the `server_args=` line shows it; None when the model's own."""
    requested_chunked_prefill_size: int | None = None
    """`--chunked-prefill-size` as the `server_args=` line shows it (0.5.23: resolved)."""
    post_capture_kv_sizing: bool | None = None
    """Whether SGLang sized the KV pool after graph capture (0.5.23, SGLANG_ENABLE_POST_CAPTURE_
    KV_SIZING): True when the log shows `KV Cache VA upper bound` or `Post-capture KV sizing: KV
    cache allocated`, False when it shows the pool `is allocated` outright, None without a KV
    line."""
    post_capture_requested: bool | None = None
    """Whether the trial's environment turned post-capture sizing on. SGLang reads the variable
    (`environ.py`) and prints it nowhere, so the log cannot say it: the trial sets it from its
    environment (`trial.judge`); None for a log read on its own."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: numbers, strings, None and flat dicts of numbers only."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Ledger:
        """Inverse of `to_dict`; unknown keys are ignored so older records still load."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def merged(self, other: Ledger) -> Ledger:
        """This ledger with its None fields filled from `other`."""
        fill = {
            f.name: getattr(other, f.name) for f in fields(self) if getattr(self, f.name) is None
        }
        return replace(self, **fill)
