"""The serving summary folded from batch and retraction lines."""

from __future__ import annotations

from pathlib import Path

from autotune.logparse.lines import parse_text
from autotune.logparse.serving import summarize
from autotune.review.ledgerview import as_text, summarize_log

LOGS = Path(__file__).parent.parent / "fixtures" / "logs"


def test_operator_log_summary() -> None:
    log = parse_text((LOGS / "v0_5_9_kimi_tp8_eagle3.log").read_text())
    got = summarize(log.batches, log.events)
    assert (got.prefill_lines, got.decode_lines) == (2, 3)
    assert (got.max_running, got.max_queued, got.max_token_usage) == (48, 104, 0.95)
    assert got.max_gen_throughput == 989.01
    assert got.cuda_graph_share == 1.0
    assert got.mean_accept_len == 2.853
    assert (got.retraction_events, got.retracted_requests) == (1, 2)


def test_pd_retractions_and_no_lines() -> None:
    text = (
        "[2026-02-24 12:00:00 TP0] Decode batch, #running-req: 3, #token: 100, token usage: 0.20,"
        " pre-allocated usage: 0.10, #prealloc-req: 0, #transfer-req: 0, #retracted-req: 2,"
        " cuda graph: False, gen throughput (token/s): 50.00, #queue-req: 0\n"
    )
    log = parse_text(text)
    got = summarize(log.batches, log.events)
    assert got.max_retracted_queue == 2  # a gauge (the retracted queue's length), not a count
    assert got.retraction_events == 0 and got.retracted_requests == 0
    assert got.cuda_graph_share == 0.0 and got.mean_accept_len is None
    empty = summarize((), ())
    assert empty.decode_lines == 0 and empty.max_running is None and empty.retraction_events == 0
    assert empty.max_retracted_queue is None


def test_a_hybrid_pool_s_other_usage_is_read_and_shown() -> None:
    """Qwen3-Next on an NPU (2026-07) prints `full token usage` and `mamba usage`; a DSV4 start
    on 0.5.18 `full token usage` and `swa token usage`. The Mamba slots filled faster than the
    KV pool: the summary keeps both, and the text names them."""
    head = "Prefill batch, #new-seq: 12, #new-token: 43008, #cached-token: 0, "
    tail = ", #pending-token: 109585, npu graph: False, input throughput (token/s): 15734.14\n"
    mamba = parse_text(
        f"[2026-07-04 04:31:24 TP0] {head}full token usage: 0.14, mamba usage: 0.20, "
        f"#running-req: 1, #queue-req: 97{tail}"
        f"[2026-07-04 04:31:36 TP0] {head}full token usage: 0.40, mamba usage: 0.60, "
        f"#running-req: 49, #queue-req: 49{tail}"
    )
    got = summarize(mamba.batches)
    assert (got.max_token_usage, got.max_mamba_usage, got.max_swa_token_usage) == (0.4, 0.6, None)
    assert "full token usage 0.40, mamba usage 0.60" in as_text(*summarize_log(mamba), mamba)
    swa = parse_text(
        f"[2026-08-23 09:09:51 TP0 EP0] {head}full token usage: 0.02, swa token usage: 0.01, "
        f"#running-req: 0, #queue-req: 1{tail}"
    )
    got = summarize(swa.batches)
    assert (got.max_token_usage, got.max_swa_token_usage, got.max_mamba_usage) == (0.02, 0.01, None)
