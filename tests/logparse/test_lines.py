"""Single lines of every serving and prefix format (reference §4.1, §4.3), and junk."""

from __future__ import annotations

import pytest

from autotune.logparse.batchline import read_common_batch
from autotune.logparse.events import Batch, Event, Kind
from autotune.logparse.lines import parse_line
from autotune.logparse.prefix import rank_order, split_prefix

TP0 = "[2026-02-24 12:00:00 TP0] "
MAIN = "[2026-02-24 12:00:00] "


def batch(line: str) -> Batch:
    item = parse_line(line)
    assert isinstance(item, Batch), line
    return item


def event(line: str) -> Event:
    item = parse_line(line)
    assert isinstance(item, Event), line
    return item


def test_prefix_with_milliseconds_and_dp_ep_tags() -> None:
    time, rank, message = split_prefix("[2026-02-24 11:57:16.250 DP1 TP2 EP2] Load weight begin.")
    assert rank == "DP1 TP2 EP2"
    assert message == "Load weight begin."
    t0, _, _ = split_prefix("[2026-02-24 11:57:16] x")
    assert time is not None and t0 is not None
    assert time - t0 == pytest.approx(0.25)


def test_main_process_and_missing_prefix_have_no_rank() -> None:
    assert split_prefix("[2026-02-24 11:57:16] The server is fired up")[1] == ""
    assert split_prefix("RuntimeError: boom") == (None, "", "RuntimeError: boom")


def test_rank_order_puts_main_first_then_numeric() -> None:
    assert sorted(["TP1", "", "TP0"], key=rank_order) == ["", "TP0", "TP1"]
    assert sorted(["TP10", "TP2"], key=rank_order) == ["TP2", "TP10"]
    assert sorted(["DP1 TP0", "DP0 TP1"], key=rank_order) == ["DP0 TP1", "DP1 TP0"]
    assert sorted(["PP1 TP0", "PP0 TP1"], key=rank_order) == ["PP0 TP1", "PP1 TP0"]


@pytest.mark.parametrize(
    ("line", "fields"),
    [
        (  # 0.5.9 decode with spec fields
            TP0 + "Decode batch, #running-req: 48, #token: 150123, token usage: 0.94, "
            "accept len: 2.85, accept rate: 0.71, cuda graph: True, gen throughput (token/s): "
            "983.12, #queue-req: 102",
            dict(
                phase="decode",
                running=48,
                queued=102,
                tokens=150123,
                token_usage=0.94,
                accept_len=2.85,
                cuda_graph=True,
                gen_throughput=983.12,
            ),
        ),
        (  # 0.4.x decode
            TP0 + "Decode batch. #running-req: 6, #token: 9000, token usage: "
            "0.01, cuda graph: False, gen throughput (token/s): 310.55, #queue-req: 0",
            dict(phase="decode", running=6, queued=0, tokens=9000, cuda_graph=False),
        ),
        (  # 0.5.4 decode with forward counter
            TP0 + "Decode batch [40], #running-req: 5, #token: 3100, token "
            "usage: 0.01, cuda graph: True, gen throughput (token/s): 201.33, #queue-req: 0",
            dict(phase="decode", running=5, tokens=3100, gen_throughput=201.33),
        ),
        (  # 0.4.x prefill
            TP0 + "Prefill batch. #new-seq: 4, #new-token: 4096, "
            "#cached-token: 12, token usage: 0.01, #running-req: 2, #queue-req: 1",
            dict(
                phase="prefill",
                new_seq=4,
                new_tokens=4096,
                cached_tokens=12,
                running=2,
                queued=1,
                cuda_graph=None,
                input_throughput=None,
            ),
        ),
        (  # 0.5.4 prefill: trailing comma, no throughput
            TP0 + "Prefill batch [5], #new-seq: 2, #new-token: 2048, "
            "#cached-token: 0, token usage: 0.01, #running-req: 3, #queue-req: 0, ",
            dict(phase="prefill", new_seq=2, new_tokens=2048, running=3, queued=0),
        ),
        (  # 0.5.9 prefill
            TP0 + "Prefill batch, #new-seq: 3, #new-token: 8192, "
            "#cached-token: 120, token usage: 0.41, #running-req: 45, #queue-req: 104, "
            "input throughput (token/s): 15012.33, cuda graph: False",
            dict(phase="prefill", new_tokens=8192, input_throughput=15012.33, cuda_graph=False),
        ),
        (  # 0.5.23 prefill: pending tokens, cuda graph before throughput
            TP0 + "Prefill batch, #new-seq: 8, #new-token: 8192, "
            "#cached-token: 4096, token usage: 0.30, #running-req: 20, #queue-req: 5, "
            "#pending-token: 30000, cuda graph: False, input throughput (token/s): 21000.50",
            dict(phase="prefill", running=20, queued=5, input_throughput=21000.5),
        ),
        (  # hybrid SWA
            TP0 + "Decode batch, #running-req: 3, #token: 100, full token usage: 0.20, "
            "swa token usage: 0.50, cuda graph: True, gen throughput (token/s): 50.00, "
            "#queue-req: 0",
            dict(token_usage=0.20),
        ),
        (  # PD decode mode with retractions
            TP0 + "Decode batch, #running-req: 3, #token: 100, token usage: "
            "0.20, pre-allocated usage: 0.10, #prealloc-req: 0, #transfer-req: 0, "
            "#retracted-req: 2, cuda graph: True, gen throughput (token/s): 50.00, #queue-req: 0",
            dict(retracted=2, running=3),
        ),
        (  # SGLANG_LOG_FORWARD_ITERS head
            TP0 + "Prefill batch [123], #new-seq: 1, #new-token: 1, "
            "#cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0, input "
            "throughput (token/s): 1.00, cuda graph: False",
            dict(new_tokens=1),
        ),
    ],
)
def test_batch_lines(line: str, fields: dict[str, object]) -> None:
    got = batch(line)
    for key, value in fields.items():
        assert getattr(got, key) == (pytest.approx(value) if isinstance(value, float) else value)


@pytest.mark.parametrize(
    ("line", "kind", "values", "label"),
    [
        ("[t] x", None, {}, ""),
        (
            TP0 + "Load weight end. elapsed=452.31 s, type=DeepseekV3ForCausalLM,"
            " dtype=torch.bfloat16, avail mem=21.71 GB, mem usage=72.33 GB.",
            Kind.WEIGHT_LOAD_END,
            {"avail_gib": 21.71, "usage_gib": 72.33, "elapsed_s": 452.31},
            "DeepseekV3ForCausalLM",
        ),
        (
            TP0 + "Init torch distributed ends. mem usage=1.55 GB",
            Kind.DIST_INIT_END,
            {"usage_gib": 1.55},
            "",
        ),
        (
            TP0 + "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 10, "
            "K size: 1.25 GB, V size: 1.25 GB",
            Kind.KV_ALLOCATED,
            {"tokens": 10, "kv_gib": 2.5, "k_gib": 1.25, "v_gib": 1.25},
            "torch.bfloat16",
        ),
        (
            "Capturing batches (bs=512 avail_mem=10.23 GB):   0%|   | 0/52\rCapturing batches "
            "(bs=256 avail_mem=9.10 GB):  50%|   | 26/52",
            Kind.GRAPH_CAPTURING,
            {"bs": 256, "avail_gib": 9.10},
            "",
        ),
        (
            TP0 + "Capture target verify CUDA graph end. elapsed=29.00 s, mem "
            "usage=1.10 GB, avail mem=7.38 GB.",
            Kind.GRAPH_CAPTURE_END,
            {"usage_gib": 1.10, "avail_gib": 7.38, "elapsed_s": 29.0},
            "target verify",
        ),
        (
            TP0 + "Capture draft decode CUDA graph end. elapsed=19.00 s, mem "
            "usage=0.40 GB, avail mem=6.48 GB.",
            Kind.GRAPH_CAPTURE_END,
            {"usage_gib": 0.40},
            "draft decode",
        ),
        (
            TP0 + "Capture piecewise CUDA graph begin. avail mem=17.28 GB",
            Kind.GRAPH_CAPTURE_BEGIN,
            {"avail_gib": 17.28},
            "piecewise",
        ),
        (
            TP0 + "Capture decode CUDA graph end. bs=[1, 2], elapsed=88.00 s, "
            "mem usage=3.75 GB, avail mem=6.52 GB.",
            Kind.GRAPH_CAPTURE_END,
            {"usage_gib": 3.75, "avail_gib": 6.52},
            "decode",
        ),
        (
            TP0 + "KV cache pool is full. Retract requests. #retracted_reqs: 2, "
            "#new_tokens_gained: 5120, #new_token_ratio: 0.4200 -> 0.6100",
            Kind.RETRACT,
            {"retracted": 2},
            "",
        ),
        (
            MAIN + "INFO:     Started server process [48211]",
            Kind.SERVER_PROCESS,
            {"pid": 48211},
            "",
        ),
        (
            MAIN + "INFO:     Uvicorn running on http://127.0.0.1:30000 (Press CTRL+C to quit)",
            Kind.UVICORN_RUNNING,
            {},
            "http://127.0.0.1:30000",
        ),
        (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 896.00 MiB. GPU 0 has",
            Kind.TORCH_OOM,
            {"tried_gib": 0.875},
            "",
        ),
        ("RuntimeError: CUDA error: out of memory", Kind.CUDA_ERROR_OOM, {}, ""),
        ("NCCL error: unhandled cuda error, NCCL version 2.21.5", Kind.NCCL_ERROR, {}, ""),
        (
            MAIN + "SIGTERM received. signum=None frame=None. Draining requests and "
            "shutting down...",
            Kind.SIGTERM_RECEIVED,
            {},
            "",
        ),
        (
            TP0 + "Health check failed. Server couldn't get a response from "
            "detokenizer for last 20 seconds. tic start time: 12:00:00. "
            "last_heartbeat time: 11:59:40",
            Kind.HEALTH_CHECK_FAILED,
            {},
            "",
        ),
    ],
)
def test_event_lines(line: str, kind: Kind | None, values: dict[str, float], label: str) -> None:
    item = parse_line(line)
    if kind is None:
        assert item is None
        return
    got = event(line)
    assert got.kind is kind
    assert got.label == label
    for key, value in values.items():
        assert got.values[key] == pytest.approx(value)


@pytest.mark.parametrize(
    "line",
    [
        "",
        "[",
        "[2026-02-24 11:5",
        "\x00\x00\x00",
        "Decode batch",
        TP0 + "Decode batch, #running-req: x",
        '[2026-02-24 12:00:00] INFO:     127.0.0.1:1 - "GET /health HTTP/1.1" 200 OK',
        "[99999-99-99 99:99:99] Load weight begin. avail mem=1.00 GB",
        "ERROR:    Exception in ASGI application",
    ],
)
def test_junk_is_ignored(line: str) -> None:
    assert parse_line(line) is None


# -- 0.5.18 and 0.5.23 lines (format strings: autotune.logparse.formats) ----------------------


@pytest.mark.parametrize(
    ("line", "kind", "values", "label"),
    [
        (
            TP0 + "Capture target prefill CUDA graph begin. backend=breakable, num_tokens=[4, 8, "
            "8192], avail mem=10.05 GB",
            Kind.GRAPH_CAPTURE_BEGIN,
            {"avail_gib": 10.05, "max_tokens": 8192},
            "target prefill",
        ),
        (
            TP0 + "Capture target verify CUDA graph end. bs=[1, 2, 48], elapsed=88.00 s, mem "
            "usage=3.20 GB, avail mem=7.43 GB.",
            Kind.GRAPH_CAPTURE_END,
            {"usage_gib": 3.2, "max_bs": 48, "count": 3},
            "target verify",
        ),
        (
            TP0 + "Capture target decode CPU graph end. bs=[1, 2], elapsed=1.00 s, mem usage=0.00 "
            "GB, avail mem=100.00 GB.",
            Kind.GRAPH_CAPTURE_END,
            {"max_bs": 2},
            "target decode",
        ),
        (
            TP0 + "Capture draft extend CUDA graph end. step=0, elapsed=3.00 s, mem usage=0.10 GB, "
            "avail mem=5.70 GB.",
            Kind.GRAPH_CAPTURE_END,
            {"usage_gib": 0.1},
            "draft extend",
        ),
        (
            TP0 + "Capture draft decode CUDA graph begin. backend=full, num_tokens_per_req=1, "
            "bs=[1, 2, 48], avail mem=6.30 GB",
            Kind.GRAPH_CAPTURE_BEGIN,
            {"max_bs": 48, "tokens_per_req": 1},
            "draft decode",
        ),
        (
            TP0 + "Capture cuda graph bs [1, 2, 4, 8, 160]",
            Kind.GRAPH_BATCH_SIZES,
            {"max_bs": 160, "count": 5},
            "",
        ),
        (
            "Capturing prefill shape (num_tokens=8192 avail_mem=7.50 GB):   0%|",
            Kind.GRAPH_CAPTURING,
            {"num_tokens": 8192, "avail_gib": 7.5},
            "prefill",
        ),
        (
            TP0 + "KV Cache VA upper bound. dtype: torch.bfloat16, #tokens: 900000, K size: 54.98 "
            "GB, V size: 54.98 GB",
            Kind.KV_ALLOCATED,
            {"va_upper_bound": 1, "kv_gib": 109.96, "pool": 0},
            "torch.bfloat16",
        ),
        (
            TP0 + "SWA KV Cache is allocated. dtype: torch.bfloat16, #tokens: 80000, K size: 0.50 "
            "GB, V size: 0.50 GB",
            Kind.KV_ALLOCATED,
            {"pool": 1, "tokens": 80000},
            "torch.bfloat16",
        ),
        (
            TP0
            + "MiniMax MSA-v1 main NVFP4 KV Cache is allocated. dtype: torch.uint8, #tokens: 10,"
            " KV size: 1.00 GB",
            Kind.KV_ALLOCATED,
            {"pool": 2},
            "torch.uint8",
        ),
        (
            TP0 + "Mamba Cache is allocated. max_mamba_cache_size: 512, conv_state size: 0.25GB, "
            "ssm_state size: 1.50GB ",
            Kind.MAMBA_ALLOCATED,
            {"gib": 1.75, "slots": 512},
            "",
        ),
        (
            TP0 + "Post-capture KV sizing: KV cache allocated. dtype: torch.bfloat16, #tokens: "
            "867614, KV size: 105.91 GB, avail mem=14.39 GB",
            Kind.POST_CAPTURE,
            {"tokens": 867614, "kv_gib": 105.91, "avail_gib": 14.39},
            "kv",
        ),
        (
            TP0 + "Load weight end. Committed real weights after CUDA graph capture in 12.50 s "
            "(capture overlap window 30.00 s, startup overlap total 480.00 s)",
            Kind.WEIGHT_COMMIT,
            {"elapsed_s": 12.5},
            "",
        ),
        (
            TP0 + "Memory baseline taken. mem usage=1.55 GB",
            Kind.MEMORY_BASELINE,
            {"usage_gib": 1.55},
            "",
        ),
        (
            MAIN + "Engine startup timings (s): load_weight=312.40, kv_cache_allocation=1.20, "
            "scheduler_e2e=400.10, cuda_graph={prefill=30.00, decode=45.00}, tokenizer_e2e=405.00",
            Kind.STARTUP_TIMINGS,
            {"load_weight": 312.4, "cuda_graph.decode": 45.0, "tokenizer_e2e": 405.0},
            "",
        ),
        (
            TP0 + "Allocating draft hierarchical KV host pool: 288833 tokens, 0.59 GB host memory.",
            Kind.HOST_CACHE,
            {"tokens": 288833, "gb": 0.59},
            "draft",
        ),
        (
            TP0 + "Allocating kv hierarchical KV host pool: 10 tokens, 1.00 GB host memory, packed "
            "MTP KV layers: target_layers=61, draft_layers=1, total_layers=62.",
            Kind.HOST_CACHE,
            {"tokens": 10, "gb": 1.0},
            "kv",
        ),
        (
            TP0 + "Allocating 1.20 GB host memory for hierarchical Mamba cache (64 state slots, "
            "layout=layer_first).",
            Kind.HOST_CACHE,
            {"gb": 1.2},
            "other",
        ),
        (
            TP0 + "HiCache host KV pool (100 tokens) is smaller than the device pool (200 tokens);"
            "L2 cache effectiveness is reduced.",
            Kind.HICACHE_SMALLER,
            {"tokens": 100},
            "",
        ),
        (
            TP0 + "HiCache auto-sizing: ratio 2.000 -> 1.500; 716.0 GiB host memory per rank "
            "(fraction 0.80, 8 ranks on this host), host pools 19.5 GiB.",
            Kind.HICACHE_AUTOSIZE,
            {"ratio": 1.5, "per_rank_gib": 716.0, "ranks": 8},
            "",
        ),
        (
            "ValueError: Not enough host memory for V4 paged pool c4. Requesting 12.00 GB but only "
            "have 3.50 GB free.",
            Kind.HOST_MEMORY,
            {"requested_gb": 12.0, "free_gb": 3.5},
            "",
        ),
        (
            MAIN + "Subprocess detokenizer (pid=77) crashed with exit code 1. Triggering SIGQUIT "
            "for cleanup...",
            Kind.SUBPROCESS_CRASHED,
            {"code": 1, "pid": 77},
            "detokenizer",
        ),
        (
            TP0 + "DetokenizerManager watchdog timeout (self.watchdog_timeout=300.0, "
            "self.soft=False)",
            Kind.WATCHDOG_TIMEOUT,
            {},
            "",
        ),
        (MAIN + "Initialization failed. Please see the error messages above.", Kind.ERROR, {}, ""),
        (
            '  File "/x/sglang/srt/managers/scheduler.py", line 2109, in event_loop_overlap',
            Kind.SERVING_FRAME,
            {},
            "event_loop_overlap",
        ),
        ('  File "/x/sglang/srt/managers/scheduler.py", line 568, in __init__', None, {}, ""),
        ("Successfully installed sglang-0.5.21", Kind.VERSION, {}, "0.5.21"),
        (MAIN + "sglang version: 0.5.23", Kind.VERSION, {}, "0.5.23"),
    ],
)
def test_0_5_23_event_lines(
    line: str, kind: Kind | None, values: dict[str, float], label: str
) -> None:
    test_event_lines(line, kind, values, label)


@pytest.mark.parametrize(
    ("line", "fields"),
    [
        (
            TP0
            + "Prefill batch [12], #new-seq: 8, #new-token: 8192, #cached-token: 0, token usage: "
            "0.31, #running-req: 44, #queue-req: 12, #pending-token: 61000, #replay-token: 128, "
            "cuda graph: False, input throughput (token/s): 19000.25",
            dict(pending_tokens=61000, running=44, input_throughput=19000.25, cuda_graph=False),
        ),
        (
            TP0 + "Prefill batch, #new-seq: 1, #new-token: 7, #cached-token: 0, full token usage: "
            "0.10, swa token usage: 0.20, #running-req: 0, #queue-req: 0, #pending-token: 9, "
            "#bootstrap-req: 0, #inflight-req: 0, #optimistic-req: 0, cuda graph: True, input "
            "throughput (token/s): 1.00, est. prefill TFLOPS/s (per GPU): 3.21",
            dict(pending_tokens=9, token_usage=0.10, cuda_graph=True, input_throughput=1.0),
        ),
        (
            TP0 + "Decode batch, #running-req: 48, #token: 52311, token usage: 0.36, accept len: "
            "2.71, accept rate: 0.57, cap len: 3.00, block accept len: 2.50, cuda graph: True, gen "
            "throughput (token/s): 1520.33, #queue-req: 0",
            dict(accept_len=2.71, accept_rate=0.57, tokens=52311, gen_throughput=1520.33),
        ),
        (
            TP0 + "Decode batch, #running-req: 4, #token: 100, token usage: 0.01, cpu graph: True, "
            "gen throughput (token/s): 9.00, #queue-req: 0",
            dict(cuda_graph=True, running=4),
        ),
        (
            TP0 + "Decode batch, #running-req: 3, #full token: 100, full token usage: 0.20, #swa "
            "token: 50, swa token usage: 0.50, cuda graph: True, gen throughput (token/s): 50.00, "
            "#queue-req: 0",
            dict(tokens=100, token_usage=0.20),
        ),
    ],
)
def test_0_5_23_batch_lines(line: str, fields: dict[str, object]) -> None:
    test_batch_lines(line, fields)


def test_server_args_lines_of_both_shapes() -> None:
    from autotune.logparse.serverargs import read_server_args

    new = MAIN + "server_args={'model_path': '/m', 'mem_fraction_static': 0.88, 'tp_size': 8, "
    new += "'cuda_graph_config': {'decode': {'max_bs': 512}}, 'api_key': 'sk-1'}"
    old = MAIN + "server_args=ServerArgs(model_path='/m', mem_fraction_static=0.88, tp_size=8, "
    old += "lora_paths=SomeObject(1), api_key=None)"
    cut = old[:95]
    assert event(new).label == "dict" and event(old).label == "ServerArgs"
    assert read_server_args(new)["cuda_graph_config"] == {"decode": {"max_bs": 512}}
    got = read_server_args(old)
    assert got["mem_fraction_static"] == 0.88 and "lora_paths" not in got
    assert read_server_args(cut)["mem_fraction_static"] == 0.88


_DECODE_05X = (
    "[2025-12-12 08:43:59 TP0] Decode batch, #running-req: 6, #token: 1920, token usage: 0.94, "
    "cuda graph: True, gen throughput (token/s): 446.45, #queue-req: 5"
)
_HYBRID_05X = (
    "[2025-12-12 08:43:59 TP0] Decode batch, #running-req: 6, #full token: 1920, full token "
    "usage: 0.92, #swa token: 64, swa token usage: 0.09, cuda graph: True, gen throughput "
    "(token/s): 24.33, #queue-req: 5"
)


@pytest.mark.parametrize("line", [_DECODE_05X, _HYBRID_05X])
@pytest.mark.parametrize("end", [", ", ",", ""], ids=["as-printed", "trimmed", "0.5.23"])
def test_a_decode_line_s_trailing_separator_keeps_its_last_field(line: str, end: str) -> None:
    """0.4.x to 0.5.x end the decode line with `#queue-req: {n}, `; a copy with its trailing
    blanks trimmed ends in `5,`. Either way the queue is read, as from 0.5.23's bare `5`."""
    got = batch(line + end)
    assert (got.running, got.queued, got.cuda_graph) == (6, 5, True)
    assert got.gen_throughput in (446.45, 24.33)
    if line is _DECODE_05X:  # the common shape stays on the one-regex path
        assert read_common_batch(line + end, 0) == got


def test_a_negative_profiled_value_keeps_its_sign() -> None:
    got = event(
        "[2025-07-02 07:41:59 DP0 TP0] max_total_tokens=131072 is larger than the profiled "
        "value -561981. Use the profiled value instead."
    )
    assert got.kind is Kind.NO_KV_ROOM  # no pool fits: SGLang raises next
    assert dict(got.values) == {"requested": 131072.0, "profiled": -561981.0}
