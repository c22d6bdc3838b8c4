"""Outcome precedence: failure lines, their place against "fired up", then the harness's facts."""

from __future__ import annotations

from autotune.logparse.lines import Event, parse_text
from autotune.logparse.outcome import Outcome, RunFacts, classify

READY = "[2026-02-24 12:00:00] The server is fired up and ready to roll!\n"
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0\n"
BAD = "RuntimeError: CUDA error: an illegal memory access was encountered\n"


def events(text: str) -> tuple[Event, ...]:
    return parse_text(text).events


def test_oom_before_ready_is_startup_after_ready_is_runtime() -> None:
    assert classify(events(OOM + READY)).outcome is Outcome.STARTUP_OOM
    assert classify(events(READY + OOM)).outcome is Outcome.RUNTIME_OOM


def test_bare_error_line_is_not_a_crash_while_the_process_lives() -> None:
    assert classify(events(READY + BAD)).outcome is Outcome.READY
    verdict = classify(events(READY + BAD), RunFacts(exited=True))
    assert verdict.outcome is Outcome.CRASH
    assert "illegal memory access" in verdict.evidence[0]


def test_exit_without_any_failure_line() -> None:
    assert classify(events(READY), RunFacts(exited=True)).outcome is Outcome.CRASH
    assert classify(events(""), RunFacts(exited=True)).outcome is Outcome.STARTUP_ERROR


def test_harness_facts() -> None:
    assert (
        classify(events(""), RunFacts(timed_out="weight_load")).cause == "phase_timeout:weight_load"
    )
    assert classify(events(""), RunFacts(timed_out="weight_load")).outcome is Outcome.TIMEOUT
    assert classify(events(""), RunFacts(stalled="graph_capture")).outcome is Outcome.HANG
    assert classify(events(READY), RunFacts(unhealthy="no answer")).outcome is Outcome.HANG
    lost = classify(events(READY), RunFacts(lost="server process 7 is gone"))
    assert (lost.outcome, lost.cause) == (Outcome.CRASH, "process_lost")
    assert lost.evidence[0] == "server process 7 is gone"
    assert classify(events(READY), RunFacts(stopped_by_us=True)).outcome is Outcome.STOPPED


def test_noise_after_our_stop_does_not_turn_a_stop_into_a_crash() -> None:
    text = READY + "[2026-02-24 12:00:01 TP0] Scheduler hit an exception: KeyboardInterrupt\n"
    facts = RunFacts(stopped_by_us=True, exited=True, stop_line=1)
    assert classify(events(text), facts).outcome is Outcome.STOPPED
    # ... but an OOM is never noise.
    assert classify(events(READY + OOM), facts).outcome is Outcome.RUNTIME_OOM


def test_failure_line_beats_timeout_fact() -> None:
    verdict = classify(events(OOM), RunFacts(timed_out="weight_load"))
    assert verdict.outcome is Outcome.STARTUP_OOM


def test_is_oom() -> None:
    assert Outcome.RUNTIME_OOM.is_oom and Outcome.STARTUP_OOM.is_oom
    assert not Outcome.CRASH.is_oom
