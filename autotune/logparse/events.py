"""The vocabulary of a parsed SGLang log: what a recognised line says (`Kind`), the classes of
kinds the verdicts rest on (`FAILURE_KINDS`, `OOM_KINDS`, `MACHINE_KINDS`, `SERVING_KINDS`,
`STARTUP_KINDS`), one recognised line (`Event`), one batch line (`Batch`) and a whole log read
at once (`ParsedLog`).

Kept apart from the readers (`logparse.lines` and the modules it calls) because every consumer
of a parsed log (the ledger, the verdicts, the serving summary, the server's log watch) needs
these types and none of the reading.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import NamedTuple


class Kind(StrEnum):
    """What a recognised non-batch line says."""

    VERSION = "version"
    SERVER_ARGS = "server_args"
    DIST_INIT_BEGIN = "dist_init_begin"
    DIST_INIT_END = "dist_init_end"
    MEMORY_BASELINE = "memory_baseline"
    UNBALANCED_MEMORY = "unbalanced_memory"
    WEIGHT_LOAD_BEGIN = "weight_load_begin"
    WEIGHT_LOAD_END = "weight_load_end"
    WEIGHT_COMMIT = "weight_commit"
    KV_DTYPE = "kv_dtype"
    SWA_POOL = "swa_pool"
    MAMBA_ALLOCATED = "mamba_allocated"
    KV_ALLOCATED = "kv_allocated"
    KV_CAP_IGNORED = "kv_cap_ignored"
    MEMORY_POOL_END = "memory_pool_end"
    GRAPH_CAPTURE_BEGIN = "graph_capture_begin"
    GRAPH_CAPTURING = "graph_capturing"
    GRAPH_BATCH_SIZES = "graph_batch_sizes"
    GRAPH_CAPTURE_END = "graph_capture_end"
    POST_CAPTURE = "post_capture"
    DEEPGEMM_JIT = "deepgemm_jit"
    POOL_BELOW_CONTEXT = "pool_below_context"
    SCHEDULER_SUMMARY = "scheduler_summary"
    MRR_REDUCED = "mrr_reduced"
    MRR_SPEC_RESET = "mrr_spec_reset"
    HOST_HEADROOM = "host_headroom"
    HICACHE_AUTOSIZE = "hicache_autosize"
    HICACHE_SMALLER = "hicache_smaller"
    HOST_CACHE = "host_cache"
    STARTUP_TIMINGS = "startup_timings"
    SERVER_PROCESS = "server_process"
    UVICORN_RUNNING = "uvicorn_running"
    READY = "ready"
    SIGTERM_RECEIVED = "sigterm_received"
    GRACEFUL_EXIT = "graceful_exit"
    RETRACT = "retract"
    OOM_HANDLED = "oom_handled"
    PORT_WAIT = "port_wait"
    SERVING_FRAME = "serving_frame"
    ALLOC_FRAME = "alloc_frame"
    """A traceback frame of SGLang's KV allocator (`mem_cache/allocation.py`: `in
    alloc_paged_token_slots_extend`, …), whose only raise is its out-of-memory error: where an
    excerpt cut the message, the frame says which pool ran out (its label: the OOM kind)."""
    RELEASE_LINE = "release_line"
    OOM_DETAIL = "oom_detail"
    """A line of an allocator's out-of-memory message after its first (`mem_cache/allocation.py`:
    `Try to allocate N tokens.`, then the pools' `Available tokens: …`, `Available full tokens:
    …`, `Available mamba: …`, `SWA available tokens: …`), printed without a prefix: no failure of
    its own, the evidence of the one above it."""
    HEALTH_CHECK_FAILED = "health_check_failed"
    # Failure lines.
    NO_KV_ROOM = "no_kv_room"
    POOL_TOO_SMALL = "pool_too_small"
    GRAPH_CAPTURE_FAILED = "graph_capture_failed"
    HOST_MEMORY = "host_memory"
    TORCH_OOM = "torch_oom"
    CUDA_ERROR_OOM = "cuda_error_oom"
    TRITON_OOM = "triton_oom"
    PREFILL_OOM = "prefill_oom"
    DECODE_OOM = "decode_oom"
    ALLOC_OOM = "alloc_oom"
    REQ_SLOTS_OOM = "req_slots_oom"
    RETRACT_OOM = "retract_oom"
    REQUEST_OOM_ABORT = "request_oom_abort"
    OOM = "oom"
    HOST_ENOMEM = "host_enomem"
    SCHEDULER_EXCEPTION = "scheduler_exception"
    SIGQUIT = "sigquit"
    RANK_DEAD = "rank_dead"
    SUBPROCESS_CRASHED = "subprocess_crashed"
    WATCHDOG_TIMEOUT = "watchdog_timeout"
    LOAD_BARRIER = "load_barrier"
    LEAK_CHECK = "memory_leak_check"
    FATAL_SIGNAL = "fatal_signal"
    WARMUP_FAILED = "warmup_failed"
    HICACHE_TOO_SMALL = "hicache_too_small"
    EXIT_CODE = "exit_code"
    NCCL_ERROR = "nccl_error"
    # Machine faults: the host, not the parameters.
    PORT_IN_USE = "port_in_use"
    DISK_FULL = "disk_full"
    GPU_FAULT = "gpu_fault"
    HOST_FAULT = "host_fault"
    NCCL_FAULT = "nccl_fault"
    ERROR = "error"


OOM_KINDS = frozenset(
    {
        Kind.TORCH_OOM,
        Kind.CUDA_ERROR_OOM,
        Kind.TRITON_OOM,
        Kind.PREFILL_OOM,
        Kind.DECODE_OOM,
        Kind.ALLOC_OOM,
        Kind.REQ_SLOTS_OOM,
        Kind.RETRACT_OOM,
        Kind.REQUEST_OOM_ABORT,
        Kind.OOM,
    }
)
"""Every "out of memory" that SGLang treats as one: a CUDA, Triton or SGLang allocator line of a
dying scheduler, or a request failed with the OOM error (0.5.23's abort of the last request a
decode batch could not keep). Never dropped as noise. Lines that report running out and go on
(retractions, fallbacks) are `Kind.RETRACT` and `Kind.OOM_HANDLED`, serving events."""

POOL_OOM_KINDS = frozenset(
    {Kind.PREFILL_OOM, Kind.DECODE_OOM, Kind.ALLOC_OOM, Kind.RETRACT_OOM, Kind.REQUEST_OOM_ABORT}
)
"""The out-of-memory endings that are the KV pool's own, not CUDA's: SGLang's token allocator
found no free slots for a batch (`mem_cache/allocation.py`, `… out of memory. Try to lower your
batch size.`), or the decode batch did not fit even with one request left
(`ScheduleBatch.retract_decode`). A bigger pool (a higher fraction) or fewer running requests
helps; a lower fraction shrinks the pool. Nothing here measured a GPU peak."""

MACHINE_KINDS = frozenset(
    {Kind.PORT_IN_USE, Kind.DISK_FULL, Kind.GPU_FAULT, Kind.HOST_FAULT, Kind.NCCL_FAULT}
)
"""Deaths the host caused, read from SGLang's, Python's, CUDA's and NCCL's own messages: a port
another process holds, a full disk, a GPU or driver fault, the host's limits or I/O, NCCL's
system and network errors. Not the parameters' result (`Outcome.MACHINE_ERROR`)."""

FAILURE_KINDS = frozenset(
    {
        Kind.NO_KV_ROOM,
        Kind.POOL_TOO_SMALL,
        Kind.GRAPH_CAPTURE_FAILED,
        Kind.HOST_MEMORY,
        *OOM_KINDS,
        Kind.SCHEDULER_EXCEPTION,
        Kind.SIGQUIT,
        Kind.RANK_DEAD,
        Kind.SUBPROCESS_CRASHED,
        Kind.WATCHDOG_TIMEOUT,
        Kind.LOAD_BARRIER,
        Kind.LEAK_CHECK,
        Kind.FATAL_SIGNAL,
        Kind.WARMUP_FAILED,
        Kind.HICACHE_TOO_SMALL,
        Kind.HOST_ENOMEM,
        Kind.NCCL_ERROR,
        *MACHINE_KINDS,
        Kind.ERROR,
        Kind.ALLOC_FRAME,
    }
)
"""Lines that end a run: each one precedes a raise, an exit or SGLang killing its own tree, or
(`REQUEST_OOM_ABORT`) fails a request with the OOM error."""

SERVING_KINDS = frozenset(
    {
        Kind.PREFILL_OOM,
        Kind.DECODE_OOM,
        Kind.ALLOC_OOM,
        Kind.REQ_SLOTS_OOM,
        Kind.RETRACT_OOM,
        Kind.SUBPROCESS_CRASHED,
        Kind.RETRACT,
        Kind.REQUEST_OOM_ABORT,
        Kind.SERVING_FRAME,
        Kind.LEAK_CHECK,
    }
)
"""Lines only a serving server prints: the scheduler's allocator running out for a batch, a
retraction, the subprocess watchdog (started once every scheduler reported ready), a traceback
frame of the event loop or the forward pass, the pools' leak check (it runs in the event loop,
once requests have come and gone). They place a failure at serving time even when the
"fired up" line is outside the excerpt."""


STARTUP_KINDS = frozenset(
    {
        Kind.SERVER_ARGS,
        Kind.DIST_INIT_BEGIN,
        Kind.DIST_INIT_END,
        Kind.MEMORY_BASELINE,
        Kind.WEIGHT_LOAD_BEGIN,
        Kind.WEIGHT_LOAD_END,
        Kind.KV_ALLOCATED,
        Kind.MEMORY_POOL_END,
        Kind.GRAPH_CAPTURE_BEGIN,
        Kind.GRAPH_CAPTURE_END,
        Kind.POST_CAPTURE,
        Kind.SCHEDULER_SUMMARY,
        Kind.STARTUP_TIMINGS,
    }
)
"""The lines of a server start that the memory ledger is read from (`logparse.accounting`): the
arguments, the per-rank accounting from distributed init to graph capture, the TP0 summary. A
log with none of them began after the start (a rotated file, `journalctl --since`, an excerpt):
its serving lines still read, its memory figures cannot."""


_NO_VALUES: Mapping[str, float] = MappingProxyType({})


class Event(NamedTuple):
    """One recognised line. `values` holds its numbers under stable names (avail_gib, usage_gib,
    elapsed_s, tokens, kv_gib, …); `label` its one text detail (graph role such as
    "target decode", model class, KV dtype, URL). A NamedTuple because a long log makes
    hundreds of thousands of these."""

    kind: Kind
    line_no: int
    time: float | None
    rank: str
    text: str
    values: Mapping[str, float] = _NO_VALUES
    label: str = ""


class Batch(NamedTuple):
    """One Prefill or Decode batch line (TP0 of each DP group). Missing fields are None.
    `pending_tokens` is 0.5.18+'s `#pending-token` (prefill tokens still waiting to be
    scheduled). A hybrid model's line gives its full-attention pool's `full token usage` as
    `token_usage`, and its other pool's beside it: `swa token usage` (sliding-window layers) or
    `mamba usage` (the Mamba state slots), either of which can be the one that runs out."""

    phase: str  # "prefill" | "decode"
    line_no: int
    time: float | None
    rank: str
    running: int | None = None
    queued: int | None = None
    token_usage: float | None = None
    tokens: int | None = None
    new_seq: int | None = None
    new_tokens: int | None = None
    cached_tokens: int | None = None
    gen_throughput: float | None = None
    input_throughput: float | None = None
    cuda_graph: bool | None = None
    accept_len: float | None = None
    retracted: int | None = None
    pending_tokens: int | None = None
    accept_rate: float | None = None
    swa_token_usage: float | None = None
    mamba_usage: float | None = None


Parsed = Event | Batch


@dataclass(frozen=True, slots=True)
class ParsedLog:
    """A whole log read at once: events and batches in line order, and how many lines it had."""

    events: tuple[Event, ...]
    batches: tuple[Batch, ...]
    lines: int

    def of(self, *kinds: Kind) -> tuple[Event, ...]:
        """The events of any of `kinds`, in line order."""
        return tuple(e for e in self.events if e.kind in kinds)

    def first(self, kind: Kind) -> Event | None:
        """The first event of `kind`, None when the log has none."""
        return next((e for e in self.events if e.kind is kind), None)


Ctx = tuple[int, float | None, str, str]
"""Where a line was: its number, time, rank tag and text (an `Event`'s first four fields)."""


# The allocation label of a KV line (`{label} KV Cache is allocated`, 0.5.18+): "Full" and "SWA"
# for hybrid sliding-window pools, MiniMax index pools otherwise. Coded as a value so that the
# label field keeps the dtype.
POOL_MAIN, POOL_SWA, POOL_AUX = 0.0, 1.0, 2.0
