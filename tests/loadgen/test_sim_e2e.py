"""run_workload end to end against the simulator (`python -m autotune.sim`, like SGLang)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

from autotune.config.workload import Stress
from autotune.loadgen import Target, run_workload, stress_plan, workload_from_dict

if TYPE_CHECKING:
    from tests.loadgen.conftest import SimServer

pytestmark = pytest.mark.e2e
Start = Callable[..., "SimServer | None"]


def start(sim_server: Start, *flags: str) -> SimServer:
    sim = sim_server(*flags)
    assert sim is not None
    return sim


@pytest.mark.parametrize(
    ("api", "stream"), [("generate", True), ("completions", True), ("chat", True), ("chat", False)]
)
def test_each_api(sim_server: Start, api: str, stream: bool) -> None:
    sim = start(sim_server)
    phases = [{"kind": "steady", "concurrency": 4, "duration_s": 30, "max_requests": 8}]
    ws = workload_from_dict(
        {"api": api, "stream": stream, "input_len": 300, "output_len": 16, "phases": phases}
    )
    res = run_workload(ws, Target(sim.url), sim.facts(), is_dead=sim.is_dead)
    s = res.overall
    assert (s.completed, s.failed) == (8, 0), s.errors
    assert {r.output_tokens for r in res.records} == {16}  # ignore_eos: exact lengths
    if api != "chat":  # token ids: the simulator counts exactly what was sent
        assert {r.input_tokens for r in res.records} == {300}
    assert s.ttft_ms is not None and s.e2e_ms is not None and s.tpot_ms is not None
    assert (s.itl_ms is not None) == stream
    if stream and api == "generate":  # gaps split over completion_tokens: one per token
        # after the first chunk's tokens (TTFT, as bench_serving counts them); a busy machine
        # can put two tokens in a first chunk, never fewer gaps than tokens after it
        assert s.itl_ms is not None
        gaps = [len(r.itl) for r in res.records]
        assert all(1 <= 16 - n <= 3 for n in gaps), gaps
    elif stream:  # OpenAI routes: one gap per chunk, as bench_serving counts them
        assert s.itl_ms is not None and 0 < s.itl_ms.count <= 8 * 15


def test_each_phase_kind(sim_server: Start) -> None:
    sim = start(sim_server, "--chunked-prefill-size", "2048", "--max-running-requests", "12")
    facts = sim.facts()
    phases = [
        {"kind": "warmup", "requests": 2},
        {"kind": "steady", "concurrency": 4, "duration_s": 0.5},
        {"kind": "poisson", "rate": 20, "duration_s": 0.5},
        {"kind": "stress", "rounds": 1, "output_len": 4},
    ]
    ws = workload_from_dict(
        {
            "input_len": {"dist": "uniform", "min": 50, "max": 500},
            "output_len": 8,
            "phases": phases,
            "seed": 2,
        }
    )
    res = run_workload(ws, Target(sim.url), facts, is_dead=sim.is_dead)
    assert [p.ended_by for p in res.phases] == ["completed"] * 4
    assert all(p.summary.failed == 0 for p in res.phases), [p.summary.errors for p in res.phases]
    warm, steady, poisson, stress = res.phases
    assert warm.summary.completed == 2 and steady.summary.completed >= 4
    assert poisson.summary.completed >= 1
    sized = stress_plan(Stress("x", rounds=1, output_len=4), facts)
    assert stress.plan == sized
    assert (sized["requests"], sized["input_len"]) == (12, 2048)
    assert stress.summary.completed == 12
    assert {r.input_tokens for r in res.records if r.phase == stress.name} == {sized["input_len"]}
    assert res.died is None


def test_server_that_ooms_under_stress(sim_server: Start) -> None:
    """The default profile with too little headroom starts, then OOMs on a burst of chunks:
    the highest --mem-fraction-static that still starts leaves the least headroom."""
    for fraction in ("0.91", "0.90", "0.89", "0.88", "0.87"):
        sim = sim_server(
            "--mem-fraction-static", fraction, profile="kimi-k2.5-tp8-96g", tp=8, may_fail=True
        )
        if sim is not None:
            break
    assert sim is not None, "no fraction in 0.87-0.91 starts on the default profile"
    phases = [
        {"kind": "stress", "rounds": 3, "output_len": 8},
        {"kind": "steady", "concurrency": 2, "duration_s": 30},
    ]
    ws = workload_from_dict({"input_len": 200, "output_len": 8, "phases": phases})
    res = run_workload(ws, Target(sim.url), sim.facts(), is_dead=sim.is_dead)
    assert "CUDA out of memory" in sim.text()
    assert res.died is not None and res.died.phase == "stress-0"
    assert res.died.in_flight > 0 and res.died.in_flight_input_tokens > 0
    assert [p.ended_by for p in res.phases] == ["server_died", "skipped"]
    assert res.phases[0].summary.completed == 0


def test_server_killed_mid_phase(sim_server: Start) -> None:
    sim = start(sim_server)
    killer = threading.Timer(1.0, sim.stop)
    phases = [{"kind": "poisson", "rate": 30, "duration_s": 60}]
    ws = workload_from_dict({"input_len": 100, "output_len": 2000, "phases": phases})
    killer.start()
    try:
        res = run_workload(ws, Target(sim.url), sim.facts(), is_dead=sim.is_dead)
    finally:
        killer.cancel()
    assert res.died is not None and res.died.reason == "server exited with -9"
    assert res.phases[0].ended_by == "server_died"
    assert res.duration_s < 60  # stopped long before the phase's 60 s
    assert res.overall.failed > 0


def test_api_key(sim_server: Start, monkeypatch: pytest.MonkeyPatch) -> None:
    sim = start(sim_server, "--api-key", "sim-key")
    phases = [{"kind": "warmup", "requests": 3, "concurrency": 3}]
    ws = workload_from_dict(
        {"api": "chat", "api_key_env": "AUTOTUNE_TEST_KEY", "output_len": 4, "phases": phases}
    )
    monkeypatch.setenv("AUTOTUNE_TEST_KEY", "sim-key")
    ok = run_workload(ws, Target(sim.url), sim.facts(), is_dead=sim.is_dead)
    assert ok.phases[0].summary.completed == 3
    monkeypatch.setenv("AUTOTUNE_TEST_KEY", "wrong")
    bad = run_workload(ws, Target(sim.url), sim.facts(), is_dead=sim.is_dead)
    assert bad.phases[0].summary.errors == {"HTTP 401": 3}
