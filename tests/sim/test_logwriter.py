"""Log lines match the SGLang 0.5.9 formats of reference §4 (as a parser would read them)."""

from __future__ import annotations

import datetime as dt
import io
import re

from autotune.sim.loglines import (
    DecodeBatch,
    KvAllocation,
    PrefillBatch,
    fmt_capture_end,
    fmt_decode,
    fmt_kv_allocated,
    fmt_load_end,
    fmt_oom_error,
    fmt_prefill,
    fmt_summary,
)
from autotune.sim.logwriter import LogWriter

FIXED = dt.datetime(2026, 2, 24, 11, 57, 16)


def test_prefixes_per_rank_and_main() -> None:
    out = io.StringIO()
    w = LogWriter(8, stream=out, access_stream=out, clock=lambda: FIXED)
    w.rank(3, "x")
    w.main("y")
    w.uvicorn("Started server process [1]")
    w.access("127.0.0.1:5", "GET", "/health", 200)
    assert out.getvalue().splitlines() == [
        "[2026-02-24 11:57:16 TP3] x",
        "[2026-02-24 11:57:16] y",
        "[2026-02-24 11:57:16] INFO:     Started server process [1]",
        '[2026-02-24 11:57:16] INFO:     127.0.0.1:5 - "GET /health HTTP/1.1" 200',
    ]
    single = io.StringIO()
    LogWriter(1, stream=single, clock=lambda: FIXED).rank(0, "z")
    assert single.getvalue() == "[2026-02-24 11:57:16] z\n"


def test_startup_strings() -> None:
    assert fmt_load_end(420, "DeepseekV3ForCausalLM", "torch.bfloat16", 21.71, 72.33) == (
        "Load weight end. elapsed=420.00 s, type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, "
        "avail mem=21.71 GB, mem usage=72.33 GB."
    )
    assert fmt_kv_allocated(KvAllocation(159277, 10.424)) == (
        "KV Cache is allocated. #tokens: 159277, KV size: 10.42 GB"
    )
    assert fmt_kv_allocated(KvAllocation(10, None, 0.04, 0.04)).endswith(
        "K size: 0.04 GB, V size: 0.04 GB"
    )
    assert fmt_capture_end(95, 3.75, 5.47) == (
        "Capture cuda graph end. Time elapsed: 95.00 s. mem usage=3.75 GB. avail mem=5.47 GB."
    )
    summary = fmt_summary(159277, 8192, 16384, 48, 131072, 5.47)
    assert re.fullmatch(
        r"max_total_num_tokens=(\d+), chunked_prefill_size=(-?\d+), max_prefill_tokens=(\d+), "
        r"max_running_requests=(\d+), context_len=(\d+), available_gpu_mem=([\d.]+) GB",
        summary,
    )


def test_serving_strings() -> None:
    prefill = fmt_prefill(PrefillBatch(2, 8192, 64, 0.5, 46, 100, 1234.5))
    assert re.fullmatch(
        r"Prefill batch, #new-seq: \d+, #new-token: \d+, #cached-token: \d+, token usage: "
        r"[\d.]+, #running-req: \d+, #queue-req: \d+, input throughput \(token/s\): [\d.]+, "
        r"cuda graph: (True|False)",
        prefill,
    )
    decode = fmt_decode(DecodeBatch(48, 90000, 0.57, True, 981.23, 102, accept=(2.5, 0.5)))
    assert decode == (
        "Decode batch, #running-req: 48, #token: 90000, token usage: 0.57, accept len: 2.50, "
        "accept rate: 0.50, cuda graph: True, gen throughput (token/s): 981.23, #queue-req: 102"
    )
    assert "accept len" not in fmt_decode(DecodeBatch(1, 1, 0.0, False, 1.0, 0))
    oom = fmt_oom_error(2.0, 95.59, 0.5, 95.0, 3.7)
    assert oom.startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.")
