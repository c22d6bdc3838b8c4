"""SGLang log lines -> typed events; pure functions, every format from 0.2.x to 0.5.23.

A line is read in two steps: its prefix (`[2026-02-24 11:57:16.123 DP0 TP0 EP0] `, 0.3.0's
`[04:40:55 TP0] `, 0.2.x's `[gpu=0] `, or none at all for tracebacks and tqdm bars: `split_prefix`)
gives the time and the rank tag; the message then goes through a chain of `startswith` checks
ordered by frequency, because serving lines and access-log lines are most of a long log and must
cost one or two string tests each. Batch lines are read as `key: value` pairs rather than by one
regex per version, so 0.2.x–0.4.x (`Decode batch. …`), 0.5.4 (`Decode batch [n], …`), 0.5.9 and
0.5.23 field orders all parse with the same code. Anything unrecognised yields None:
logs carry junk (tqdm carriage returns, warnings, systemd prefixes) between the lines that matter.

A line is a failure (`FAILURE_KINDS`) only when SGLang's code raises, exits or kills its tree
after printing it, or fails a request with the OOM error; a line it prints and then handles is a
serving event: a retraction in any release's shape (`Kind.RETRACT`), an out-of-memory it recovered
from (`Kind.OOM_HANDLED`), a wait for a port (`Kind.PORT_WAIT`). Failures the machine caused
(`MACHINE_KINDS`) are read from Python's, uvicorn's, CUDA's and NCCL's own messages. The table of
every line, its SGLang source and its class is in docs/sglang-server.md §1.6.
"""

from __future__ import annotations

import ast
import gc
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from types import MappingProxyType
from typing import Any, NamedTuple


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
        Kind.WARMUP_FAILED,
        Kind.HICACHE_TOO_SMALL,
        Kind.HOST_ENOMEM,
        Kind.NCCL_ERROR,
        *MACHINE_KINDS,
        Kind.ERROR,
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
    }
)
"""Lines only a serving server prints: the scheduler's allocator running out for a batch, a
retraction, the subprocess watchdog (started once every scheduler reported ready), a traceback
frame of the event loop or the forward pass. They place a failure at serving time even when the
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
"""The lines of a server start that the memory ledger is read from (`logparse.ledger`): the
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
    scheduled)."""

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


Parsed = Event | Batch


@dataclass(frozen=True, slots=True)
class ParsedLog:
    """A whole log read at once: events and batches in line order, and how many lines it had."""

    events: tuple[Event, ...]
    batches: tuple[Batch, ...]
    lines: int

    def of(self, *kinds: Kind) -> tuple[Event, ...]:
        return tuple(e for e in self.events if e.kind in kinds)

    def first(self, kind: Kind) -> Event | None:
        return next((e for e in self.events if e.kind is kind), None)


# ---------------------------------------------------------------------------------------------
# Prefix: time and rank tag
# ---------------------------------------------------------------------------------------------

_DAY_EPOCH: dict[str, float] = {}
_RANK_TAGS = ("DP", "PP", "ATTN_CP", "MOE_DP", "TP", "EP")


def _day_epoch(day: str) -> float | None:
    epoch = _DAY_EPOCH.get(day)
    if epoch is None:
        try:
            epoch = datetime.strptime(day, "%Y-%m-%d").replace(tzinfo=UTC).timestamp()
        except ValueError:
            return None
        if len(_DAY_EPOCH) < 4096:
            _DAY_EPOCH[day] = epoch
    return epoch


_last_stamp: list[Any] = ["", None]  # consecutive lines mostly share their timestamp


def _header_time(stamp: str) -> float | None:
    """Epoch seconds for `YYYY-MM-DD HH:MM:SS[.mmm]`, read as UTC (only differences matter)."""
    if stamp != _last_stamp[0]:
        _last_stamp[0], _last_stamp[1] = stamp, _stamp_time(stamp)
    time: float | None = _last_stamp[1]
    return time


def _stamp_time(header: str) -> float | None:
    day = _day_epoch(header[:10])
    if day is None or len(header) < 19 or header[13] != ":" or header[16] != ":":
        return None
    try:
        secs = int(header[11:13]) * 3600 + int(header[14:16]) * 60 + int(header[17:19])
        if len(header) > 22 and header[19] == ".":
            return day + secs + int(header[20:23]) / 1000.0
    except ValueError:
        return None
    return day + secs


def split_prefix(line: str) -> tuple[float | None, str, str]:
    """(time, rank tag, message). The rank tag is e.g. "TP3" or "DP0 TP0 EP0"; "" for the main
    process, for tp=1 and for lines without a prefix (tracebacks, tqdm bars).

    Every prefix SGLang has printed (`configure_logger` in `srt/utils.py`, `[%(asctime)s{prefix}]
    %(message)s`) is read:

    * 0.3.4 onwards: `[2024-11-30 05:10:04 TP0] `, `[… DP0 TP0 EP0] `, `[… PP1 TP0] `, and
      `[2026-02-24 11:57:16.123 TP0] ` where milliseconds are on; the main process's `[…] `.
    * 0.3.0–0.3.3: `datefmt="%H:%M:%S"`, so `[04:40:55 TP0] `, `[04:40:55 DP0 TP0] `,
      `[04:40:55] `. The time is seconds since midnight (only differences are used; a log that
      runs past midnight steps back once there).
    * 0.2.x: `logging.basicConfig(format="%(message)s")`, no prefix, but the worker's lines name
      their GPU: `[gpu=0] Decode batch. …` (`managers/tp_worker.py`, `model_runner.py`). The GPU
      index is the tensor-parallel rank there (`controller_single.py` gives rank i GPU i of its
      node), so the tag reads "TP0".

    A journald or container prefix before SGLang's own is skipped. Plain string tests on the
    common shape rather than a regex: this runs on every line of logs that reach millions.
    """
    if line.startswith("[20"):
        if line[5:6] != "-" or line[14:15] != ":":
            return None, "", line
        end = line.find("]", 20)
        if end < 0:
            return None, "", line
        cut = 24 if line[20] == "." else 20
        time = _header_time(line[1:cut])
        if time is None:
            return None, "", line
        rank = line[cut + 1 : end] if end > cut else ""
        return time, rank, line[end + 2 :] if line[end + 1 : end + 2] == " " else line[end + 1 :]
    if line.startswith("[gpu="):
        return _gpu_prefix(None, line)
    if "[" not in line:
        return None, "", line
    return _other_prefix(line)


_PREFIX = re.compile(
    r"\[(?:(\d{4}-\d\d-\d\d) )?(\d\d):(\d\d):(\d\d)(?:\.(\d{3}))?((?: [A-Z][A-Z_]*\d+)*)\] ?"
)
"""A prefix anywhere in the line: `[2024-07-20 04:40:55 TP0] ` or 0.3.0–0.3.3's `[04:40:55 TP0] `,
`[04:40:55 DP0 TP0] `, `[04:40:55] `, also after a journald or container prefix. The rank tags
must look like SGLang's (`TP0`, `DP1`, `EP3`), so tqdm's `[01:02<00:00, …]` and torch's
`[W1203 10:00:00.123 file.cpp:119]` are not prefixes."""
_GPU = re.compile(r"\[gpu=(\d+)\] ?")


def _other_prefix(line: str) -> tuple[float | None, str, str]:
    """The prefix of a line that does not begin with a dated one: a time-only or an embedded
    one (either possibly followed by 0.2.x's `[gpu=N] `), a lone `[gpu=N] `, or none."""
    m = _PREFIX.match(line) if line[0] == "[" else None
    if m is None:
        m = _PREFIX.search(line)
    if m is None:
        at = line.find("[gpu=")
        return _gpu_prefix(None, line[at:]) if at >= 0 else (None, "", line)
    day, h, mi, sec, ms, tags = m.groups()
    if day is not None:
        time = _header_time(f"{day} {h}:{mi}:{sec}" + (f".{ms}" if ms else ""))
    else:
        time = int(h) * 3600 + int(mi) * 60 + int(sec) + (int(ms) / 1000.0 if ms else 0.0)
    rest = line[m.end() :]
    if not tags and rest.startswith("[gpu="):
        return _gpu_prefix(time, rest)
    return time, tags.strip(), rest


def _gpu_prefix(time: float | None, line: str) -> tuple[float | None, str, str]:
    """0.2.x's `[gpu=N] message`: rank "TPN"."""
    m = _GPU.match(line)
    if m is None:
        return time, "", line
    return time, f"TP{m.group(1)}", line[m.end() :]


def rank_order(rank: str) -> tuple[int, ...]:
    """Sort key for rank tags: "" (main / single GPU) first, then DP, PP, …, TP, EP numerically."""
    if not rank:
        return ()
    parts = dict.fromkeys(_RANK_TAGS, 0)
    for tag in rank.split():
        for name in _RANK_TAGS:
            if tag.startswith(name) and tag[len(name) :].isdigit():
                parts[name] = int(tag[len(name) :])
                break
    return (1, *parts.values())


# ---------------------------------------------------------------------------------------------
# Messages
# ---------------------------------------------------------------------------------------------

_NUM = r"(-?\d+(?:\.\d+)?)"
_AVAIL = re.compile(r"avail[ _]mem=" + _NUM)
_USAGE = re.compile(r"mem usage=" + _NUM)
_ELAPSED = re.compile(r"(?:elapsed=|Time elapsed: )" + _NUM)
_TYPE = re.compile(r"type=([\w.]+)")
_KV_TOKENS = re.compile(r"#tokens: (\d+)")
_KV_SIZE = re.compile(r"\bKV size: " + _NUM)
_K_SIZE = re.compile(r"\bK size: " + _NUM)
_V_SIZE = re.compile(r"\bV size: " + _NUM)
_KV_DTYPE = re.compile(r"dtype: ([\w.]+)")
_GRAPH_ROLE = re.compile(
    r"^Capture (?:(target|draft) )?(?:(\w+) )?(?:cuda|cpu|npu|xpu|musa) graph\b", re.I
)
_BS_LIST = re.compile(r"\bbs=\[([\d, ]*)\]")
_TOKENS_LIST = re.compile(r"\bnum_tokens=\[([\d, ]*)\]")
_PER_REQ = re.compile(r"num_tokens_per_(?:req|bs)=(\d+)")
_GRAPH_BS = re.compile(r"graph bs \[([\d, ]*)\]")
_CAPTURING = re.compile(r"(bs|num_tokens)=(\d+) avail_mem=" + _NUM)
_SUMMARY_FIELD = re.compile(r"(\w+)=" + _NUM)
_HOST_POOL = re.compile(
    r"Allocating (\w+) hierarchical KV host pool: (\d+) tokens, " + _NUM + " GB host memory"
)
_HOST_GB = re.compile(r"Allocating " + _NUM + " GB host memory")
_HOST_SMALLER = re.compile(
    r"HiCache (?:(\w+) )?host (?:KV )?pool \((\d+) tokens\) is smaller than the device "
    r"pool \((\d+) tokens\)"
)
_AUTOSIZE = re.compile(
    rf"ratio {_NUM} -> {_NUM}; {_NUM} GiB host memory per rank \(fraction {_NUM}, "
    rf"(\d+) ranks on this host\), host pools {_NUM} GiB"
)
_HEADROOM = re.compile(r"host " + _NUM + " GiB, cgroup " + _NUM + " GiB")
_HOST_REQUEST = re.compile(r"Requesting " + _NUM + " GB but only have " + _NUM + " GB free")
_MRR_REDUCED = re.compile(r"requested (\d+) to (\d+)")
_PID = re.compile(r"\[(\d+)\]")
_URL = re.compile(r"(https?://\S+)")
_RETRACT = re.compile(r"#retracted_reqs: (\d+)")
_MRR_RESET = re.compile(r"reset to (\d+)")
_TRIED = re.compile(r"Tried to allocate " + _NUM + r" ?(GiB|MiB|KiB|B)")
_EXIT = re.compile(r"exit code(?::| | is) ?(-?\d+)", re.I)
_SUBPROCESS = re.compile(r"^Subprocess (\S+) \(pid=(\d+)\) crashed with exit code (-?\d+)")
_TERMINATED = re.compile(r"^Scheduler or DataParallelController (\d+) terminated with (-?\d+)")
_POST_MRR = re.compile(r"max_running_requests (\d+) -> (\d+)")
_POST_GB = re.compile(_NUM + " GB")
_POST_MAX_BS = re.compile(r"max_bs=(\d+) < max_running_requests=(\d+)")
_SWA_TOKENS = re.compile(r"(full|swa)_layer_tokens=(\d+)")
_BELOW_CONTEXT = re.compile(r"KV pool holds (\d+) tokens, fewer than --context-length (\d+)")
_CAP_IGNORED = re.compile(r"max_total_tokens=(\d+) is larger than the profiled value (\d+)")
_MAMBA = re.compile(r"(conv_state|ssm_state|intermediate_ssm_state_cache) size: " + _NUM + " ?GB")
_MAMBA_SIZE = re.compile(r"max_mamba_cache_size: (\d+)")
_TIMING = re.compile(r"(\w+)=" + _NUM)
_VERSION = re.compile(r"\bsglang(?:\s+version)?\s*(?:==|:|=|-|\s)\s*v?(\d+)\.(\d+)\.(\d+)", re.I)
_SERVING_FRAMES = (
    "in event_loop",
    "in run_batch",
    "in forward_batch_generation",
    "in forward_thread_func",
    "in process_batch_result",
    "in get_next_batch_to_run",
)
"""Traceback frames of the scheduler's serving loop and forward pass (`event_loop_overlap`,
`event_loop_normal`, `event_loop_pp`, …, `run_batch`, `forward_batch_generation`; the overlap
worker's `forward_thread_func` in releases that had one). Startup never runs them: graph capture
and profiling call the model runner directly."""


def _flag(raw: str) -> bool:
    return raw.startswith("True")


# Batch field name in the log -> (position after `rank` in Batch, converter).
_BATCH_FIELDS: dict[str, tuple[int, Callable[[str], Any]]] = {
    "#running-req": (0, int),
    "#queue-req": (1, int),
    "token usage": (2, float),
    "full token usage": (2, float),
    "#token": (3, int),
    "#full token": (3, int),
    "#new-seq": (4, int),
    "#new-token": (5, int),
    "#cached-token": (6, int),
    "gen throughput (token/s)": (7, float),
    "input throughput (token/s)": (8, float),
    "cuda graph": (9, _flag),
    "cpu graph": (9, _flag),
    "npu graph": (9, _flag),
    "musa graph": (9, _flag),
    "accept len": (10, float),
    "#retracted-req": (11, int),
    "#pending-token": (12, int),
    "accept rate": (13, float),
}
_BATCH_SLOTS = 14


def _num(pattern: re.Pattern[str], text: str) -> float | None:
    m = pattern.search(text)
    return float(m.group(1)) if m else None


def _values(**numbers: float | None) -> dict[str, float]:
    return {k: v for k, v in numbers.items() if v is not None}


# Whole-line patterns for the common shapes of 0.4.x, 0.5.4, 0.5.9 and 0.5.18–0.5.23 batch lines:
# one regex call reads prefix and fields together, which is what keeps a million-line log under a
# few seconds. Anything else (hybrid SWA, PD modes, spec cap lengths, MFU suffixes) goes through
# the generic `key: value` reader `_batch`.
_STAMP = r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{3})?)(?: ([A-Z_]+\d+(?: [A-Z_]+\d+)*))?\] "
_HEAD = r" batch(?:\. |, | \[\d+\], )"
_DECODE = re.compile(
    _STAMP + "Decode" + _HEAD + r"#running-req: (\d+), #token: (\d+), token usage: ([\d.]+), "
    r"(?:accept len: ([\d.]+), accept rate: ([\d.]+), )?cuda graph: (True|False), "
    r"gen throughput \(token/s\): ([\d.]+), #queue-req: (\d+)$"
)
_PREFILL = re.compile(
    _STAMP
    + "Prefill"
    + _HEAD
    + r"#new-seq: (\d+), #new-token: (\d+), #cached-token: (\d+), token usage: ([\d.]+), "
    r"#running-req: (\d+), #queue-req: (\d+)(?:, input throughput \(token/s\): ([\d.]+), "
    r"cuda graph: (True|False))?,? ?$"
)
_PREFILL_PENDING = re.compile(  # 0.5.18+: `#pending-token`, then the graph flag, then throughput
    _STAMP
    + "Prefill"
    + _HEAD
    + r"#new-seq: (\d+), #new-token: (\d+), #cached-token: (\d+), token usage: ([\d.]+), "
    r"#running-req: (\d+), #queue-req: (\d+), #pending-token: (\d+), "
    r"(?:#replay-token: \d+, )?cuda graph: (True|False), input throughput \(token/s\): ([\d.]+)$"
)


def _common_batch(line: str, line_no: int) -> Batch | None:
    if "Decode batch" in line:
        m = _DECODE.search(line)
        if m is None:
            return None
        stamp, rank, run, tok, use, acc, rate, graph, gen, queue = m.groups()
        return tuple.__new__(
            Batch,
            (
                "decode",
                line_no,
                _header_time(stamp),
                rank or "",
                int(run),
                int(queue),
                float(use),
                int(tok),
                None,
                None,
                None,
                float(gen),
                None,
                graph == "True",
                float(acc) if acc else None,
                None,
                None,
                float(rate) if rate else None,
            ),
        )
    pending: str | None = None
    if "#pending-token" in line:
        m = _PREFILL_PENDING.search(line)
        if m is None:
            return None
        stamp, rank, seq, new, cached, use, run, queue, pending, graph, thr = m.groups()
    else:
        m = _PREFILL.search(line)
        if m is None:
            return None
        stamp, rank, seq, new, cached, use, run, queue, thr, graph = m.groups()
    return tuple.__new__(
        Batch,
        (
            "prefill",
            line_no,
            _header_time(stamp),
            rank or "",
            int(run),
            int(queue),
            float(use),
            None,
            int(seq),
            int(new),
            int(cached),
            None,
            float(thr) if thr else None,
            graph == "True" if graph else None,
            None,
            None,
            int(pending) if pending is not None else None,
            None,
        ),
    )


def _batch(phase: str, message: str, line_no: int, time: float | None, rank: str) -> Batch | None:
    body_at = message.find("#")
    if body_at < 0:
        return None
    slots: list[Any] = [None] * _BATCH_SLOTS
    found = False
    body = message[body_at:]
    if body_at < 30 and "). " in body:
        # 0.3.x's mixed chunk: `Prefill batch(mixed #running-req: 2). #new-seq: 1, …`
        body = body.replace("). ", ", ", 1)
    for part in body.split(", "):
        key, _, raw = part.partition(": ")
        field = _BATCH_FIELDS.get(key)
        if field is None:
            continue
        try:
            slots[field[0]] = field[1](raw)
        except ValueError:
            continue
        found = True
    return Batch(phase, line_no, time, rank, *slots) if found else None


Ctx = tuple[int, float | None, str, str]  # line number, time, rank, text
Builder = Callable[[str, Ctx], Event | None]


def _plain(kind: Kind) -> Builder:
    return lambda message, ctx: Event(kind, *ctx)


def _memory(kind: Kind, label: re.Pattern[str] | None = None) -> Builder:
    """Events with `avail mem=`, `mem usage=`, `elapsed=` figures (and a regex-read label)."""

    def build(message: str, ctx: Ctx) -> Event:
        values = _values(
            avail_gib=_num(_AVAIL, message),
            usage_gib=_num(_USAGE, message),
            elapsed_s=_num(_ELAPSED, message),
        )
        m = label.search(message) if label is not None else None
        return Event(kind, *ctx, values, m.group(1) if m else "")

    return build


def _ints(raw: str) -> list[int]:
    return [int(x) for x in raw.replace(" ", "").split(",") if x]


def _weight_end(message: str, ctx: Ctx) -> Event:
    if message.startswith("Load weight end. Committed"):
        # --startup-weight-load-mode overlap: the real weights land after graph capture
        return Event(Kind.WEIGHT_COMMIT, *ctx, _values(elapsed_s=_num(_SUMMARY_NUM, message)))
    return _memory(Kind.WEIGHT_LOAD_END, _TYPE)(message, ctx)  # type: ignore[return-value]


_SUMMARY_NUM = re.compile(r"in " + _NUM + " s")

# The allocation label of a KV line (`{label} KV Cache is allocated`, 0.5.18+): "Full" and "SWA"
# for hybrid sliding-window pools, MiniMax index pools otherwise. Coded as a value so that the
# label field keeps the dtype.
POOL_MAIN, POOL_SWA, POOL_AUX = 0.0, 1.0, 2.0


def _kv_allocated(message: str, ctx: Ctx) -> Event | None:
    at = message.find("KV Cache ")
    if at < 0:
        return None
    rest = message[at + 9 :]
    if rest.startswith("is allocated"):
        va = False
    elif rest.startswith("VA upper bound"):
        va = True
    else:
        return None
    name = message[:at].strip()
    pool = POOL_MAIN if name in ("", "Full") else POOL_SWA if name == "SWA" else POOL_AUX
    kv = _num(_KV_SIZE, message)
    k, v = _num(_K_SIZE, message), _num(_V_SIZE, message)
    if kv is None and k is not None and v is not None:
        kv = k + v  # MHA prints K and V separately
    m = _KV_DTYPE.search(message)
    values = _values(
        tokens=_num(_KV_TOKENS, message),
        kv_gib=kv,
        k_gib=k,
        v_gib=v,
        pool=pool,
        va_upper_bound=1.0 if va else None,
    )
    return Event(Kind.KV_ALLOCATED, *ctx, values, m.group(1) if m else "")


def _mamba(message: str, ctx: Ctx) -> Event:
    parts = {name: float(gb) for name, gb in _MAMBA.findall(message)}
    size = _num(_MAMBA_SIZE, message)
    values = _values(gib=sum(parts.values()) if parts else None, slots=size)
    return Event(Kind.MAMBA_ALLOCATED, *ctx, values)


def _swa_pool(message: str, ctx: Ctx) -> Event:
    values = {f"{k}_tokens": float(v) for k, v in _SWA_TOKENS.findall(message)}
    return Event(Kind.SWA_POOL, *ctx, values)


def _capturing(message: str, ctx: Ctx) -> Event:
    m = _CAPTURING.search(message)
    values = {m.group(1): float(m.group(2)), "avail_gib": float(m.group(3))} if m else {}
    return Event(Kind.GRAPH_CAPTURING, *ctx, values, "prefill" if "prefill" in message else "")


def _capture(message: str, ctx: Ctx) -> Event | None:
    """`Capture [target|draft] [decode|prefill|verify|extend|piecewise] CUDA graph begin|end`
    (0.5.14+ roles; plain `Capture cuda graph …` before), `Capture cuda graph bs [...]`."""
    if " failed" in message:
        return _wrapped_fault(message, ctx) or Event(Kind.GRAPH_CAPTURE_FAILED, *ctx)
    if " graph bs [" in message:
        m = _GRAPH_BS.search(message)
        sizes = _ints(m.group(1)) if m else []
        values = {"max_bs": float(max(sizes)), "count": float(len(sizes))} if sizes else {}
        return Event(Kind.GRAPH_BATCH_SIZES, *ctx, values)
    head = message[:80]
    if " begin" in head:
        kind = Kind.GRAPH_CAPTURE_BEGIN
    elif " end" in head:
        kind = Kind.GRAPH_CAPTURE_END
    else:
        return None  # the `num tokens [...]` lists, assertion texts
    end = kind is Kind.GRAPH_CAPTURE_END
    values = _values(
        avail_gib=_num(_AVAIL, message),
        usage_gib=_num(_USAGE, message) if end else None,
        elapsed_s=_num(_ELAPSED, message) if end else None,
        tokens_per_req=_num(_PER_REQ, message) if "_per_" in message else None,
    )
    bs = _BS_LIST.search(message) if "bs=[" in message else None
    if bs and (sizes := _ints(bs.group(1))):
        values.update(max_bs=float(max(sizes)), count=float(len(sizes)))
    tokens = _TOKENS_LIST.search(message) if "num_tokens=[" in message else None
    if tokens and (sizes := _ints(tokens.group(1))):
        values.update(max_tokens=float(max(sizes)), count=float(len(sizes)))
    m = _GRAPH_ROLE.match(message)
    role = " ".join(p.lower() for p in m.groups() if p) if m else ""
    return Event(kind, *ctx, values, role)


def _summary(message: str, ctx: Ctx) -> Event:
    values = {k: float(v) for k, v in _SUMMARY_FIELD.findall(message)}
    if "available_cpu_mem" in values:
        values["available_gpu_mem"] = values.pop("available_cpu_mem")
    return Event(Kind.SCHEDULER_SUMMARY, *ctx, values)


def _mrr_reduced(message: str, ctx: Ctx) -> Event:
    m = _MRR_REDUCED.search(message)
    values = {"requested": float(m.group(1)), "value": float(m.group(2))} if m else {}
    return Event(Kind.MRR_REDUCED, *ctx, values)


def _mrr_reset(message: str, ctx: Ctx) -> Event:
    m = _MRR_RESET.search(message)
    return Event(Kind.MRR_SPEC_RESET, *ctx, _values(value=float(m.group(1)) if m else None))


def _retract(message: str, ctx: Ctx) -> Event:
    """A decode batch that did not fit, requests sent back to the queue: a serving event, never
    a failure. Every release's shape (after `ScheduleBatch.retract_decode`): 0.1–0.2
    `decode out of memory happened, #retracted_reqs: n, #new_token_ratio: a -> b`
    (`forward_decode_batch`) and 0.3–0.4.x `Decode out of memory happened. #retracted_reqs: n, …`
    (`Scheduler.update_running_batch`), both INFO; 0.4.x to 0.5.23 (`update_running_batch`)
    `KV cache pool is full. Retract requests. #retracted_reqs: n,
    #new_tokens_gained: m[, #mamba_num_gained: k], #new_token_ratio: a -> b` (WARNING), and
    `Testing retraction. …` under SGLANG_TEST_RETRACT (label "test")."""
    label = "test" if message.startswith("Testing") else ""
    return Event(Kind.RETRACT, *ctx, _values(retracted=_num(_RETRACT, message)), label)


def _kv_dtype(message: str, ctx: Ctx) -> Event:
    return Event(Kind.KV_DTYPE, *ctx, label=message.rsplit(" ", 1)[-1])


def _host_cache(message: str, ctx: Ctx) -> Event | None:
    """`Allocating {label} hierarchical KV host pool: N tokens, X GB host memory.` (0.5.18+; the
    label is kv, full, swa, draft or draft_swa) or `Allocating X GB host memory for …`."""
    if "host" not in message:
        return None
    m = _HOST_POOL.search(message)
    if m:
        values = {"tokens": float(m.group(2)), "gb": float(m.group(3))}
        return Event(Kind.HOST_CACHE, *ctx, values, m.group(1))
    g = _HOST_GB.search(message)
    if g is None:
        return None
    # 0.5.9's KV pool, or one named after "for": a Mamba, DSA indexer, V4 or MiniMax pool
    label = "" if "for hierarchical KV cache" in message else "other"
    return Event(Kind.HOST_CACHE, *ctx, {"gb": float(g.group(1))}, label)


def _hicache(message: str, ctx: Ctx) -> Event | None:
    if message.startswith("HiCache auto-sizing: ratio"):
        m = _AUTOSIZE.search(message)
        keys = ("ratio_requested", "ratio", "per_rank_gib", "fraction", "ranks", "pools_gib")
        values = dict(zip(keys, map(float, m.groups()), strict=True)) if m else {}
        return Event(Kind.HICACHE_AUTOSIZE, *ctx, values)
    if message.startswith("HiCache memory headroom"):
        m = _HEADROOM.search(message)
        values = {"host_gib": float(m.group(1)), "cgroup_gib": float(m.group(2))} if m else {}
        return Event(Kind.HOST_HEADROOM, *ctx, values)
    m = _HOST_SMALLER.search(message)
    if m:
        values = {"tokens": float(m.group(2)), "device_tokens": float(m.group(3))}
        return Event(Kind.HICACHE_SMALLER, *ctx, values, m.group(1) or "")
    return None


def _post_capture(message: str, ctx: Ctx) -> Event:
    """SGLANG_ENABLE_POST_CAPTURE_KV_SIZING: the pool resized after graph capture. The label
    says which line: kv, draft_kv, max_running_requests, canary, swa, eager_gap."""
    body = message[24:]
    values: dict[str, float] = {}
    if body.startswith("KV cache allocated"):
        label = "kv"
        values = _values(
            tokens=_num(_KV_TOKENS, body),
            kv_gib=_num(_KV_SIZE, body),
            avail_gib=_num(_AVAIL, body),
        )
    elif body.startswith("draft KV cache allocated"):
        label = "draft_kv"
        values = _values(tokens=_num(_KV_TOKENS, body), kv_gib=_num(_KV_SIZE, body))
    elif body.startswith("max_running_requests"):
        label = "max_running_requests"
        m = _POST_MRR.search(body)
        values = {"requested": float(m.group(1)), "value": float(m.group(2))} if m else {}
    elif body.startswith("KV-canary"):
        label = "canary"
        values = _values(gib=_num(_POST_GB, body))
    elif body.startswith("full_layer_tokens"):
        label = "swa"
        values = {f"{k}_tokens": float(v) for k, v in _SWA_TOKENS.findall(body)}
    else:
        label = "eager_gap"
        m = _POST_MAX_BS.search(body)
        values = {"max_bs": float(m.group(1)), "requests": float(m.group(2))} if m else {}
    return Event(Kind.POST_CAPTURE, *ctx, values, label)


def _timings(message: str, ctx: Ctx) -> Event:
    """`Engine startup timings (s): load_weight=…, …, cuda_graph={prefill=…, …}, …`; the graph
    phases are named `cuda_graph.<phase>`."""
    values: dict[str, float] = {}
    inner_at, inner_end = message.find("{"), message.find("}")
    for m in _TIMING.finditer(message):
        inside = inner_at < m.start() < inner_end
        values[f"cuda_graph.{m.group(1)}" if inside else m.group(1)] = float(m.group(2))
    return Event(Kind.STARTUP_TIMINGS, *ctx, values)


def _rank_dead(message: str, ctx: Ctx) -> Event | None:
    """0.5.9 `Rank i scheduler is dead. …` (its exit code on the next line); 0.5.18+ `Rank i
    scheduler died during initialization (exit code: X). …`."""
    if "is dead" in message:
        return Event(Kind.RANK_DEAD, *ctx)
    if "died during initialization" in message:
        m = _EXIT.search(message)
        return Event(Kind.RANK_DEAD, *ctx, {"code": float(m.group(1))} if m else {})
    return None


def _subprocess(message: str, ctx: Ctx) -> Event | None:
    m = _SUBPROCESS.match(message)
    if m is None:
        return None
    values = {"pid": float(m.group(2)), "code": float(m.group(3))}
    return Event(Kind.SUBPROCESS_CRASHED, *ctx, values, m.group(1))


def _terminated(message: str, ctx: Ctx) -> Event | None:
    """A non-zero node's scheduler ending (multi-node); exit code 0 is a clean stop."""
    m = _TERMINATED.match(message)
    if m is None or m.group(2) == "0":
        return None
    values = {"pid": float(m.group(1)), "code": float(m.group(2))}
    return Event(Kind.SUBPROCESS_CRASHED, *ctx, values, "scheduler")


def _exit_code(message: str, ctx: Ctx) -> Event:
    code = message[11:].strip()
    values = {"code": float(code)} if code.lstrip("-").isdigit() else {}
    return Event(Kind.EXIT_CODE, *ctx, values)


def _pool_below_context(message: str, ctx: Ctx) -> Event:
    m = _BELOW_CONTEXT.search(message)
    values = {"tokens": float(m.group(1)), "context": float(m.group(2))} if m else {}
    return Event(Kind.POOL_BELOW_CONTEXT, *ctx, values)


def _cap_ignored(message: str, ctx: Ctx) -> Event:
    m = _CAP_IGNORED.search(message)
    values = {"requested": float(m.group(1)), "profiled": float(m.group(2))} if m else {}
    return Event(Kind.KV_CAP_IGNORED, *ctx, values)


def _server_args(message: str, ctx: Ctx) -> Event:
    """`server_args={...}` (0.5.23: the resolved dict) or `server_args=ServerArgs(...)` (≤0.5.18);
    read lazily by `read_server_args`."""
    shape = "dict" if message.startswith("server_args={") else "ServerArgs"
    return Event(Kind.SERVER_ARGS, *ctx, label=shape)


def _watchdog(message: str, ctx: Ctx) -> Event | None:
    """`{debug_name} watchdog timeout (…)`: Scheduler, DetokenizerManager, TokenizerManager,
    DataParallelController."""
    return Event(Kind.WATCHDOG_TIMEOUT, *ctx) if " watchdog timeout (" in message else None


def _initialization_failed(message: str, ctx: Ctx) -> Event:
    """`Initialization failed. warmup error: …` is the warm-up; `… Please see the error messages
    above.` is a scheduler that did not report ready (the error is above)."""
    kind = Kind.WARMUP_FAILED if "warmup" in message else Kind.ERROR
    return Event(kind, *ctx)


# How a startup or lifecycle message begins -> how to read it.
_STARTS: tuple[tuple[str, Builder], ...] = (
    ("Load weight begin", _memory(Kind.WEIGHT_LOAD_BEGIN)),
    ("Load weight end", _weight_end),
    ("KV Cache ", _kv_allocated),
    ("KV cache pool is full", _retract),
    ("Decode out of memory happened", _retract),
    ("decode out of memory happened", _retract),
    ("Testing retraction", _retract),
    ("KV pool holds", _pool_below_context),
    ("Capturing batches", _capturing),
    ("Capturing prefill shape", _capturing),
    ("Capture ", _capture),
    ("Init torch distributed begin", _plain(Kind.DIST_INIT_BEGIN)),
    ("Init parallel begin", _plain(Kind.DIST_INIT_BEGIN)),
    ("Init torch distributed ends", _memory(Kind.DIST_INIT_END)),
    ("Init parallel ends", _memory(Kind.DIST_INIT_END)),
    ("Initialization failed", _initialization_failed),
    ("Memory pool end", _memory(Kind.MEMORY_POOL_END)),
    ("Memory baseline taken", _memory(Kind.MEMORY_BASELINE)),
    ("Mamba Cache is allocated", _mamba),
    ("Max running requests is reset", _mrr_reset),
    ("max_total_num_tokens=", _summary),
    ("max_running_requests was reduced", _mrr_reduced),
    ("max_total_tokens=", _cap_ignored),
    ("Using KV cache dtype", _kv_dtype),
    ("Use sliding window memory pool", _swa_pool),
    ("The server is fired up and ready to roll", _plain(Kind.READY)),
    ("The memory capacity is unbalanced", _plain(Kind.UNBALANCED_MEMORY)),
    ("Allocating ", _host_cache),
    ("HiCache ", _hicache),
    ("Post-capture KV sizing: ", _post_capture),
    ("Engine startup timings", _timings),
    ("server_args=", _server_args),
    ("Scheduler hit an exception", _plain(Kind.SCHEDULER_EXCEPTION)),
    ("TokenizerManager hit an exception", _plain(Kind.SCHEDULER_EXCEPTION)),
    ("DetokenizerManager hit an exception", _plain(Kind.SCHEDULER_EXCEPTION)),
    ("DataParallelController hit an exception", _plain(Kind.SCHEDULER_EXCEPTION)),
    ("MultiTokenizerRouter hit an exception", _plain(Kind.SCHEDULER_EXCEPTION)),
    ("MultiDetokenizerRouter hit an exception", _plain(Kind.SCHEDULER_EXCEPTION)),
    ("Scheduler or DataParallelController ", _terminated),
    ("Scheduler watchdog timeout", _plain(Kind.WATCHDOG_TIMEOUT)),
    ("SIGQUIT received", _plain(Kind.SIGQUIT)),
    ("Received sigquit from a child process", _plain(Kind.SIGQUIT)),
    ("SIGTERM received", _plain(Kind.SIGTERM_RECEIVED)),
    ("Signal SIGTERM received", _plain(Kind.SIGTERM_RECEIVED)),
    ("Gracefully exiting", _plain(Kind.GRACEFUL_EXIT)),
    ("Rank ", _rank_dead),
    ("Subprocess ", _subprocess),
    ("Exit code: ", _exit_code),
    ("Health check failed", _plain(Kind.HEALTH_CHECK_FAILED)),
    ("Entering DeepGEMM", _plain(Kind.DEEPGEMM_JIT)),
    ("retract_decode: aborted last request", _plain(Kind.REQUEST_OOM_ABORT)),
)
_BY_FIRST_CHAR: dict[str, tuple[tuple[str, Builder], ...]] = {
    c: tuple(row for row in _STARTS if row[0][0] == c) for c in {row[0][0] for row in _STARTS}
}


def _startup(message: str, ctx: Ctx) -> Event | None:
    """Startup and lifecycle lines, matched on how the message begins."""
    for prefix, build in _BY_FIRST_CHAR.get(message[0], ()):
        if message.startswith(prefix):
            return build(message, ctx)
    if " watchdog timeout (" in message:
        return _watchdog(message, ctx)
    if " KV Cache " in message[:60]:
        return _kv_allocated(message, ctx)  # `Full KV Cache is allocated`, `SWA KV Cache …`
    return None


def _uvicorn(message: str, ctx: Ctx) -> Event | None:
    body = message[5:].lstrip()
    if body.startswith("Started server process"):
        m = _PID.search(body)
        return Event(Kind.SERVER_PROCESS, *ctx, _values(pid=float(m.group(1)) if m else None))
    if body.startswith("Uvicorn running on"):
        m = _URL.search(body)
        return Event(Kind.UVICORN_RUNNING, *ctx, label=m.group(1) if m else "")
    return None


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
        return _wrapped_fault(line, ctx) or Event(Kind.GRAPH_CAPTURE_FAILED, *ctx)
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


def _failure(line: str, ctx: Ctx) -> Event | None:
    """Failure text, wherever it sits in the line (tracebacks carry no prefix)."""
    if line.startswith(_REQUEST_LOG):
        return None
    if ("emory" in line or "EMORY" in line or "ALLOC_FAILED" in line) and _ANY_OOM.search(line):
        return _oom(line, ctx)
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
    if "Not enough host memory" in line or "No host memory is left for HiCache" in line:
        m = _HOST_REQUEST.search(line)
        values = {"requested_gb": float(m.group(1)), "free_gb": float(m.group(2))} if m else {}
        return Event(Kind.HOST_MEMORY, *ctx, values)
    if "host memory should be larger than the device memory" in line:
        return Event(Kind.HICACHE_TOO_SMALL, *ctx)
    if "Capture cuda graph failed" in line or ("graph" in line and "graph failed:" in line):
        return _wrapped_fault(line, ctx) or Event(Kind.GRAPH_CAPTURE_FAILED, *ctx)
    if "scheduler died during initialization" in line:
        m = _EXIT.search(line)  # the raised RuntimeError, as a traceback's last line
        return Event(Kind.RANK_DEAD, *ctx, {"code": float(m.group(1))} if m else {})
    if "unhandled cuda error" in line:
        return Event(Kind.NCCL_ERROR, *ctx)
    if _looks_like_exception(line) or ": error: " in line:  # the latter: argparse usage errors
        return Event(Kind.ERROR, *ctx)
    v = _VERSION.search(line) if "glang" in line or "GLang" in line or "GLANG" in line else None
    if v is not None:
        return Event(Kind.VERSION, *ctx, label=".".join(v.groups()))
    return None


# Machine faults and the host's memory, each from its own message (see `_machine`).
_MACHINE_HINT = re.compile(
    r"Errno|in use|No space|quota|ECC|NVLink|CUDA|GPU|NVIDIA|NVRM|bus|ncclSystem|ncclRemote|"
    r"system error|remote process|shared memory segment|Cannot allocate memory|not available in"
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
            r"Error while creating shared memory segment"
        ),
    ),
)
_PORT_WAIT = ("trying port", "Waiting for", "could not find the process that uses it")
"""SGLang waiting for a port (`utils/network.py` `wait_port_available`: `port {p} is in use.
Waiting for {i} seconds …`, `The port {p} is in use, but we could not find the process …`) or
moving to the next one (`Port {p} is already in use, trying port {p+1}`): events, not deaths;
the death is the `… is not available in {n} seconds` it raises after."""


def _wrapped_fault(message: str, ctx: Ctx) -> Event | None:
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
    exited or there was a network error`)."""
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


def _frame(message: str, ctx: Ctx) -> Event | None:
    """A traceback frame (`  File "…", line N, in event_loop_overlap`) of the serving loop."""
    at = message.rfind(", in ")
    if at > 0 and message[at + 2 :].startswith(_SERVING_FRAMES):
        return Event(Kind.SERVING_FRAME, *ctx, label=message[at + 5 :].strip())
    return None


def parse_line(line: str, line_no: int = 0) -> Parsed | None:
    """One line (a trailing newline is ignored) -> an Event, a Batch, or None for anything else."""
    if " batch" in line:
        common = _common_batch(line, line_no)
        if common is not None:
            return common
    elif "HTTP/1." in line:
        return None  # uvicorn access log
    line = line.rstrip("\n")
    if "\r" in line:  # a tqdm bar rewritten in place: the last state is what counts
        line = line.rstrip("\r").rsplit("\r", 1)[-1]
    time, rank, message = split_prefix(line)
    if not message:
        return None
    c = message[0]
    if c == "D" and message.startswith("Decode batch"):
        return _batch("decode", message, line_no, time, rank)
    if c == "P" and message.startswith("Prefill batch"):
        return _batch("prefill", message, line_no, time, rank)
    ctx = (line_no, time, rank, line)
    if c == "I" and message.startswith("INFO:"):
        return _uvicorn(message, ctx)
    if c == " " and message.startswith("  File "):
        return _frame(message, ctx)
    event = _startup(message, ctx)
    if event is not None:
        return event
    return _failure(message, ctx)


def parse_lines(lines: Iterable[str], first_line_no: int = 1) -> ParsedLog:
    """Every line of a log; line numbers start at `first_line_no`."""
    events: list[Event] = []
    batches: list[Batch] = []
    line_no = first_line_no - 1
    parse = parse_line
    collecting = gc.isenabled()
    gc.disable()  # the cyclic collector would rescan the growing lists of tuples again and again
    try:
        for line_no, raw in enumerate(lines, first_line_no):
            item = parse(raw, line_no)
            if item is None:
                continue
            if type(item) is Batch:
                batches.append(item)
            else:
                events.append(item)  # type: ignore[arg-type]
    finally:
        if collecting:
            gc.enable()
    return ParsedLog(tuple(events), tuple(batches), line_no - first_line_no + 1)


def parse_text(text: str) -> ParsedLog:
    return parse_lines(text.split("\n"))


# ---------------------------------------------------------------------------------------------
# The server_args line
# ---------------------------------------------------------------------------------------------

Scalar = str | int | float | bool | None
_ARG_PAIR = re.compile(
    r"""['"]?(\w+)['"]?(?:=|: )(None|True|False|-?\d+(?:\.\d+)?(?:e-?\d+)?|'[^']*'|"[^"]*")"""
)


def read_server_args(text: str) -> dict[str, Any]:
    """The arguments a `server_args=` line shows: 0.5.23's resolved dict (nested dicts kept) or
    0.5.9–0.5.18's `ServerArgs(key=value, …)` repr. Values that are not Python literals are left
    out; a cut-off line falls back to its scalar `key: value` pairs."""
    at = text.find("server_args=")
    if at < 0:
        return {}
    body = text[at + len("server_args=") :].strip()
    try:
        if body.startswith("{"):
            value = ast.literal_eval(body)
            if isinstance(value, dict):
                return {str(k): v for k, v in value.items()}
        elif body.startswith("ServerArgs("):
            call = ast.parse(body, mode="eval").body
            if isinstance(call, ast.Call):
                out: dict[str, Any] = {}
                for kw in call.keywords:
                    if kw.arg is None:
                        continue
                    try:
                        out[kw.arg] = ast.literal_eval(kw.value)
                    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                        continue
                return out
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass
    pairs: dict[str, Any] = {}
    for key, raw in _ARG_PAIR.findall(body):
        if key in pairs:
            continue  # the first occurrence is the top level one
        try:
            pairs[key] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            continue
    return pairs
