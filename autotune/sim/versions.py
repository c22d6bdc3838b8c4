"""The SGLang releases the simulator speaks, as data: one `SglangVersion` per release.

Each entry's flag table is `flagtables/<release>.json`, written from that release's own parser;
the entry says, rule by rule, how the release differs where the simulator models it: the GPU-class
defaults and the automatic `--mem-fraction-static`, the memory order (draft weights before or
after the KV profile, the draft folded into the per-token cell), the request table's padding
row, prefill CUDA graphs, post-capture KV sizing, the HiCache host-RAM rules, the death paths,
the graceful-stop exit code and the HTTP shapes. The modules that act on a rule ask the version
(`sizing` and `memplan` for memory, `startup`/`server` for the process, `httpapi` for
responses, `loglines` and `tracebacks` for the text). Adding a release is a new flag table, one
entry here, and where its log text changed, a `loglines.Lines` subclass.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from autotune.sim.flagspec import Flag, ReleaseTable, release_table

# (GiB limit, chunked_prefill_size, decode max_bs below TP 4, decode max_bs at TP 4+): the first
# row whose limit the GPU is under applies; `top` applies above the last.
GpuClasses = tuple[tuple[int, int, int, int], ...]


def _frozen(mapping: Mapping[str, object]) -> Mapping[str, object]:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class SglangVersion:
    """One SGLang release and the rules the simulator applies for it. Each rule defaults to
    0.5.9's behaviour, so a release's entry names only the rules where it departs from it."""

    name: str
    gpu_classes: GpuClasses
    top_class: tuple[int, int]
    spec_reserve_mib: Mapping[str, object]
    """Extra MiB the automatic fraction reserves per speculative algorithm (0.5.9)."""
    prefill_graph_reserve: bool = False
    """The automatic fraction also reserves the prefill graph (0.5.23 `reserve_for_graph_mb`)."""
    cap_graph_bs_by_running: bool = False
    """Decode max_bs defaults to --max-running-requests when that is smaller (0.5.23)."""
    draft_before_profile: bool = False
    """Draft weights load before the KV profile (counted in A), not out of the headroom."""
    fold_draft_cell: bool = False
    """EAGLE/STANDALONE: int(cell · L_draft / L_target) is added to the target's per-token cell."""
    req_pool_padding: int = 0
    """Rows the request table holds beyond max_running_requests (0.5.23: one padding row)."""
    prefill_graphs: bool = False
    """Prefill CUDA graphs (breakable backend) are captured before decode by default."""
    post_capture_kv_sizing: bool = False
    """SGLANG_ENABLE_POST_CAPTURE_KV_SIZING exists (MHA models; off by default)."""
    host_budget_per_rank: bool = False
    """HiCache checks each pool against (available − 10 GiB) ÷ local ranks, not the whole box."""
    host_reads_cgroup: bool = False
    """Available host RAM is bounded by the memory cgroup's headroom, logged as `HiCache memory
    headroom: host … GiB, cgroup … GiB` (0.5.23 `mem_cache/host_memory.py`); before, a pool the
    container cannot hold is pinned until its OOM killer ends a rank."""
    host_pool_must_exceed_device: bool = True
    """A host pool not larger than the device pool is refused (0.5.9) rather than warned about."""
    draft_host_pool: bool = False
    """A speculative draft gets its own HiCache host pool (`Allocating draft ...`)."""
    hicache_auto_size: bool = False
    """Without --hicache-ratio/--hicache-size the ratio shrinks to fit host RAM (0.5.23)."""
    imbalance_raises: bool = False
    """Unbalanced free memory across TP ranks is a RuntimeError (SGLANG_ENABLE_TP_MEMORY_
    INBALANCE_CHECK, default on) rather than the warning the simulator printed for 0.5.9."""
    subprocess_watchdog: bool = False
    """A scheduler killed after startup is noticed (SubprocessWatchdog) and the tree killed."""
    graceful_exit_code: int | None = None
    """Exit code after a drained SIGTERM; None means the process SIGKILLs itself (rc −9)."""
    setting_dests: Mapping[str, object] = field(default_factory=dict)
    """This release's dest → the ServerSettings field it fills (its spellings of our knobs)."""
    server_args_dict: bool = False
    """The startup line prints the resolved dict (`server_args={...}`), not `ServerArgs(...)`."""
    parse_warnings_stamped: bool = False
    """Warnings while parsing flags carry the `[time]` prefix (0.5.23 configures logging on
    import); 0.5.9 prints them bare (Python's last-resort handler)."""
    launch_warning: bool = False
    """`python -m sglang.launch_server` warns that `sglang serve` is the recommended entry."""
    retractions_key: str = "total_retractions"
    reasoning_tokens: bool = False
    graph_memory_per_phase: bool = False
    pool_below_context_warning: bool = False
    """A pool of fewer tokens than the context is warned about on TP0 before the summary line
    (0.5.23 `managers/tp_worker.py` `get_worker_info`: `KV pool holds N tokens, fewer than
    --context-length M. …`); 0.5.9 cuts a request to the pool without a word."""

    @property
    def number(self) -> tuple[int, ...]:
        """The release as numbers (`(0, 5, 23)`), for comparing releases."""
        return parse_version(self.name)

    @property
    def flags(self) -> tuple[Flag, ...]:
        """The release's flags, read from its table when first asked for."""
        return self._table.flags

    @property
    def fields(self) -> tuple[tuple[str, object], ...]:
        """ServerArgs' fields in declaration order with their raw defaults."""
        return self._table.fields

    @property
    def _table(self) -> ReleaseTable:
        return release_table(self.name)


def parse_version(text: str) -> tuple[int, ...]:
    """'0.5.9' -> (0, 5, 9); post/rc suffixes are ignored."""
    parts: list[int] = []
    for piece in text.split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


V0_5_9 = SglangVersion(
    name="0.5.9",
    gpu_classes=(
        (20, 2048, 8, 8),
        (35, 2048, 24, 80),
        (60, 4096, 32, 160),
        (90, 8192, 256, 512),
        (160, 8192, 256, 512),
    ),
    top_class=(16384, 512),
    spec_reserve_mib=_frozen({"EAGLE": 2048, "EAGLE3": 2048, "NEXTN": 2048, "STANDALONE": 6144}),
)

V0_5_23 = SglangVersion(
    name="0.5.23",
    gpu_classes=(
        (20, 2048, 8, 8),
        (35, 4096, 48, 160),
        (60, 4096, 32, 160),
        (90, 8192, 256, 512),
        (160, 8192, 256, 512),
    ),
    top_class=(16384, 512),
    spec_reserve_mib=_frozen({}),
    prefill_graph_reserve=True,
    cap_graph_bs_by_running=True,
    draft_before_profile=True,
    fold_draft_cell=True,
    req_pool_padding=1,
    prefill_graphs=True,
    post_capture_kv_sizing=True,
    host_budget_per_rank=True,
    host_reads_cgroup=True,
    host_pool_must_exceed_device=False,
    draft_host_pool=True,
    hicache_auto_size=True,
    imbalance_raises=True,
    subprocess_watchdog=True,
    graceful_exit_code=0,
    setting_dests=_frozen(
        {"cuda_graph_max_bs_decode": "cuda_graph_max_bs", "cuda_graph_bs_decode": "cuda_graph_bs"}
    ),
    server_args_dict=True,
    parse_warnings_stamped=True,
    launch_warning=True,
    retractions_key="num_retractions",
    reasoning_tokens=True,
    graph_memory_per_phase=True,
    pool_below_context_warning=True,
)

VERSIONS: Mapping[str, SglangVersion] = MappingProxyType({v.name: v for v in (V0_5_9, V0_5_23)})
DEFAULT = V0_5_9


def get_version(name: str) -> SglangVersion:
    """The release named `name` (exactly one of VERSIONS; raises KeyError naming them)."""
    try:
        return VERSIONS[name]
    except KeyError:
        raise KeyError(
            f"SGLang {name} is not simulated; choose one of {', '.join(VERSIONS)}"
        ) from None
