"""run_workload's early end against the fake server (real subprocess, real HTTP): a steady phase
ends once its throughput settled and its headroom stopped falling, cancelling what is in flight;
a stress phase skips its remaining rounds once its peak repeated; off, every phase runs out."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from autotune.loadgen import ServerFacts, Target, run_workload, workload_from_dict
from autotune.loadgen.driver import WorkloadResult
from autotune.loadgen.metrics import ENDED_EARLY
from autotune.testing.fakeserver import Running

Start = Callable[..., Running]
FACTS = ServerFacts(max_running_requests=6, chunked_prefill_size=300, context_len=4096)
RULE = {"window_s": 0.3, "windows": 3, "tolerance": 0.5, "min_s": 1.0, "min_requests": 10}


def _spec(phases: list[dict[str, object]], end_early: object = RULE) -> dict[str, object]:
    return {
        "seed": 3,
        "input_len": 20,
        "output_len": 40,
        "drain_timeout_s": 5,
        "end_early": end_early,
        "phases": phases,
    }


def _frees(values: Iterator[float]) -> Callable[[], float | None]:
    return lambda: next(values)


def _falling() -> Iterator[float]:
    free = 80.0
    while True:
        free -= 1.0
        yield free


def _steady_free() -> Iterator[float]:
    while True:
        yield 40.0


STEADY = [{"kind": "steady", "concurrency": 4, "duration_s": 30}]


def _run(
    start: Start,
    token_ms: str,
    phases: list[dict[str, object]],
    frees: Iterator[float] | None = None,
    end_early: object = RULE,
) -> WorkloadResult:
    """`phases` against a fake server of `token_ms` per token, reading free memory off `frees`."""
    srv = start("--ttft-ms", token_ms, "--itl-ms", token_ms)
    ws = workload_from_dict(_spec(phases, end_early))
    headroom = None if frees is None else _frees(frees)
    return run_workload(ws, Target(srv.url), FACTS, is_dead=srv.is_dead, headroom=headroom)


def test_a_settled_steady_phase_ends_early_and_cancels_what_is_in_flight(
    fake_server: Start,
) -> None:
    res = _run(fake_server, "5", STEADY, _steady_free())
    steady = res.phases[0]
    assert steady.ended_by == "ended_early"
    assert steady.duration_s < 15
    assert steady.early_end is not None and steady.early_end.startswith("ended at ")
    assert "of 30: throughput within 50% over 3 windows of 0.3 s" in steady.early_end
    assert "least free memory 40.00 GiB, not falling" in steady.early_end
    assert steady.summary.errors == {} and steady.summary.completed >= 10
    cut = [r for r in res.records if r.error]
    assert cut and all(r.error and r.error.startswith(ENDED_EARLY) for r in cut)
    # what they streamed before the end counts: the rate up to the end, without a drain's tail
    made = sum(r.output_tokens for r in res.records)
    assert sum(r.output_tokens for r in cut) > 0
    assert steady.summary.output_throughput * steady.duration_s == pytest.approx(made)
    assert steady.summary.unfinished == len(cut)
    assert res.to_dict()["phases"][0]["early_end"] == steady.early_end  # type: ignore[index]


def test_headroom_still_falling_keeps_the_phase_running(fake_server: Start) -> None:
    phases = [{"kind": "steady", "concurrency": 4, "duration_s": 3}]
    res = _run(fake_server, "5", phases, _falling())
    assert res.phases[0].ended_by == "completed"
    assert res.phases[0].early_end is None and res.phases[0].duration_s >= 3


def test_off_runs_the_whole_duration(fake_server: Start) -> None:
    phases = [{"kind": "steady", "concurrency": 4, "duration_s": 3}]
    res = _run(fake_server, "5", phases, end_early=False)
    assert res.phases[0].ended_by == "completed" and res.phases[0].duration_s >= 3


def test_a_stress_peak_seen_twice_skips_the_remaining_rounds(fake_server: Start) -> None:
    phases = [{"kind": "stress", "rounds": 4, "output_len": 3}]
    res = _run(fake_server, "1", phases, _steady_free())
    stress = res.phases[0]
    assert stress.ended_by == "ended_early"
    assert stress.summary.completed == 2 * 6  # two rounds of the server's 6 slots
    assert stress.early_end is not None
    assert stress.early_end.startswith("ended after 2 of 4 rounds: peak repeated in rounds 1 and 2")


def test_a_stress_peak_that_deepens_runs_every_round(fake_server: Start) -> None:
    phases = [{"kind": "stress", "rounds": 3, "output_len": 3}]
    res = _run(fake_server, "1", phases, _falling())
    assert res.phases[0].ended_by == "completed"
    assert res.phases[0].summary.completed == 3 * 6
