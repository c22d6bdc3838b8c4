"""The memory ledger as `/server_info` reports it, and where it disagrees with the log's.

`/server_info` carries the sizes the log prints; `ledger_from_server_info` reads both of its
shapes (0.5.9: `memory_usage.graph` one number; 0.5.18+: a dict per phase, `graph_usage`) and
`cross_check` names the fields on which log and server disagree. Apart from the log's reader
(`logparse.accounting`): it reads a JSON answer, not log events, and shares only the `Ledger` it
fills.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune.logparse.ledger import DRAFT_PHASES, Ledger


def _int(value: float | None) -> int | None:
    return int(value) if value is not None else None


def _number(data: Mapping[str, Any], key: str) -> float | None:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def graph_usage(memory_usage: Mapping[str, Any]) -> dict[str, float] | None:
    """`memory_usage.graph` in either shape, as GiB per SGLang phase: 0.5.18+'s dict
    (`{prefill, decode, target_verify, draft_prefill, draft_decode, draft_extend}`, target and
    draft summed per phase) as it is, 0.5.9's one number (the target's decode graphs) as
    `{"decode": x}`. None when absent or unreadable."""
    graph = memory_usage.get("graph")
    if isinstance(graph, Mapping):
        phases = {str(k): float(v) for k, v in graph.items() if _is_number(v)}
        return phases or None
    if isinstance(graph, int | float) and not isinstance(graph, bool):
        return {"decode": float(graph)}
    return None


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def ledger_from_server_info(info: Mapping[str, Any]) -> Ledger:
    """The sizes `/server_info` reports: the resolved arguments at the top level, and
    `internal_states[0]` (DP rank 0's scheduler): `memory_usage` {weight, kvcache,
    token_capacity, graph; 0.5.18+ also startup_available and token_capacity_swa}."""
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
    phases = graph_usage(mem)
    graph = draft_graph = None
    if phases is not None:
        graph = round(sum(v for k, v in phases.items() if k not in DRAFT_PHASES), 3)
        if any(k in DRAFT_PHASES for k in phases):
            draft_graph = round(sum(v for k, v in phases.items() if k in DRAFT_PHASES), 3)
    version = info.get("version")
    return Ledger(
        max_total_num_tokens=_int(tokens),
        weights_gib=_number(mem, "weight"),
        kv_gib=_number(mem, "kvcache"),
        graph_gib=graph,
        draft_graph_gib=draft_graph,
        graph_phases=phases,
        available_gpu_mem_gib=_number(mem, "startup_available"),
        swa_tokens=_int(_number(mem, "token_capacity_swa")),
        max_running_requests=_int(mrr),
        chunked_prefill_size=_int(_number(info, "chunked_prefill_size")),
        max_prefill_tokens=_int(_number(info, "max_prefill_tokens")),
        context_len=_int(context),
        sglang_version=version if isinstance(version, str) and version else None,
    )


_CHECKED = (
    "max_total_num_tokens",
    "weights_gib",
    "kv_gib",
    "graph_gib",
    "draft_graph_gib",
    "available_gpu_mem_gib",
    "max_running_requests",
    "chunked_prefill_size",
    "max_prefill_tokens",
    "context_len",
)


def cross_check(
    from_log: Ledger, from_server: Ledger, gib_tolerance: float = 0.05
) -> tuple[str, ...]:
    """Fields shown by both sources that disagree, as `name: log=X server=Y` lines; graph
    memory is also compared phase by phase (`graph_phases.decode: …`).

    GiB figures may differ by `gib_tolerance` (the log rounds to two decimals); counts must match.
    A server that reports graph memory as one number (0.5.9) reports the target's decode graphs
    only, so its total is compared with the log's decode phase, not with every capture.
    """
    problems: list[str] = []
    server_phases = from_server.graph_phases or {}
    one_number = set(server_phases) == {"decode"} and from_server.draft_graph_gib is None
    for name in _CHECKED:
        a, b = getattr(from_log, name), getattr(from_server, name)
        if a is None or b is None or (one_number and name == "graph_gib"):
            continue
        tolerance = gib_tolerance if name.endswith("_gib") else 0
        if abs(a - b) > tolerance:
            problems.append(f"{name}: log={a} server={b}")
    log_phases = from_log.graph_phases or {}
    for phase, b in server_phases.items():
        a = log_phases.get(phase)
        if a is None and b == 0.0:
            continue  # a phase the server never captured
        if a is None and phase in DRAFT_PHASES and phase != "draft_prefill":
            continue  # draft decode/extend lines are TP0's (log_info_on_rank0); may be cut
        if a is None:
            a = 0.0 if log_phases else None
        if a is not None and abs(a - b) > gib_tolerance:
            problems.append(f"graph_phases.{phase}: log={a} server={b}")
    return tuple(problems)
