"""Every log format row of reference §4, read from a fixture: ledger fields and outcome.

Each row names a fixture under tests/fixtures/logs, the outcome and cause it must classify to, and
the ledger fields it must show (a field not listed must be None when listed in `ABSENT`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from autotune.logparse.accounting import build_ledger
from autotune.logparse.lines import parse_text
from autotune.logparse.outcome import Outcome, RunFacts, classify

LOGS = Path(__file__).parent.parent / "fixtures" / "logs"

KIMI_SUMMARY = {
    "max_total_num_tokens": 159277,
    "chunked_prefill_size": 8192,
    "max_prefill_tokens": 16384,
    "max_running_requests": 48,
    "context_len": 262144,
}
FAILED_AT_F093 = {
    "p_gib": 94.04,
    "weights_gib": 72.33,
    "avail_after_weights_gib": 21.71,
    "max_total_num_tokens": 231140,
    "kv_gib": 15.13,
    "graph_gib": 4.72,
    "avail_after_graphs_gib": 0.82,
}

V0523: dict[str, Any] = {
    "semantics": "0.5.23",
    "p_gib": 94.03,
    "weights_gib": 72.33,
    "draft_weights_gib": 0.81,
    "avail_after_weights_gib": 20.89,  # A: after the draft too, which loads before the pool
    "max_total_num_tokens": 144416,  # ⌊(20.89 − 94.03 × 0.12)·2^30 ÷ 71,424⌋: the folded cell
    "kv_gib": 9.45,
    "draft_kv_gib": 0.28,  # the EAGLE3 head's own MHA pool, K 0.14 + V 0.14
    "req_to_token_gib": 0.05,
    "avail_after_pool_gib": 11.39,
    "graph_gib": 3.70,  # target prefill 0.50 + target verify 3.20
    "draft_graph_gib": 0.75,  # draft prefill (every rank) + decode and extend (TP0)
    "graph_phases": {
        "prefill": 0.5,
        "target_verify": 3.2,
        "draft_prefill": 0.2,
        "draft_decode": 0.3,
        "draft_extend": 0.25,
    },
    "graph_max_bs": 48,
    "prefill_graph_max_tokens": 8192,
    "avail_after_graphs_gib": 6.68,
    "available_gpu_mem_gib": 6.68,
    "host_cache_gb": 20.3,
    "host_cache_tokens": 288833,
    "draft_host_cache_gb": 0.59,
    "host_budget_gb": 977.37,  # 728.2 GiB is 0.8 of one rank's (1830.4 − 10) ÷ 2 GiB
    "host_ranks": 2,
    "max_running_requests": 48,
    "context_len": 262144,
    "mem_fraction_static": 0.88,
    "page_size": 1,
    "speculative_algorithm": "EAGLE3",
    "speculative_num_draft_tokens": 4,
    "hicache_ratio": 2.0,
    "model_type": "DeepseekV3ForCausalLM",
    "ranks": 2,
}
SERVED_0523 = {"semantics": "0.5.23", "kv_gib": 9.45, "available_gpu_mem_gib": 6.68}
FRAGMENT = {"semantics": None, "p_gib": None, "kv_gib": None}

ROWS: list[tuple[str, Outcome, str, dict[str, Any]]] = [
    (
        "v0_5_9_kimi_tp8_eagle3.log",
        Outcome.READY,
        "ready",
        {
            "p_gib": 94.04,
            "weights_gib": 72.33,
            "avail_after_weights_gib": 21.71,
            "kv_gib": 10.42,
            "draft_weights_gib": 0.81,
            "draft_kv_gib": 0.60,
            "req_to_token_gib": 0.05,
            "graph_gib": 3.75,
            "draft_graph_gib": 0.61,
            "avail_after_graphs_gib": 5.47,
            "available_gpu_mem_gib": 5.47,
            "host_cache_gb": 48.0,
            "host_cache_tokens": None,
            "kv_dtype": "torch.bfloat16",
            "model_type": "DeepseekV3ForCausalLM",
            "ranks": 2,
            **KIMI_SUMMARY,
        },
    ),
    (
        "v0_4_6_tp2.log",
        Outcome.READY,
        "ready",
        {
            "p_gib": 78.10,
            "weights_gib": 15.62,
            "avail_after_weights_gib": 62.48,
            "kv_gib": 50.93,
            "req_to_token_gib": 2.5,
            "graph_gib": 1.21,
            "avail_after_graphs_gib": 7.77,
            "available_gpu_mem_gib": None,
            "kv_dtype": None,
            "max_total_num_tokens": 1000000,
            "max_running_requests": 4096,
            "context_len": 163840,
        },
    ),
    (
        "v0_5_4_llama_tp2.log",
        Outcome.READY,
        "ready",
        {"kv_gib": 38.76, "req_to_token_gib": 1.0, "graph_gib": 0.92, "kv_dtype": "torch.bfloat16"},
    ),
    (
        "v0_5_13_dtype_tp2.log",
        Outcome.READY,
        "ready",
        {
            "kv_gib": 44.60,
            "kv_dtype": "torch.float8_e4m3fn",
            "max_total_num_tokens": 1363000,
            "graph_gib": 3.60,  # decode 2.10 + piecewise 1.50
            "avail_after_graphs_gib": 15.77,
            "draft_weights_gib": None,
        },
    ),
    (
        "v0_5_14_spec_tp2.log",
        Outcome.READY,
        "ready",
        {
            "weights_gib": 72.33,
            "draft_weights_gib": 0.81,
            "kv_gib": 9.59,
            "draft_kv_gib": 0.56,
            "req_to_token_gib": 0.05,
            "graph_gib": 3.80,  # target decode + target verify + target prefill
            "draft_graph_gib": 0.40,
            "avail_after_graphs_gib": 6.48,
        },
    ),
    (
        "v0_5_23_hicache_tp2.log",
        Outcome.READY,
        "ready",
        {
            "p_gib": 94.03,
            "kv_gib": 10.42,
            "graph_gib": 3.75,
            "avail_after_graphs_gib": 6.29,
            "host_cache_gb": 16.79,
            "host_cache_tokens": 238916,
            "max_running_requests": 79638,
            "context_len": 4096,
        },
    ),
    (
        "dp_ep_tp4.log",
        Outcome.READY,
        "ready",
        {
            "p_gib": 137.40,
            "avail_after_weights_gib": 49.60,
            "kv_gib": 31.41,
            "graph_gib": 4.12,
            "avail_after_graphs_gib": 12.98,
            "available_gpu_mem_gib": 13.50,
            "ranks": 4,
        },
    ),
    (
        "pp2_tp2.log",
        Outcome.READY,
        "ready",
        {"p_gib": 78.40, "weights_gib": 51.50, "kv_gib": 17.20, "graph_gib": None, "ranks": 4},
    ),
    (
        "tp1_no_tag.log",
        Outcome.READY,
        "ready",
        {"p_gib": 22.90, "kv_gib": 4.80, "graph_gib": 0.60, "context_len": 32768, "ranks": 1},
    ),
    (
        "junk_journald.log",
        Outcome.READY,
        "ready",
        {"p_gib": 94.04, "weights_gib": 72.33, "kv_gib": 10.42, **KIMI_SUMMARY},
    ),
    # Every prefix SGLang printed, and logs that lack rank 0's pool line or the whole start.
    (
        "partial_tp8_kv_odd_ranks.log",
        Outcome.READY,
        "ready",
        # P from each rank's `Load weight end` (avail + mem usage), the least: TP6's
        {"p_gib": 78.07, "kv_gib": 50.93, "max_total_num_tokens": 1000000, "ranks": 8},
    ),
    (
        "v0_2_13_gpu_tagged_tp2.log",
        Outcome.READY,
        "ready",
        {"p_gib": 78.84, "weights_gib": 8.14, "max_total_num_tokens": 954214, "ranks": 2},
    ),
    ("v0_3_0_time_only_serving.log", Outcome.UNKNOWN, "no_ready_line", {"kv_gib": None}),
    ("v0_5_9_serving_only_dp2.log", Outcome.UNKNOWN, "no_ready_line", {"ranks": None}),
    ("startup_no_kv_room_v0_5_9.log", Outcome.STARTUP_OOM, "no_kv_room", {"kv_gib": None}),
    ("startup_no_kv_room_v0_4.log", Outcome.STARTUP_OOM, "no_kv_room", {"weights_gib": 15.62}),
    ("startup_no_kv_room_v0_5_14.log", Outcome.STARTUP_OOM, "no_kv_room", {"kv_gib": None}),
    (
        "startup_graph_capture_oom.log",
        Outcome.STARTUP_OOM,
        "graph_capture_failed",
        {"kv_gib": 19.63, "graph_gib": None, "max_total_num_tokens": 300000},
    ),
    ("startup_host_memory.log", Outcome.STARTUP_OOM, "host_memory", {"host_cache_gb": None}),
    ("startup_weight_oom.log", Outcome.STARTUP_OOM, "torch_oom", {"weights_gib": None}),
    (
        "startup_host_oom_killer.log",
        Outcome.STARTUP_OOM,
        "host_oom_killer",
        {"host_cache_gb": 400.0},
    ),
    ("startup_hicache_too_small.log", Outcome.STARTUP_ERROR, "hicache_too_small", {}),
    ("startup_error_model.log", Outcome.STARTUP_ERROR, "error", {"p_gib": 94.04}),
    ("startup_rank_dead.log", Outcome.STARTUP_ERROR, "rank_dead", {}),
    ("startup_warmup_failed.log", Outcome.STARTUP_ERROR, "warmup_failed", {}),
    ("startup_in_progress.log", Outcome.UNKNOWN, "no_ready_line", {"weights_gib": 72.33}),
    ("runtime_torch_oom.log", Outcome.RUNTIME_OOM, "torch_oom", FAILED_AT_F093),
    ("runtime_cuda_error_oom.log", Outcome.RUNTIME_OOM, "cuda_error_oom", FAILED_AT_F093),
    ("runtime_prefill_oom.log", Outcome.RUNTIME_OOM, "prefill_oom", FAILED_AT_F093),
    ("runtime_decode_oom.log", Outcome.RUNTIME_OOM, "decode_oom", FAILED_AT_F093),
    ("runtime_crash.log", Outcome.CRASH, "error", FAILED_AT_F093),
    ("runtime_watchdog.log", Outcome.HANG, "watchdog_timeout", FAILED_AT_F093),
    ("stopped_after_serving.log", Outcome.STOPPED, "sigterm", FAILED_AT_F093),
    # 0.5.23 and 0.5.18, rendered from those releases' format strings
    # (tests/fixtures/render_sglang_logs.py): Kimi-K2-like MLA target, EAGLE3 head with MHA KV.
    ("v0_5_23_eagle3_hicache_tp2.log", Outcome.READY, "ready", V0523),
    (
        "v0_5_23_post_capture_tp1.log",
        Outcome.READY,
        "ready",
        {
            "semantics": "0.5.23",
            "kv_va_gib": 109.96,  # the address space reserved first
            "kv_gib": 105.91,  # what post-capture sizing then backed
            "max_total_num_tokens": 867614,
            "canary_gib": 0.5,
            "max_running_requests": 3800,
            "graph_phases": {"prefill": 0.9, "decode": 1.1},
            "graph_max_bs": 512,
            "available_gpu_mem_gib": 14.39,
            "host_cache_gb": 56.86,  # smaller than the GPU pool: only a warning in 0.5.23
            "host_cache_tokens": 433808,
            "speculative_algorithm": None,
            "draft_kv_gib": None,
        },
    ),
    (
        "v0_5_23_startup_rank_killed.log",
        Outcome.STARTUP_OOM,
        "host_oom_killer",
        {"semantics": "0.5.23", "host_cache_gb": 20.3},
    ),
    (
        "v0_5_23_startup_rank_exit1.log",
        Outcome.STARTUP_ERROR,
        "rank_dead",
        {"draft_weights_gib": 0.81},
    ),
    (
        "v0_5_23_startup_no_kv_room.log",
        Outcome.STARTUP_OOM,
        "no_kv_room",
        {"avail_after_weights_gib": 20.89, "mem_fraction_static": 0.7, "kv_gib": None},
    ),
    ("v0_5_23_startup_not_enough_memory.log", Outcome.STARTUP_OOM, "no_kv_room", {"kv_gib": None}),
    (
        "v0_5_23_startup_graph_capture_oom.log",
        Outcome.STARTUP_OOM,
        "graph_capture_failed",
        {"kv_gib": 9.45, "draft_kv_gib": 0.28, "graph_gib": None},
    ),
    (
        "v0_5_23_startup_host_memory.log",
        Outcome.STARTUP_OOM,
        "host_memory",
        {"host_free_gb": 799.94, "host_requested_gb": 800.0, "hicache_size_gb": 800.0},
    ),
    (
        "v0_5_23_startup_warmup_failed.log",
        Outcome.STARTUP_ERROR,
        "warmup_failed",
        {"available_gpu_mem_gib": 6.68},
    ),
    ("v0_5_23_runtime_subprocess_killed.log", Outcome.RUNTIME_OOM, "host_oom_killer", SERVED_0523),
    ("v0_5_23_runtime_subprocess_crash.log", Outcome.CRASH, "subprocess_crashed", SERVED_0523),
    ("v0_5_23_runtime_cuda_driver_oom.log", Outcome.RUNTIME_OOM, "cuda_error_oom", SERVED_0523),
    ("v0_5_23_runtime_triton_oom.log", Outcome.RUNTIME_OOM, "triton_oom", SERVED_0523),
    ("v0_5_23_runtime_cublas_oom.log", Outcome.RUNTIME_OOM, "oom", SERVED_0523),
    ("v0_5_23_runtime_req_slots_oom.log", Outcome.RUNTIME_OOM, "req_slots_oom", SERVED_0523),
    ("v0_5_23_runtime_watchdog.log", Outcome.HANG, "watchdog_timeout", SERVED_0523),
    ("v0_5_23_fragment_prefill_oom.log", Outcome.RUNTIME_OOM, "prefill_oom", FRAGMENT),
    ("v0_5_23_fragment_decode_oom.log", Outcome.RUNTIME_OOM, "decode_oom", FRAGMENT),
    ("v0_5_23_fragment_alloc_oom.log", Outcome.RUNTIME_OOM, "alloc_oom", FRAGMENT),
    ("v0_5_23_fragment_forward_torch_oom.log", Outcome.RUNTIME_OOM, "torch_oom", FRAGMENT),
    (
        "v0_5_18_eagle3_hicache_tp2.log",
        Outcome.READY,
        "ready",
        {
            **V0523,
            "semantics": "0.5.18",
            "host_cache_gb": 48.0,
            "host_cache_tokens": 683061,
            "draft_host_cache_gb": 1.4,
            "hicache_size_gb": 48.0,
            "hicache_ratio": None,
            "host_budget_gb": None,
            "host_ranks": None,
            "page_size": None,
        },
    ),
    (
        "v0_5_18_startup_host_memory.log",
        Outcome.STARTUP_OOM,
        "host_memory",
        {
            "semantics": "0.5.18",
            "host_cache_gb": 700.0,
            "host_free_gb": 12.31,
            "host_requested_gb": 20.4,
            "draft_host_cache_gb": None,
        },
    ),
    (
        "v0_5_18_startup_rank_killed.log",
        Outcome.STARTUP_OOM,
        "host_oom_killer",
        {"semantics": "0.5.18", "kv_gib": 9.45},
    ),
    (
        "v0_5_18_runtime_decode_oom.log",
        Outcome.RUNTIME_OOM,
        "decode_oom",
        {"semantics": "0.5.18", "draft_weights_gib": 0.81},
    ),
    # Retractions are serving events in every release's shape, and a handled OOM fallback too.
    ("v0_4_6_runtime_retractions.log", Outcome.READY, "ready", {"max_total_num_tokens": 1000000}),
    ("v0_5_23_runtime_retractions.log", Outcome.READY, "ready", SERVED_0523),
    # 0.5.9 raises when even one request does not fit after retracting: the scheduler dies.
    ("v0_5_9_runtime_retract_oom.log", Outcome.RUNTIME_OOM, "retract_oom", KIMI_SUMMARY),
    # The machine's faults, from Python's and uvicorn's own messages.
    ("v0_5_9_startup_port_in_use.log", Outcome.MACHINE_ERROR, "port_in_use", KIMI_SUMMARY),
    ("v0_5_9_runtime_disk_full.log", Outcome.MACHINE_ERROR, "disk_full", KIMI_SUMMARY),
    # `autotune init`'s release logs: SGLang's own slots (0.4: min(pool // 2, 2049)) on a small
    # pool, and 0.5.8's fraction for a vision model (adjust_mem_fraction_for_vlm), every digit.
    (
        "v0_4_qwq32b_tp4_l4.log",
        Outcome.READY,
        "ready",
        {
            "p_gib": 21.66,
            "kv_gib": 2.82,
            "avail_after_graphs_gib": 0.53,
            "ranks": 4,
            "max_total_num_tokens": 46080,
            "max_running_requests": 2049,
        },
    ),
    # Qwen3.5-9B TP2 (hybrid GDN) from public notes of a start on SGLang main, 2026-04: the
    # Mamba state pool is allocated with the request table and is not part of it
    (
        "v0_5_10_qwen35_mamba_tp2.log",
        Outcome.UNKNOWN,
        "no_ready_line",
        {
            "p_gib": 22.93,
            "kv_gib": 5.00,
            "mamba_gib": 4.48,
            "req_to_token_gib": 0.11,
            "graph_gib": 0.26,
            "max_running_requests": 62,
            "ranks": 2,
        },
    ),
    # sgl-project/sglang#12827: a collector's `[ISO time] ` before every line
    (
        "v0_5_4_collector_iso_prefix.log",
        Outcome.STARTUP_ERROR,
        "scheduler_exception",
        {"p_gib": 15.12, "kv_gib": None, "ranks": 1},
    ),
    (
        "v0_5_8_kimi_vl_computed_fraction_tp8.log",
        Outcome.READY,
        "ready",
        {
            "p_gib": 139.03,
            "kv_gib": 42.94,
            "available_gpu_mem_gib": 21.10,
            "ranks": 8,
            "max_total_num_tokens": 656182,
            "mem_fraction_static": 0.8260405859375,
        },
    ),
]


def test_every_fixture_has_a_row() -> None:
    assert sorted(p.name for p in LOGS.glob("*.log")) == sorted(row[0] for row in ROWS)


@pytest.mark.parametrize(("name", "outcome", "cause", "expected"), ROWS, ids=[r[0] for r in ROWS])
def test_fixture(name: str, outcome: Outcome, cause: str, expected: dict[str, Any]) -> None:
    log = parse_text((LOGS / name).read_text(errors="replace"))
    verdict = classify(log.events, batches=log.batches)
    assert (verdict.outcome, verdict.cause) == (outcome, cause)
    if outcome not in (Outcome.UNKNOWN,):
        assert verdict.evidence, "every decided outcome carries the lines that prove it"
    ledger = build_ledger(log.events).to_dict()
    for key, value in expected.items():
        if isinstance(value, float):
            assert ledger[key] == pytest.approx(value, abs=1e-6), key
        else:
            assert ledger[key] == value, key


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("runtime_torch_oom.log", "CUDA out of memory. Tried to allocate 2.00 GiB"),
        ("startup_no_kv_room_v0_5_9.log", "Not enough memory"),
        ("startup_host_memory.log", "Not enough host memory available"),
        ("startup_graph_capture_oom.log", "Capture cuda graph failed"),
        ("runtime_watchdog.log", "Scheduler watchdog timeout"),
        ("v0_5_9_runtime_retract_oom.log", "ValueError: Out of memory even after retracting"),
    ],
)
def test_evidence_names_the_deciding_line(name: str, needle: str) -> None:
    log = parse_text((LOGS / name).read_text())
    assert any(needle in line for line in classify(log.events).evidence)


@pytest.mark.parametrize(
    ("name", "first"),
    [
        (
            "v0_5_9_startup_port_in_use.log",
            "[2026-02-24 12:02:40] ERROR:    [Errno 98] error while attempting to bind on address "
            "('127.0.0.1', 30000): address already in use",
        ),
        (
            "v0_5_9_runtime_disk_full.log",
            "OSError: [Errno 28] No space left on device: "
            "'/root/.triton/cache/3f1c/tmp.pid_48230_5120/_fwd_kernel.cubin'",
        ),
    ],
)
def test_a_machine_fault_is_proved_by_the_line_that_explains_it(name: str, first: str) -> None:
    """The line that names the fault comes first, before the `Scheduler hit an exception` that
    announced it, and no memory line before it stands in for it (before: `startup_error` with
    `Allocating 48.00 GB host memory …`, and a `startup_error` for the full disk)."""
    log = parse_text((LOGS / name).read_text())
    verdict = classify(log.events, batches=log.batches)
    assert verdict.evidence[0] == first
    assert not any("Allocating" in line for line in verdict.evidence)
    live = classify(log.events, RunFacts(exited=True, exit_code=1), log.batches)
    assert (live.outcome, live.evidence[0]) == (Outcome.MACHINE_ERROR, first)
