"""Outcome precedence: failure lines, their place against "fired up", then the harness's facts."""

from __future__ import annotations

import pytest

from autotune.logparse.events import Event
from autotune.logparse.lines import parse_text
from autotune.logparse.outcome import REASON_CHARS, Outcome, RunFacts, classify, reason_line

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


# -- 0.5.18+: every OOM line, serving-time evidence, the deaths SGLang names -----------------

TP0 = "[2026-11-20 14:00:00 TP0] "
MAIN = "[2026-11-20 14:00:00] "
DECODE = (
    TP0 + "Decode batch, #running-req: 48, #token: 52311, token usage: 0.36, cuda graph: True, "
    "gen throughput (token/s): 1520.33, #queue-req: 0\n"
)


@pytest.mark.parametrize(
    ("line", "cause"),
    [
        ("RuntimeError: CUDA driver error: out of memory", "cuda_error_oom"),
        ("torch.AcceleratorError: CUDA error: out of memory", "cuda_error_oom"),
        ("RuntimeError: Triton Error [CUDA]: out of memory", "triton_oom"),
        (
            "RuntimeError: alloc_req_slots runs out of memory. Please set a smaller number for "
            "`--max-running-requests`. req_to_token_pool.available_size()=0, num_reqs=4, ",
            "req_slots_oom",
        ),
        (TP0 + "Out of memory. Try to lower your batch size.", "alloc_oom"),
        (
            "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling "
            "`cublasCreate(handle)`",
            "oom",
        ),
        ("gpu-box:123:456 [0] NCCL WARN Cuda failure 2 'out of memory'", "oom"),
        ("RuntimeError: CUDA_ERROR_OUT_OF_MEMORY: out of memory", "cuda_error_oom"),
        ("jax.errors.SomethingElse: RESOURCE: Out Of Memory while allocating", "oom"),
    ],
)
def test_every_out_of_memory_line_is_an_oom(line: str, cause: str) -> None:
    verdict = classify(events(READY + line + "\n"))
    assert (verdict.outcome, verdict.cause) == (Outcome.RUNTIME_OOM, cause)
    assert classify(events(line + "\n")).outcome.is_oom


@pytest.mark.parametrize(
    "line",
    [
        TP0 + "Available memory 4GB is less than required memory 6GB for warmup, reducing max_m "
        "to 4096 to avoid out of memory",
        MAIN + "Receive: obj=GenerateReqInput(text='why does CUDA say out of memory?')",
        MAIN + "Finish: obj=GenerateReqInput(rid='1'), out={'text': 'CUDA out of memory'}",
    ],
)
def test_lines_that_only_mention_memory_are_not_failures(line: str) -> None:
    assert classify(events(READY + line + "\n"), RunFacts(exited=False)).outcome is Outcome.READY


def test_a_request_failed_with_the_oom_error_is_an_oom() -> None:
    """0.5.23 aborts the last request a decode batch cannot keep (`schedule_batch.py`
    `retract_decode`, HTTP 500 with the OOM error) and keeps serving; 0.5.9 raises there and the
    scheduler dies. Both are the parameters' OOM. (The abort was read as no failure before.)"""
    line = TP0 + "retract_decode: aborted last request 3f2a due to OOM\n"
    verdict = classify(events(READY + line), RunFacts(exited=False))
    assert (verdict.outcome, verdict.cause) == (Outcome.RUNTIME_OOM, "request_oom_abort")
    assert classify(events(line)).outcome is Outcome.RUNTIME_OOM  # only a server that serves


def test_batch_lines_make_a_failure_a_runtime_one_without_the_ready_line() -> None:
    log = parse_text(DECODE + OOM)
    assert classify(log.events, batches=log.batches).outcome is Outcome.RUNTIME_OOM
    assert classify(log.events).outcome is Outcome.STARTUP_OOM  # callers must pass the batches


def test_serving_only_lines_need_no_ready_line() -> None:
    for line in (
        TP0 + "Prefill out of memory. Try to lower your batch size.",
        TP0 + "Decode out of memory. Try to lower your batch size.",
        TP0 + "KV cache pool is full. Retract requests. #retracted_reqs: 1, #new_tokens_gained: 9",
    ):
        assert classify(events(line + "\n" + OOM)).outcome is Outcome.RUNTIME_OOM, line


def test_a_forward_pass_traceback_makes_an_oom_a_runtime_one() -> None:
    frames = (
        TP0 + "Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/sgl/srt/managers/scheduler.py", line 2109, in event_loop_overlap\n'
        "    batch_result = self.run_batch(batch)\n"
        '  File "/sgl/srt/managers/tp_worker.py", line 675, in forward_batch_generation\n'
        "    out = self.model_runner.forward(\n"
    )
    assert classify(events(frames + OOM)).outcome is Outcome.RUNTIME_OOM
    startup = (
        TP0 + "Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/sgl/srt/managers/scheduler.py", line 568, in __init__\n'
        "    self.init_model_worker()\n"
    )
    assert classify(events(startup + OOM)).outcome is Outcome.STARTUP_OOM


def test_a_frame_after_the_deciding_line_counts_until_the_next_prefixed_line() -> None:
    text = (
        TP0 + "Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/sgl/srt/managers/scheduler.py", line 4870, in run_batch\n'
    )
    verdict = classify(events(text), RunFacts(exited=True))
    assert (verdict.outcome, verdict.cause) == (Outcome.CRASH, "scheduler_exception")
    boundary = TP0 + "Memory pool end. avail mem=1.00 GB\n"  # a line of another process
    later = TP0 + "Scheduler hit an exception: boom\n" + boundary + text.split("\n")[1] + "\n"
    assert classify(events(later), RunFacts(exited=True)).outcome is Outcome.STARTUP_ERROR


@pytest.mark.parametrize(
    ("text", "outcome", "cause"),
    [
        (
            "RuntimeError: Rank 0 scheduler died during initialization (exit code: -9). If exit "
            "code is -9 (SIGKILL), a common cause is the OS OOM killer. Run `dmesg -T | grep -i "
            "oom` to check.",
            Outcome.STARTUP_OOM,
            "host_oom_killer",
        ),
        (
            TP0 + "Rank 2 scheduler died during initialization (exit code: 1). If exit code is -9 "
            "(SIGKILL), a common cause is the OS OOM killer.",
            Outcome.STARTUP_ERROR,
            "rank_dead",
        ),
        (
            MAIN
            + "Subprocess scheduler_1 (pid=4242) crashed with exit code -9. Triggering SIGQUIT "
            "for cleanup...",
            Outcome.RUNTIME_OOM,
            "host_oom_killer",
        ),
        (
            MAIN
            + "Subprocess detokenizer (pid=4250) crashed with exit code -6. Triggering SIGQUIT "
            "for cleanup...",
            Outcome.CRASH,
            "subprocess_crashed",
        ),
    ],
)
def test_deaths_0_5_18_names(text: str, outcome: Outcome, cause: str) -> None:
    verdict = classify(events(text + "\n" + MAIN + "SIGQUIT received. signum=3, frame=None.\n"))
    assert (verdict.outcome, verdict.cause) == (outcome, cause)
    assert verdict.evidence[0] == text.strip()


def test_new_oom_kinds_are_never_stop_noise() -> None:
    facts = RunFacts(stopped_by_us=True, exited=True, stop_line=1)
    text = READY + "RuntimeError: Triton Error [CUDA]: out of memory\n"
    assert classify(events(text), facts).outcome is Outcome.RUNTIME_OOM
    crash = READY + MAIN + "Subprocess scheduler_0 (pid=1) crashed with exit code -9.\n"
    assert classify(events(crash), facts).outcome is Outcome.STOPPED


def test_the_reason_line_keeps_the_start_of_the_deciding_line() -> None:
    long = "torch.OutOfMemoryError: CUDA out of memory. " + "x" * 400
    line = reason_line("runtime_oom", "torch_oom", (long, "another line"))
    assert line.startswith("runtime_oom (torch_oom): torch.OutOfMemoryError")
    assert line.endswith("…") and len(line) == len("runtime_oom (torch_oom): ") + REASON_CHARS + 1
    assert reason_line("ok", "", ()) == "ok"
    assert reason_line("hang", "stall:serving", ("short",)) == "hang (stall:serving): short"
