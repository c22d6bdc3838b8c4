"""Ledger records, /server_info reading and the log-vs-server cross-check."""

from __future__ import annotations

import json
from pathlib import Path

from autotune.logparse.accounting import build_ledger
from autotune.logparse.ledger import Ledger
from autotune.logparse.lines import parse_text
from autotune.logparse.serverinfo import cross_check, graph_usage, ledger_from_server_info

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


# -- 0.5.18+: memory_usage.graph per phase ---------------------------------------------------

SERVER_INFO_0523 = {
    "mem_fraction_static": 0.88,
    "chunked_prefill_size": 8192,
    "max_total_num_tokens": 144416,
    "internal_states": [
        {
            "memory_usage": {
                "weight": 72.33,
                "kvcache": 9.451,
                "startup_available": 6.68,
                "token_capacity": 144416,
                "token_capacity_swa": None,
                "graph": {
                    "prefill": 0.5,
                    "decode": 0.0,
                    "target_verify": 3.2,
                    "draft_prefill": 0.2,
                    "draft_decode": 0.3,
                    "draft_extend": 0.25,
                },
            },
            "effective_max_running_requests_per_dp": 48,
        }
    ],
    "version": "0.5.23",
}
LOGS = Path(__file__).parent.parent / "fixtures" / "logs"


def test_server_info_graph_per_phase() -> None:
    got = ledger_from_server_info(SERVER_INFO_0523)
    assert got.graph_phases is not None and got.graph_phases["target_verify"] == 3.2
    assert (got.graph_gib, got.draft_graph_gib) == (3.7, 0.75)
    assert got.available_gpu_mem_gib == 6.68 and got.sglang_version == "0.5.23"
    assert graph_usage({"graph": 3.75}) == {"decode": 3.75}
    assert graph_usage({"graph": "n/a"}) is None and graph_usage({}) is None


def test_cross_check_reads_both_shapes() -> None:
    log = build_ledger(parse_text((LOGS / "v0_5_23_eagle3_hicache_tp2.log").read_text()).events)
    assert cross_check(log, ledger_from_server_info(SERVER_INFO_0523)) == ()
    states = SERVER_INFO_0523["internal_states"]
    assert isinstance(states, list)
    usage = dict(states[0]["memory_usage"])
    usage["graph"] = {**usage["graph"], "target_verify": 2.2}
    bad = {**SERVER_INFO_0523, "internal_states": [{**states[0], "memory_usage": usage}]}
    problems = cross_check(log, ledger_from_server_info(bad))
    assert [p.split(":")[0] for p in problems] == ["graph_gib", "graph_phases.target_verify"]
    # 0.5.9's one number is the decode graphs: checked against that phase only
    old = build_ledger(parse_text((LOGS / "v0_5_13_dtype_tp2.log").read_text()).events)
    assert old.graph_phases is not None and set(old.graph_phases) == {"decode", "prefill"}
    decode = old.graph_phases["decode"]
    assert cross_check(old, ledger_from_server_info(_info_0_5_9(decode))) == ()
    assert cross_check(old, ledger_from_server_info(_info_0_5_9(decode + 1))) != ()


def _info_0_5_9(graph: float) -> dict[str, object]:
    return {"internal_states": [{"memory_usage": {"graph": graph}}]}


def test_health_reads_memory_usage_in_both_shapes() -> None:
    from autotune.server.health import memory_usage

    states = SERVER_INFO_0523["internal_states"]
    assert isinstance(states, list)
    info = {**SERVER_INFO_0523, "internal_states": [*states, {"memory_usage": {"graph": 1.5}}, 7]}
    rows = memory_usage(info)
    assert [r["graph"] for r in rows] == [states[0]["memory_usage"]["graph"], {"decode": 1.5}]
    assert memory_usage({}) == []


def test_the_ledger_names_its_rules_and_keeps_no_secret() -> None:
    text = (
        "[2026-11-20 14:00:00] server_args={'model_path': '/m', 'api_key': 'sk-123', "
        "'mem_fraction_static': 0.9, 'speculative_algorithm': None}\n"
        "[2026-11-20 14:00:01 TP0] Init parallel begin.\n"
    )
    led = build_ledger(parse_text(text).events)
    assert led.semantics == "0.5.23" and led.semantics_from is not None
    assert led.mem_fraction_static == 0.9 and "sk-123" not in json.dumps(led.to_dict())
    assert Ledger.from_dict(json.loads(json.dumps(led.to_dict()))) == led


_SPLIT = "Use sliding window memory pool. full_layer_tokens=375360, swa_layer_tokens=300288\n"


def _swa_start(*kv: str) -> str:
    """One rank's hybrid sliding-window pool as releases before the `Full`/`SWA` labels print
    it: the split, the bare KV lines, the pool end."""
    lines = [_SPLIT, *kv, "Memory pool end. avail mem=11.87 GB\n"]
    return "".join("[2026-01-31 13:50:39 TP1] " + line for line in lines)


def test_a_bare_sliding_window_half_is_not_the_pool_nor_a_draft() -> None:
    """The SWA half comes first, with the split's SWA count; the pool holds the full count and
    both halves' bytes (SGLang sizes each full token's cell with its share of an SWA cell)."""
    log = _swa_start(
        "KV Cache is allocated. #tokens: 300288, K size: 8.38 GB, V size: 5.59 GB\n",
        "KV Cache is allocated. #tokens: 375360, K size: 2.00 GB, V size: 2.00 GB\n",
    )
    led = build_ledger(parse_text(log).events)
    assert (led.max_total_num_tokens, led.kv_gib) == (375360, 17.97)
    assert (led.swa_tokens, led.swa_kv_gib, led.draft_kv_gib) == (300288, 13.97, None)


def test_an_excerpt_with_only_the_swa_half_gives_the_pool_s_tokens_from_the_split() -> None:
    """Every rank printed the split, one the SWA half; the full half's line is cut off."""
    kv = "KV Cache is allocated. #tokens: 300288, K size: 8.38 GB, V size: 5.59 GB\n"
    log = "".join(f"[2026-01-31 13:50:39 TP{r}] " + _SPLIT for r in (2, 1, 0, 3))
    log += "[2026-01-31 13:50:39 TP1] " + kv
    led = build_ledger(parse_text(log).events)
    assert (led.max_total_num_tokens, led.kv_gib, led.ranks) == (375360, None, 4)
    assert (led.swa_tokens, led.swa_kv_gib) == (300288, 13.97)


def test_two_bare_halves_of_one_count_are_the_pool_then_its_swa_half() -> None:
    log = _swa_start(
        "KV Cache is allocated. #tokens: 300288, K size: 2.00 GB, V size: 2.00 GB\n",
        "KV Cache is allocated. #tokens: 300288, K size: 1.00 GB, V size: 1.00 GB\n",
    ).replace("full_layer_tokens=375360", "full_layer_tokens=300288")
    led = build_ledger(parse_text(log).events)
    assert (led.kv_gib, led.swa_kv_gib, led.draft_kv_gib) == (6.0, 2.0, None)


def test_labelled_halves_keep_their_labels() -> None:
    """0.5.23 names each half (`Full KV Cache …`, `SWA KV Cache …`), the full one first."""
    log = _swa_start(
        "Full KV Cache is allocated. dtype: torch.bfloat16, #tokens: 375360, K size: 2.00 GB, "
        "V size: 2.00 GB\n",
        "SWA KV Cache is allocated. dtype: torch.bfloat16, #tokens: 300288, K size: 8.38 GB, "
        "V size: 5.59 GB\n",
    )
    led = build_ledger(parse_text(log).events)
    assert (led.max_total_num_tokens, led.kv_gib, led.swa_kv_gib) == (375360, 17.97, 13.97)


# A hybrid sliding-window pool with a draft model, as a 2026 build printed it (no rank tag, a
# docker compose column first): no `Use sliding window memory pool` line in the excerpt; the two
# bare halves, SWA first, then `SWAKVPool mem usage` with the split and both halves' GiB; the
# pool end, the target's graphs; then the Frozen-KV MTP draft loads, with its own 64-token pool.
_SWAKV = "".join(
    "2026-06-09 12:30:37.557 | [2026-06-09 09:30:37] " + line + "\n"
    for line in (
        "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 102292, K size: 3.41 GB, "
        "V size: 3.41 GB",
        "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 127866, K size: 1.71 GB, "
        "V size: 1.71 GB",
        "SWAKVPool mem usage: 10.24 GB, swa size: 102292, full size: 127866",
        "Memory pool end. avail mem=3.27 GB",
        "Capture cuda graph begin. This can take up to several minutes. avail mem=3.26 GB",
        "Capture cuda graph bs [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 18, 20, 22, 24]",
        "Load weight end. elapsed=17.93 s, type=Gemma4AssistantForCausalLM, avail mem=2.93 GB, "
        "mem usage=0.29 GB.",
        "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 64, K size: 0.00 GB, "
        "V size: 0.00 GB",
        "Memory pool end. avail mem=3.01 GB",
    )
)


def test_the_swakvpool_line_after_the_halves_gives_the_pool_and_its_swa_half() -> None:
    """The split comes after both halves: the line with its SWA count is the SWA half, the other
    the full half; the pool is the full count and both halves, not a pool and a draft's."""
    led = build_ledger(parse_text(_SWAKV).events)
    assert (led.max_total_num_tokens, led.kv_gib, led.kv_dtype) == (127866, 10.24, "torch.bfloat16")
    assert (led.swa_tokens, led.swa_kv_gib) == (102292, 6.82)
    assert led.avail_after_pool_gib == 3.27


def test_a_weight_load_after_the_rank_s_pool_end_is_the_draft_s() -> None:
    """The target's weights load before its pool in every release; a load after the pool end
    and the target's graphs is the draft's (0.5.9's order), as is the pool after it."""
    led = build_ledger(parse_text(_SWAKV).events)
    assert (led.weights_gib, led.model_type, led.avail_after_weights_gib) == (None, None, None)
    assert (led.draft_weights_gib, led.draft_kv_gib) == (0.29, 0.0)
