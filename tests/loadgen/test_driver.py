"""run_workload end to end against the fake SGLang-like server (real subprocess, real HTTP)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from autotune.loadgen import (
    ServerFacts,
    Slo,
    Stress,
    Target,
    run_workload,
    stress_plan,
    workload_from_dict,
)
from autotune.testing.fakeserver import Running

Start = Callable[..., Running]
FACTS = ServerFacts(max_running_requests=12, chunked_prefill_size=700, context_len=4096)


def spec(**kw: object) -> dict[str, object]:
    base: dict[str, object] = {
        "seed": 5,
        "input_len": {"dist": "uniform", "min": 5, "max": 60},
        "output_len": 6,
    }
    return {**base, **kw}


@pytest.mark.parametrize("api", ["generate", "completions", "chat"])
@pytest.mark.parametrize("stream", [True, False])
def test_each_api_streamed_or_not(fake_server: Start, api: str, stream: bool) -> None:
    srv = fake_server("--ttft-ms", "2", "--itl-ms", "1")
    phases = [{"kind": "steady", "concurrency": 3, "duration_s": 5, "max_requests": 9}]
    ws = workload_from_dict(spec(api=api, stream=stream, phases=phases))
    res = run_workload(ws, Target(srv.url), FACTS, is_dead=srv.is_dead)
    s = res.overall
    assert (s.requests, s.completed, s.error_rate) == (9, 9, 0.0)
    assert s.total_output_tokens == 9 * 6
    assert s.ttft_ms is not None and s.e2e_ms is not None
    assert (s.itl_ms is not None) == stream and (s.tpot_ms is not None)
    if api != "chat":  # token ids: the server's count equals ours
        sent = [r.input_tokens for r in res.records]
        assert all(5 <= n <= 60 for n in sent) and len(set(sent)) > 1


def test_phases_in_order_with_warmup_left_out(fake_server: Start, tmp_path: Path) -> None:
    srv = fake_server("--ttft-ms", "1", "--itl-ms", "1")
    phases = [
        {"kind": "warmup", "requests": 3, "concurrency": 2},
        {"kind": "steady", "concurrency": 4, "duration_s": 0.4},
        {"kind": "poisson", "rate": 40, "duration_s": 0.5},
        {"kind": "stress", "rounds": 2, "output_len": 3},
    ]
    res = run_workload(
        workload_from_dict(spec(phases=phases)),
        Target(srv.url),
        FACTS,
        is_dead=srv.is_dead,
        slo=Slo(ttft_ms=10_000),
    )
    warm, steady, poisson, stress = res.phases
    assert [p.ended_by for p in res.phases] == ["completed"] * 4
    assert warm.summary.requests == 3
    assert steady.summary.completed > 4 and steady.summary.peak_concurrency <= 4
    assert poisson.summary.completed > 0
    # stress: max running requests x one prefill chunk each, twice
    assert stress.plan == {"requests": 12, "input_len": 700, "output_len": 3, "rounds": 2}
    assert stress.summary.completed == 24
    assert {r.input_tokens for r in res.records if r.phase == stress.name} == {700}
    assert stress.summary.peak_concurrency == 12
    assert res.overall.requests == sum(p.summary.requests for p in res.phases[1:])
    assert res.overall.good_fraction == 1.0
    assert res.died is None
    d = res.to_dict()
    json.dumps(d, allow_nan=False)
    assert "records" not in json.dumps(d)
    path = tmp_path / "records.jsonl"
    res.write_records(path)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(lines) == len(res.records) and {"ttft", "itl", "scheduled_s", "error"} <= set(
        lines[0]
    )


def test_poisson_schedule_is_seeded(fake_server: Start) -> None:
    srv = fake_server()

    def offsets(seed: int) -> list[float]:
        phases = [{"kind": "poisson", "rate": 100, "duration_s": 0.3}]
        res = run_workload(
            workload_from_dict(spec(seed=seed, phases=phases)),
            Target(srv.url),
            FACTS,
            is_dead=srv.is_dead,
        )
        start = res.phases[0].started_s
        return sorted(round(r.scheduled_s - start, 3) for r in res.records)

    a, b = offsets(1), offsets(1)
    assert len(a) > 5 and max(abs(x - y) for x, y in zip(a, b, strict=True)) < 0.01
    assert offsets(2) != a


def test_sessions_resend_history(fake_server: Start) -> None:
    srv = fake_server()
    phases = [{"kind": "steady", "concurrency": 2, "duration_s": 5, "max_requests": 6}]
    ws = workload_from_dict(
        spec(
            phases=phases,
            input_len=20,
            output_len=10,
            sessions={"turns": 3, "system_prompt_len": 50},
        )
    )
    res = run_workload(ws, Target(srv.url), FACTS, is_dead=srv.is_dead)
    by_turn = {r.turn: r.input_tokens for r in res.records}
    assert by_turn == {0: 72, 1: 102, 2: 132}  # 50 system + 2 head + 20, then +10 answer +20


def test_api_key_from_environment(fake_server: Start, monkeypatch: pytest.MonkeyPatch) -> None:
    srv = fake_server("--api-key", "s3cret")
    phases = [{"kind": "warmup", "requests": 2}]
    ws = workload_from_dict(spec(phases=phases, api="completions", api_key_env="LOADGEN_KEY"))
    monkeypatch.setenv("LOADGEN_KEY", "s3cret")
    ok = run_workload(ws, Target(srv.url), FACTS, is_dead=srv.is_dead)
    assert ok.phases[0].summary.completed == 2
    monkeypatch.setenv("LOADGEN_KEY", "wrong")
    bad = run_workload(ws, Target(srv.url), FACTS, is_dead=srv.is_dead)
    assert bad.phases[0].summary.errors == {"HTTP 401": 2}
    direct = run_workload(ws, Target(srv.url, api_key="s3cret"), FACTS, is_dead=srv.is_dead)
    assert direct.phases[0].summary.completed == 2


def test_server_dying_mid_phase_stops_the_run(fake_server: Start) -> None:
    srv = fake_server("--itl-ms", "20", "--die-after", "10")
    phases = [
        {"kind": "steady", "concurrency": 4, "duration_s": 60},
        {"kind": "stress"},
    ]
    res = run_workload(
        workload_from_dict(spec(output_len=50, phases=phases)),
        Target(srv.url),
        FACTS,
        is_dead=srv.is_dead,
    )
    assert res.died is not None and res.died.reason.startswith("server exited with")
    assert res.died.phase == "steady-0"
    assert [p.ended_by for p in res.phases] == ["server_died", "skipped"]
    assert res.duration_s < 60  # stopped long before the phase's 60 s
    assert res.overall.failed >= 2 and res.overall.completed <= 10
    assert {r.error.split(":")[0] for r in res.records if r.error} <= {"connection", "cancelled"}


def test_is_dead_report_cancels_in_flight_requests(fake_server: Start) -> None:
    srv = fake_server("--ttft-ms", "100000")  # never answers
    calls = [0]

    def is_dead() -> str | None:
        calls[0] += 1
        return "OOM in log" if calls[0] > 3 else None

    phases = [
        {"kind": "stress", "rounds": 3},
        {"kind": "steady", "concurrency": 1, "duration_s": 1},
    ]
    res = run_workload(
        workload_from_dict(spec(phases=phases)), Target(srv.url), FACTS, is_dead=is_dead
    )
    assert res.died is not None
    assert (res.died.reason, res.died.phase, res.died.in_flight) == ("OOM in log", "stress-0", 12)
    assert res.died.in_flight_input_tokens == 12 * 700
    assert res.phases[0].summary.errors == {"cancelled": 12}
    assert res.records[0].error == "cancelled: server died (OOM in log)"
    assert res.phases[1].ended_by == "skipped"


def test_unreported_death_is_bounded_by_phase_time(fake_server: Start) -> None:
    srv = fake_server("--die-after", "3")
    phases = [{"kind": "steady", "concurrency": 2, "duration_s": 0.5}]
    res = run_workload(
        workload_from_dict(spec(phases=phases)), Target(srv.url), FACTS, is_dead=lambda: None
    )
    s = res.overall
    assert res.died is None and res.phases[0].ended_by == "completed"
    assert 2 <= s.completed <= 3 and "connection" in s.errors
    assert s.failed < 40  # clients pause after a refused connection instead of spinning


def test_phase_time_limit_cancels_stuck_requests(fake_server: Start) -> None:
    srv = fake_server("--ttft-ms", "100000")
    phases = [{"kind": "steady", "concurrency": 2, "duration_s": 0.2}]
    ws = workload_from_dict(spec(phases=phases, drain_timeout_s=0.3))
    res = run_workload(ws, Target(srv.url), FACTS, is_dead=srv.is_dead)
    assert res.phases[0].ended_by == "time_limit"
    assert res.overall.errors == {"cancelled": 2}


def test_stress_sizing_from_server_facts() -> None:
    phase = Stress("s", rounds=2, output_len=64)
    facts = ServerFacts(max_running_requests=48, chunked_prefill_size=8192, context_len=131072)
    assert stress_plan(phase, facts) == {
        "requests": 48,
        "input_len": 8192,
        "output_len": 64,
        "rounds": 2,
    }
    # a pool of 100K tokens holds 12 such requests at once: send one more than fits
    pooled = ServerFacts(48, 8192, 131072, max_total_num_tokens=100_000)
    assert stress_plan(phase, pooled)["requests"] == 13
    # chunked prefill off (-1) or unknown: 8192; a short context shrinks the prompt
    assert stress_plan(phase, ServerFacts(4, -1, 4096))["input_len"] == 4096 - 64 - 1
    assert stress_plan(phase, ServerFacts())["requests"] == 32
    assert stress_plan(Stress("s", requests=5, input_len=100), pooled)["requests"] == 5


def test_dataset_of_lengths_and_prompts(fake_server: Start, tmp_path: Path) -> None:
    srv = fake_server()
    data = tmp_path / "traffic.jsonl"
    data.write_text(
        '{"input_len": 40, "output_len": 5}\n{"prompt": "hello there friend", "output_len": 3}\n'
    )
    phases = [{"kind": "steady", "concurrency": 1, "duration_s": 5, "max_requests": 4}]
    ws = workload_from_dict({"dataset": str(data), "phases": phases})
    res = run_workload(ws, Target(srv.url), FACTS, is_dead=srv.is_dead)
    got = sorted((r.input_tokens, r.output_tokens) for r in res.records)
    assert got == [(3, 3), (3, 3), (40, 5), (40, 5)]


def test_time_limit_while_streaming_leaves_requests_unfinished(fake_server: Start) -> None:
    srv = fake_server("--itl-ms", "20")
    phases = [{"kind": "steady", "concurrency": 3, "duration_s": 0.2}]
    ws = workload_from_dict(spec(phases=phases, output_len=5000, drain_timeout_s=0.3))
    res = run_workload(ws, Target(srv.url), FACTS, is_dead=srv.is_dead)
    s = res.phases[0].summary
    assert res.phases[0].ended_by == "time_limit"
    assert (s.unfinished, s.requests, s.failed, s.error_rate) == (3, 0, 0, None)
    assert all(r.error and r.error.startswith("unfinished: phase steady-0") for r in res.records)


def test_the_pool_limits_input_where_it_is_smaller_than_the_context() -> None:
    assert ServerFacts(context_len=32768, max_total_num_tokens=4096).pool_limits_input
    assert not ServerFacts(context_len=8192, max_total_num_tokens=100_000).pool_limits_input
    assert ServerFacts(max_total_num_tokens=4096).pool_limits_input
    assert not ServerFacts(context_len=8192).pool_limits_input
