"""SGLang's memory accounting of one server start, read from its log into a `Ledger`
(`logparse.ledger`): where each GiB of a GPU went.

SGLang prints its accounting per rank: free memory before weights (P), weights, the KV pool, the
pool end, CUDA graphs, then a TP0 summary line. `build_ledger` turns those events into one
`Ledger`. Choices:

* P and every "avail" figure take the MIN over ranks, because SGLang sizes the pool from the
  tightest GPU and the tightest GPU is the one that runs out first; usages take the MAX.
* What SGLang computes alike on every rank (the pool's tokens, GiB and dtype, the draft's pool,
  the model class: `_SHARED`) is read from the lowest rank that printed it, rank 0 first: an
  excerpt or interleaved output may lack rank 0's line and still show the pool.
* 0.2.x–0.3.x print no weight `mem usage=`; the weights are then the rank's `Load weight begin`
  avail minus its `Load weight end` avail, the difference later releases print.
* Speculative decoding prints `Load weight end` twice per rank, target first, then draft. Up to
  0.5.9 the draft loads after the target's graphs; from 0.5.18 it loads before the KV pool is
  sized, so `avail_after_weights_gib` (A, what the pool was sized from) is what the *last* load
  before the first KV line left. `semantics` names the rule set (`logparse.semantics`) and
  `semantics_from` what in the log chose it.
* KV lines before a rank's first `Memory pool end` are the target's (`Full`/`SWA`/aux pools by
  their label); the draft's come after it (0.5.9: after its weights; 0.5.18+: its own pool end).
  Releases before the labels print a hybrid sliding-window pool as two bare `KV Cache is
  allocated` lines, the SWA half first (`SWAKVPool` builds `swa_kv_pool`, then `full_kv_pool`),
  after `Use sliding window memory pool. full_layer_tokens=F, swa_layer_tokens=S`: the line with
  S tokens is the SWA half, never the pool or a draft's, and the pool holds F tokens
  (`pool_configurator.py`: `max_total_num_tokens=full_tokens`). Two bare lines with the same
  count are read in the order they come, full pool first. `SWAKVPool mem usage: X GB, swa size:
  S, full size: F` (`swa_memory_pool.py`) gives the same split after the halves' lines, which
  are then read again with it. The pool's GiB is both halves (X where printed): SGLang's cell
  per pool token carries the SWA layers' share (`_recompute_cell_size`).
* A `Load weight end` after the rank's `Memory pool end` is the draft's: the target's weights
  load before its pool in every release, and a draft that loads after the target's graphs
  (0.5.9's order, kept by builds that make the draft worker after the target's) comes there.
  `KV Cache VA upper bound` (post-capture sizing) is reserved address space, not memory; the
  `Post-capture KV sizing: KV cache allocated` line then gives the pool.
* Graph captures are labelled with their role from 0.5.18 (`target prefill|decode|verify`,
  `draft prefill|decode|verify|extend`), kept per phase under SGLang's own names
  (`graph_phases`: prefill, decode, target_verify, draft_prefill, draft_decode, draft_extend, as
  `/server_info` reports them; a draft's `verify` is booked as draft_decode, as SGLang books
  it); before that a capture after the rank's second weight load belongs to the draft.
* The request table is not printed; it is what the pool took beyond its KV lines:
  `avail after the last weight load − KV lines − "Memory pool end" avail` (two-decimal precision).
  A hybrid linear-attention model's Mamba state pool (`Mamba Cache is allocated`, the target's,
  before its pool end) is allocated in that step too, inside the request table's pool
  (`HybridReqToTokenPool`); it is counted apart (`mamba_gib`), not in the request table.
* HiCache host pools are per rank; the target's (`kv`, `full`, `swa`) and the draft's (`draft`,
  `draft_swa`) are counted apart, the same rank's lines summed.
* Every field is None when the log does not show it; nothing is guessed from defaults.

`/server_info` carries the same sizes; `logparse.serverinfo` reads them and cross-checks them
against this ledger.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from autotune.logparse.events import POOL_AUX, POOL_MAIN, POOL_SWA, Batch, Event, Kind
from autotune.logparse.ledger import DRAFT_PHASES, GRAPH_PHASES, Ledger
from autotune.logparse.prefix import rank_order
from autotune.logparse.semantics import detect
from autotune.logparse.serverargs import read_server_args

_DRAFT_TYPE = re.compile(r"NextN|MTP|Eagle|Draft")
"""A draft model's class as `Load weight end. type=…` names it (0.5.23 `models/`:
`DeepseekV3ForCausalLMNextN`, `Glm5NextForConditionalGenerationNextN`, `MiMoMTP`,
`LlamaForCausalLMEagle3`, `DFlashDraftModel`): an excerpt may begin at the draft's load."""

# A capture line's role (`logparse.lines`) -> SGLang's phase name. 0.5.9's unlabelled decode
# capture is "decode", its piecewise (prefill) capture "prefill".
_PHASE_OF_ROLE = {
    "target prefill": "prefill",
    "target decode": "decode",
    "target verify": "target_verify",
    "draft prefill": "draft_prefill",
    "draft decode": "draft_decode",
    # a draft worker that captures through the target's decode path (DFlash/DSpark drafts,
    # 0.5.23 `cuda_graph_setup.py` `capture_decode_graph`): `draft verify`, booked as draft_decode
    "draft verify": "draft_decode",
    "draft extend": "draft_extend",
    "draft": "draft_decode",
    "target": "decode",
    "decode": "decode",
    "prefill": "prefill",
    "piecewise": "prefill",
    "verify": "target_verify",
    "": "decode",
}


@dataclass
class _Rank:
    """What one rank printed, in order; roles follow the weight loads (target, then draft) and
    the pool ends (target pool, then the draft's)."""

    loads_begun: int = 0
    loads_done: int = 0
    pool_ends: int = 0
    p: float | None = None
    weights: float | None = None
    after_weights: float | None = None
    sized_from: float | None = None
    draft_weights: float | None = None
    draft_loaded: bool = False
    draft_before_pool: bool = False
    last_load_avail: float | None = None
    kv_since_load: float = 0.0
    kv_main_lines: int = 0
    kv: float | None = None
    kv_tokens: int | None = None
    kv_dtype: str | None = None
    kv_va: float | None = None
    swa_kv: float | None = None
    swa_tokens: int | None = None
    swa_split: tuple[int, int] | None = None
    """`Use sliding window memory pool`'s or `SWAKVPool`'s (full tokens, SWA tokens)."""
    swa_pool_kv: float | None = None
    """`SWAKVPool mem usage`: both halves of a hybrid sliding-window pool, GiB."""
    target_kv: list[Event] = field(default_factory=list)
    """The target's unlabelled and `Full`/`SWA` KV lines before the pool end, to be read again
    when the split comes after them (`SWAKVPool` prints it once both halves are built)."""
    aux_kv: float | None = None
    mamba: float | None = None
    """The Mamba state pool (`Mamba Cache is allocated`), part of the request table's pool
    (`HybridReqToTokenPool`) and sized from the KV budget."""
    draft_kv: float | None = None
    req_to_token: float | None = None
    after_pool: float | None = None
    phases: dict[str, float] = field(default_factory=dict)
    graph: float | None = None
    draft_graph: float | None = None
    after_graphs: float | None = None
    post_kv: float | None = None
    post_tokens: int | None = None
    post_draft_kv: float | None = None
    model_type: str | None = None

    def add(self, event: Event) -> None:
        v = event.values
        kind = event.kind
        if kind is Kind.WEIGHT_LOAD_BEGIN:
            self.loads_begun += 1
            if self.loads_begun == 1 and not self.pool_ends:
                self.p = v.get("avail_gib")
        elif kind is Kind.WEIGHT_LOAD_END:
            self._weights(event)
        elif kind is Kind.KV_ALLOCATED:
            self._kv(event)
        elif kind is Kind.MAMBA_ALLOCATED and not self.pool_ends:
            gib = v.get("gib")
            if gib is not None:
                self.mamba = round((self.mamba or 0.0) + gib, 2)
                self.kv_since_load += gib
        elif kind is Kind.SWA_POOL and not self.pool_ends:
            self._split(event)
        elif kind is Kind.MEMORY_POOL_END:
            self.pool_ends += 1
            avail = v.get("avail_gib")
            if self.after_pool is None:
                self.after_pool = avail
                if avail is not None and self.last_load_avail is not None and self.kv_main_lines:
                    rest = self.last_load_avail - self.kv_since_load - avail
                    self.req_to_token = round(max(rest, 0.0), 2)
        elif kind is Kind.GRAPH_CAPTURE_END:
            self._graph(event)
        elif kind is Kind.POST_CAPTURE:
            if event.label == "kv":
                self.post_kv = v.get("kv_gib")
                tokens = v.get("tokens")
                self.post_tokens = int(tokens) if tokens is not None else None
                self.after_graphs = v.get("avail_gib", self.after_graphs)
            elif event.label == "draft_kv":
                self.post_draft_kv = (self.post_draft_kv or 0.0) + v.get("kv_gib", 0.0)

    def _split(self, event: Event) -> None:
        """A hybrid sliding-window pool's split. `Use sliding window memory pool` comes before
        the halves' KV lines; `SWAKVPool mem usage` after them, with both halves' GiB: the lines
        already read are then read again with the split known."""
        v = event.values
        full, swa = v.get("full_tokens"), v.get("swa_tokens")
        if full is None or swa is None:
            return
        self.swa_split = (int(full), int(swa))
        if v.get("gib") is not None and not v.get("va_upper_bound"):
            self.swa_pool_kv = v["gib"]
        if self.target_kv and self.swa_kv is None and self.kv_va is None:
            lines, self.target_kv = self.target_kv, []
            self.kv = self.kv_tokens = self.kv_dtype = self.draft_kv = None
            self.kv_main_lines = 0
            for line in lines:
                self._target_kv(line)

    def _weights(self, event: Event) -> None:
        v = event.values
        self.loads_done += 1
        self.last_load_avail = v.get("avail_gib")
        self.kv_since_load = 0.0
        if self.pool_ends:
            # after this rank's pool end: the draft's (the target's weights load before its
            # pool in every release; up to 0.5.9, and in later builds whose draft worker is
            # made after the target's, the draft loads after the target's graphs)
            if self.draft_weights is None:
                self.draft_weights = v.get("usage_gib")
            self.draft_loaded = True
            return
        if self.loads_done == 1 and _DRAFT_TYPE.search(event.label):
            # the rank's first load in this log is a draft's: the excerpt begins after the
            # target's load, which is not in it
            self.loads_done = 2
        if self.loads_done == 1:
            self.weights, self.after_weights = v.get("usage_gib"), v.get("avail_gib")
            if self.weights is None and self.p is not None and self.after_weights is not None:
                # 0.2.x-0.3.x print no `mem usage=`; later releases print exactly this
                # difference (`model_runner.py`: `weight_load_mem_usage = before - after`).
                self.weights = round(self.p - self.after_weights, 2)
            usage, after = self.weights, self.after_weights
            if self.p is None and not self.loads_begun and usage is not None and after is not None:
                # an excerpt that begins after `Load weight begin`: its `mem usage=` is the free
                # memory before the load less after it (`model_runner.py` `load_model`), so the
                # two figures give back the one it left out
                self.p = round(after + usage, 2)
            self.model_type = event.label or None
        elif self.loads_done == 2:
            self.draft_weights = v.get("usage_gib")
            self.draft_loaded = True
        if not self.kv_main_lines and not self.pool_ends:
            self.sized_from = v.get("avail_gib")  # A: the last load before the pool
            self.draft_before_pool = self.loads_done >= 2

    def _kv(self, event: Event) -> None:
        v = event.values
        gib = v.get("kv_gib")
        pool = v.get("pool", 0.0)
        if v.get("va_upper_bound"):
            if self.kv_va is None and not self.pool_ends:
                self.kv_va = gib
                tokens = v.get("tokens")
                self.kv_tokens = int(tokens) if tokens is not None else self.kv_tokens
                self.kv_dtype = event.label or self.kv_dtype
                self.kv_main_lines += 1
            return  # reserved address space, not memory
        self.kv_since_load += gib or 0.0
        if self.pool_ends:  # the draft's pool (0.5.18+: its own; 0.5.9: after its weights)
            self.draft_kv = (self.draft_kv or 0.0) + (gib or 0.0)
        elif pool == POOL_AUX:
            self.aux_kv = (self.aux_kv or 0.0) + (gib or 0.0)
        else:
            self.target_kv.append(event)
            self._target_kv(event)

    def _target_kv(self, event: Event) -> None:
        """A target KV line before the pool end: the pool, a sliding-window pool's SWA half, or
        (a second unlabelled line without a split) the draft's pool."""
        v = event.values
        gib = v.get("kv_gib")
        pool = v.get("pool", 0.0)
        if pool == POOL_SWA or (pool == POOL_MAIN and self._swa_half(v.get("tokens"))):
            self.swa_kv = gib
            tokens = v.get("tokens")
            self.swa_tokens = int(tokens) if tokens is not None else None
        else:
            self.kv_main_lines += 1
            if self.kv_main_lines == 1:
                self.kv, self.kv_dtype = gib, event.label or None
                tokens = v.get("tokens")
                self.kv_tokens = int(tokens) if tokens is not None else None
            elif self.kv_main_lines == 2:
                self.draft_kv = gib  # two unlabelled lines before the pool end

    def _swa_half(self, tokens: float | None) -> bool:
        """Whether a bare (or `Full`) KV line before the pool end is a sliding-window pool's SWA
        half: its count is the split's SWA count and not its full one, or it is the second bare
        line where both halves hold the same count."""
        if self.swa_split is None or self.swa_kv is not None:
            return False
        full, swa = self.swa_split
        if tokens is not None and int(tokens) == swa != full:
            return True
        return self.kv_main_lines == 1 and full == swa

    @property
    def pool_kv(self) -> float | None:
        """The target pool's GiB: a hybrid sliding-window pool's both halves (`SWAKVPool mem
        usage`, else the two halves' lines), as SGLang sizes it (`pool_configurator.py`: each
        full token's cell carries `swa_full_tokens_ratio` of an SWA cell)."""
        if self.swa_pool_kv is not None:
            return self.swa_pool_kv
        if self.kv is not None and self.swa_kv is not None:
            return round(self.kv + self.swa_kv, 2)
        return self.kv

    @property
    def split_full_tokens(self) -> int | None:
        """The full-layer tokens the split names: the pool's size when no line of it shows."""
        return self.swa_split[0] if self.swa_split else None

    @property
    def split_swa_tokens(self) -> int | None:
        """The SWA-layer tokens the split names."""
        return self.swa_split[1] if self.swa_split else None

    def _graph(self, event: Event) -> None:
        v = event.values
        self.after_graphs = v.get("avail_gib", self.after_graphs)
        usage = v.get("usage_gib")
        if usage is None:  # 0.4.2 and before: `Capture cuda graph end. Time elapsed: 1.79 s`
            return  # no figure, so no size: unknown, not 0 GiB
        role = event.label
        legacy_draft = not role and self.draft_loaded and not self.draft_before_pool
        phase = "draft_decode" if legacy_draft else _PHASE_OF_ROLE.get(role, "decode")
        self.phases[phase] = round(self.phases.get(phase, 0.0) + usage, 2)
        if phase in DRAFT_PHASES:
            self.draft_graph = (self.draft_graph or 0.0) + usage
        else:
            self.graph = (self.graph or 0.0) + usage


def _low(values: Iterable[float | None]) -> float | None:
    present = [x for x in values if x is not None]
    return min(present) if present else None


def _high(values: Iterable[float | None]) -> float | None:
    present = [x for x in values if x is not None]
    return round(max(present), 2) if present else None


def _int(value: float | None) -> int | None:
    return int(value) if value is not None else None


def _phases(ordered: list[_Rank]) -> dict[str, float] | None:
    seen = {p for r in ordered for p in r.phases}
    if not seen:
        return None
    return {
        p: round(max(r.phases.get(p, 0.0) for r in ordered), 2) for p in GRAPH_PHASES if p in seen
    }


@dataclass
class _Host:
    """The HiCache host pools one rank printed (the first rank that printed any)."""

    rank: str | None = None
    gb: float | None = None
    tokens: float | None = None
    draft_gb: float | None = None

    def add(self, event: Event) -> None:
        if self.rank is None:
            self.rank = event.rank
        elif event.rank != self.rank:
            return
        gb = event.values.get("gb")
        if event.label in ("draft", "draft_swa"):
            self.draft_gb = round((self.draft_gb or 0.0) + (gb or 0.0), 2)
            return
        self.gb = round((self.gb or 0.0) + (gb or 0.0), 2)
        if self.tokens is None and event.label in ("kv", "full", ""):
            self.tokens = event.values.get("tokens")


def _scalar(args: Mapping[str, Any], key: str, kind: type) -> Any:
    value = args.get(key)
    if isinstance(value, bool) or value is None:
        return None
    if kind is str:
        return str(value) if isinstance(value, str) else None
    if isinstance(value, int | float):
        return kind(value)
    return None


def _from_server_args(event: Event | None) -> dict[str, Any]:
    """The fields a `server_args=` line gives; never its secrets (only these keys are read)."""
    if event is None:
        return {}
    args = read_server_args(event.text)
    hicache = _scalar(args, "hicache_size", float)
    out = {
        "mem_fraction_static": _scalar(args, "mem_fraction_static", float),
        "page_size": _scalar(args, "page_size", int),
        "tp_size": _scalar(args, "tp_size", int),
        "pp_size": _scalar(args, "pp_size", int),
        "dp_size": _scalar(args, "dp_size", int),
        "speculative_algorithm": _scalar(args, "speculative_algorithm", str),
        "speculative_num_draft_tokens": _scalar(args, "speculative_num_draft_tokens", int),
        "max_total_tokens_cap": _scalar(args, "max_total_tokens", int),
        "hicache_ratio": _scalar(args, "hicache_ratio", float),
        "hicache_size_gb": hicache if hicache else None,
        "chunked_prefill_size": _scalar(args, "chunked_prefill_size", int),
        "max_prefill_tokens": _scalar(args, "max_prefill_tokens", int),
        "max_running_requests": _scalar(args, "max_running_requests", int),
        "requested_max_running_requests": _scalar(args, "max_running_requests", int),
        "requested_cuda_graph_max_bs": _scalar(
            args,
            "cuda_graph_max_bs_decode"
            if "cuda_graph_max_bs_decode" in args
            else "cuda_graph_max_bs",
            int,
        ),
        "requested_context_length": _scalar(args, "context_length", int),
        "requested_chunked_prefill_size": _scalar(args, "chunked_prefill_size", int),
    }
    if not args.get("enable_hierarchical_cache"):
        out["hicache_ratio"] = out["hicache_size_gb"] = None
    return out


def build_ledger(events: Iterable[Event], batches: Iterable[Batch] = ()) -> Ledger:
    """The ledger shown by a log's events (from `logparse`); fields the log lacks stay None.
    The log's batch lines (`batches`) add the ranks that printed them to the rank count, for an
    excerpt of serving lines alone."""
    events = tuple(events)
    ranks: dict[str, _Rank] = {}
    summary: Mapping[str, float] = {}
    host = _Host()
    first: dict[Kind, Event] = {}
    mrr_reduced: float | None = None
    mrr_requested: float | None = None
    mrr_rule: str | None = None
    kv_dtype: str | None = None
    graph_bs: float | None = None
    for event in events:
        kind = event.kind
        if kind not in first:
            first[kind] = event
        if kind in _PER_RANK:
            ranks.setdefault(event.rank, _Rank()).add(event)
        elif kind is Kind.KV_DTYPE:
            kv_dtype = kv_dtype or event.label or None
        elif kind is Kind.SCHEDULER_SUMMARY:
            summary = summary or event.values
        elif kind is Kind.HOST_CACHE:
            host.add(event)
        elif kind is Kind.MRR_REDUCED:
            mrr_reduced = event.values.get("value")
            mrr_requested, mrr_rule = event.values.get("requested"), "kv_capacity"
        elif kind is Kind.MRR_SPEC_RESET:
            mrr_rule = mrr_rule or "spec_reset"
        elif kind is Kind.GRAPH_BATCH_SIZES:
            graph_bs = graph_bs or event.values.get("max_bs")
        if kind is Kind.POST_CAPTURE and event.label == "max_running_requests":
            mrr_reduced = event.values.get("value", mrr_reduced)
            mrr_requested = mrr_requested or event.values.get("requested")
            mrr_rule = "post_capture"
        if kind is Kind.POST_CAPTURE and event.label in ("kv", "draft_kv"):
            ranks.setdefault(event.rank, _Rank()).add(event)
    ordered = [ranks[r] for r in sorted(ranks, key=rank_order)]
    rules, chosen_by = detect(events, any(r.draft_before_pool for r in ordered))
    mrr = summary.get("max_running_requests", mrr_reduced)
    post = _shared(ordered, "post_kv") is not None
    tokens = _shared(ordered, "post_tokens" if post else "kv_tokens")
    if tokens is None:
        tokens = _shared(ordered, "split_full_tokens")
    post_draft = _shared(ordered, "post_draft_kv")
    args = _from_server_args(first.get(Kind.SERVER_ARGS))
    led = Ledger(
        p_gib=_low(r.p for r in ordered),
        weights_gib=_high(r.weights for r in ordered),
        avail_after_weights_gib=_low(r.sized_from for r in ordered),
        max_total_num_tokens=_int(summary.get("max_total_num_tokens", tokens)),
        kv_gib=_shared(ordered, "post_kv" if post else "pool_kv"),
        kv_dtype=_shared(ordered, "kv_dtype") or kv_dtype,
        draft_weights_gib=_high(r.draft_weights for r in ordered),
        draft_kv_gib=post_draft if post_draft is not None else _shared(ordered, "draft_kv"),
        req_to_token_gib=_high(r.req_to_token for r in ordered),
        avail_after_pool_gib=_low(r.after_pool for r in ordered),
        graph_gib=_high(r.graph for r in ordered),
        draft_graph_gib=_high(r.draft_graph for r in ordered),
        avail_after_graphs_gib=_low(r.after_graphs for r in ordered),
        available_gpu_mem_gib=summary.get("available_gpu_mem"),
        host_cache_gb=host.gb,
        host_cache_tokens=_int(host.tokens),
        max_running_requests=_int(mrr),
        chunked_prefill_size=_int(summary.get("chunked_prefill_size")),
        max_prefill_tokens=_int(summary.get("max_prefill_tokens")),
        context_len=_int(summary.get("context_len")),
        model_type=_shared(ordered, "model_type"),
        ranks=_ranks(events, ranks, batches),
        semantics=rules.name if rules else None,
        semantics_from=chosen_by or None,
        sglang_version=e.label if (e := first.get(Kind.VERSION)) else None,
        graph_phases=_phases(ordered),
        graph_max_bs=_int(_graph_max_bs(events) or graph_bs),
        prefill_graph_max_tokens=_int(_prefill_max_tokens(events)),
        kv_va_gib=_shared(ordered, "kv_va"),
        swa_kv_gib=_shared(ordered, "swa_kv"),
        swa_tokens=_shared(ordered, "swa_tokens") or _shared(ordered, "split_swa_tokens"),
        aux_kv_gib=_shared(ordered, "aux_kv"),
        mamba_gib=_shared(ordered, "mamba"),
        canary_gib=_canary(events),
        draft_host_cache_gb=host.draft_gb,
        host_free_gb=_first_value(first, Kind.HOST_MEMORY, "free_gb"),
        host_requested_gb=_first_value(first, Kind.HOST_MEMORY, "requested_gb"),
        host_budget_gb=_host_budget(first.get(Kind.HICACHE_AUTOSIZE)),
        host_ranks=_int(_first_value(first, Kind.HICACHE_AUTOSIZE, "ranks")),
        host_available_gib=_first_value(first, Kind.HOST_HEADROOM, "host_gib"),
        cgroup_headroom_gib=_first_value(first, Kind.HOST_HEADROOM, "cgroup_gib"),
        startup_timings=dict(t.values) if (t := first.get(Kind.STARTUP_TIMINGS)) else None,
        requested_max_running_requests=args.get("requested_max_running_requests")
        or _int(mrr_requested),
        max_running_requests_rule=mrr_rule,
        post_capture_kv_sizing=_post_capture_seen(events),
    )
    return led.merged(Ledger(**{k: v for k, v in args.items() if v is not None}))


_SHARED = frozenset(
    {
        "kv",
        "pool_kv",
        "kv_tokens",
        "kv_dtype",
        "kv_va",
        "swa_kv",
        "swa_tokens",
        "split_full_tokens",
        "split_swa_tokens",
        "aux_kv",
        "mamba",
        "draft_kv",
        "post_kv",
        "post_tokens",
        "post_draft_kv",
        "model_type",
    }
)
"""What SGLang computes once for every rank: the pool is sized from the memory all ranks
reduced to its minimum (`model_runner.py` `profile_max_num_token`, `get_available_gpu_memory(…,
distributed=True)`), so its tokens, bytes and dtype, the draft's pool and the model class are the
same on each. Free memory and usages are each GPU's own and are not in this set."""


def _shared(ordered: Iterable[_Rank], name: str) -> Any:
    """A value every rank computes alike (`_SHARED`), from the lowest rank that printed it: rank 0
    when its line is in the log, else the next one (an excerpt, interleaved output that lost a
    line). Ranks come in `rank_order`, so a pipeline stage's own ranks come before the next
    stage's (whose pool holds other layers)."""
    assert name in _SHARED, name
    return next((v for r in ordered if (v := getattr(r, name)) is not None), None)


def _ranks(
    events: Iterable[Event], accounted: Mapping[str, _Rank], batches: Iterable[Batch] = ()
) -> int | None:
    """How many ranks the log shows: every rank tag that printed a line SGLang's logger prefixed
    with one (`TP3`, `DP1 TP1`; not `PID…`, which a custom logging config gives every process),
    and the untagged one of a single-GPU log's accounting lines. A rank seen only in its graph
    capture or a warning counts, as the ranks with memory lines do."""
    tags = set(accounted)
    seen = itertools.chain((e.rank for e in events), (b.rank for b in batches))
    tags.update(rank for rank in seen if rank and not rank.startswith("PID"))
    return len(tags) or None


def _first_value(first: Mapping[Kind, Event], kind: Kind, key: str) -> float | None:
    event = first.get(kind)
    return event.values.get(key) if event is not None else None


def _graph_max_bs(events: Iterable[Event]) -> float | None:
    sizes = [
        e.values["max_bs"]
        for e in events
        if e.kind in (Kind.GRAPH_CAPTURE_BEGIN, Kind.GRAPH_CAPTURE_END)
        and "max_bs" in e.values
        and not e.label.startswith("draft")
    ]
    return max(sizes) if sizes else None


def _prefill_max_tokens(events: Iterable[Event]) -> float | None:
    sizes = [
        e.values["max_tokens"]
        for e in events
        if e.kind is Kind.GRAPH_CAPTURE_BEGIN and "max_tokens" in e.values
    ]
    return max(sizes) if sizes else None


def _post_capture_seen(events: Iterable[Event]) -> bool | None:
    """Whether the target pool was sized after graph capture: 0.5.23 prints `KV Cache VA upper
    bound` for a pool it will resize (`mem_cache/memory_pool.py`, `post_capture_active`) and
    `Post-capture KV sizing: KV cache allocated` once it did (`kv_pool_runtime.py`); a pool that
    `is allocated` outright was not. None without a target KV line."""
    seen: bool | None = None
    for e in events:
        if e.kind is Kind.POST_CAPTURE and e.label == "kv":
            return True
        if e.kind is Kind.KV_ALLOCATED and e.values.get("pool", 0.0) != POOL_AUX and seen is None:
            seen = bool(e.values.get("va_upper_bound"))
    return seen


def _canary(events: Iterable[Event]) -> float | None:
    return next(
        (
            e.values.get("gib")
            for e in events
            if e.kind is Kind.POST_CAPTURE and e.label == "canary"
        ),
        None,
    )


def _host_budget(event: Event | None) -> float | None:
    """`HiCache auto-sizing: …; X GiB host memory per rank (fraction F, …)`: X is F of the
    rank's budget, in GiB; the budget in decimal GB."""
    if event is None:
        return None
    per_rank, fraction = event.values.get("per_rank_gib"), event.values.get("fraction")
    if per_rank is None or not fraction:
        return None
    return round(per_rank * (1 << 30) / 1e9 / fraction, 2)


_PER_RANK = frozenset(
    {
        Kind.WEIGHT_LOAD_BEGIN,
        Kind.WEIGHT_LOAD_END,
        Kind.SWA_POOL,
        Kind.MAMBA_ALLOCATED,
        Kind.KV_ALLOCATED,
        Kind.MEMORY_POOL_END,
        Kind.GRAPH_CAPTURE_END,
    }
)


RANK_FIELDS = (
    "p_gib",
    "weights_gib",
    "avail_after_weights_gib",
    "kv_gib",
    "avail_after_pool_gib",
    "graph_gib",
    "avail_after_graphs_gib",
)
"""The ledger fields every rank prints for itself (SGLang 0.5.23 logs each with `logger.info` on
every TP worker, not `log_info_on_rank0`: `model_executor/model_runner.py` `load_model` for
`Load weight begin/end`, `mem_cache/memory_pool.py` for `KV Cache is allocated`,
`mem_cache/kv_cache_configurator.py` for `Memory pool end`,
`model_executor/model_runner_components/cuda_graph_setup.py` for `Capture … CUDA graph end`)."""


def rank_ledgers(events: Iterable[Event]) -> dict[str, Ledger]:
    """One ledger per rank tag that printed a per-rank line (`_PER_RANK`), each built from that
    rank's own lines only, in `rank_order`: what each rank showed of `RANK_FIELDS`, so a rank
    whose line is missing is seen (the merged ledger takes the least or most over the ranks that
    printed)."""
    events = tuple(events)
    tags = sorted({e.rank for e in events if e.kind in _PER_RANK}, key=rank_order)
    return {
        tag: build_ledger(e for e in events if e.kind in _PER_RANK and e.rank == tag)
        for tag in tags
    }
