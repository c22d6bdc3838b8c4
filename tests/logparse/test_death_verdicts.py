"""Which lines are deaths and which are serving events, and how a death is classed from the
signal and its sender, the log's own lines and the host's state (`logparse.outcome`).

Lines are in SGLang's own shapes (0.1–0.4 and 0.5.9 / 0.5.23, quoted from `scheduler.py`,
`schedule_batch.py`, `mem_cache/allocation.py`, `utils/network.py`, `utils/common.py`) and in
Python's, uvicorn's, CUDA's and NCCL's; whole logs come from tests/fixtures/logs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.logparse.events import FAILURE_KINDS, MACHINE_KINDS, Event, Kind, ParsedLog
from autotune.logparse.lines import parse_line, parse_text
from autotune.logparse.outcome import OOM_RULED_OUT, Outcome, RunFacts, classify, signal_name
from autotune.logparse.serving import summarize
from autotune.record.direction import Push, push_of

LOGS = Path(__file__).parent.parent / "fixtures" / "logs"
TP0 = "[2026-11-20 14:00:00 TP0] "
TP1 = "[2026-11-20 14:00:00 TP1] "
MAIN = "[2026-11-20 14:00:00] "
READY = MAIN + "The server is fired up and ready to roll!\n"
DECODE = (
    TP0 + "Decode batch, #running-req: 48, #token: 52311, token usage: 0.99, cuda graph: True, "
    "gen throughput (token/s): 1520.33, #queue-req: 10\n"
)
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total\n"
CRASH = (
    TP0 + "Scheduler hit an exception: Traceback (most recent call last):\n"
    '  File "/sgl/srt/managers/scheduler.py", line 2109, in event_loop_overlap\n'
    "    batch_result = self.run_batch(batch)\n"
    "RuntimeError: CUDA error: an illegal memory access was encountered\n"
    "\n" + MAIN + "SIGQUIT received. signum=3, frame=None. It usually means one child failed.\n"
)


def log_of(name: str) -> ParsedLog:
    return parse_text((LOGS / name).read_text())


def event(line: str) -> Event:
    item = parse_line(line)
    assert isinstance(item, Event), line
    return item


# -- 1. Warnings are not deaths ------------------------------------------------------------------

RETRACTIONS = [
    # 0.1–0.2 (`forward_decode_batch`, INFO)
    ("decode out of memory happened, #retracted_reqs: 1, #new_token_ratio: 0.9998 -> 1.0000", 1),
    # 0.3–0.4.x (`update_running_batch`, INFO): the tester's line
    (
        TP0
        + "Decode out of memory happened. #retracted_reqs: 1, #new_token_ratio: 0.4000 -> 0.5000",
        1,
    ),
    # 0.4.x–0.5.9 (WARNING)
    (
        TP0 + "KV cache pool is full. Retract requests. #retracted_reqs: 3, #new_tokens_gained: "
        "9120, #new_token_ratio: 0.4200 -> 0.6100",
        3,
    ),
    # 0.5.23, a Mamba hybrid
    (
        TP0 + "KV cache pool is full. Retract requests. #retracted_reqs: 2, #new_tokens_gained: "
        "6120, #mamba_num_gained: 2, #new_token_ratio: 0.4200 -> 0.6100",
        2,
    ),
    # SGLANG_TEST_RETRACT
    (TP0 + "Testing retraction. #retracted_reqs: 4, #new_tokens_gained: 100", 4),
]


@pytest.mark.parametrize(
    ("line", "count"), RETRACTIONS, ids=["0.1", "0.4", "0.5.9", "0.5.23", "test"]
)
def test_a_retraction_is_a_serving_event_in_every_release(line: str, count: int) -> None:
    got = event(line)
    assert got.kind is Kind.RETRACT and got.values["retracted"] == count
    assert got.kind not in FAILURE_KINDS
    log = parse_text(READY + DECODE + line + "\n" + DECODE)
    assert classify(log.events, batches=log.batches).outcome is Outcome.READY
    assert classify(log.events, RunFacts(), log.batches).outcome is Outcome.READY
    assert classify(log.events, RunFacts(stopped_by_us=True, exited=True, stop_line=9)).outcome is (
        Outcome.STOPPED
    )


def test_retractions_are_counted_once_per_group() -> None:
    """Every TP rank prints the line; the summary counts the event once, and sums the requests."""
    lines = [line for line, _ in RETRACTIONS[1:3]]
    text = READY + "".join(
        f"[2026-11-20 14:00:0{i} {rank}] {line.split('] ', 1)[-1]}\n"
        for i, line in enumerate(lines)
        for rank in ("TP0", "TP1")
    )
    text += "[2026-11-20 14:00:05 DP1 TP4] " + lines[0].split("] ", 1)[-1] + "\n"
    log = parse_text(text)
    got = summarize(log.batches, log.events)
    assert (got.retraction_events, got.retracted_requests) == (3, 5)


def test_retraction_fixtures_of_0_4_and_0_5_23_are_ready_and_counted() -> None:
    old = log_of("v0_4_6_runtime_retractions.log")
    got = summarize(old.batches, old.events)
    assert (got.retraction_events, got.retracted_requests) == (2, 4)
    new = log_of("v0_5_23_runtime_retractions.log")
    got = summarize(new.batches, new.events)
    assert (got.retraction_events, got.retracted_requests, got.handled_ooms) == (2, 3, 1)
    for log in (old, new):
        assert classify(log.events, RunFacts(), log.batches).outcome is Outcome.READY


HANDLED = [
    TP0 + "WARNING: CUDA out of memory while capturing the piecewise graph; falling back to eager",
    "WARNING 12-03 10:00:00 [cuda.py:120] CUDA out of memory in the autotuner, falling back",
    TP0 + "[CudaGraph][dedup] DecodeCudaGraphRunner init failed (CUDA out of memory. Tried to "
    "allocate 64.00 MiB. GPU 0 has a total capacity of 94.97 GiB); using plain executables.",
    TP0 + "retry() failed once (0th try, maximum 3 retries). Will delay 2.00s and retry. Error: "
    "CUDA error: out of memory",
    TP0 + "CUDA VMM fabric backing unavailable on device 0; trying fallback: "
    "CUDA_ERROR_OUT_OF_MEMORY",
    "[W1203 10:00:00.123456789 CUDAGuardImpl.h:119] Warning: CUDA warning: out of memory "
    "(function destroyEvent)",
]


@pytest.mark.parametrize("line", HANDLED)
def test_a_handled_out_of_memory_fallback_is_not_a_death(line: str) -> None:
    assert event(line).kind is Kind.OOM_HANDLED
    log = parse_text(READY + DECODE + line + "\n")
    assert classify(log.events, RunFacts(), log.batches).outcome is Outcome.READY
    assert summarize(log.batches, log.events).handled_ooms == 1


ROUTINE = [
    TP0 + "Scheduler watchdog timeout (self.watchdog_timeout=30, self.soft=True)",
    MAIN + "DetokenizerManager watchdog timeout (self.watchdog_timeout=30, self.soft=True)",
    TP0 + "Not enough host memory for request 3ce84ffb82764f45b028dd8e6c4beed1",
]
"""Lines SGLang prints and goes on serving after (0.5.23's source): a soft watchdog only dumps
(`utils/watchdog.py`, SIGQUIT is the hard one's); a disaggregated decode server that finds no
host room to offload one request's KV skips that offload (`decode_kvcache_offload_manager.py`)."""


@pytest.mark.parametrize("line", ROUTINE)
def test_a_line_sglang_serves_on_after_is_not_a_death(line: str) -> None:
    assert parse_line(line) is None
    log = parse_text(READY + DECODE + line + "\n" + DECODE)
    assert classify(log.events, RunFacts(), log.batches).outcome is Outcome.READY


def test_the_hard_watchdog_of_0_5_23_is_a_hang() -> None:
    line = TP0 + "Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)"
    assert event(line).kind is Kind.WATCHDOG_TIMEOUT


@pytest.mark.parametrize(
    ("line", "cause"),
    [
        # A raised exception is never handled, whatever words it carries.
        (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB instead",
            "torch_oom",
        ),
        (TP0 + "Decode out of memory. Try to lower your batch size.", "decode_oom"),
        (TP0 + "Prefill out of memory. Try to lower your batch size.", "prefill_oom"),
        ("gpu-box:123:456 [0] NCCL WARN Cuda failure 2 'out of memory'", "oom"),
        # 0.5.9 raises here (`ScheduleBatch.retract_decode`) and the scheduler dies.
        (
            "ValueError: Out of memory even after retracting all other requests in the decode "
            "batch.",
            "retract_oom",
        ),
        # Before that, the same corner of `retract_decode` was an assert (sgl-project/sglang#14948,
        # PD decode with a 128K request), and the SWA pool's variant of it.
        (
            "AssertionError: No space left for only one request, "
            "self.token_to_kv_pool_allocator.available_size()=0",
            "retract_oom",
        ),
        (
            "AssertionError: No space left for only one request in SWA mode "
            "full_available_size=0, swa_available_size=812",
            "retract_oom",
        ),
        # 0.5.23 fails the request with the OOM error and serves on: still the parameters' OOM.
        (TP0 + "retract_decode: aborted last request 7c1e due to OOM", "request_oom_abort"),
    ],
)
def test_deaths_and_oom_errors_stay_ooms(line: str, cause: str) -> None:
    log = parse_text(READY + DECODE + line + "\n")
    verdict = classify(log.events, RunFacts(), log.batches)
    assert (verdict.outcome, verdict.cause) == (Outcome.RUNTIME_OOM, cause)
    assert verdict.evidence[0] == line.strip()


def test_a_dying_schedulers_torch_oom_traceback_is_an_oom() -> None:
    """`Scheduler hit an exception` followed by a traceback that ends in torch's OOM."""
    log = parse_text(READY + DECODE + CRASH.replace(CRASH.split("\n")[3], OOM.strip()))
    verdict = classify(log.events, RunFacts(exited=True, exit_code=-9), log.batches)
    assert (verdict.outcome, verdict.cause) == (Outcome.RUNTIME_OOM, "torch_oom")


def test_sglang_waiting_for_a_port_is_not_a_death() -> None:
    for line in (
        MAIN + "Port 30001 is already in use, trying port 30002",
        MAIN + "port 30001 is in use. Waiting for 15 seconds for port_base to be available. "
        "port_base is used by a process already.",
        MAIN + "The port 30001 is in use, but we could not find the process that uses it.",
    ):
        assert event(line).kind is Kind.PORT_WAIT
        assert classify(parse_text(READY + line + "\n").events, RunFacts()).outcome is Outcome.READY


# -- 2. The line that explains the death ----------------------------------------------------------

MACHINE_LINES = [
    (
        MAIN + "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', "
        "30000): address already in use",
        Kind.PORT_IN_USE,
    ),
    (MAIN + "[Errno 98] Address already in use", Kind.PORT_IN_USE),  # 0.5.23 reuse-port socket
    ("OSError: [Errno 98] Address already in use", Kind.PORT_IN_USE),
    (
        "ValueError: nccl_port at 30010 is not available in 30 seconds. nccl_port at 30010 is "
        "not available",
        Kind.PORT_IN_USE,
    ),
    (
        "torch.distributed.DistNetworkError: The server socket has failed to listen on any local "
        "network address. port: 29500, useIpv6: false, code: -98, name: EADDRINUSE, message: "
        "address already in use",
        Kind.PORT_IN_USE,
    ),
    ("OSError: [Errno 28] No space left on device", Kind.DISK_FULL),
    (
        "Exception: Capture cuda graph failed: [Errno 28] No space left on device: "
        "'/cache/triton/fused_moe_kernel.cubin'",
        Kind.DISK_FULL,
    ),
    ("OSError: [Errno 122] Disk quota exceeded", Kind.DISK_FULL),
    ("RuntimeError: CUDA error: uncorrectable ECC error encountered", Kind.GPU_FAULT),
    ("RuntimeError: CUDA error: unknown error", Kind.GPU_FAULT),
    ("RuntimeError: CUDA error: no CUDA-capable device is detected", Kind.GPU_FAULT),
    ("RuntimeError: No CUDA GPUs are available", Kind.GPU_FAULT),
    ("RuntimeError: Found no NVIDIA driver on your system.", Kind.GPU_FAULT),
    ("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.", Kind.GPU_FAULT),
    ("OSError: [Errno 24] Too many open files", Kind.HOST_FAULT),
    ("OSError: [Errno 5] Input/output error", Kind.HOST_FAULT),
    (
        "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, "
        "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5",
        Kind.NCCL_FAULT,
    ),
    (
        "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, remote "
        "process exited or there was a network error, NCCL version 2.21.5",
        Kind.NCCL_FAULT,
    ),
    # gloo's TCP transport under the graph capture's CPU-group collectives (custom all-reduce's
    # `register_graph_buffers`): a peer that never answered (sgl-project/sglang#5883, two nodes)
    # or closed its connection (#4205); the capture only wraps it
    (
        "Exception: Capture cuda graph failed: [/pytorch/third_party/gloo/gloo/transport/tcp/"
        "unbound_buffer.cc:133] Timed out waiting 1800000ms for send operation to complete",
        Kind.NCCL_FAULT,
    ),
    (
        "Exception: Capture cuda graph failed: [../third_party/gloo/gloo/transport/tcp/pair.cc:534]"
        " Connection closed by peer [10.0.0.2]:48213",
        Kind.NCCL_FAULT,
    ),
    # NCCL's own network warnings before the scheduler's exception, where NCCL_DEBUG is set: the
    # connection between two nodes (sgl-project/sglang#5594) or a peer that went away
    (
        "h100-15:139:1092 [7] socket.c:485 NCCL WARN socketStartConnect: Connect to "
        "10.0.0.82<38455> failed : Software caused connection abort",
        Kind.NCCL_FAULT,
    ),
    (
        "node-1:4021:4102 [3] NCCL WARN socketProgress: Connection closed by remote peer "
        "node-2<51234>",
        Kind.NCCL_FAULT,
    ),
    (
        "node-1:4021:4102 [3] transport/net_ib.cc:1296 NCCL WARN NET/IB : Got completion from peer "
        "10.0.0.2<40123> with "
        "error 12, opcode 0, len 0, vendor err 129 (Recv)",
        Kind.NCCL_FAULT,
    ),
]


@pytest.mark.parametrize(("line", "kind"), MACHINE_LINES)
def test_a_machine_fault_is_a_machine_error_with_its_line_first(line: str, kind: Kind) -> None:
    assert event(line).kind is kind and kind in MACHINE_KINDS
    text = TP0 + "Scheduler hit an exception: Traceback (most recent call last):\n" + line + "\n"
    text += MAIN + "Received sigquit from a child process. It usually means the child failed.\n"
    log = parse_text(text)
    verdict = classify(log.events, RunFacts(exited=True, exit_code=-9), log.batches)
    assert (verdict.outcome, verdict.cause) == (Outcome.MACHINE_ERROR, str(kind))
    assert verdict.evidence[0] == line.strip()
    assert Outcome.MACHINE_ERROR.requeued and not Outcome.MACHINE_ERROR.is_parameter_result


@pytest.mark.parametrize(
    ("line", "outcome", "cause"),
    [
        # A kernel bug the configuration reaches: the parameters' crash, run again it recurs.
        (
            "RuntimeError: CUDA error: an illegal memory access was encountered",
            Outcome.CRASH,
            "error",
        ),
        ("RuntimeError: CUDA error: device-side assert triggered", Outcome.CRASH, "error"),
        # The host's memory ran out: sized by the parameters (host cache), like the OOM killer.
        ("OSError: [Errno 12] Cannot allocate memory", Outcome.RUNTIME_OOM, "host_enomem"),
        # NCCL's `unhandled cuda error` is an allocation failure inside NCCL, as before.
        (
            "NCCL error: unhandled cuda error, NCCL version 2.21.5",
            Outcome.RUNTIME_OOM,
            "nccl_error",
        ),
    ],
)
def test_parameter_crashes_stay_parameter_results(line: str, outcome: Outcome, cause: str) -> None:
    log = parse_text(READY + DECODE + line + "\n")
    verdict = classify(log.events, RunFacts(exited=True), log.batches)
    assert (verdict.outcome, verdict.cause) == (outcome, cause)


def test_the_tester_s_port_log_names_errno_98_not_the_host_memory_line() -> None:
    """Before: `startup_error` with `Allocating 48.00 GB host memory …` as its evidence."""
    log = log_of("v0_5_9_startup_port_in_use.log")
    facts = RunFacts(exited=True, exit_code=1, notes=("[…] Allocating 48.00 GB host memory",))
    verdict = classify(log.events, facts, log.batches)
    assert (verdict.outcome, verdict.cause) == (Outcome.MACHINE_ERROR, "port_in_use")
    assert "[Errno 98]" in verdict.evidence[0] and "address already in use" in verdict.evidence[0]


def test_disk_full_fixture_is_a_machine_error_not_a_parameter_failure() -> None:
    log = log_of("v0_5_9_runtime_disk_full.log")
    verdict = classify(log.events, RunFacts(exited=True, exit_code=-9), log.batches)
    assert (verdict.outcome, verdict.cause) == (Outcome.MACHINE_ERROR, "disk_full")
    assert verdict.evidence[0].startswith("OSError: [Errno 28] No space left on device")
    assert not verdict.outcome.is_parameter_result


def test_another_ranks_oom_explains_an_nccl_remote_error() -> None:
    remote = MACHINE_LINES[-1][0]
    log = parse_text(READY + DECODE + TP1.replace("TP1", "TP0") + remote + "\n" + OOM)
    assert classify(log.events, RunFacts(exited=True), log.batches).outcome is Outcome.RUNTIME_OOM
    killed = MAIN + "Subprocess scheduler_1 (pid=4242) crashed with exit code -9.\n"
    log = parse_text(READY + DECODE + remote + "\n" + killed)
    verdict = classify(log.events, RunFacts(exited=True), log.batches)
    assert (verdict.outcome, verdict.cause) == (Outcome.RUNTIME_OOM, "host_oom_killer")
    log = parse_text(READY + DECODE + remote + "\n")
    verdict = classify(log.events, RunFacts(exited=True), log.batches)
    assert (verdict.outcome, verdict.cause) == (Outcome.MACHINE_ERROR, "nccl_fault")


def test_a_rank_sigkilled_while_the_kernel_watched_and_named_no_oom_kill_was_killed() -> None:
    """SGLang's watchdog reports a scheduler's -9 and its hint names the OOM killer; read alone,
    the log is a host OOM. Where the harness watched the kernel's OOM killer from the launch
    and it killed nothing meanwhile, the SIGKILL came from outside: `killed`, not a
    parameter result, at startup and while serving alike."""
    remote = MACHINE_LINES[-1][0]
    killed = MAIN + "Subprocess scheduler_3 (pid=13221) crashed with exit code -9.\n"
    for head in (READY + DECODE + remote + "\n", MAIN + "Load weight begin. avail mem=90.00 GB\n"):
        log = parse_text(head + killed)
        facts = RunFacts(exited=True, exit_code=-9, oom_ruled_out=True)
        verdict = classify(log.events, facts, log.batches)
        assert (verdict.outcome, verdict.cause) == (Outcome.KILLED, "signal:SIGKILL")
        assert verdict.evidence[0] == killed.strip() and verdict.evidence[1] == OOM_RULED_OUT
        assert not verdict.outcome.is_parameter_result
        unwatched = classify(log.events, RunFacts(exited=True, exit_code=-9), log.batches)
        assert unwatched.cause == "host_oom_killer"
    # a rank that died otherwise stays what its own line says
    crashed = MAIN + "Subprocess scheduler_3 (pid=13221) crashed with exit code -6.\n"
    log = parse_text(READY + DECODE + crashed)
    verdict = classify(log.events, RunFacts(exited=True, oom_ruled_out=True), log.batches)
    assert (verdict.outcome, verdict.cause) == (Outcome.CRASH, "subprocess_crashed")


# -- 3. The harness's facts: the signal and its sender, the host's state -------------------------


def test_signal_names() -> None:
    assert (signal_name(-9), signal_name(-15), signal_name(0), signal_name(1)) == (
        "SIGKILL",
        "SIGTERM",
        "",
        "",
    )
    assert signal_name(None) == ""


def test_sigkill_from_outside_with_no_failure_line_is_killed() -> None:
    log = log_of("v0_5_9_kimi_tp8_eagle3.log")
    facts = RunFacts(exited=True, exit_code=-9, sender="outside", notes=("last line",))
    verdict = classify(log.events, facts, log.batches)
    assert (verdict.outcome, verdict.cause) == (Outcome.KILLED, "signal:SIGKILL")
    assert "SIGKILL" in verdict.evidence[0] and "neither by autotune" in verdict.evidence[0]
    assert verdict.outcome.requeued
    # Before, the same death read as the parameters' crash.
    assert classify(log.events, RunFacts(exited=True), log.batches).outcome is Outcome.CRASH


def test_a_bare_error_line_does_not_explain_a_signal_from_outside() -> None:
    """A handled request error (uvicorn's `Exception in ASGI application`) before the kill."""
    log = log_of("stopped_after_serving.log")
    events = [e for e in log.events if e.kind is not Kind.SIGTERM_RECEIVED]
    facts = RunFacts(exited=True, exit_code=-9, sender="outside")
    assert classify(events, facts, log.batches).outcome is Outcome.KILLED


def test_sigkill_after_a_scheduler_exception_is_the_crash() -> None:
    """SGLang SIGKILLs its own tree after a failure (`kill_process_tree`): the log decides."""
    log = log_of("runtime_crash.log")
    for sender in ("outside", ""):
        facts = RunFacts(exited=True, exit_code=-9, sender=sender)
        verdict = classify(log.events, facts, log.batches)
        assert (verdict.outcome, verdict.cause) == (Outcome.CRASH, "error"), sender
        assert "illegal memory access" in verdict.evidence[0]
    log = parse_text(READY + DECODE + OOM)
    facts = RunFacts(exited=True, exit_code=-9, sender="outside")
    assert classify(log.events, facts, log.batches).outcome is Outcome.RUNTIME_OOM


def test_sigterm_from_outside_is_killed() -> None:
    """SGLang logged `SIGTERM received` before autotune began any stop: it drains and requests
    fail with 503 (before: `ok`, or `stopped`)."""
    log = log_of("stopped_after_serving.log")
    sigterm = next(e for e in log.events if e.kind is Kind.SIGTERM_RECEIVED)
    for facts in (
        RunFacts(exited=True, exit_code=0),  # 0.5.23 drains and exits 0
        RunFacts(exited=True, exit_code=-9, sender="outside"),  # 0.5.9 SIGKILLs itself after
        RunFacts(),  # still draining, seen by the live checks
        RunFacts(exited=True, stopped_by_us=True, stop_line=sigterm.line_no + 3),  # stop later
    ):
        verdict = classify(log.events, facts, log.batches)
        assert (verdict.outcome, verdict.cause) == (Outcome.KILLED, "signal:SIGTERM"), facts
        assert verdict.evidence[0] == sigterm.text.strip()
    # Our own stop's SIGTERM, and a log read with no facts, stay a stop.
    ours = RunFacts(exited=True, stopped_by_us=True, stop_line=sigterm.line_no - 1)
    assert classify(log.events, ours, log.batches).outcome is Outcome.STOPPED
    mine = RunFacts(exited=True, exit_code=-15, sender="autotune")
    assert classify(log.events, mine, log.batches).outcome is Outcome.STOPPED
    assert classify(log.events, batches=log.batches).outcome is Outcome.STOPPED


def test_failure_lines_after_a_foreign_sigterm_are_its_noise_but_ooms_are_not() -> None:
    sigterm = (
        MAIN + "SIGTERM received. signum=15 frame=None. Draining requests and shutting down...\n"
    )
    noise = (
        TP0 + "Scheduler hit an exception: Traceback (most recent call last):\nKeyboardInterrupt\n"
    )
    log = parse_text(READY + DECODE + sigterm + noise)
    assert classify(log.events, RunFacts(exited=True), log.batches).outcome is Outcome.KILLED
    log = parse_text(READY + DECODE + sigterm + OOM)
    assert classify(log.events, RunFacts(exited=True), log.batches).outcome is Outcome.RUNTIME_OOM
    crash_first = parse_text(READY + DECODE + CRASH + sigterm)
    verdict = classify(crash_first.events, RunFacts(exited=True), crash_first.batches)
    assert verdict.outcome is Outcome.CRASH


GROUP_SIGTERM = (
    MAIN + "SIGTERM received. signum=15 frame=None. Draining requests and shutting down...\n"
    + MAIN + "Subprocess scheduler_0 (pid=14599) crashed with exit code -15. Triggering SIGQUIT "
    "for cleanup...\n"
    + MAIN + "SIGQUIT received. signum=None, frame=None. It usually means one child failed.\n"
)  # fmt: skip
"""A SIGTERM to the whole process group (`systemctl stop`, `kill -- -PGID`) on 0.5.23: the
tokenizer manager logs it, each scheduler dies of it (it has no handler), and the subprocess
watchdog reports that exit (`utils/watchdog.py`) and sends SIGQUIT."""


def test_a_stop_of_the_whole_process_group_read_from_its_log_is_a_stop() -> None:
    """Read after the fact (`autotune ledger`, `init --from-log`) it was `crash
    (subprocess_crashed)`, and init set aside a good log."""
    log = parse_text(READY + DECODE + GROUP_SIGTERM)
    verdict = classify(log.events, batches=log.batches)
    assert (verdict.outcome, verdict.cause) == (Outcome.STOPPED, "sigterm")
    # an OOM while it drains is still the parameters'
    log = parse_text(READY + DECODE + GROUP_SIGTERM + OOM)
    assert classify(log.events, batches=log.batches).outcome is Outcome.RUNTIME_OOM


def test_a_scheduler_ended_by_a_stop_signal_is_killed_not_a_crash() -> None:
    """A scheduler SIGTERMed on its own (no `SIGTERM received` from the main process): someone
    stopped it; a segfault's -11 stays the rank's own crash."""
    alone = "".join(line + "\n" for line in GROUP_SIGTERM.splitlines()[1:])
    for facts in (None, RunFacts(exited=True, exit_code=-9)):
        log = parse_text(READY + DECODE + alone)
        verdict = classify(log.events, facts, log.batches)
        assert (verdict.outcome, verdict.cause) == (Outcome.KILLED, "signal:SIGTERM")
        assert not verdict.outcome.is_parameter_result
    log = parse_text(READY + DECODE + alone.replace("code -15", "code -11"))
    assert classify(log.events, batches=log.batches).outcome is Outcome.CRASH


def test_the_oom_killer_is_the_host_oom_rule() -> None:
    serving = log_of("v0_5_9_kimi_tp8_eagle3.log")
    facts = RunFacts(
        exited=True, exit_code=-9, sender="oom_killer", notes=("Killed process 48211 (python)",)
    )
    verdict = classify(serving.events, facts, serving.batches)
    assert (verdict.outcome, verdict.cause) == (Outcome.RUNTIME_OOM, "host_oom_killer")
    assert "OOM killer" in verdict.evidence[0] and verdict.evidence[1] == facts.notes[0]
    assert verdict.outcome.is_parameter_result
    start = log_of("startup_in_progress.log")
    verdict = classify(start.events, facts, start.batches)
    assert (verdict.outcome, verdict.cause) == (Outcome.STARTUP_OOM, "host_oom_killer")


def test_our_stop_with_sigkill_is_a_stop() -> None:
    log = log_of("v0_5_9_kimi_tp8_eagle3.log")
    facts = RunFacts(exited=True, exit_code=-9, sender="autotune", stop_line=52)
    assert classify(log.events, facts, log.batches).outcome is Outcome.STOPPED


@pytest.mark.parametrize(
    ("host", "cause"),
    [
        (("disk full: 0 B free on /results",), "disk_full"),
        (("the disk under /results/t is full: 0.0 MiB free of 300 MiB",), "disk_full"),
        (("port 30000 is held by pid 123 (nginx)",), "port_in_use"),
        (
            ("the server's log /r/server.log cannot be written: Operation not permitted",),
            "log_unwritable",
        ),
        (("GPU 0 reports Xid 79",), "host_state"),
    ],
)
def test_the_host_state_explains_a_death_the_log_does_not(
    host: tuple[str, ...], cause: str
) -> None:
    start = log_of("startup_in_progress.log")
    for facts in (
        RunFacts(exited=True, exit_code=1, host=host, notes=("last line",)),
        RunFacts(stalled="weight_load", host=host),
        RunFacts(timed_out="startup", host=host),
    ):
        verdict = classify(start.events, facts, start.batches)
        assert (verdict.outcome, verdict.cause) == (Outcome.MACHINE_ERROR, cause), facts
        assert verdict.evidence[0] == host[0]


def test_the_host_state_never_beats_the_log_or_a_clean_stop() -> None:
    host = ("disk full: 0 B free on /results",)
    crash = log_of("runtime_crash.log")
    facts = RunFacts(exited=True, exit_code=-9, host=host)
    assert classify(crash.events, facts, crash.batches).outcome is Outcome.CRASH
    served = log_of("v0_5_9_kimi_tp8_eagle3.log")
    stop = RunFacts(exited=True, stopped_by_us=True, stop_line=52, host=host)
    assert classify(served.events, stop, served.batches).outcome is Outcome.STOPPED
    alive = RunFacts(host=host)
    assert classify(served.events, alive, served.batches).outcome is Outcome.READY
    # With a machine fault in the log, the host's lines follow the log's.
    port = log_of("v0_5_9_startup_port_in_use.log")
    facts = RunFacts(exited=True, exit_code=1, host=("port 30000 is held by pid 123 (nginx)",))
    verdict = classify(port.events, facts, port.batches)
    assert verdict.outcome is Outcome.MACHINE_ERROR and "[Errno 98]" in verdict.evidence[0]
    assert verdict.evidence[-1] == facts.host[0]


def test_the_host_running_out_of_ram_pushes_the_search_to_a_smaller_host_cache() -> None:
    """`[Errno 12] Cannot allocate memory` is the host cache's, like the OOM killer's -9."""
    log = parse_text(READY + DECODE + "OSError: [Errno 12] Cannot allocate memory\n")
    verdict = classify(log.events, RunFacts(exited=True), log.batches)
    reason = f"{verdict.outcome} ({verdict.cause}): {verdict.evidence[0]}"
    assert push_of(str(verdict.outcome), reason) is Push.SHRINK_HOST
    machine = classify(parse_text(READY + "OSError: [Errno 28] No space left on device\n").events)
    assert push_of(str(machine.outcome), f"{machine.outcome} ({machine.cause})") is Push.NONE


_SEGFAULT = (
    "Fatal Python error: Segmentation fault\n\n"
    "Thread 0x00007f3b2e7fc640 (most recent call first):\n"
    '  File "/sgl/srt/model_executor/model_runner.py", line 2467 in forward\n'
    '  File "/sgl/srt/managers/scheduler.py", line 1207 in event_loop_overlap\n\n'
)
_PEERS = "".join(
    f"[2026-11-20 14:05:00 TP{r}] Scheduler watchdog timeout (self.watchdog_timeout=300, "
    "self.soft=False)\n"
    for r in range(7)
)
_QUIT = MAIN + "SIGQUIT received. signum=None, frame=None. It usually means one child failed.\n"


@pytest.mark.parametrize(
    "after",
    [
        _PEERS + _QUIT,  # 0.5.9: the peers wait in the collective until their watchdogs
        MAIN + "Subprocess scheduler_7 (pid=4242) crashed with exit code -11. Triggering "
        "SIGQUIT for cleanup...\n" + _QUIT,  # 0.5.23's SubprocessWatchdog
    ],
    ids=["0.5.9-peers-watchdog", "0.5.23-subprocess-watchdog"],
)
def test_a_rank_s_own_crash_explains_its_peers_hang(after: str) -> None:
    """One rank segfaults (faulthandler's lines, no traceback, no SIGQUIT of its own); its peers'
    watchdog timeouts, or the SubprocessWatchdog's report, follow. The rank's crash is the
    verdict, not the hang it caused."""
    parsed = parse_text(READY + DECODE + _SEGFAULT + after)
    verdict = classify(parsed.events, RunFacts(exited=True, exit_code=-9), parsed.batches)
    assert (verdict.outcome, verdict.cause) == (Outcome.CRASH, "fatal_signal"), verdict
    assert verdict.evidence[0] == "Fatal Python error: Segmentation fault"
    kinds = {e.kind for e in parsed.events}
    assert Kind.FATAL_SIGNAL in FAILURE_KINDS and Kind.SERVING_FRAME in kinds


def test_a_crash_at_startup_is_a_startup_error_and_an_abort_is_not_a_crash() -> None:
    """Before "fired up" the same crash is the start's (`startup_error`). `Fatal Python error:
    Aborted` is what NCCL's and torch's watchdogs end a process with on purpose: not read, so
    the peers' watchdog timeouts decide (`hang`)."""
    early = parse_text(_SEGFAULT.replace(" in event_loop_overlap", " in __init__") + _QUIT)
    verdict = classify(early.events, RunFacts(exited=True, exit_code=-9), early.batches)
    assert (verdict.outcome, verdict.cause) == (Outcome.STARTUP_ERROR, "fatal_signal")
    aborted = parse_text(READY + DECODE + _SEGFAULT.replace("Segmentation fault", "Aborted")
                         + _PEERS + _QUIT)  # fmt: skip
    verdict = classify(aborted.events, RunFacts(exited=True, exit_code=-9), aborted.batches)
    assert (verdict.outcome, verdict.cause) == (Outcome.HANG, "watchdog_timeout")


_OLD_WATCHDOG = "".join(
    f"[2025-03-09 00:57:15 TP{r}] Watchdog timeout (self.watchdog_timeout=300)\n" for r in (4, 6, 1)
)


def test_the_scheduler_s_own_watchdog_line_of_earlier_releases_is_a_hang() -> None:
    """Before the watchdog class, the scheduler's thread printed `Watchdog timeout
    (self.watchdog_timeout=300)` on each rank and sent its parent SIGQUIT; the main process
    then said `Received sigquit from a child proces.` (0.4.x's spelling)."""
    quit_line = (
        "[2025-03-09 00:57:20] Received sigquit from a child proces. It usually means the "
        "child failed.\n"
    )
    assert event(quit_line.rstrip("\n")).kind is Kind.SIGQUIT
    parsed = parse_text(_OLD_WATCHDOG + quit_line + "Killed\n")
    assert [e.kind for e in parsed.events] == [Kind.WATCHDOG_TIMEOUT] * 3 + [Kind.SIGQUIT]
    verdict = classify(parsed.events, batches=parsed.batches)
    assert (verdict.outcome, verdict.cause) == (Outcome.HANG, "watchdog_timeout")
    assert verdict.evidence[0] == "[2025-03-09 00:57:15 TP4] Watchdog timeout " + (
        "(self.watchdog_timeout=300)"
    )


def test_the_old_watchdog_line_after_access_lines_is_read_without_the_start() -> None:
    """An excerpt of a serving server: uvicorn's access lines, then one rank's watchdog."""
    parsed = parse_text(
        '[2025-08-02 19:24:26] INFO:     172.16.19.148:37398 - "POST /v1/completions HTTP/1.1"'
        " 200 OK\n"
        "[2025-08-02 19:24:30 TP3] Watchdog timeout (self.watchdog_timeout=300)\n"
    )
    verdict = classify(parsed.events, batches=parsed.batches)
    assert (verdict.outcome, verdict.cause) == (Outcome.HANG, "watchdog_timeout")


@pytest.mark.parametrize(
    ("facts", "outcome", "cause"),
    [
        (RunFacts(exited=True, exit_code=0), Outcome.KILLED, "clean_exit"),
        (RunFacts(exited=True, exit_code=1), Outcome.CRASH, "exited_after_ready"),
        (RunFacts(exited=True, exit_code=0, stopped_by_us=True), Outcome.STOPPED, "stopped"),
    ],
    ids=["exit-0-by-itself", "exit-1-silent", "exit-0-our-stop"],
)
def test_a_ready_server_that_exits_0_by_itself_was_stopped_from_outside(
    facts: RunFacts, outcome: Outcome, cause: str
) -> None:
    """SGLang exits 0 only when told to stop: a ready server's exit 0 with no failure line, no
    signal and no stop of ours is `killed` (its point runs again), not the parameters' crash; a
    silent non-zero exit stays a crash."""
    log = parse_text(READY + DECODE)
    verdict = classify(log.events, facts, log.batches)
    assert (verdict.outcome, verdict.cause) == (outcome, cause)
    if outcome is Outcome.KILLED:
        assert verdict.evidence[0].startswith("the server's main process exited 0 by itself")
        assert verdict.outcome.requeued and not verdict.outcome.is_parameter_result


def test_an_exit_0_during_startup_stays_a_startup_error() -> None:
    log = parse_text(MAIN + "Load weight begin. avail mem=90.00 GB\n")
    verdict = classify(log.events, RunFacts(exited=True, exit_code=0), log.batches)
    assert (verdict.outcome, verdict.cause) == (Outcome.STARTUP_ERROR, "exited_during_startup")


def test_a_profiled_pool_at_or_below_zero_is_no_room_for_the_kv_pool() -> None:
    """0.4.x prints the cap warning with the profiled pool, then raises `Not enough memory` when
    it is not above zero: a log cut between the two still shows the weights left no room."""
    start = TP0 + "Load weight end. type=DeepseekV3ForCausalLM, avail mem=21.73 GB\n"
    line = TP0 + "max_total_tokens=131072 is larger than the profiled value -561981. Use the "
    line += "profiled value instead."
    assert event(line).kind is Kind.NO_KV_ROOM
    verdict = classify(parse_text(start + line + "\n").events)
    assert (verdict.outcome, verdict.cause) == (Outcome.STARTUP_OOM, "no_kv_room")
    assert verdict.evidence[0] == line.strip()
    capped = line.replace("-561981", "96000")
    assert event(capped).kind is Kind.KV_CAP_IGNORED
    assert classify(parse_text(start + capped + "\n").events).outcome is Outcome.UNKNOWN


def test_an_exception_in_model_tp_server_is_the_scheduler_s_exception() -> None:
    """0.2.x–0.3.x's `ModelTpServer.exposed_step` logs `Exception in ModelTpServer:` and the
    traceback, then raises (the older `Scheduler hit an exception`). A 0.2.15 TP2 excerpt with an
    fp8_e5m2 KV cache, cut inside the prefill: a log SGLang wrote, and a crash while serving."""
    log = parse_text(
        "[14:47:01 TP0] Exception in ModelTpServer:\n"
        "Traceback (most recent call last):\n"
        '  File "/usr/local/lib/python3.10/dist-packages/sglang/srt/managers/tp_worker.py", '
        "line 244, in exposed_step\n"
        "    self.forward_step()\n"
        '  File "/usr/local/lib/python3.10/dist-packages/sglang/srt/managers/tp_worker.py", '
        "line 507, in forward_prefill_batch\n"
        "    sample_output, logits_output = s\n"
    )
    assert log.events[0].kind is Kind.SCHEDULER_EXCEPTION and log.events[0].rank == "TP0"
    verdict = classify(log.events, batches=log.batches)
    assert (verdict.outcome, verdict.cause) == (Outcome.CRASH, "scheduler_exception")


NCCL_TIMEOUT = (
    "[rank1]:[E725 07:53:08.217000 412 ProcessGroupNCCL.cpp:632] [PG ID 2 PG GUID 3 Rank 1] "
    "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=8112, OpType=ALLREDUCE, "
    "NumelIn=7168, NumelOut=7168, Timeout(ms)=600000) ran for 600084 milliseconds before "
    "timing out."
)


def test_a_collective_that_timed_out_is_a_hang_unless_a_rank_s_own_death_explains_it() -> None:
    """torch's NCCL watchdog line is a hang, as SGLang's own watchdog timeout is: not the
    parameters' result; a rank's OOM in the same log is the death that explains it."""
    log = parse_text(READY + DECODE + NCCL_TIMEOUT + "\n")
    verdict = classify(log.events, RunFacts(exited=True, exit_code=-6), log.batches)
    assert (verdict.outcome, verdict.cause) == (Outcome.HANG, "watchdog_timeout")
    assert verdict.evidence[0] == NCCL_TIMEOUT
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    log = parse_text(READY + DECODE + oom + "\n" + NCCL_TIMEOUT + "\n")
    verdict = classify(log.events, RunFacts(exited=True, exit_code=-6), log.batches)
    assert (verdict.outcome, verdict.cause) == (Outcome.RUNTIME_OOM, "torch_oom")


def test_a_stall_of_processes_stopped_from_outside_is_killed_not_a_hang() -> None:
    """A serving stall whose server processes were stopped by a signal (state T: SIGSTOP,
    SIGTSTP) is a death from outside, queued again; the same stall otherwise is the
    server's hang."""
    log = parse_text(READY + DECODE)
    note = "no answer to the workload for 3.1 s …; pid 7 stopped by a signal from outside"
    stopped = classify(log.events, RunFacts(stalled="serving", sender="outside", notes=(note,)))
    assert (stopped.outcome, stopped.cause) == (Outcome.KILLED, "signal:stopped")
    assert stopped.evidence == (note,) and stopped.outcome.requeued
    hung = classify(log.events, RunFacts(stalled="serving", notes=(note,)))
    assert (hung.outcome, hung.cause) == (Outcome.HANG, "stall:serving")
