"""The memory ledger of one server start: where each GiB of a GPU went, read from its log.

SGLang prints its accounting per rank (reference §4.2): free memory before weights (P), weights,
the KV pool, the pool end, CUDA graphs, then a TP0 summary line. `build_ledger` turns those events
into one `Ledger`. Choices, all from reference §1:

* P and every "avail" figure take the MIN over ranks, because SGLang sizes the pool from the
  tightest GPU and the tightest GPU is the one that runs out first; usages take the MAX.
* Speculative decoding prints `Load weight end` and `KV Cache is allocated` twice per rank, target
  first, then draft; graph captures are labelled `target`/`draft` from 0.5.14, and before that a
  capture after the rank's second weight load belongs to the draft.
* The request table is not printed; it is what the pool took beyond its KV lines:
  `avail after the last weight load − KV lines − "Memory pool end" avail` (two-decimal precision).
* Every field is None when the log does not show it; nothing is guessed from defaults.

`/server_info` (reference §5) carries the same sizes; `ledger_from_server_info` reads them and
`cross_check` names the fields on which log and server disagree.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from autotune.logparse.lines import Event, Kind, rank_order


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

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: numbers, strings and None only."""
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


@dataclass
class _Rank:
    """What one rank printed, in order; roles follow the weight loads (target, then draft)."""

    loads_begun: int = 0
    loads_done: int = 0
    p: float | None = None
    weights: float | None = None
    after_weights: float | None = None
    draft_weights: float | None = None
    last_load_avail: float | None = None
    kv_since_load: float = 0.0
    kv_lines: int = 0
    kv: float | None = None
    kv_tokens: int | None = None
    kv_dtype: str | None = None
    draft_kv: float | None = None
    req_to_token: float | None = None
    after_pool: float | None = None
    graph: float | None = None
    draft_graph: float | None = None
    after_graphs: float | None = None
    model_type: str | None = None

    def add(self, event: Event) -> None:
        v = event.values
        kind = event.kind
        if kind is Kind.WEIGHT_LOAD_BEGIN:
            self.loads_begun += 1
            if self.loads_begun == 1:
                self.p = v.get("avail_gib")
        elif kind is Kind.WEIGHT_LOAD_END:
            self.loads_done += 1
            self.last_load_avail = v.get("avail_gib")
            self.kv_since_load = 0.0
            if self.loads_done == 1:
                self.weights, self.after_weights = v.get("usage_gib"), v.get("avail_gib")
                self.model_type = event.label or None
            elif self.loads_done == 2:
                self.draft_weights = v.get("usage_gib")
        elif kind is Kind.KV_ALLOCATED:
            self.kv_lines += 1
            gib = v.get("kv_gib")
            self.kv_since_load += gib or 0.0
            if self.kv_lines == 1:
                self.kv, self.kv_dtype = gib, event.label or None
                tokens = v.get("tokens")
                self.kv_tokens = int(tokens) if tokens is not None else None
            elif self.kv_lines == 2:
                self.draft_kv = gib
        elif kind is Kind.MEMORY_POOL_END:
            avail = v.get("avail_gib")
            if self.after_pool is None:
                self.after_pool = avail
                if avail is not None and self.last_load_avail is not None and self.kv_lines:
                    rest = self.last_load_avail - self.kv_since_load - avail
                    self.req_to_token = round(max(rest, 0.0), 2)
        elif kind is Kind.GRAPH_CAPTURE_END:
            usage = v.get("usage_gib") or 0.0
            draft = "draft" in event.label or (not event.label and self.loads_done >= 2)
            if draft:
                self.draft_graph = (self.draft_graph or 0.0) + usage
            else:
                self.graph = (self.graph or 0.0) + usage
            self.after_graphs = v.get("avail_gib", self.after_graphs)


def _low(values: Iterable[float | None]) -> float | None:
    present = [x for x in values if x is not None]
    return min(present) if present else None


def _high(values: Iterable[float | None]) -> float | None:
    present = [x for x in values if x is not None]
    return round(max(present), 2) if present else None


def _int(value: float | None) -> int | None:
    return int(value) if value is not None else None


def build_ledger(events: Iterable[Event]) -> Ledger:
    """The ledger shown by a log's events (from `logparse`); fields the log lacks stay None."""
    ranks: dict[str, _Rank] = {}
    summary: Mapping[str, float] = {}
    host_gb: float | None = None
    host_tokens: float | None = None
    mrr_reduced: float | None = None
    kv_dtype: str | None = None
    for event in events:
        kind = event.kind
        if kind is Kind.KV_DTYPE:
            kv_dtype = kv_dtype or event.label or None
        elif kind is Kind.SCHEDULER_SUMMARY:
            summary = summary or event.values
        elif kind is Kind.HOST_CACHE:
            if host_gb is None:
                host_gb, host_tokens = event.values.get("gb"), event.values.get("tokens")
        elif kind is Kind.MRR_REDUCED:
            mrr_reduced = event.values.get("value")
        elif kind in _PER_RANK:
            ranks.setdefault(event.rank, _Rank()).add(event)
    ordered = [ranks[r] for r in sorted(ranks, key=rank_order)]
    ref = ordered[0] if ordered else _Rank()
    mrr = summary.get("max_running_requests", mrr_reduced)
    return Ledger(
        p_gib=_low(r.p for r in ordered),
        weights_gib=_high(r.weights for r in ordered),
        avail_after_weights_gib=_low(r.after_weights for r in ordered),
        max_total_num_tokens=_int(summary.get("max_total_num_tokens", ref.kv_tokens)),
        kv_gib=ref.kv,
        kv_dtype=ref.kv_dtype or kv_dtype,
        draft_weights_gib=_high(r.draft_weights for r in ordered),
        draft_kv_gib=ref.draft_kv,
        req_to_token_gib=_high(r.req_to_token for r in ordered),
        avail_after_pool_gib=_low(r.after_pool for r in ordered),
        graph_gib=_high(r.graph for r in ordered),
        draft_graph_gib=_high(r.draft_graph for r in ordered),
        avail_after_graphs_gib=_low(r.after_graphs for r in ordered),
        available_gpu_mem_gib=summary.get("available_gpu_mem"),
        host_cache_gb=host_gb,
        host_cache_tokens=_int(host_tokens),
        max_running_requests=_int(mrr),
        chunked_prefill_size=_int(summary.get("chunked_prefill_size")),
        max_prefill_tokens=_int(summary.get("max_prefill_tokens")),
        context_len=_int(summary.get("context_len")),
        model_type=ref.model_type,
        ranks=len(ordered) or None,
    )


_PER_RANK = frozenset(
    {
        Kind.WEIGHT_LOAD_BEGIN,
        Kind.WEIGHT_LOAD_END,
        Kind.KV_ALLOCATED,
        Kind.MEMORY_POOL_END,
        Kind.GRAPH_CAPTURE_END,
    }
)


# ---------------------------------------------------------------------------------------------
# /server_info
# ---------------------------------------------------------------------------------------------


def _number(data: Mapping[str, Any], key: str) -> float | None:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def ledger_from_server_info(info: Mapping[str, Any]) -> Ledger:
    """The sizes `/server_info` reports (top level and `internal_states[0]`, reference §5)."""
    states = info.get("internal_states")
    state: Mapping[str, Any] = (
        states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}
    )
    usage = state.get("memory_usage")
    mem: Mapping[str, Any] = usage if isinstance(usage, dict) else {}
    mrr = _number(state, "effective_max_running_requests_per_dp")
    if mrr is None:
        mrr = _number(info, "max_running_requests")
    tokens = _number(info, "max_total_num_tokens")
    if tokens is None:
        tokens = _number(mem, "token_capacity")
    context = _number(info, "context_length")
    if context is None:
        context = _number(info, "context_len")
    return Ledger(
        max_total_num_tokens=_int(tokens),
        weights_gib=_number(mem, "weight"),
        kv_gib=_number(mem, "kvcache"),
        graph_gib=_number(mem, "graph"),
        max_running_requests=_int(mrr),
        chunked_prefill_size=_int(_number(info, "chunked_prefill_size")),
        max_prefill_tokens=_int(_number(info, "max_prefill_tokens")),
        context_len=_int(context),
    )


_CHECKED = (
    "max_total_num_tokens",
    "weights_gib",
    "kv_gib",
    "graph_gib",
    "max_running_requests",
    "chunked_prefill_size",
    "max_prefill_tokens",
    "context_len",
)


def cross_check(
    from_log: Ledger, from_server: Ledger, gib_tolerance: float = 0.05
) -> tuple[str, ...]:
    """Fields shown by both sources that disagree, as `name: log=X server=Y` lines.

    GiB figures may differ by `gib_tolerance` (the log rounds to two decimals); counts must match.
    """
    problems: list[str] = []
    for name in _CHECKED:
        a, b = getattr(from_log, name), getattr(from_server, name)
        if a is None or b is None:
            continue
        tolerance = gib_tolerance if name.endswith("_gib") else 0
        if abs(a - b) > tolerance:
            problems.append(f"{name}: log={a} server={b}")
    return tuple(problems)
