"""Ledger records, /server_info reading and the log-vs-server cross-check."""

from __future__ import annotations

import json

from autotune.logparse.ledger import Ledger, build_ledger, cross_check, ledger_from_server_info
from autotune.logparse.lines import parse_text

SERVER_INFO = {
    "model_path": "/models/Kimi-K2.5",
    "chunked_prefill_size": 8192,
    "max_prefill_tokens": 16384,
    "mem_fraction_static": 0.88,
    "status": "ready",
    "max_total_num_tokens": 159277,
    "max_req_input_len": 159271,
    "internal_states": [
        {
            "memory_usage": {
                "weight": 72.33,
                "kvcache": 10.42,
                "token_capacity": 159277,
                "graph": 3.75,
            },
            "effective_max_running_requests_per_dp": 48,
            "last_gen_throughput": 980.0,
        }
    ],
    "version": "0.5.9",
}


def test_round_trip_through_json() -> None:
    ledger = Ledger(p_gib=94.04, max_total_num_tokens=159277, kv_dtype="torch.bfloat16")
    again = Ledger.from_dict(json.loads(json.dumps(ledger.to_dict())))
    assert again == ledger


def test_from_dict_ignores_unknown_keys() -> None:
    assert Ledger.from_dict({"kv_gib": 1.5, "future_field": 3}) == Ledger(kv_gib=1.5)


def test_empty_log_gives_all_none() -> None:
    assert all(v is None for v in build_ledger(parse_text("junk\n").events).to_dict().values())


def test_server_info_fields() -> None:
    got = ledger_from_server_info(SERVER_INFO)
    assert got.max_total_num_tokens == 159277
    assert got.weights_gib == 72.33
    assert got.kv_gib == 10.42
    assert got.graph_gib == 3.75
    assert got.max_running_requests == 48
    assert got.chunked_prefill_size == 8192
    assert got.p_gib is None


def test_server_info_tolerates_missing_and_odd_types() -> None:
    got = ledger_from_server_info({"internal_states": "nope", "max_total_num_tokens": True})
    assert got == Ledger()


def test_cross_check_agrees_within_rounding_and_names_disagreements() -> None:
    log = Ledger(max_total_num_tokens=159277, kv_gib=10.42, graph_gib=3.75, weights_gib=72.33)
    assert cross_check(log, ledger_from_server_info(SERVER_INFO)) == ()
    wrong = Ledger(max_total_num_tokens=159000, kv_gib=10.60)
    problems = cross_check(wrong, ledger_from_server_info(SERVER_INFO))
    assert [p.split(":")[0] for p in problems] == ["max_total_num_tokens", "kv_gib"]


def test_merged_fills_only_missing_fields() -> None:
    log = Ledger(kv_gib=10.42, max_running_requests=None)
    merged = log.merged(Ledger(kv_gib=99.0, max_running_requests=48))
    assert (merged.kv_gib, merged.max_running_requests) == (10.42, 48)
