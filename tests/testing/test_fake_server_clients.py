"""The fake server streams as SGLang 0.5.23 does, checked with real clients' own parsers.

- the `openai` Python client streams chat and completions from it, with and without
  `stream_options.include_usage`, and sees SGLang's chunk fields (`object`, `id`, `created`,
  `model`, the finish reason, usage only when asked);
- each chunk has exactly the keys SGLang's own models dump (`CompletionStreamResponse`,
  `sse_utils.build_sse_content`, `ChatCompletionStreamResponse`, `UsageProcessor`), built in
  the SGLang venv;
- bench_serving's own request functions (`async_request_sglang_generate`,
  `async_request_openai_completions`, `async_request_openai_chat_completions`, run unchanged
  by scripts/bench_serving_client.py in the SGLang venv) read every token from it.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest

from autotune.testing.fakeserver import Running

Start = Callable[..., Running]
ROOT = Path(__file__).resolve().parents[2]
N = 5


def _client(srv: Running) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0, timeout=30)


@pytest.mark.parametrize("usage", [False, True])
def test_openai_client_streams_chat(fake_server: Start, usage: bool) -> None:
    srv = fake_server()
    with _client(srv) as client:
        chunks = list(
            client.chat.completions.create(
                model="my-model",
                messages=[{"role": "user", "content": "one two three"}],
                max_tokens=N,
                stream=True,
                stream_options={"include_usage": True} if usage else openai.omit,
            )
        )
    assert {c.object for c in chunks} == {"chat.completion.chunk"}
    assert len({c.id for c in chunks}) == 1 and all(c.model == "my-model" for c in chunks)
    assert all(c.created > 1_600_000_000 for c in chunks)
    with_choice = [c for c in chunks if c.choices]
    assert with_choice[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in with_choice) == "w" * N
    assert [c.choices[0].finish_reason for c in with_choice][-1] == "length"
    usage_chunks = [c for c in chunks if c.usage is not None]
    if usage:
        assert usage_chunks == [chunks[-1]] and not chunks[-1].choices
        assert chunks[-1].usage is not None
        assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (3, N)
    else:
        assert usage_chunks == [] and len(chunks) == N + 2  # role, N tokens, finish


@pytest.mark.parametrize("usage", [False, True])
def test_openai_client_streams_completions(fake_server: Start, usage: bool) -> None:
    srv = fake_server()
    with _client(srv) as client:
        chunks = list(
            client.completions.create(
                model="m",
                prompt=[11, 12, 13, 14],
                max_tokens=N,
                stream=True,
                stream_options={"include_usage": True} if usage else openai.omit,
            )
        )
    assert {c.object for c in chunks} == {"text_completion"}
    texts = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].text for c in texts) == "w" * N
    assert [c.choices[0].finish_reason for c in texts] == [None] * (N - 1) + ["length"]
    if usage:
        assert [c.usage is not None for c in chunks] == [False] * N + [True]
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == N
        assert chunks[-1].usage.prompt_tokens == 4
    else:
        assert len(chunks) == N and all(c.usage is None for c in chunks)


def test_continuous_usage_stats_put_usage_on_every_chunk(fake_server: Start) -> None:
    srv = fake_server()
    with _client(srv) as client:
        chunks = list(
            client.completions.create(
                model="m",
                prompt="a b",
                max_tokens=N,
                stream=True,
                stream_options={"include_usage": False},
                extra_body={"stream_options": {"continuous_usage_stats": True}},
            )
        )
    assert [c.usage.completion_tokens if c.usage else None for c in chunks] == list(range(1, N + 1))


def test_openai_client_reads_whole_answers(fake_server: Start) -> None:
    srv = fake_server()
    with _client(srv) as client:
        chat = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], max_tokens=N
        )
        comp = client.completions.create(model="m", prompt="x", max_tokens=N)
    assert chat.object == "chat.completion" and chat.choices[0].message.content == "w" * N
    assert comp.object == "text_completion" and comp.choices[0].text == "w" * N
    assert chat.usage is not None and chat.usage.completion_tokens == N


def _events(srv: Running, path: str, body: dict[str, object]) -> list[object]:
    req = urllib.request.Request(srv.url + path, json.dumps(body).encode())
    with urllib.request.urlopen(req, timeout=30) as resp:
        raw = resp.read().decode()
    out: list[object] = []
    for line in raw.split("\n\n"):
        if line.startswith("data: "):
            out.append("[DONE]" if line == "data: [DONE]" else json.loads(line[6:]))
    return out


def _shape(value: object) -> object:
    """Keys in order and leaf types: what a client's parser depends on."""
    if isinstance(value, dict):
        return [(k, _shape(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [_shape(v) for v in value]
    return type(value).__name__


REFERENCE = """
import json, sys
from sglang.srt.entrypoints.openai.protocol import (
    ChatCompletionStreamResponse, CompletionResponseStreamChoice, CompletionStreamResponse)
from sglang.srt.entrypoints.openai.sse_utils import build_sse_content
from sglang.srt.entrypoints.openai.usage_processor import UsageProcessor

def usage(n):
    return UsageProcessor.calculate_streaming_usage(
        {0: 3}, {0: 0}, {0: n}, cached_tokens={0: 0}, n_choices=1, enable_cache_report=False)

def completion(text, finish, continuous):
    chunk = CompletionStreamResponse(
        id="i", created=1, object="text_completion", model="m",
        choices=[CompletionResponseStreamChoice(index=0, text=text, finish_reason=finish)])
    if continuous:
        chunk.usage = UsageProcessor.calculate_token_usage(prompt_tokens=3, completion_tokens=1)
    return json.loads(chunk.model_dump_json())

def sse(s):
    return json.loads(s[len("data: "):])

out = {
    "completions": [completion("w", None, False), completion("w", "length", False),
        json.loads(CompletionStreamResponse(id="i", created=1, choices=[], model="m",
            usage=usage(2)).model_dump_json(exclude_none=True)), "[DONE]"],
    "completions_continuous": [completion("w", None, True), completion("w", "length", True),
        "[DONE]"],
    "chat": [
        sse(build_sse_content(chunk_id="i", created=1, model="m", index=0, role="assistant",
            content="")),
        sse(build_sse_content(chunk_id="i", created=1, model="m", index=0, content="w")),
        sse(build_sse_content(chunk_id="i", created=1, model="m", index=0, content="w")),
        sse(build_sse_content(chunk_id="i", created=1, model="m", index=0,
            finish_reason="length")),
        json.loads(ChatCompletionStreamResponse(id="i", created=1, choices=[], model="m",
            usage=usage(2)).model_dump_json()),
        "[DONE]"],
}
json.dump(out, sys.stdout)
"""


def _last_json(sglang_python: Path, *args: str) -> Any:
    """The JSON on the last line SGLang's Python prints, run on `args` from `/`."""
    done = subprocess.run(
        [str(sglang_python), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.sglang
def test_chunks_have_the_fields_sglang_dumps(fake_server: Start, sglang_python: Path) -> None:
    want = _last_json(sglang_python, "-c", REFERENCE)
    srv = fake_server()
    usage = {"stream_options": {"include_usage": True}}
    base = {"model": "m", "max_tokens": 2, "stream": True}
    got = {
        "completions": _events(srv, "/v1/completions", {**base, "prompt": "a b c", **usage}),
        "completions_continuous": _events(
            srv,
            "/v1/completions",
            {**base, "prompt": "a b c", "stream_options": {"continuous_usage_stats": True}},
        ),
        "chat": _events(
            srv,
            "/v1/chat/completions",
            {**base, "messages": [{"role": "user", "content": "a b c"}], **usage},
        ),
    }
    for name in want:
        assert [_shape(e) for e in got[name]] == [_shape(e) for e in want[name]], name


def _bench_serving(
    sglang_python: Path, srv: Running, api: str, n: int, extra: dict[str, object]
) -> list[dict[str, object]]:
    out = _last_json(
        sglang_python,
        str(ROOT / "scripts" / "bench_serving_client.py"),
        "--url",
        srv.url,
        "--api",
        api,
        "--requests",
        "6",
        "--concurrency",
        "3",
        "--input-len",
        "7",
        "--output-len",
        str(n),
        "--extra",
        json.dumps(extra),
        "--keep-text",
    )
    requests: list[dict[str, object]] = out["requests"]
    return requests


@pytest.mark.sglang
@pytest.mark.parametrize(
    ("api", "extra"),
    [
        ("generate", {}),
        ("completions", {}),
        ("chat", {}),
        ("chat", {"stream_options": {"include_usage": True}}),
    ],
)
def test_bench_serving_reads_every_token(
    fake_server: Start, sglang_python: Path, api: str, extra: dict[str, object]
) -> None:
    srv = fake_server("--itl-ms", "1")
    n = 9
    for r in _bench_serving(sglang_python, srv, api, n, extra):
        assert r["success"] is True, r["error"]
        assert r["generated_text"] == "w" * n
        assert (r["itl_count"], r["output_len"]) == (n - 1, n)
        assert isinstance(r["ttft"], float) and r["ttft"] > 0
        # the server's own prompt count ("w " * 7 is 8 words to it) reaches bench_serving
        # only in the usage chunk; without one it keeps the length it was given
        assert r["prompt_len"] == (8 if api == "chat" and extra else 7)


@pytest.mark.sglang
def test_bench_serving_completions_meets_sglang_usage_chunk(
    fake_server: Start, sglang_python: Path
) -> None:
    """bench_serving's completions reader indexes `choices[0]` of every chunk, so the usage
    chunk (`choices: []`) SGLang sends for `include_usage` fails it: the fake must not send one
    unasked (it did, and every completions run of bench_serving failed against it)."""
    srv = fake_server()
    asked = _bench_serving(
        sglang_python, srv, "completions", 3, {"stream_options": {"include_usage": True}}
    )
    assert all(r["success"] is False and "IndexError" in str(r["error"]) for r in asked)
    plain = _bench_serving(sglang_python, srv, "completions", 3, {})
    assert all(r["success"] is True for r in plain)
