"""End to end: launch the simulator, wait for the ready line, talk to it over real HTTP."""

from __future__ import annotations

import concurrent.futures
import json
import re

import openai
import pytest

from autotune.sim.gpustate import read_gpu_state
from tests.sim.conftest import SMALL, Launcher
from tests.sim.http import get_json, request, sse_events

pytestmark = pytest.mark.e2e


def test_startup_log_then_streaming_generate(launch_sim: Launcher) -> None:
    sim = launch_sim([*SMALL, "--decode-log-interval", "5", "--enable-metrics"])
    sim.wait_ready()
    log = sim.log()
    for line in (
        "] Init torch distributed ends. elapsed=5.00 s, mem usage=0.55 GB",
        "] Load weight begin. avail mem=139.85 GB",
        "Load weight end. elapsed=40.00 s, type=Qwen3ForCausalLM, dtype=torch.bfloat16",
        "KV Cache is allocated. #tokens: ",
        "INFO:     Uvicorn running on http://127.0.0.1:",
    ):
        assert line in log
    assert " TP0]" not in log  # tp=1: no rank tag
    assert re.search(r"max_total_num_tokens=\d+, chunked_prefill_size=8192, ", log)
    body = {"text": "hello world", "sampling_params": {"max_new_tokens": 20}, "stream": True}
    events = sse_events(f"{sim.base}/generate", body)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    counts = [c["meta_info"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 20
    assert all(chunks[i]["text"].startswith(chunks[i - 1]["text"]) for i in range(1, len(chunks)))
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert chunks[0]["meta_info"]["prompt_tokens"] == 2
    assert sim.wait_for("Decode batch, #running-req: 1, #token: ", 5)
    status, raw = request(f"{sim.base}/metrics", method="GET")
    assert status == 200
    assert b"sglang:generation_tokens_total" in raw and b"sglang:max_total_num_tokens" in raw


def test_openai_client_streams_chat_and_completions(launch_sim: Launcher) -> None:
    sim = launch_sim([*SMALL, "--served-model-name", "qwen", "--api-key", "sekret"])
    sim.wait_ready()
    client = openai.OpenAI(base_url=f"{sim.base}/v1", api_key="sekret", max_retries=0)
    assert [m.id for m in client.models.list().data] == ["qwen"]
    stream = client.chat.completions.create(
        model="qwen",
        messages=[{"role": "user", "content": "Say something"}],
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    )
    parts, usage = [], None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            usage = chunk.usage
    assert usage is not None and usage.completion_tokens == 12
    assert len("".join(parts).split()) == 12
    comp = client.completions.create(model="qwen", prompt="Once upon", max_tokens=7, stream=True)
    text = "".join(c.choices[0].text for c in comp)
    assert len(text.split()) == 7
    full = client.chat.completions.create(
        model="qwen", messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    assert full.usage is not None and full.usage.completion_tokens == 3
    bad = openai.OpenAI(base_url=f"{sim.base}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    status, _ = request(f"{sim.base}/health")
    assert status == 200  # /health is exempt from the key, as in SGLang


def test_bench_serving_generate_payload(launch_sim: Launcher) -> None:
    sim = launch_sim(SMALL)
    sim.wait_ready()
    model = get_json(f"{sim.base}/v1/models")["data"][0]["id"]
    assert model == "Qwen/Qwen3-32B"
    payload = {
        "input_ids": list(range(1, 301)),
        "sampling_params": {"temperature": 0.0, "max_new_tokens": 33, "ignore_eos": True},
        "stream": True,
        "return_logprob": False,
        "logprob_start_len": -1,
    }
    events = sse_events(f"{sim.base}/generate", payload)
    first = next(e for e in events if isinstance(e, dict) and e["text"])
    assert first["meta_info"]["completion_tokens"] >= 1
    assert events[-2]["meta_info"]["completion_tokens"] == 33
    # Same prompt again: the radix cache serves the shared prefix.
    again = sse_events(f"{sim.base}/generate", payload)
    assert again[-2]["meta_info"]["cached_tokens"] >= 288
    info = get_json(f"{sim.base}/get_server_info")
    assert info["max_total_num_tokens"] > 0
    state = info["internal_states"][0]
    assert set(state["memory_usage"]) == {"weight", "kvcache", "token_capacity", "graph"}
    assert state["memory_usage"]["weight"] == 61.03
    status, raw = request(f"{sim.base}/flush_cache", method="POST")
    assert status == 200 and raw.startswith(b"Cache flushed")
    non_stream = request(
        f"{sim.base}/generate", {"text": "x y", "sampling_params": {"max_new_tokens": 4}}
    )
    assert json.loads(non_stream[1])["meta_info"]["completion_tokens"] == 4
    too_long = request(f"{sim.base}/generate", {"input_ids": [1] * 41000})
    assert too_long[0] == 400 and b"longer than the model's context length" in too_long[1]


def test_gpu_state_tracks_the_server_and_cuda_visible_devices(launch_sim: Launcher) -> None:
    args = ["--model-path", "meta-llama/Llama-3.1-70B-Instruct", "--sim-profile",
            "llama-3.1-70b-tp8-h100", "--tp", "4", "--skip-server-warmup"]  # fmt: skip
    sim = launch_sim(args, env={"CUDA_VISIBLE_DEVICES": "4,5,6,7"})
    sim.wait_ready()
    gpus = {g.index: g for g in read_gpu_state(sim.gpu_dir)}
    assert len(gpus) == 8
    rank2 = sim.children()["sglang::scheduler_TP2"]  # rank 2 runs on the third visible GPU
    assert gpus[6].processes.keys() == {rank2} and gpus[0].used_bytes == 0
    free = float(re.findall(r"available_gpu_mem=([\d.]+) GB", sim.log())[0])
    assert abs(gpus[7].used_bytes / 2**30 - (gpus[7].total_bytes / 2**30 - free)) < 0.01
    sim.kill()
    assert all(g.used_bytes == 0 for g in read_gpu_state(sim.gpu_dir))


def test_retraction_when_the_pool_runs_out(launch_sim: Launcher) -> None:
    sim = launch_sim([*SMALL, "--max-total-tokens", "700", "--schedule-conservativeness", "0.05",
                      "--decode-log-interval", "10"])  # fmt: skip
    sim.wait_ready()
    body = {"input_ids": list(range(5, 105)), "sampling_params": {"max_new_tokens": 120,
            "ignore_eos": True}}  # fmt: skip
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda i: request(f"{sim.base}/generate",
                                                  {**body, "input_ids": [i, *body["input_ids"]]}),
                                range(6)))  # fmt: skip
    assert all(status == 200 for status, _ in results)
    metas = [json.loads(raw)["meta_info"] for _, raw in results]
    assert all(m["completion_tokens"] == 120 for m in metas)
    assert sim.wait_for("KV cache pool is full. Retract requests. #retracted_reqs: ", 5)
    assert any(m["total_retractions"] > 0 for m in metas)
