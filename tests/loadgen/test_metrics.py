"""Metrics against hand-computed cases (bench_serving's definitions, reference §6)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from autotune.loadgen.metrics import RequestRecord, Slo, Stats, refused, summarize, tpot_of


def rec(
    sent: float,
    ttft: float | None,
    itl: tuple[float, ...],
    e2e: float | None,
    inp: int,
    out: int,
    error: str | None = None,
    scheduled: float | None = None,
    end: float | None = None,
) -> RequestRecord:
    return RequestRecord(
        phase="p",
        index=0,
        scheduled_s=sent if scheduled is None else scheduled,
        sent_s=sent,
        end_s=end if end is not None else (sent + e2e if e2e is not None else sent),
        ttft=ttft,
        itl=itl,
        e2e=e2e,
        input_tokens=inp,
        output_tokens=out,
        error=error,
    )


# r1: 3 tokens at 0.1, 0.15, 0.2; r2: 2 tokens at 0.4, 0.5; r3 failed.
R1 = rec(0.0, 0.1, (0.05, 0.05), 0.2, 10, 3)
R2 = rec(0.1, 0.3, (0.1,), 0.4, 20, 2, scheduled=0.05)
R3 = rec(0.2, None, (), None, 30, 0, error="HTTP 500: boom", end=0.3)


def test_throughputs_count_only_successes() -> None:
    s = summarize([R1, R2, R3], 1.0)
    assert (s.requests, s.completed, s.failed) == (3, 2, 1)
    assert s.error_rate == pytest.approx(1 / 3)
    assert s.errors == {"HTTP 500": 1}
    assert (s.total_input_tokens, s.total_output_tokens) == (30, 5)
    assert s.request_throughput == pytest.approx(2.0)
    assert s.input_throughput == pytest.approx(30.0)
    assert s.output_throughput == pytest.approx(5.0)
    assert s.total_throughput == pytest.approx(35.0)


def test_latency_stats_hand_computed() -> None:
    s = summarize([R1, R2, R3], 2.0)
    assert s.ttft_ms is not None and s.tpot_ms is not None
    assert s.itl_ms is not None and s.e2e_ms is not None
    assert (s.ttft_ms.mean, s.ttft_ms.p50) == pytest.approx((200.0, 200.0))
    assert s.ttft_ms.p90 == pytest.approx(280.0)  # 100 + 0.9 * (300 - 100), numpy linear
    assert s.ttft_ms.p99 == pytest.approx(298.0)
    # TPOT = (e2e - ttft) / (out - 1): r1 (0.2-0.1)/2 = 50 ms, r2 (0.4-0.3)/1 = 100 ms
    assert s.tpot_ms.mean == pytest.approx(75.0)
    # ITL = every gap: 50, 50, 100 ms
    assert s.itl_ms.count == 3
    assert s.itl_ms.mean == pytest.approx(200 / 3)
    assert s.itl_ms.p50 == pytest.approx(50.0)
    assert s.itl_ms.p90 == pytest.approx(90.0)  # index 1.8 between 50 and 100
    assert s.itl_ms.max == pytest.approx(100.0)
    assert s.e2e_ms.mean == pytest.approx(300.0)
    assert s.concurrency == pytest.approx(0.6 / 2.0)  # sum of e2e / duration


def test_stats_match_numpy_on_random_data() -> None:
    rng = np.random.default_rng(7)
    xs = list(rng.lognormal(0, 1, 1001))
    st = Stats.of_seconds(xs)
    assert st is not None
    a = np.asarray(xs) * 1000
    assert st.mean == pytest.approx(float(np.mean(a)))
    assert st.p50 == pytest.approx(float(np.median(a)))
    assert st.p90 == pytest.approx(float(np.percentile(a, 90)))
    assert st.p99 == pytest.approx(float(np.percentile(a, 99)))


def test_tpot_undefined_for_single_token_outputs() -> None:
    one = rec(0.0, 0.1, (), 0.1, 5, 1)
    assert tpot_of(one) is None
    assert summarize([one], 1.0).tpot_ms is None


def test_peak_concurrency_and_peak_token_rate() -> None:
    s = summarize([R1, R2, R3], 1.0)
    # [0, .2], [.1, .5], [.2, .3]: an end at .2 sorts before the start at .2
    assert s.peak_concurrency == 2
    assert s.max_output_tokens_per_s == 5
    spread = rec(0.5, 0.4, (0.2, 0.2), 0.8, 1, 3)  # tokens at 0.9, 1.1, 1.3
    assert summarize([spread], 2.0).max_output_tokens_per_s == 2


def test_goodput_requires_every_slo() -> None:
    s = summarize([R1, R2, R3], 1.0, Slo(ttft_ms=200))
    assert s.goodput == pytest.approx(1.0)
    assert s.good_fraction == pytest.approx(1 / 3)
    s = summarize([R1, R2, R3], 1.0, Slo(ttft_ms=1000, tpot_ms=60))
    assert s.goodput == pytest.approx(1.0)  # r2's TPOT is 100 ms
    s = summarize([R1, R2, R3], 1.0, Slo(e2e_ms=1000))
    assert s.goodput == pytest.approx(2.0)
    assert summarize([R1], 1.0).goodput is None


def test_client_lag_flags_coordinated_omission() -> None:
    s = summarize([R1, R2, R3], 1.0)
    assert s.lag_ms is not None
    assert s.lag_ms.max == pytest.approx(50.0)
    assert s.lagged_fraction == pytest.approx(1 / 3)
    assert s.coordinated_omission  # p99 lag 49 ms > 25 ms
    on_time = summarize([R1, R3], 1.0)
    assert not on_time.coordinated_omission
    assert summarize([R1], 1.0, capped_arrivals=1).coordinated_omission


def test_empty_gives_none_not_zero_and_is_json_safe() -> None:
    s = summarize([], 0.0)
    assert s.ttft_ms is None and s.error_rate is None and s.lag_ms is None
    json.dumps(s.to_dict(), allow_nan=False)
    json.dumps(summarize([R1, R2, R3], 1.0, Slo(ttft_ms=1)).to_dict(), allow_nan=False)


def test_requests_cut_mid_stream_are_unfinished_not_failed() -> None:
    cut = rec(
        0.05, 0.05, (0.01,), None, 7, 2, error="unfinished: phase p reached its 1 s limit", end=0.6
    )
    s = summarize([R1, R2, R3, cut], 1.0)
    assert (s.requests, s.failed, s.unfinished) == (3, 1, 1)
    assert s.error_rate == pytest.approx(1 / 3)
    assert s.errors == {"HTTP 500": 1}
    assert s.peak_concurrency == 3  # it was in flight all the same


@pytest.mark.parametrize(
    ("error", "is_refused"),
    [
        ('HTTP 500: {"error": {"message": "Internal Server Error"}}', True),
        ("HTTP 404: model not found", True),
        ("HTTP 400: The input (9000 tokens) is longer than the model's context length", True),
        ("server error: Requested token count exceeds the model's maximum context length", True),
        ("aborted: Out of memory even after retracting all other requests", True),
        ("empty response: no token arrived", True),
        ("bad stream chunk: b'garbage'", True),
        ("HTTP 503: The server is shutting down.", False),
        ("HTTP 429: too many requests", False),
        ("HTTP 408: request timeout", False),
        ("timeout: no complete response within 30 s", False),
        ("connection: [Errno 111] Connection refused", False),
        ("cancelled: phase ended", False),
    ],
)
def test_refused_is_the_server_s_own_answer_not_load(error: str, is_refused: bool) -> None:
    assert refused(error) is is_refused


def test_each_error_kind_keeps_its_first_message() -> None:
    late = rec(0.3, None, (), None, 30, 0, error="HTTP 500: later", end=0.4)
    slow = rec(0.4, None, (), None, 30, 0, error="timeout: no complete response", end=0.5)
    s = summarize([R1, R3, late, slow], 1.0)
    assert s.errors == {"HTTP 500": 2, "timeout": 1}
    assert s.error_examples == {
        "HTTP 500": "HTTP 500: boom",
        "timeout": "timeout: no complete response",
    }
