"""The `LoadApi` contract, run against every API in `autotune.loadgen.apis.APIS`.

Each registered API builds its request (a prompt of pool ids, and a dataset's literal text),
sends it to the fake SGLang server (`autotune.testing.fakeserver`, answers shaped as SGLang
0.5.23 writes them) and reads the answer, streamed and not, with `ResponseReader`: every token
arrives, TTFT and the gaps are there, the counts are the server's. The study file accepts
exactly the registered names, so an API added to the registry is checked here with no further
list to extend.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

from autotune.config.workload import Api, LengthDist, workload_from_dict
from autotune.errors import ConfigError
from autotune.loadgen.apis import APIS, LoadApi, RequestOptions, ResponseReader
from autotune.loadgen.client import Client
from autotune.loadgen.shapes import Prompt, RequestPlan, Shaper, TokenPool

if TYPE_CHECKING:
    from autotune.testing.fakeserver import Running as FakeServer

Start = Callable[..., "FakeServer"]
NAMES = sorted(APIS)
OUTPUT = 6
PHASES = [{"kind": "steady", "concurrency": 1, "duration_s": 1}]


def _plans(pool: TokenPool) -> dict[str, tuple[RequestPlan, int]]:
    """Both kinds of prompt, each with the prompt tokens the fake server counts for it."""
    ids = Shaper(random.Random(0), LengthDist.fixed(40), LengthDist.fixed(OUTPUT)).single()
    text = RequestPlan(Prompt(text="one two three four"), 4, OUTPUT)
    return {"ids": (ids, ids.input_len), "text": (text, 4)}


async def _ask(url: str, api: LoadApi, opt: RequestOptions, body: bytes) -> ResponseReader:
    client = Client(url)
    reader = ResponseReader(api.name, opt.stream, 0.0, OUTPUT)

    def on_send(ts: float) -> None:
        reader.start = ts

    try:
        _, end = await client.send("POST", api.path, body, reader, on_send)
    finally:
        client.close()
    reader.finish(end)
    return reader


def test_the_registry_holds_exactly_the_names_the_study_file_accepts() -> None:
    assert set(APIS) == set(Api)
    for name, api in APIS.items():
        assert api.name is name and api.path.startswith("/")
        spec = workload_from_dict({"api": name.value, "phases": PHASES})
        assert spec.api is name
    with pytest.raises(ConfigError) as err:
        workload_from_dict({"api": "grpc", "phases": PHASES})
    assert str(err.value).startswith("workload.api") and all(a in str(err.value) for a in NAMES)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("stream", [True, False])
def test_a_body_says_what_was_asked(name: Api, stream: bool) -> None:
    api, pool = APIS[name], TokenPool(random.Random(0), size=2048)
    for plan, _ in _plans(pool).values():
        opt = RequestOptions(name, "the-model", stream, True, 0.0)
        body = json.loads(api.body(plan, pool, opt))
        assert isinstance(body, dict) and body["stream"] is stream
        assert ("the-model" in body.values()) == api.names_model
        text = json.dumps(body)
        assert f'"max_new_tokens": {OUTPUT}' in text or f'"max_tokens": {OUTPUT}' in text


@pytest.mark.parametrize("name", NAMES)
def test_every_api_reads_the_fake_servers_answers(fake_server: Start, name: Api) -> None:
    srv = fake_server("--ttft-ms", "2", "--itl-ms", "1")
    api, pool = APIS[name], TokenPool(random.Random(0), size=2048)
    for stream in (True, False):
        opt = RequestOptions(name, "m", stream, True, 0.0)
        for kind, (plan, prompt_tokens) in _plans(pool).items():
            r = asyncio.run(_ask(srv.url, api, opt, api.body(plan, pool, opt)))
            case = f"{name} {kind} stream={stream}"
            assert r.error is None, case
            assert r.ttft is not None and r.ttft > 0, case
            assert r.output_tokens == OUTPUT, case
            assert len(r.itl) == (OUTPUT - 1 if stream else 0), case
            assert r.prompt_tokens == prompt_tokens, case
            assert r.done == stream, case  # a stream ends with `data: [DONE]`


@pytest.mark.parametrize("name", NAMES)
def test_every_api_fails_a_request_on_an_error_or_a_bad_status(name: Api) -> None:
    for status, chunk, error in (
        (200, b'data: {"error": {"message": "bad"}}\n\n', "server error: bad"),
        (200, b"data: [DONE]\n\n", "empty response: no token arrived"),
        (503, b"busy", "HTTP 503: busy"),
    ):
        r = ResponseReader(name, True, 0.0, OUTPUT)
        r.on_headers(status, {})
        r.on_data(0.1, chunk)
        r.finish(0.2)
        assert r.error is not None and r.error.startswith(error), (name, r.error)
