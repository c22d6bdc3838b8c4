"""Failure text in an SGLang log -> events: out-of-memory in every form (torch, CUDA, Triton,
cuBLAS, NCCL, SGLang's allocators) and whether it was handled, the machine's faults (a port in
use, a full disk, a GPU or driver fault, the host's limits, NCCL), SGLang's own fatal messages,
the last line of a traceback and the frames of the serving loop.

Kept apart from the startup messages (`logparse.messages`) because failures are read wherever
they sit in a line (tracebacks carry no prefix), by what they contain rather than how they
begin; which of them end a run is `events.FAILURE_KINDS`.
"""

from __future__ import annotations

import re

from autotune.logparse.events import MACHINE_KINDS, Ctx, Event, Kind

NUM = r"(-?\d+(?:\.\d+)?)"
"""A number as SGLang logs it, as one capture group."""
_HOST_REQUEST = re.compile(r"Requesting " + NUM + " GB but only have " + NUM + " GB free")
_TRIED = re.compile(r"Tried to allocate " + NUM + r" ?(GiB|MiB|KiB|B)")
EXIT_CODE = re.compile(r"exit code(?::| | is) ?(-?\d+)", re.I)
"""An exit code in a message (`exit code: 1`, `exit code is -9`)."""
_VERSION = re.compile(r"\bsglang(?:\s+version)?\s*(?:==|:|=|-|\s)\s*v?(\d+)\.(\d+)\.(\d+)", re.I)

_SERVING_FRAMES = (
    "in event_loop",
    "in run_event_loop",
    "in dispatch_event_loop",
    "in run_batch",
    "in forward_batch_generation",
    "in forward_thread_func",
    "in process_batch_result",
    "in get_next_batch_to_run",
    "in process_input_requests",
    "in get_new_batch_prefill",
    "in _get_new_batch_prefill_raw",
    "in update_running_batch",
    "in get_ready_grammar_requests",
    "in move_ready_grammar_requests",
    "in exposed_step",
    "in get_model_worker_batch",
)
"""Traceback frames of the scheduler's serving loop and forward pass (`event_loop_overlap`,
`event_loop_normal`, `event_loop_pp`, …; 0.5.18+'s `run_event_loop` and `dispatch_event_loop`,
which `run_scheduler_process` calls only once the scheduler sent its init info, graph capture and
warm-ups done; `run_batch`, `forward_batch_generation`; the steps that build a batch from the
requests received: `process_input_requests`, `get_new_batch_prefill` and its
`_get_new_batch_prefill_raw`, the grammar queue's `get_ready_grammar_requests` (earlier
`move_ready_grammar_requests`), `update_running_batch`; the overlap worker's
`forward_thread_func` in releases that had one; 0.2.x–0.3.x's `ModelTpServer.exposed_step`, the
step the controller calls for each batch; `ScheduleBatch.get_model_worker_batch`, which only
`run_batch` calls). Startup never runs them: graph capture and profiling
call the model runner directly (and `prepare_for_extend`, which a pipeline's chunk-size
profiling calls at startup, is left out)."""


_ANY_OOM = re.compile(
    r"out of memory|OutOfMemory|OUT_OF_MEMORY|CUBLAS_STATUS_ALLOC_FAILED|"
    r"cudaErrorMemoryAllocation",
    re.I,
)
_NOT_OOM = (
    "to avoid out of memory",  # DeepGEMM warm-up shrinking its shapes (a warning)
    "ran out of GPU memory",  # multimodal preprocessing retried on CPU
)
_REQUEST_LOG = ("Receive: ", "Receive OpenAI: ", "Finish: ", "{")
"""--log-requests lines: they carry prompt text, which may say anything."""


_HANDLED = (
    "falling back",
    "fall back",
    "fallback",
    "retrying",
    "will retry",
    "and retry",
    "skipping",
    "skipped",
    "instead",
    "using plain",
    "disabling",
)
"""Words of a message that ran out of memory and went on: SGLang's handled OOMs say what they
did instead (`[CudaGraph][dedup] … init failed (…); using plain executables.`,
`retry() failed once (…). Will delay … and retry. Error: …`, `CUDA VMM … backing unavailable …;
trying fallback: …`, FlashInfer's `extend autotune skipped`)."""
_WARNING_LEVEL = re.compile(r"WARNING\b|\[W\d{4} ")
"""A message logged at warning level by a logger that prints its level (Python's `logging` with a
level field, torch's C++ `[W1203 10:00:00.123 file.cpp:119] Warning: …`); NCCL's `NCCL WARN` is
its error level and is not one of these."""


def _handled(line: str) -> bool:
    """An out-of-memory message that SGLang (or torch) logged and recovered from: never a
    traceback's exception line (that one was raised), but a warning or a line saying what it did
    instead."""
    if _looks_like_exception(line):
        return False
    if _WARNING_LEVEL.match(line) or "UserWarning" in line or "RuntimeWarning" in line:
        return True
    low = line.lower()
    return any(cue in low for cue in _HANDLED)


def _oom(line: str, ctx: Ctx) -> Event | None:
    """Any line that reports running out of GPU memory: torch, the CUDA runtime or driver,
    Triton, cuBLAS, NCCL, SGLang's token and request-slot allocators. A handled one is
    `Kind.OOM_HANDLED`, a serving event."""
    if "Out of memory even after retracting" in line:
        # 0.5.9 raises it (`ValueError`, `ScheduleBatch.retract_decode`): the scheduler dies.
        # 0.5.23 fails that one request with it (HTTP 500) and keeps serving.
        oom = Kind.RETRACT_OOM if _looks_like_exception(line) else Kind.REQUEST_OOM_ABORT
        return Event(oom, *ctx)
    if any(benign in line for benign in _NOT_OOM):
        return None
    if _handled(line):
        return Event(Kind.OOM_HANDLED, *ctx)
    if "Tried to allocate" in line and "out of memory" in line:
        m = _TRIED.search(line)
        values = {}
        if m:
            scale = {"GiB": 1.0, "MiB": 1 / 1024, "KiB": 1 / 1024**2, "B": 1 / 1024**3}
            values = {"tried_gib": float(m.group(1)) * scale[m.group(2)]}
        kind = Kind.GRAPH_CAPTURE_FAILED if "Capture" in line else Kind.TORCH_OOM
        return Event(kind, *ctx, values)
    if "Capture" in line and "graph failed" in line:
        return wrapped_fault(line, ctx) or Event(Kind.GRAPH_CAPTURE_FAILED, *ctx)
    if "Prefill out of memory" in line:
        return Event(Kind.PREFILL_OOM, *ctx)
    if "Decode out of memory" in line:
        return Event(Kind.DECODE_OOM, *ctx)
    if "alloc_req_slots runs out of memory" in line:
        return Event(Kind.REQ_SLOTS_OOM, *ctx)
    if "Out of memory. Try to lower your batch size" in line:
        return Event(Kind.ALLOC_OOM, *ctx)
    if "Triton Error" in line:
        return Event(Kind.TRITON_OOM, *ctx)
    if "CUDA error: out of memory" in line or "CUDA driver error: out of memory" in line:
        return Event(Kind.CUDA_ERROR_OOM, *ctx)
    if "CUDA_ERROR_OUT_OF_MEMORY" in line or "cudaErrorMemoryAllocation" in line:
        return Event(Kind.CUDA_ERROR_OOM, *ctx)
    if "CUDA out of memory" in line or "OutOfMemoryError" in line:
        return Event(Kind.TORCH_OOM, *ctx)
    return Event(Kind.OOM, *ctx)


_FATAL_SIGNALS = (
    "Segmentation fault",
    "Bus error",
    "Floating point exception",
    "Illegal instruction",
)
"""The crashes CPython's faulthandler names in `Fatal Python error: <signal>` (SGLang enables it in
each scheduler, `managers/scheduler.py` `configure_scheduler_process`: `faulthandler.enable()`):
a process that dies so prints no Python traceback and sends its parent no SIGQUIT. `Aborted` is
left out: NCCL's and torch's watchdogs abort a process on purpose after a timeout."""


_OOM_DETAIL = re.compile(r"^(?:Try to allocate \d+ tokens\.$|(?:SWA a|A)vailable [\w ]+: \d+\b)")
"""The lines an allocator's out-of-memory message goes on with (`Kind.OOM_DETAIL`): `Try to
allocate N tokens.` and the pools' `available_and_evictable_str` (0.5.23: `Available tokens: N
(available_size=… + evictable_size=…)`, `UnifiedRadixCache`'s `Available full tokens: N (…)` and
`Available mamba: N (available_size=… + component_evictable_size_=…)` for each other component,
`PureSWARadixCache`'s `SWA available tokens: N (…)`; earlier `Available tokens: N`)."""


def failure(line: str, ctx: Ctx) -> Event | None:
    """Failure text, wherever it sits in the line (tracebacks carry no prefix)."""
    if line.startswith(_REQUEST_LOG):
        return None
    if line.startswith(("Try to allocate ", "Available ", "SWA available ")):
        return Event(Kind.OOM_DETAIL, *ctx) if _OOM_DETAIL.match(line) else None
    if line.startswith("Fatal Python error: "):
        what = line[len("Fatal Python error: ") :].strip()
        return Event(Kind.FATAL_SIGNAL, *ctx, label=what) if what in _FATAL_SIGNALS else None
    if ("emory" in line or "EMORY" in line or "ALLOC_FAILED" in line) and _ANY_OOM.search(line):
        return _oom(line, ctx)
    if "No space left for only one request" in line and _looks_like_exception(line):
        # `ScheduleBatch.retract_decode`'s assert before 0.5.9 made it a `ValueError`: the
        # decode batch is down to one request and the KV pool has no slot left for it.
        return Event(Kind.RETRACT_OOM, *ctx)
    if _MACHINE_HINT.search(line):
        event = _machine(line, ctx)
        if event is not None:
            return event
    if "Not enough memory" in line or "leave no GPU memory for the KV cache" in line:
        return Event(Kind.NO_KV_ROOM, *ctx)
    if "Memory pool size is too small" in line or "max_running_request is zero" in line:
        return Event(Kind.POOL_TOO_SMALL, *ctx)
    if "cannot hold even one request" in line or "state cache is too small to serve" in line:
        return Event(Kind.POOL_TOO_SMALL, *ctx)  # SWA, mamba
    if "Not enough host memory for request " in line:
        # a disaggregated decode server's offload of one request's KV to host finding no room
        # (`DecodeKVCacheOffloadManager.offload_kv_cache`): that request is not offloaded, the
        # server goes on; not the start's host pool running out
        return None
    if "Not enough host memory" in line or "No host memory is left for HiCache" in line:
        m = _HOST_REQUEST.search(line)
        values = {"requested_gb": float(m.group(1)), "free_gb": float(m.group(2))} if m else {}
        return Event(Kind.HOST_MEMORY, *ctx, values)
    if "host memory should be larger than the device memory" in line:
        return Event(Kind.HICACHE_TOO_SMALL, *ctx)
    if "Capture cuda graph failed" in line or ("graph" in line and "graph failed:" in line):
        return wrapped_fault(line, ctx) or Event(Kind.GRAPH_CAPTURE_FAILED, *ctx)
    if "scheduler died during initialization" in line:
        m = EXIT_CODE.search(line)  # the raised RuntimeError, as a traceback's last line
        return Event(Kind.RANK_DEAD, *ctx, {"code": float(m.group(1))} if m else {})
    if "unhandled cuda error" in line:
        return Event(Kind.NCCL_ERROR, *ctx)
    if "Watchdog caught collective operation timeout" in line:
        # torch's ProcessGroupNCCL watchdog: a collective waited past its timeout for a rank
        # that never joined it; a hang like SGLang's own watchdog's, below any rank's own death
        return Event(Kind.WATCHDOG_TIMEOUT, *ctx)
    if "could finish the model loading, but there are other ranks" in line or (
        "reached monitoredBarrier, but received errors" in line
    ):
        # the barrier after the weights load (`load_model_utils.dist_barrier_after_load`, 480 s
        # in 0.5.23) timed out on this rank, which loaded: another rank is slow or gone; its own
        # line, where the log has one, explains it (an OOM ranks above this)
        return Event(Kind.LOAD_BARRIER, *ctx)
    if "memory leak detected!" in line and _looks_like_exception(line):
        # the pools' invariant check in the event loop (`InvariantChecker._report_leak`,
        # `raise_error_or_warn`: a ValueError where `SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE`
        # is on, its default; a warning otherwise, which is not a death)
        return Event(Kind.LEAK_CHECK, *ctx)
    if _looks_like_exception(line) or ": error: " in line:  # the latter: argparse usage errors
        return Event(Kind.ERROR, *ctx)
    v = _VERSION.search(line) if "glang" in line or "GLang" in line or "GLANG" in line else None
    if v is not None:
        return Event(Kind.VERSION, *ctx, label=".".join(v.groups()))
    return None


# Machine faults and the host's memory, each from its own message (see `_machine`).
_MACHINE_HINT = re.compile(
    r"Errno|in use|No space|quota|ECC|NVLink|CUDA|GPU|NVIDIA|NVRM|bus|ncclSystem|ncclRemote|"
    r"system error|remote process|shared memory segment|Cannot allocate memory|not available in|"
    r"gloo|NCCL WARN"
)
_MACHINE: tuple[tuple[Kind, re.Pattern[str]], ...] = (
    (
        Kind.PORT_IN_USE,
        re.compile(
            r"\[Errno 98\]|address already in use|EADDRINUSE|"
            r"error while attempting to bind on address|port at \d+ is not available in \d+ "
            r"seconds|port \S+ is already in use|Port is already in use",
            re.I,
        ),
    ),
    (
        Kind.DISK_FULL,
        re.compile(r"\[Errno 28\]|No space left on device|\[Errno 122\]|Disk quota exceeded"),
    ),
    (
        Kind.HOST_ENOMEM,
        re.compile(r"\[Errno 12\]|Cannot allocate memory"),
    ),
    (
        Kind.GPU_FAULT,
        re.compile(
            r"uncorrectable ECC error|uncorrectable NVLink error|"
            r"CUDA (?:driver )?error: unknown error|no CUDA-capable device is detected|"
            r"No CUDA GPUs are available|CUDA-capable device\(s\) is/are busy or unavailable|"
            r"Found no NVIDIA driver on your system|NVIDIA driver on your system is too old|"
            r"CUDA driver version is insufficient|CUDA error: system not yet initialized|"
            r"fallen off the bus|GPU is lost|NVRM: Xid",
            re.I,
        ),
    ),
    (
        Kind.HOST_FAULT,
        re.compile(r"\[Errno 24\]|Too many open files|\[Errno 5\] Input/output error"),
    ),
    (
        Kind.NCCL_FAULT,
        re.compile(
            r"unhandled system error|ncclSystemError|ncclRemoteError|"
            r"remote process exited or there was a network error|"
            r"Error while creating shared memory segment|"
            # gloo's TCP transport (the CPU group's collectives: custom all-reduce's graph
            # buffers, broadcasts): a peer that closed its connection or never answered
            r"gloo/transport/tcp/|"
            # NCCL's own warnings from its network layer (`socket.c`: `socketStartConnect:
            # Connect to … failed`, `socketProgress: Connection closed by remote peer`; the IB
            # and socket transports): a node's network between the ranks
            r"NCCL WARN (?:socket\w*: |NET/(?:IB|Socket) ?: |Net : )"
        ),
    ),
)
_PORT_WAIT = ("trying port", "Waiting for", "could not find the process that uses it")
"""SGLang waiting for a port (`utils/network.py` `wait_port_available`: `port {p} is in use.
Waiting for {i} seconds …`, `The port {p} is in use, but we could not find the process …`) or
moving to the next one (`Port {p} is already in use, trying port {p+1}`): events, not deaths;
the death is the `… is not available in {n} seconds` it raises after."""


def wrapped_fault(message: str, ctx: Ctx) -> Event | None:
    """The machine fault a failure line carries inside it (`Capture cuda graph failed: [Errno 28]
    No space left on device: …`, from the Triton kernel cache): the fault, not the step that met
    it, explains the death."""
    if not _MACHINE_HINT.search(message):
        return None
    event = _machine(message, ctx)
    return event if event is not None and event.kind in MACHINE_KINDS else None


def _machine(line: str, ctx: Ctx) -> Event | None:
    """A machine fault, or the host's memory running out (`[Errno 12] Cannot allocate memory`,
    `Kind.HOST_ENOMEM`, a memory failure like the OOM killer's), from the message of whoever
    raised it: Python's `OSError` (`[Errno 98] Address already in use`, `[Errno 28] No space
    left on device`), asyncio through uvicorn (`ERROR:    [Errno 98] error while attempting to
    bind on address (…): address already in use`), SGLang's port checks, torch's TCPStore
    (`EADDRINUSE`), the CUDA runtime and driver, NCCL (`unhandled system error`, `remote process
    exited or there was a network error`), gloo's TCP transport (`[…/gloo/transport/tcp/
    unbound_buffer.cc:133] Timed out waiting 1800000ms for send operation to complete`,
    `…/pair.cc:534] Connection closed by peer`)."""
    if "in use" in line and any(wait in line for wait in _PORT_WAIT):
        return Event(Kind.PORT_WAIT, *ctx)
    for kind, pattern in _MACHINE:
        if pattern.search(line):
            return Event(kind, *ctx)
    return None


_EXCEPTION_LINE = re.compile(r"^(?:[\w.]+\.)?\w*(?:Error|Exception)(?::|$)")


def _looks_like_exception(line: str) -> bool:
    """The last line of a Python traceback: `ValueError: …`, `torch.AcceleratorError: …`."""
    return ("Error" in line or "Exception" in line) and bool(_EXCEPTION_LINE.match(line))


_FAULT_FRAME = re.compile(r", line \d+ (in \w+)\s*$")
"""A frame as faulthandler prints it (`  File "…", line N in event_loop_overlap`, no comma)."""


_ALLOCATOR_FRAMES = {
    "alloc_paged_token_slots_extend": Kind.PREFILL_OOM,
    "alloc_paged_token_slots_decode": Kind.DECODE_OOM,
    "alloc_token_slots": Kind.ALLOC_OOM,
    "alloc_req_slots": Kind.REQ_SLOTS_OOM,
}
"""SGLang's KV allocator steps (`mem_cache/allocation.py` in 0.5.23, `mem_cache/common.py`
before) and the out-of-memory error each raises when its pool has no free slots (`Prefill out of
memory. …`, `Decode out of memory. …`, `Out of memory. …`, `alloc_req_slots runs out of
memory. …`): their only raise, so a traceback an excerpt cut after such a frame still names the
pool. Where the message is there, its own line decides (`Kind.ERROR` ranks above the frame)."""


def serving_frame(message: str, ctx: Ctx) -> Event | None:
    """A traceback frame (`  File "…", line N, in event_loop_overlap`, or faulthandler's `…, line
    N in event_loop_overlap`) of the serving loop, or of the KV allocator (`Kind.ALLOC_FRAME`)."""
    at = message.rfind(", in ")
    if at > 0 and message[at + 2 :].startswith(_SERVING_FRAMES):
        return Event(Kind.SERVING_FRAME, *ctx, label=message[at + 5 :].strip())
    if at > 0 and "mem_cache" in message:
        oom = _ALLOCATOR_FRAMES.get(message[at + 5 :].strip())
        if oom is not None:
            return Event(Kind.ALLOC_FRAME, *ctx, label=str(oom))
    fault = _FAULT_FRAME.search(message) if at < 0 else None
    if fault is not None and fault.group(1).startswith(_SERVING_FRAMES):
        return Event(Kind.SERVING_FRAME, *ctx, label=fault.group(1)[3:])
    return None
