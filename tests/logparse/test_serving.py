"""The serving summary folded from batch and retraction lines."""

from __future__ import annotations

from pathlib import Path

from autotune.logparse.lines import parse_text
from autotune.logparse.serving import summarize

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
