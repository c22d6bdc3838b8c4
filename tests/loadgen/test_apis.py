"""Request bodies and response reading, chunk by chunk, as bench_serving reads them."""

from __future__ import annotations

import json
import random

import pytest

from autotune.config.workload import LengthDist
from autotune.loadgen.apis import APIS, RequestOptions, ResponseReader, build_body
from autotune.loadgen.shapes import Shaper, TokenPool


def sse(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def native(text: str, tokens: int, finish: object = None) -> bytes:
    meta = {"prompt_tokens": 9, "completion_tokens": tokens, "finish_reason": finish}
    return sse({"text": text, "meta_info": meta})


def test_native_stream_splits_gaps_over_new_tokens() -> None:
    r = ResponseReader("generate", True, 0.5, 99)
    r.on_headers(200, {})
    r.on_data(0.8, native("", 0))  # empty text: not the first token
    r.on_data(1.0, native("a", 1))
    r.on_data(1.3, native("abcd", 4)[:10])  # split across reads
    r.on_data(1.31, native("abcd", 4)[10:])
    r.on_data(1.4, native("abcd", 4))  # no new tokens: skipped
    r.on_data(1.5, native("abcde", 5) + b"data: [DONE]\n\n")
    r.finish(1.5)
    assert r.error is None and r.done
    assert r.ttft == pytest.approx(0.5)
    assert r.itl == pytest.approx([0.31 / 3] * 3 + [0.19])  # gaps from 1.0, 1.31, 1.5
    assert (r.output_tokens, r.prompt_tokens) == (5, 9)


def test_openai_stream_one_gap_per_chunk_and_usage_for_counts() -> None:
    r = ResponseReader("completions", True, 0.0, 99)
    r.on_headers(200, {})
    for ts in (0.1, 0.2, 0.4):
        r.on_data(ts, sse({"choices": [{"text": "x", "finish_reason": None}]}))
    r.on_data(0.5, sse({"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 3}}))
    r.finish(0.5)
    assert r.ttft == pytest.approx(0.1)
    assert r.itl == pytest.approx([0.1, 0.2])
    assert (r.output_tokens, r.prompt_tokens, r.error) == (3, 4, None)
    chat = ResponseReader("chat", True, 0.0, 7)
    chat.on_headers(200, {})
    chat.on_data(0.1, sse({"choices": [{"delta": {"role": "assistant"}}]}))
    chat.on_data(0.3, sse({"choices": [{"delta": {"content": "hi"}}]}))
    chat.finish(0.3)
    assert chat.ttft == pytest.approx(0.3)
    assert chat.output_tokens == 7  # no usage: the requested count, as bench_serving does


def test_non_streamed_answer_is_one_chunk() -> None:
    r = ResponseReader("generate", False, 1.0, 3)
    r.on_headers(200, {})
    r.on_data(1.2, json.dumps({"text": "abc", "meta_info": {"completion_tokens": 3}}).encode())
    r.finish(1.25)
    assert r.ttft == pytest.approx(0.25) and r.itl == [] and r.output_tokens == 3


@pytest.mark.parametrize(
    ("status", "chunks", "error"),
    [
        (401, [b'{"error": "Unauthorized"}'], 'HTTP 401: {"error": "Unauthorized"}'),
        (200, [native("a", 1, {"type": "abort", "message": "too long"})], "aborted: too long"),
        (200, [sse({"error": {"message": "bad"}})], "server error: bad"),
        (200, [b"data: [DONE]\n\n"], "empty response: no token arrived"),
        (200, [b"data: {oops\n\n", native("a", 1)], "bad stream chunk"),
    ],
)
def test_failures_become_errors(status: int, chunks: list[bytes], error: str) -> None:
    r = ResponseReader("generate", True, 0.0, 1)
    r.on_headers(status, {})
    for c in chunks:
        r.on_data(0.1, c)
    r.finish(0.2)
    assert r.error is not None and r.error.startswith(error)


@pytest.mark.parametrize("api", sorted(APIS))
def test_bodies_are_valid_json_with_exact_ids(api: str) -> None:
    pool = TokenPool(random.Random(0), size=2048)
    plan = Shaper(
        random.Random(0), LengthDist.fixed(5000), LengthDist.fixed(9), pool_size=2048
    ).single()
    body = json.loads(build_body(plan, pool, RequestOptions(api, "m", True, True, 0.0)))
    assert body["stream"] is True
    if api == "generate":
        assert body["input_ids"] == pool.token_ids(plan.prompt)
        assert body["sampling_params"] == {
            "max_new_tokens": 9,
            "temperature": 0.0,
            "ignore_eos": True,
        }
    else:
        assert body["model"] == "m" and body["max_tokens"] == 9 and body["ignore_eos"] is True
        assert body["stream_options"] == {"include_usage": True}
    if api == "completions":
        assert body["prompt"] == pool.token_ids(plan.prompt)
    if api == "chat":
        assert len(body["messages"][0]["content"].split(" ")) == 5000


def test_large_event_spread_over_many_reads() -> None:
    r = ResponseReader("completions", True, 0.0, 1)
    r.on_headers(200, {})
    big = sse({"choices": [{"text": "x" * 300_000}]}) + sse({"choices": [{"text": "y"}]})
    for i in range(0, len(big), 1000):
        r.on_data(i / 1e6, big[i : i + 1000])
    r.finish(1.0)
    assert r.error is None and len(r.itl) == 1
