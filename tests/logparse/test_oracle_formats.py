"""(c) The log lines the ledger and outcome rules read, against the real SGLang 0.5.23.

`autotune.logparse.formats.RULES` names, for every rule, the file under `sglang/srt/` and the
literal or f-string SGLang formats its line from. Here that text must be in the installed
SGLang's source (the `sglang_python` fixture's venv; the source is located through
`importlib.util.find_spec`, nothing heavy is imported), and a line rendered from it with sample
values (f-string fields filled and formatted as Python would, %-formats from a tuple, the log
prefix SGLang's logger adds) must parse to the right kind and figures. A log rendered from those
lines, start to end, must give the ledger and the outcome its figures say.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from autotune.logparse.accounting import build_ledger
from autotune.logparse.events import FAILURE_KINDS, Batch, Event, Kind
from autotune.logparse.formats import RULES, Rule, Source
from autotune.logparse.lines import parse_line, parse_text
from autotune.logparse.outcome import Outcome, RunFacts, classify
from autotune.logparse.serving import summarize
from tests.logparse.sglang_text import (
    STRINGS_PROBE,
    found,
    render,
    startup_timings,
    summary_values,
)
from tests.oracle import run_in_sglang

pytestmark = pytest.mark.sglang

TP0 = "[2026-11-20 14:00:00 TP0] "
TP1 = "[2026-11-20 14:00:00 TP1] "
MAIN = "[2026-11-20 14:00:00] "
BY_NAME = {rule.name: rule for rule in RULES}


@pytest.fixture(scope="module")
def installed(sglang_python: Path) -> dict[str, Any]:
    """{path: [[kind, text], …]} for every file the table names, from the installed SGLang."""
    paths = sorted({src.path for rule in RULES for src in rule.sources})
    doc = json.loads(run_in_sglang(sglang_python, STRINGS_PROBE, *paths))
    assert isinstance(doc, dict)
    return doc


def _src(rule: Rule, i: int) -> Source:
    return rule.sources[i]


Line = Callable[[Rule], str]
_MAMBA_STATES = {
    "get_tensor_size_bytes(conv_state) / GB": 0.10,
    "get_tensor_size_bytes(temporal_state) / GB": 4.38,
}
_TUM_PREFILL = {"self.full_token_usage": 0.30}


def _f(i: int, prefix: str = TP0, /, **values: Any) -> Line:
    return lambda rule: prefix + render(_src(rule, i), values)


def _pct(i: int, *args: Any, prefix: str = TP0) -> Line:
    return lambda rule: prefix + render(_src(rule, i), args)


def _plain(i: int = 0, prefix: str = TP0, before: str = "", after: str = "") -> Line:
    return lambda rule: prefix + before + render(_src(rule, i)) + after


def _first_line(line: Line) -> Line:
    return lambda rule: line(rule).split("\n", 1)[0]


def _weight_end(rule: Rule) -> str:
    quant = render(_src(rule, 1), {"quant_method": "fp8"})
    values = {
        "self.weight_load_time": 442.0,
        "type(self.model).__name__": "DeepseekV3ForCausalLM",
        "quant_str + ', ' if quant_str else ''": quant + ", ",
        "after_avail_memory": 21.71,
        "self.weight_load_mem_usage": 72.33,
    }
    return TP0 + render(_src(rule, 0), values)


_STATE = "'VA upper bound' if self.post_capture_active else 'is allocated'"


def _kv(i: int, state: str, **values: Any) -> Line:
    return lambda rule: (
        TP0 + render(_src(rule, i), {"cache_name": "KV Cache", _STATE: state, **values})
    )


def _kv_labelled(rule: Rule) -> str:
    name = render(_src(rule, 0), {"self.allocation_label": render(_src(rule, 1))})
    values = {
        "cache_name": name,
        _STATE: "is allocated",
        "self.dtype": "torch.bfloat16",
        "num_tokens": 80000,
        "k_size_GB": 0.5,
        "v_size_GB": 0.5,
    }
    return TP0 + render(_src(rule, 2), values)


def _capture_prefill_begin(rule: Rule) -> str:
    name = render(_src(rule, 0), {"role": "target"})
    values = {
        "capture_name": name,
        "prefill_backend": "breakable",
        "capture_num_tokens": [4, 8, 16, 8192],
        "before_mem": 10.05,
    }
    return TP0 + render(_src(rule, 1), values)


def _capture_decode_begin(rule: Rule) -> str:
    values = {
        "capture_name": render(_src(rule, 0), {"role": "target"}),
        "graph_backend[model_runner.device]": render(_src(rule, 2)),
        "decode_backend": "full",
        "num_tokens_per_req": 4,
        "before_mem": 9.55,
    }
    return TP0 + render(_src(rule, 3), values)


def _capture_decode_end(rule: Rule) -> str:
    values = {
        "capture_name": "target decode",
        "graph_backend[model_runner.device]": "CUDA graph",
        "runner.capture_bs": [1, 2, 4, 8, 256],
        "capture_time": 88.0,
        "memory_usage_gb": 3.75,
        "after_mem": 6.3,
    }
    return TP0 + render(_src(rule, 0), values)


def _host_draft(rule: Rule) -> str:
    return TP0 + render(_src(rule, 1), (render(_src(rule, 0)), 318556, 1.2))


def _timings(rule: Rule) -> str:
    phases = {"prefill": 30.0, "decode": 45.0, "target_verify": 0.0, "draft_prefill": 2.0}
    return MAIN + startup_timings(_src(rule, 0), _src(rule, 1), phases, (312.4, 1.2, 400.1, 405.0))


def _prefill_line(
    rule: Rule, first: int, usage: str, counts: tuple[int, ...], backend: str, throughput: float
) -> str:
    """A Prefill line from its three parts, the sources from `first` on: the counts (new
    sequences, input, hit tokens, running, waiting requests, pending tokens) around the token
    usage part `usage`, the graph backend, the input throughput."""
    seqs, tokens, hit, running, waiting, pending = counts
    head = {
        "iter_msg": "",
        "prefill_stats.num_new_seqs": seqs,
        "prefill_stats.log_input_tokens": tokens,
        "prefill_stats.log_hit_tokens": hit,
        "token_usage_msg": usage,
        "prefill_stats.num_running_reqs.total": running,
        "len(self.scheduler.waiting_queue)": waiting,
        "prefill_stats.num_pending_tokens": pending,
    }
    graph = {"self._graph_backend_label": backend, "can_run_cuda_graph": False}
    tail = {"self.last_input_throughput": throughput}
    parts: tuple[Mapping[str, object], ...] = (head, graph, tail)
    return TP0 + "".join(render(_src(rule, first + i), part) for i, part in enumerate(parts))


def _prefill(rule: Rule) -> str:
    usage = render(_src(rule, 0), _TUM_PREFILL) + ", "
    return _prefill_line(rule, 1, usage, (8, 8192, 4096, 20, 5, 30000), "cuda graph", 21000.5)


def _prefill_hybrid(other: str, usage: float) -> Line:
    """A hybrid pool's Prefill line: `full token usage`, then the other pool's usage part."""

    def make(rule: Rule) -> str:
        parts = render(_src(rule, 0), {"self.full_token_usage": 0.40}) + ", "
        parts += render(_src(rule, 1), {other: usage}) + ", "
        counts = (12, 43008, 0, 49, 49, 213301)
        return _prefill_line(rule, 2, parts, counts, "npu graph", 14336.0)

    return make


def _decode(rule: Rule) -> str:
    usage = render(_src(rule, 0), {"self.full_num_used": 52311, "self.full_token_usage": 0.36})
    head = {"iter_msg": " [40]", "num_running_reqs": 48, "token_usage_msg": usage + ", "}
    spec = {"spec_accept_length": 2.71, "spec_accept_rate": 0.57}
    tail = {
        "self._graph_backend_label": "cuda graph",
        "can_run_cuda_graph": True,
        "self.last_gen_throughput": 1520.33,
        "len(self.scheduler.waiting_queue)": 0,
    }
    return TP0 + "".join(
        (render(_src(rule, 1), head), render(_src(rule, 2), spec), render(_src(rule, 3), tail))
    )


def _retract(rule: Rule) -> str:
    details = render(_src(rule, 1), {"len(retracted_reqs)": 2, "new_token_gained": 5120}) + render(
        _src(rule, 2), {"old_ratio": 0.42, "new_token_ratio": 0.61}
    )
    return TP0 + render(_src(rule, 0)) + details


def _summary(rule: Rule) -> str:
    return TP0 + render(_src(rule, 0), summary_values(159277, 8192, 48, 262144, 5.47))


SERVER_ARGS = {
    "model_path": "/models/Kimi-K2.5",
    "mem_fraction_static": 0.88,
    "max_running_requests": 48,
    "max_total_tokens": None,
    "page_size": 1,
    "tp_size": 2,
    "speculative_algorithm": "EAGLE3",
    "speculative_num_draft_tokens": 4,
    "enable_hierarchical_cache": True,
    "hicache_ratio": 2.0,
    "hicache_size": 0,
    "api_key": "sk-not-for-the-ledger",
    "cuda_graph_config": {"decode": {"backend": "full", "max_bs": 256}, "prefill": {"max_bs": 8}},
}
OOM_E = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB"

# rule -> (how to render its line, the kind it must parse to, figures, label)
SAMPLES: dict[str, tuple[Line, str, Mapping[str, float], str]] = {
    "server_args": (
        _f(0, MAIN, **{"_server_args_for_logging(server_args)": SERVER_ARGS}),
        "server_args",
        {},
        "dict",
    ),
    "dist_init_begin": (_plain(), "dist_init_begin", {}, ""),
    "dist_init_end": (
        _f(0, **{"time.perf_counter() - tic": 3.2}),
        "dist_init_end",
        {"elapsed_s": 3.2},
        "",
    ),
    "memory_baseline": (
        _f(0, **{"before_avail_memory - local_gpu_memory": 1.55}),
        "memory_baseline",
        {"usage_gib": 1.55},
        "",
    ),
    "unbalanced_memory": (_plain(after="pre_model_load_memory=80.1"), "unbalanced_memory", {}, ""),
    "weight_load_begin": (
        _f(0, **{"get_available_gpu_memory(self.device, self.gpu_id)": 94.04}),
        "weight_load_begin",
        {"avail_gib": 94.04},
        "",
    ),
    "weight_load_end": (
        _weight_end,
        "weight_load_end",
        {"avail_gib": 21.71, "usage_gib": 72.33, "elapsed_s": 442.0},
        "DeepseekV3ForCausalLM",
    ),
    "weight_commit": (_pct(0, 12.5, 30.0, 480.0), "weight_commit", {"elapsed_s": 12.5}, ""),
    "mamba_allocated": (
        _f(0, size=186, **_MAMBA_STATES),
        "mamba_allocated",
        {"gib": 4.48, "slots": 186},
        "",
    ),
    "mamba_allocated_spec": (
        _f(
            0,
            size=48,
            intermediate_ssm_gb=1.05,
            **_MAMBA_STATES,
            **{"get_tensor_size_bytes(self._intermediate_conv_window_phys) / GB": 0.02},
        ),
        "mamba_allocated",
        {"gib": 5.55, "slots": 48},
        "",
    ),
    "swa_pool": (
        _f(0, full_tokens=100000, swa_tokens=80000),
        "swa_pool",
        {"full_tokens": 100000, "swa_tokens": 80000},
        "",
    ),
    "swa_kv_pool": (
        _f(
            0,
            **{
                "'VA upper bound' if self.post_capture_active else 'mem usage'": "mem usage",
                "self.mem_usage": 10.24,
                "self.size_swa": 102292,
                "self.size": 127866,
            },
        ),
        "swa_pool",
        {"full_tokens": 127866, "swa_tokens": 102292, "gib": 10.24},
        "SWAKVPool",
    ),
    "kv_cap_ignored": (
        _f(0, user_limit=500000, token_capacity=159277),
        "kv_cap_ignored",
        {"requested": 500000, "profiled": 159277},
        "",
    ),
    "mrr_reduced": (
        _pct(0, 100000, 79638),
        "mrr_reduced",
        {"requested": 100000, "value": 79638},
        "",
    ),
    "mrr_spec_reset": (_plain(prefix=MAIN), "mrr_spec_reset", {"value": 48}, ""),
    "kv_allocated_mla": (
        _kv(
            0,
            "is allocated",
            **{"self.dtype": "torch.bfloat16", "num_tokens": 159277, "kv_size_GB": 10.42},
        ),
        "kv_allocated",
        {"tokens": 159277, "kv_gib": 10.42, "pool": 0},
        "torch.bfloat16",
    ),
    "kv_allocated_mha": (
        _kv(
            0,
            "VA upper bound",
            **{
                "self.dtype": "torch.float8_e4m3fn",
                "num_tokens": 600000,
                "k_size_GB": 7.53,
                "v_size_GB": 7.53,
            },
        ),
        "kv_allocated",
        {"tokens": 600000, "kv_gib": 15.06, "k_gib": 7.53, "va_upper_bound": 1},
        "torch.float8_e4m3fn",
    ),
    "kv_allocated_labelled": (
        _kv_labelled,
        "kv_allocated",
        {"pool": 1, "kv_gib": 1.0},
        "torch.bfloat16",
    ),
    "memory_pool_end": (
        _f(0, **{"get_available_gpu_memory(self.device, self.gpu_id)": 10.07}),
        "memory_pool_end",
        {"avail_gib": 10.07},
        "",
    ),
    "capture_prefill_begin": (
        _capture_prefill_begin,
        "graph_capture_begin",
        {"avail_gib": 10.05, "max_tokens": 8192},
        "target prefill",
    ),
    "capture_prefill_end": (
        _f(0, capture_name="draft prefill", capture_time=30.0, mem_usage=0.5, after_mem=9.55),
        "graph_capture_end",
        {"usage_gib": 0.5, "avail_gib": 9.55, "elapsed_s": 30.0},
        "draft prefill",
    ),
    "capture_decode_begin": (
        _capture_decode_begin,
        "graph_capture_begin",
        {"avail_gib": 9.55, "tokens_per_req": 4},
        "target verify",
    ),
    "capture_decode_end": (
        _capture_decode_end,
        "graph_capture_end",
        {"usage_gib": 3.75, "avail_gib": 6.3, "max_bs": 256},
        "target decode",
    ),
    "capture_draft_decode_begin": (
        _f(0, decode_backend="full", capture_bs=[1, 2, 48], before_mem=6.3, **{"self.topk": 1}),
        "graph_capture_begin",
        {"avail_gib": 6.3, "max_bs": 48},
        "draft decode",
    ),
    "capture_draft_decode_end": (
        _f(0, capture_time=19.0, after_mem=5.9, **{"before_mem - after_mem": 0.4}),
        "graph_capture_end",
        {"usage_gib": 0.4},
        "draft decode",
    ),
    "capture_draft_extend_begin": (
        _f(
            0,
            decode_backend="full",
            capture_bs=[1, 2, 48],
            before_mem=5.9,
            **{"self.speculative_num_draft_tokens": 4},
        ),
        "graph_capture_begin",
        {"tokens_per_req": 4},
        "draft extend",
    ),
    "capture_draft_extend_end": (
        _f(0, capture_time=9.0, after_mem=5.8, **{"before_mem - after_mem": 0.1}),
        "graph_capture_end",
        {"usage_gib": 0.1},
        "draft extend",
    ),
    "capture_multi_layer_extend_end": (
        _f(
            0,
            step=0,
            after_mem=5.7,
            **{"time.perf_counter() - tic": 3.0, "before_mem - after_mem": 0.1},
        ),
        "graph_capture_end",
        {"usage_gib": 0.1, "elapsed_s": 3.0},
        "draft extend",
    ),
    "capturing_batches": (
        lambda rule: (
            render(_src(rule, 0), {"bs": 512, "avail_mem": 10.23})
            + ":  98%|█████████▊| 51/52 [00:30<00:00,  1.70it/s]"
        ),
        "graph_capturing",
        {"bs": 512, "avail_gib": 10.23},
        "",
    ),
    "capturing_prefill": (
        lambda rule: render(_src(rule, 0), {"num_tokens": 8192, "avail_mem": 7.5}) + ":   0%|",
        "graph_capturing",
        {"num_tokens": 8192, "avail_gib": 7.5},
        "prefill",
    ),
    "capture_failed": (
        _first_line(_f(0, "Exception: ", e=OOM_E, CUDA_GRAPH_CAPTURE_FAILED_MSG="Possible")),
        "graph_capture_failed",
        {"tried_gib": 2.0},
        "",
    ),
    "capture_prefill_failed": (
        _first_line(
            _f(
                0,
                "RuntimeError: ",
                e="bad shape",
                **{"prefill_failure_msg(self.prefill_backend_name)": "Fail when using"},
            )
        ),
        "graph_capture_failed",
        {},
        "",
    ),
    "post_capture_kv": (
        _pct(0, "torch.bfloat16", 590000, 14.8, 6.1),
        "post_capture",
        {"tokens": 590000, "kv_gib": 14.8, "avail_gib": 6.1},
        "kv",
    ),
    "post_capture_draft_kv": (
        _pct(0, "torch.bfloat16", 590000, 0.45),
        "post_capture",
        {"tokens": 590000, "kv_gib": 0.45},
        "draft_kv",
    ),
    "post_capture_mrr": (
        _pct(0, 512, 300),
        "post_capture",
        {"requested": 512, "value": 300},
        "max_running_requests",
    ),
    "post_capture_canary": (_pct(0, 0.25), "post_capture", {"gib": 0.25}, "canary"),
    "post_capture_swa": (
        _pct(0, 300000, 120000),
        "post_capture",
        {"full_tokens": 300000, "swa_tokens": 120000},
        "swa",
    ),
    "post_capture_eager_gap": (
        _pct(0, 256, 512),
        "post_capture",
        {"max_bs": 256, "requests": 512},
        "eager_gap",
    ),
    "pool_below_context": (
        _pct(0, 60000, 262144),
        "pool_below_context",
        {"tokens": 60000, "context": 262144},
        "",
    ),
    "scheduler_summary": (
        _summary,
        "scheduler_summary",
        {"max_total_num_tokens": 159277, "max_running_requests": 48, "available_gpu_mem": 5.47},
        "",
    ),
    "host_headroom": (
        _pct(0, 1800.5, 1500.0),
        "host_headroom",
        {"host_gib": 1800.5, "cgroup_gib": 1500.0},
        "",
    ),
    "hicache_autosize": (
        _pct(0, 2.0, 1.5, 180.0, 0.8, 2, 15.6),
        "hicache_autosize",
        {"ratio": 1.5, "per_rank_gib": 180.0, "fraction": 0.8, "ranks": 2, "pools_gib": 15.6},
        "",
    ),
    "hicache_smaller": (
        _pct(0, "kv", 100000, 159277),
        "hicache_smaller",
        {"tokens": 100000, "device_tokens": 159277},
        "kv",
    ),
    "host_pool": (
        _pct(0, "kv", 318556, 22.39),
        "host_cache",
        {"tokens": 318556, "gb": 22.39},
        "kv",
    ),
    "host_pool_packed_mtp": (
        _pct(0, "kv", 318556, 22.75, 61, 1, 62),
        "host_cache",
        {"tokens": 318556, "gb": 22.75},
        "kv",
    ),
    "host_pool_draft_label": (_host_draft, "host_cache", {"gb": 1.2}, "draft"),
    "startup_timings": (
        _timings,
        "startup_timings",
        {"load_weight": 312.4, "cuda_graph.prefill": 30.0, "tokenizer_e2e": 405.0},
        "",
    ),
    "ready": (_plain(prefix=MAIN), "ready", {}, ""),
    "prefill_batch": (_prefill, "batch", {}, ""),
    "prefill_batch_swa": (_prefill_hybrid("self.swa_token_usage", 0.30), "batch", {}, ""),
    "prefill_batch_mamba": (_prefill_hybrid("self.mamba_usage", 0.60), "batch", {}, ""),
    "decode_batch": (_decode, "batch", {}, ""),
    "retract": (_retract, "retract", {"retracted": 2}, ""),
    "request_oom_abort": (_pct(0, "rid-1"), "request_oom_abort", {}, ""),
    "retract_test": (
        _plain(after="#retracted_reqs: 3, #new_tokens_gained: 960"),
        "retract",
        {"retracted": 3},
        "test",
    ),
    "request_oom_abort_reason": (_plain(prefix=MAIN), "request_oom_abort", {}, ""),
    "oom_fallback_graph_dedup": (
        _pct(0, "DecodeCudaGraphRunner", "CUDA out of memory. Tried to allocate 2.00 GiB"),
        "oom_handled",
        {},
        "",
    ),
    "oom_retry": (
        _f(0, try_index=0, max_retry=3, delay=2.0, e="CUDA error: out of memory"),
        "oom_handled",
        {},
        "",
    ),
    "oom_fallback_vmm": (
        _pct(0, "fabric", 0, "CUDA_ERROR_OUT_OF_MEMORY: out of memory"),
        "oom_handled",
        {},
        "",
    ),
    "port_wait": (
        _f(
            0,
            port=30001,
            i=15,
            port_name="port_base",
            error_message="port_base is used by a process already.",
        ),
        "port_wait",
        {},
        "",
    ),
    "port_wait_unknown_holder": (_f(0, MAIN, port=30001), "port_wait", {}, ""),
    "port_next": (_pct(0, 30001, 30002, prefix=MAIN), "port_wait", {}, ""),
    "port_not_available": (
        _f(
            0,
            "ValueError: ",
            port_name="nccl_port",
            port=30010,
            timeout_s=30,
            error_message="nccl_port at 30010 is not available",
        ),
        "port_in_use",
        {},
        "",
    ),
    "ports_in_use": (
        _f(
            0,
            MAIN,
            dist_init_port=None,
            port_base=30001,
            detokenizer_port=30002,
            nccl_port=30010,
            scheduler_input_port=30003,
        ),
        "port_in_use",
        {},
        "",
    ),
    "bootstrap_port_in_use": (
        _f(0, "RuntimeError: ", bootstrap_port=8998),
        "port_in_use",
        {},
        "",
    ),
    "no_kv_room": (
        _f(
            0,
            "ValueError: ",
            suggested_mem_fraction_static=0.781,
            minimum_mem_fraction_static=0.7801,
            **{"get_schedule().mem_fraction_static": 0.7},
        ),
        "no_kv_room",
        {},
        "",
    ),
    "not_enough_memory": (_plain(prefix="RuntimeError: "), "no_kv_room", {}, ""),
    "pool_too_small": (_plain(prefix="AssertionError: "), "pool_too_small", {}, ""),
    "mrr_zero": (_plain(prefix="AssertionError: "), "pool_too_small", {}, ""),
    "host_memory": (
        _f(
            0,
            "ValueError: ",
            **{"requested_bytes / 1000000000.0": 96.0, "available_bytes / 1000000000.0": 90.5},
        ),
        "host_memory",
        {"requested_gb": 96.0, "free_gb": 90.5},
        "",
    ),
    "host_memory_none_left": (_plain(prefix="ValueError: "), "host_memory", {}, ""),
    "prefill_oom": (
        _first_line(
            _f(
                0,
                extend_num_tokens=8192,
                **{"available_and_evictable_str(tree_cache)": "Available tokens: 0"},
            )
        ),
        "prefill_oom",
        {},
        "",
    ),
    "decode_oom": (
        _first_line(
            _f(
                0,
                **{
                    "len(seq_lens) * token_per_req": 48,
                    "available_and_evictable_str(tree_cache)": "Available tokens: 0",
                },
            )
        ),
        "decode_oom",
        {},
        "",
    ),
    "alloc_oom": (
        _first_line(
            _f(
                0,
                num_tokens=16,
                **{"available_and_evictable_str(tree_cache)": "Available tokens: 0"},
            )
        ),
        "alloc_oom",
        {},
        "",
    ),
    "req_slots_oom": (
        _f(0, "RuntimeError: ", num_reqs=4, **{"req_to_token_pool.available_size()": 0}),
        "req_slots_oom",
        {},
        "",
    ),
    "deepgemm_shrink_is_not_an_oom": (
        _f(0, memory_budget=4, required_memory=6, max_m=4096),
        "",
        {},
        "",
    ),
    "scheduler_exception": (
        _f(0, traceback="Traceback (most recent call last):"),
        "scheduler_exception",
        {},
        "",
    ),
    "watchdog_timeout": (
        _f(
            0,
            **{"self.debug_name": "Scheduler", "self.watchdog_timeout": 300.0, "self.soft": False},
        ),
        "watchdog_timeout",
        {},
        "",
    ),
    "rank_died": (
        _f(0, "RuntimeError: ", rank=1, **{"proc.exitcode": -9}),
        "rank_dead",
        {"code": -9},
        "",
    ),
    "subprocess_crashed": (
        _f(0, MAIN, name="scheduler_1", **{"proc.pid": 4242, "proc.exitcode": -9}),
        "subprocess_crashed",
        {"code": -9, "pid": 4242},
        "scheduler_1",
    ),
    "scheduler_terminated": (
        _f(0, MAIN, **{"proc.pid": 4242, "proc.exitcode": -6}),
        "subprocess_crashed",
        {"code": -6},
        "scheduler",
    ),
    "sigquit": (_f(0, MAIN, signum=3, frame=None), "sigquit", {}, ""),
    "sigquit_launch": (_plain(prefix=MAIN), "sigquit", {}, ""),
    "warmup_failed": (
        _f(0, MAIN, last_traceback="Traceback (most recent call last):"),
        "warmup_failed",
        {},
        "",
    ),
    "init_failed": (_plain(prefix="RuntimeError: "), "error", {}, ""),
    "sigterm": (_f(0, MAIN, signum=15, frame=None), "sigterm_received", {}, ""),
    "sigterm_force_exit": (_plain(prefix=MAIN), "sigterm_received", {}, ""),
    "graceful_exit": (
        _f(0, MAIN, remain_num_req=3, remaining_rids=["a", "b", "c"]),
        "graceful_exit",
        {},
        "",
    ),
    "health_check_failed": (
        _f(0, MAIN, HEALTH_CHECK_TIMEOUT=20, tic_time=1.0, last_receive_time=0.5),
        "health_check_failed",
        {},
        "",
    ),
    "deepgemm_jit": (_plain(after="It may take a long time"), "deepgemm_jit", {}, ""),
}

BATCHES: dict[str, dict[str, object]] = {
    "prefill_batch": {
        "phase": "prefill",
        "new_seq": 8,
        "new_tokens": 8192,
        "cached_tokens": 4096,
        "token_usage": 0.30,
        "running": 20,
        "queued": 5,
        "pending_tokens": 30000,
        "cuda_graph": False,
        "input_throughput": 21000.5,
    },
    "prefill_batch_swa": {
        "phase": "prefill",
        "token_usage": 0.40,
        "swa_token_usage": 0.30,
        "mamba_usage": None,
        "running": 49,
        "pending_tokens": 213301,
        "cuda_graph": False,
    },
    "prefill_batch_mamba": {
        "phase": "prefill",
        "token_usage": 0.40,
        "mamba_usage": 0.60,
        "swa_token_usage": None,
        "queued": 49,
        "input_throughput": 14336.0,
    },
    "decode_batch": {
        "phase": "decode",
        "running": 48,
        "tokens": 52311,
        "token_usage": 0.36,
        "accept_len": 2.71,
        "accept_rate": 0.57,
        "cuda_graph": True,
        "gen_throughput": 1520.33,
        "queued": 0,
    },
}


def test_every_rule_has_a_sample() -> None:
    assert sorted(SAMPLES) == sorted(BY_NAME)


@pytest.mark.parametrize("rule", RULES, ids=[r.name for r in RULES])
def test_the_source_text_is_in_the_installed_sglang(rule: Rule, installed: dict[str, Any]) -> None:
    files = installed["files"]
    for src in rule.sources:
        strings = files.get(src.path)
        assert strings is not None, f"{rule.name}: {src.path} is not in {installed['srt']}"
        assert found(src, strings), (
            f"{rule.name}: {src.path} has no {src.style} string {src.text!r}"
        )


def _parse(line: str) -> Event | Batch | None:
    return parse_line(line, 1)


@pytest.mark.parametrize("rule", RULES, ids=[r.name for r in RULES])
def test_a_line_rendered_from_the_source_parses_to_its_fields(
    rule: Rule, installed: dict[str, Any]
) -> None:
    for src in rule.sources:
        assert found(src, installed["files"].get(src.path)), rule.name
    make, kind, values, label = SAMPLES[rule.name]
    line = make(rule)
    got = _parse(line)
    assert rule.reads == kind, "the table and the sample agree on what the line is"
    if kind == "":
        assert got is None or (isinstance(got, Event) and got.kind not in FAILURE_KINDS), line
        return
    if kind == "batch":
        assert isinstance(got, Batch), line
        for key, value in BATCHES[rule.name].items():
            want = pytest.approx(value) if isinstance(value, float) else value
            assert getattr(got, key) == want, (key, line)
        return
    assert isinstance(got, Event), line
    assert got.kind is Kind(kind), line
    assert got.label == label, line
    for key, value in values.items():
        assert got.values.get(key) == pytest.approx(value), (key, line)


def _line(name: str, prefix: str | None = None) -> str:
    text = SAMPLES[name][0](BY_NAME[name])
    if prefix is not None:
        for known in (TP0, MAIN):
            if text.startswith(known):
                return prefix + text[len(known) :]
    return text


def test_a_log_rendered_from_the_sources_gives_its_ledger_and_outcome(
    installed: dict[str, Any],
) -> None:
    """A 0.5.23 start with an EAGLE3 draft and HiCache, rendered line by line from the sources:
    the draft loads before the pool, the ledger names 0.5.23's rules and every figure."""
    for rule in RULES:
        for src in rule.sources:
            assert found(src, installed["files"].get(src.path)), rule.name
    begin, end = BY_NAME["weight_load_begin"], BY_NAME["weight_load_end"]
    draft_end = TP0 + render(
        end.sources[0],
        {
            "self.weight_load_time": 5.0,
            "type(self.model).__name__": "LlamaForCausalLMEagle3",
            "quant_str + ', ' if quant_str else ''": "",
            "after_avail_memory": 20.9,
            "self.weight_load_mem_usage": 0.81,
        },
    )
    draft_begin = TP0 + render(
        begin.sources[0], {"get_available_gpu_memory(self.device, self.gpu_id)": 21.71}
    )
    draft_kv = TP0 + render(
        BY_NAME["kv_allocated_mha"].sources[0],
        {
            "cache_name": "KV Cache",
            _STATE: "is allocated",
            "self.dtype": "torch.bfloat16",
            "num_tokens": 159277,
            "k_size_GB": 0.3,
            "v_size_GB": 0.3,
        },
    )
    pool_end = BY_NAME["memory_pool_end"].sources[0]
    draft_pool_end = TP0 + render(
        pool_end, {"get_available_gpu_memory(self.device, self.gpu_id)": 9.47}
    )
    lines = [
        _line("server_args"),
        _line("dist_init_begin"),
        _line("dist_init_end"),
        _line("memory_baseline"),
        _line("weight_load_begin"),
        _line("weight_load_end"),
        draft_begin,
        draft_end,
        _line("kv_allocated_mla"),
        TP0 + render(pool_end, {"get_available_gpu_memory(self.device, self.gpu_id)": 10.07}),
        draft_kv,
        draft_pool_end,
        _line("capture_prefill_begin"),
        _line("capture_decode_begin"),
        _line("capture_decode_end"),
        _line("capture_prefill_end"),
        _line("capture_draft_decode_begin"),
        _line("capture_draft_decode_end"),
        _line("scheduler_summary"),
        _line("hicache_autosize"),
        _line("host_pool"),
        _host_draft(BY_NAME["host_pool_draft_label"]),
        _line("startup_timings"),
        _line("prefill_batch"),
        _line("ready"),
        _line("decode_batch"),
    ]
    log = parse_text("\n".join(lines) + "\n")
    led = build_ledger(log.events)
    assert led.semantics == "0.5.23" and led.semantics_from
    assert (led.p_gib, led.weights_gib, led.draft_weights_gib) == (94.04, 72.33, 0.81)
    assert led.avail_after_weights_gib == 20.9  # A: after the draft, which loads first
    assert led.kv_gib == 10.42 and led.draft_kv_gib == pytest.approx(0.6)
    assert led.req_to_token_gib == pytest.approx(0.41)  # 20.90 − 10.42 − 10.07
    assert led.graph_phases == {"decode": 3.75, "draft_prefill": 0.5, "draft_decode": 0.4}
    assert (led.graph_gib, led.draft_graph_gib) == (3.75, 0.9)
    assert led.graph_max_bs == 256 and led.prefill_graph_max_tokens == 8192
    assert (led.host_cache_gb, led.host_cache_tokens, led.draft_host_cache_gb) == (
        22.39,
        318556,
        1.2,
    )
    assert led.host_budget_gb == pytest.approx(180.0 * 2**30 / 1e9 / 0.8, abs=0.01)
    assert (led.mem_fraction_static, led.speculative_algorithm, led.tp_size) == (0.88, "EAGLE3", 2)
    assert "api_key" not in led.to_dict() and "sk-not" not in json.dumps(led.to_dict())
    assert led.startup_timings is not None and led.startup_timings["load_weight"] == 312.4
    assert classify(log.events, batches=log.batches).outcome is Outcome.READY
    serving = summarize(log.batches, log.events)
    assert serving.max_pending_tokens == 30000 and serving.mean_accept_rate == 0.57


@pytest.mark.parametrize(
    ("name", "outcome", "cause"),
    [
        ("rank_died", Outcome.STARTUP_OOM, "host_oom_killer"),
        ("subprocess_crashed", Outcome.RUNTIME_OOM, "host_oom_killer"),
        ("scheduler_terminated", Outcome.CRASH, "subprocess_crashed"),
        ("prefill_oom", Outcome.RUNTIME_OOM, "prefill_oom"),
        ("req_slots_oom", Outcome.RUNTIME_OOM, "req_slots_oom"),
        ("host_memory", Outcome.STARTUP_OOM, "host_memory"),
        ("no_kv_room", Outcome.STARTUP_OOM, "no_kv_room"),
        ("capture_failed", Outcome.STARTUP_OOM, "graph_capture_failed"),
        ("request_oom_abort", Outcome.RUNTIME_OOM, "request_oom_abort"),
        ("port_not_available", Outcome.MACHINE_ERROR, "port_in_use"),
        ("ports_in_use", Outcome.MACHINE_ERROR, "port_in_use"),
    ],
)
def test_deaths_rendered_from_the_sources_are_read_as_their_outcome(
    name: str, outcome: Outcome, cause: str, installed: dict[str, Any]
) -> None:
    """Each death alone, without the ready line: what the line itself proves (a request failed
    with the OOM error is an OOM; a port SGLang gave up waiting for is the machine's)."""
    for src in BY_NAME[name].sources:
        assert found(src, installed["files"].get(src.path)), name
    log = parse_text(_line("server_args") + "\n" + _line(name) + "\n")
    verdict = classify(log.events, batches=log.batches)
    assert (verdict.outcome, verdict.cause) == (outcome, cause)


def test_the_probe_reads_the_installed_package(installed: dict[str, Any]) -> None:
    assert Path(installed["srt"]).name == "srt"
    assert sum(1 for v in installed["files"].values() if v) == len(
        {s.path for r in RULES for s in r.sources}
    )


@pytest.mark.parametrize(
    "name",
    [
        "retract",
        "retract_test",
        "oom_fallback_graph_dedup",
        "oom_retry",
        "oom_fallback_vmm",
        "port_wait",
        "port_wait_unknown_holder",
        "port_next",
        "deepgemm_shrink_is_not_an_oom",
    ],
)
def test_serving_events_rendered_from_the_sources_end_nothing(
    name: str, installed: dict[str, Any]
) -> None:
    """A retraction, a handled out-of-memory fallback, a wait for a port: the server lives on."""
    for src in BY_NAME[name].sources:
        assert found(src, installed["files"].get(src.path)), name
    ready = _line("ready")
    log = parse_text(ready + "\n" + _line(name) + "\n")
    assert classify(log.events, batches=log.batches).outcome is Outcome.READY
    assert classify(log.events, RunFacts(), log.batches).outcome is Outcome.READY
