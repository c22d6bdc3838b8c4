"""Frozen Optuna trials shaped like the ones `autotune run` records, with SGLang's arithmetic.

P = 94.05 GiB, A = 21.71 GiB and 70,272 B/token are the operator's figures
(docs/sglang-memory.md); the post-pool allocations are the simulator's for Kimi-K2.5 with EAGLE-3
and 48 request slots.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import optuna
from optuna.distributions import FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

P, A, CELL = 94.05, 21.71, 70272
GIB = 1 << 30
T0 = datetime(2026, 2, 24, 22, 0, 0)
REQ, DRAFT_W, DRAFT_KV, DRAFT_G, GRAPHS, OTHER = 0.04, 0.68, 0.08, 0.08, 3.70, 1.20


def tokens(f: float) -> int:
    return int((A - P * (1 - f)) * GIB) // CELL


def ledger(f: float, requests: int = 48, chunk: int | None = None) -> dict[str, Any]:
    n = tokens(f)
    kv = round((n + 1) * CELL / GIB, 2)
    free = round(A - kv - REQ - OTHER - GRAPHS - DRAFT_W - DRAFT_KV - DRAFT_G, 2)
    return {
        "p_gib": P,
        "weights_gib": 72.33,
        "avail_after_weights_gib": A,
        "max_total_num_tokens": n,
        "kv_gib": kv,
        "draft_weights_gib": DRAFT_W,
        "draft_kv_gib": DRAFT_KV,
        "draft_graph_gib": DRAFT_G,
        "req_to_token_gib": REQ,
        "graph_gib": GRAPHS,
        "avail_after_graphs_gib": free,
        "available_gpu_mem_gib": free,
        "max_running_requests": requests,
        "context_len": 262144,
        "ranks": 8,
        **({"chunked_prefill_size": chunk} if chunk else {}),
    }


def trial(
    number: int,
    f: float,
    *,
    outcome: str = "ok",
    throughput: float = 145.0,
    peak: float = 2.5,
    requests: int = 48,
    min_headroom: float = 0.5,
    state: TrialState = TrialState.COMPLETE,
    reason: str = "",
    evidence: tuple[str, ...] = (),
    log_path: str | None = None,
    rise: float | None = None,
    least_free: float | None = None,
    chunk: int | None = None,
) -> FrozenTrial:
    """One recorded trial: ok ones measured `peak` GiB at the stress peak. `rise` is what the
    GPU probe recorded as the peak when it differs (it measures from the workload's start, not
    from the free memory after startup); `least_free` the least free memory recorded when it is
    not `free − peak` (a trial that died under load records what it saw before dying); `chunk`
    the prefill chunk the server's log reported."""
    led = (
        ledger(f, requests, chunk)
        if outcome != "startup_oom"
        else {"p_gib": P, "weights_gib": 72.33, "avail_after_weights_gib": A}
    )
    free = led.get("available_gpu_mem_gib")
    ok = outcome == "ok"
    headroom = free - peak if ok and free is not None else None
    if least_free is not None:
        headroom = least_free
    cap = tokens(f)
    record = {
        "params": {"mem_fraction_static": f, "max_running_requests": requests},
        "ledger": led,
        "outcome": outcome,
        "reason": reason,
        "capacity_tokens": cap,
        "throughput_tok_s": throughput if ok else 0.0,
        "headroom_gib": headroom,
        "stress_peak_gib": (rise if rise is not None else peak) if ok or rise else None,
        "error_rate": 0.0 if ok else 0.99,
        "p99_ttft_ms": 2300.0 if ok else None,
        "p99_itl_ms": 400.0 if ok else None,
        "workload": {"overall": {"tpot_ms": {"p50": 40.0}}} if ok else {},
        "evidence": list(evidence),
        "phases": {"total": 12.0},
        "log_path": log_path or f"/results/t/trials/{number:04d}/server.log",
        "argv": ["python", "-m", "sglang.launch_server", "--mem-fraction-static", str(f)],
        "sglang_version": "0.5.9",
        "host": "box",
    }
    attrs: dict[str, Any] = {"outcome": outcome, "reason": reason, "record": record}
    constraints: dict[str, float] = {}
    values = None
    if state == TrialState.COMPLETE:
        attrs.update(capacity_tokens=cap, throughput_tok_s=record["throughput_tok_s"],
                     headroom_gib=headroom)  # fmt: skip
        oom = outcome.endswith("oom")
        constraints = {
            "oom": 1.0 if oom else 0.0,
            "crash": 0.0,
            "error_rate": record["error_rate"] - 0.01,
            "headroom_gib": min_headroom - (headroom if headroom is not None else 0.0),
        }
        values = [float(cap), float(record["throughput_tok_s"])]
    t = optuna.trial.create_trial(
        state=state,
        values=values,
        params={"mem_fraction_static": f, "max_running_requests": requests},
        distributions={
            "mem_fraction_static": FloatDistribution(0.80, 0.99, step=0.01),
            "max_running_requests": IntDistribution(16, 128, step=16),
        },
        user_attrs=attrs,
        constraints=constraints or None,
    )
    t.number = number
    t.datetime_start = T0 + timedelta(minutes=10 * number)
    if state == TrialState.RUNNING:
        t.datetime_complete = None
    return t


def walk() -> list[FrozenTrial]:
    """A walk over the fraction like the demo study: 0.86…0.90 fine, 0.91 too little headroom,
    0.92 OOM under stress, 0.94 OOM at startup."""
    return [
        trial(0, 0.88),
        trial(1, 0.90, throughput=144.0),
        trial(2, 0.86),
        trial(3, 0.87),
        trial(4, 0.89),
        trial(5, 0.91),
        trial(6, 0.92, outcome="runtime_oom", reason="runtime_oom: torch.OutOfMemoryError"),
        trial(7, 0.94, outcome="startup_oom", reason="startup_oom: CUDA out of memory"),
    ]
