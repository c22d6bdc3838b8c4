"""Whose fault a workload's failed requests are (`trial.judge.refusal`): the server's own
answers to most requests make the trial `refused`, not a parameter result; load's failures
(timeouts, overload statuses) and a minority of refusals stay the parameters' figures, named in
the evidence (`request_errors`)."""

from __future__ import annotations

from autotune.loadgen.metrics import RequestRecord, Summary, summarize
from autotune.trial.judge import refusal, request_errors


def _summary(*errors: str | None) -> Summary:
    records = [
        RequestRecord(
            phase="steady-0",
            index=i,
            scheduled_s=0.0,
            sent_s=0.0,
            end_s=1.0,
            ttft=None if e else 0.1,
            itl=() if e else (0.1,),
            e2e=None if e else 1.0,
            input_tokens=8,
            output_tokens=0 if e else 2,
            error=e,
        )
        for i, e in enumerate(errors)
    ]
    return summarize(records, 1.0)


NOT_FOUND = 'HTTP 404: {"detail": "Not Found"}'
BROKEN = "HTTP 500: Internal Server Error"


def test_most_requests_refused_is_a_refusal_named_by_its_commonest_kind() -> None:
    got = refusal(_summary(NOT_FOUND, NOT_FOUND, NOT_FOUND, BROKEN, None))
    assert got == (
        "http_404",
        (
            f"3 of 5 requests failed: {NOT_FOUND}",
            f"1 of 5 requests failed: {BROKEN}",
        ),
    )


def test_half_or_fewer_refused_stays_the_parameters_result() -> None:
    assert refusal(_summary(BROKEN, BROKEN, None, None)) is None
    assert request_errors(_summary(BROKEN, BROKEN, None, None)) == (
        f"2 of 4 requests failed: {BROKEN}",
    )


def test_load_s_failures_are_never_a_refusal() -> None:
    """Timeouts and overload answers (503 while draining, 429) come from the load the
    parameters set: a server with too few slots times requests out."""
    timeout = "timeout: no complete response within 30 s"
    busy = "HTTP 503: The request queue is full."
    s = _summary(timeout, timeout, busy, busy, None)
    assert refusal(s) is None
    assert request_errors(s) == (
        f"2 of 5 requests failed: {timeout}",
        f"2 of 5 requests failed: {busy}",
    )


def test_no_requests_no_refusal() -> None:
    assert refusal(_summary()) is None
    assert request_errors(_summary(None, None)) == ()


def test_prompts_refused_by_a_pool_smaller_than_the_context_are_the_parameters() -> None:
    """SGLang refuses a prompt of min(context, pool) − 6 tokens or more: with the KV pool the
    smaller, a too-long answer (400, a stream's error object, an abort) is the memory setting's
    doing, a parameter result; other refusals still count."""
    too_long = "HTTP 400: Input length (9000 tokens) exceeds the maximum allowed length"
    s = _summary(too_long, too_long, too_long, None)
    assert refusal(s) is not None
    assert refusal(s, pool_limits_input=True) is None
    assert refusal(_summary(BROKEN, BROKEN, None), pool_limits_input=True) is not None
