"""The `LoadApi` contract, run against every API in `autotune.loadgen.apis.APIS`.

Each registered API builds its request (a prompt of pool ids, and a dataset's literal text),
sends it to the fake SGLang server (`autotune.testing.fakeserver`, answers shaped as SGLang
0.5.23 writes them) and reads the answer, streamed and not, with `ResponseReader`: every token
arrives, TTFT and the gaps are there, the counts are the server's. The registry is the only list
of APIs: the study file keeps the name, and a run refuses a name it does not hold before anything
is launched or written; an API added to the registry is checked here with nothing else to extend.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from autotune.config.workload import LengthDist, workload_from_dict
from autotune.errors import ConfigError
from autotune.loadgen.apis import APIS, LoadApi, RequestOptions, ResponseReader, api_named
from autotune.loadgen.client import Client
from autotune.loadgen.shapes import Prompt, RequestPlan, Shaper, TokenPool
from tests.simstudy import run, sim_study

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


def test_every_registered_api_is_a_name_the_study_file_keeps() -> None:
    for name, api in APIS.items():
        assert api.name == name and api.path.startswith("/")
        assert api_named(name) is api
        assert workload_from_dict({"api": name, "phases": PHASES}).api == name
    assert workload_from_dict({"phases": PHASES}).api == "generate"
    with pytest.raises(ConfigError) as err:
        api_named("grpc")
    assert str(err.value) == "workload.api: unknown API 'grpc'; use one of " + ", ".join(APIS)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("stream", [True, False])
def test_a_body_says_what_was_asked(name: str, stream: bool) -> None:
    api, pool = APIS[name], TokenPool(random.Random(0), size=2048)
    for plan, _ in _plans(pool).values():
        opt = RequestOptions(name, "the-model", stream, True, 0.0)
        body = json.loads(api.body(plan, pool, opt))
        assert isinstance(body, dict) and body["stream"] is stream
        assert ("the-model" in body.values()) == api.names_model
        text = json.dumps(body)
        assert f'"max_new_tokens": {OUTPUT}' in text or f'"max_tokens": {OUTPUT}' in text


@pytest.mark.parametrize("name", NAMES)
def test_every_api_reads_the_fake_servers_answers(fake_server: Start, name: str) -> None:
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
def test_every_api_fails_a_request_on_an_error_or_a_bad_status(name: str) -> None:
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


@pytest.mark.e2e
def test_run_refuses_an_unknown_api_before_it_launches_or_writes(tmp_path: Path) -> None:
    study = tmp_path / "grpc.toml"
    text = sim_study(n_trials=1, duration=0.3).replace("[workload]", '[workload]\napi = "grpc"')
    study.write_text(text)
    done = run(study, "run", timeout=120)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr == (
        "autotune: error: workload.api: unknown API 'grpc'; use one of " + ", ".join(APIS) + "\n"
    )
    assert not (tmp_path / "results").exists()  # no study, no trial, no lock, no simulated GPU
