"""SGLang log lines -> typed events; pure functions, every format from 0.4.x to 0.5.23.

A line is read in two steps: its prefix (`[2026-02-24 11:57:16.123 DP0 TP0 EP0] `, or none at all
for tracebacks and tqdm bars) gives the time and the rank tag; the message then goes through a
chain of `startswith` checks ordered by frequency, because serving lines and access-log lines are
most of a long log and must cost one or two string tests each. Batch lines are read as `key: value`
pairs rather than by one regex per version, so 0.4.x (`Decode batch. …`), 0.5.4 (`Decode batch [n],
…`), 0.5.9 and 0.5.23 field orders all parse with the same code. Anything unrecognised yields None:
logs carry junk (tqdm carriage returns, warnings, systemd prefixes) between the lines that matter.
"""

from __future__ import annotations

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

    DIST_INIT_BEGIN = "dist_init_begin"
    DIST_INIT_END = "dist_init_end"
    MEMORY_BASELINE = "memory_baseline"
    UNBALANCED_MEMORY = "unbalanced_memory"
    WEIGHT_LOAD_BEGIN = "weight_load_begin"
    WEIGHT_LOAD_END = "weight_load_end"
    KV_DTYPE = "kv_dtype"
    KV_ALLOCATED = "kv_allocated"
    MEMORY_POOL_END = "memory_pool_end"
    GRAPH_CAPTURE_BEGIN = "graph_capture_begin"
    GRAPH_CAPTURING = "graph_capturing"
    GRAPH_CAPTURE_END = "graph_capture_end"
    DEEPGEMM_JIT = "deepgemm_jit"
    SCHEDULER_SUMMARY = "scheduler_summary"
    MRR_REDUCED = "mrr_reduced"
    MRR_SPEC_RESET = "mrr_spec_reset"
    HOST_CACHE = "host_cache"
    HICACHE_AUTOSIZE = "hicache_autosize"
    SERVER_PROCESS = "server_process"
    UVICORN_RUNNING = "uvicorn_running"
    READY = "ready"
    SIGTERM_RECEIVED = "sigterm_received"
    GRACEFUL_EXIT = "graceful_exit"
    RETRACT = "retract"
    HEALTH_CHECK_FAILED = "health_check_failed"
    # Failure lines.
    NO_KV_ROOM = "no_kv_room"
    POOL_TOO_SMALL = "pool_too_small"
    GRAPH_CAPTURE_FAILED = "graph_capture_failed"
    HOST_MEMORY = "host_memory"
    TORCH_OOM = "torch_oom"
    CUDA_ERROR_OOM = "cuda_error_oom"
    PREFILL_OOM = "prefill_oom"
    DECODE_OOM = "decode_oom"
    SCHEDULER_EXCEPTION = "scheduler_exception"
    SIGQUIT = "sigquit"
    RANK_DEAD = "rank_dead"
    WATCHDOG_TIMEOUT = "watchdog_timeout"
    WARMUP_FAILED = "warmup_failed"
    HICACHE_TOO_SMALL = "hicache_too_small"
    EXIT_CODE = "exit_code"
    NCCL_ERROR = "nccl_error"
    ERROR = "error"


FAILURE_KINDS = frozenset(
    {
        Kind.NO_KV_ROOM,
        Kind.POOL_TOO_SMALL,
        Kind.GRAPH_CAPTURE_FAILED,
        Kind.HOST_MEMORY,
        Kind.TORCH_OOM,
        Kind.CUDA_ERROR_OOM,
        Kind.PREFILL_OOM,
        Kind.DECODE_OOM,
        Kind.SCHEDULER_EXCEPTION,
        Kind.SIGQUIT,
        Kind.RANK_DEAD,
        Kind.WATCHDOG_TIMEOUT,
        Kind.WARMUP_FAILED,
        Kind.HICACHE_TOO_SMALL,
        Kind.NCCL_ERROR,
        Kind.ERROR,
    }
)


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
    """One Prefill or Decode batch line (TP0 of each DP group). Missing fields are None."""

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

    Plain string tests rather than a regex: this runs on every line of logs that reach millions.
    """
    start = 0
    if not line.startswith("[20"):
        start = line.find("[20")  # tolerate journald / container prefixes before SGLang's own
        if start < 0:
            return None, "", line
    if line[start + 5 : start + 6] != "-" or line[start + 14 : start + 15] != ":":
        return None, "", line
    end = line.find("]", start + 20)
    if end < 0:
        return None, "", line
    cut = start + 24 if line[start + 20] == "." else start + 20
    time = _header_time(line[start + 1 : cut])
    if time is None:
        return None, "", line
    rank = line[cut + 1 : end] if end > cut else ""
    return time, rank, line[end + 2 :] if line[end + 1 : end + 2] == " " else line[end + 1 :]


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
    r"^Capture (?:(target verify|target|draft extend|draft) )?(\w+ )?cuda graph", re.I
)
_CAPTURING = re.compile(r"bs=(\d+) avail_mem=" + _NUM)
_SUMMARY_FIELD = re.compile(r"(\w+)=" + _NUM)
_HOST_GB = re.compile(
    r"Allocating (?:kv hierarchical KV host pool: (\d+) tokens, )?" + _NUM + " GB"
)
_MRR_REDUCED = re.compile(r"requested (\d+) to (\d+)")
_PID = re.compile(r"\[(\d+)\]")
_URL = re.compile(r"(https?://\S+)")
_RETRACT = re.compile(r"#retracted_reqs: (\d+)")
_MRR_RESET = re.compile(r"reset to (\d+)")
_TRIED = re.compile(r"Tried to allocate " + _NUM + r" ?(GiB|MiB|KiB|B)")


def _flag(raw: str) -> bool:
    return raw.startswith("True")


# Batch field name in the log -> (position after `rank` in Batch, converter).
_BATCH_FIELDS: dict[str, tuple[int, Callable[[str], Any]]] = {
    "#running-req": (0, int),
    "#queue-req": (1, int),
    "token usage": (2, float),
    "full token usage": (2, float),
    "#token": (3, int),
    "#new-seq": (4, int),
    "#new-token": (5, int),
    "#cached-token": (6, int),
    "gen throughput (token/s)": (7, float),
    "input throughput (token/s)": (8, float),
    "cuda graph": (9, _flag),
    "accept len": (10, float),
    "#retracted-req": (11, int),
}
_BATCH_SLOTS = 12


def _num(pattern: re.Pattern[str], text: str) -> float | None:
    m = pattern.search(text)
    return float(m.group(1)) if m else None


def _values(**numbers: float | None) -> dict[str, float]:
    return {k: v for k, v in numbers.items() if v is not None}


# The common shapes of 0.4.x, 0.5.4 and 0.5.9–0.5.23 batch lines, read in one match; anything
# else (hybrid SWA, PD modes, 0.5.23 prefill order) goes through the generic `key: value` reader.
# Whole-line patterns for the common shapes of 0.4.x, 0.5.4 and 0.5.9–0.5.23 batch lines: one
# regex call reads prefix and fields together, which is what keeps a million-line log under a few
# seconds. Anything else (hybrid SWA, PD modes, 0.5.23 prefill order) goes through `_batch`.
_STAMP = r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{3})?)(?: ([A-Z_]+\d+(?: [A-Z_]+\d+)*))?\] "
_HEAD = r" batch(?:\. |, | \[\d+\], )"
_DECODE = re.compile(
    _STAMP + "Decode" + _HEAD + r"#running-req: (\d+), #token: (\d+), token usage: ([\d.]+), "
    r"(?:accept len: ([\d.]+), accept rate: [\d.]+, )?cuda graph: (True|False), "
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


def _common_batch(line: str, line_no: int) -> Batch | None:
    if "Decode batch" in line:
        m = _DECODE.search(line)
        if m is None:
            return None
        stamp, rank, run, tok, use, acc, graph, gen, queue = m.groups()
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
            ),
        )
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
        ),
    )


def _batch(phase: str, message: str, line_no: int, time: float | None, rank: str) -> Batch | None:
    body_at = message.find("#")
    if body_at < 0:
        return None
    slots: list[Any] = [None] * _BATCH_SLOTS
    found = False
    for part in message[body_at:].split(", "):
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


def _kv_allocated(message: str, ctx: Ctx) -> Event:
    kv = _num(_KV_SIZE, message)
    k, v = _num(_K_SIZE, message), _num(_V_SIZE, message)
    if kv is None and k is not None and v is not None:
        kv = k + v  # MHA prints K and V separately
    m = _KV_DTYPE.search(message)
    values = _values(tokens=_num(_KV_TOKENS, message), kv_gib=kv, k_gib=k, v_gib=v)
    return Event(Kind.KV_ALLOCATED, *ctx, values, m.group(1) if m else "")


def _capturing(message: str, ctx: Ctx) -> Event:
    m = _CAPTURING.search(message)
    values = {"bs": float(m.group(1)), "avail_gib": float(m.group(2))} if m else {}
    return Event(Kind.GRAPH_CAPTURING, *ctx, values)


def _capture(message: str, ctx: Ctx) -> Event | None:
    """`Capture [target|draft] [decode|prefill|verify|piecewise] cuda graph begin|end|failed`."""
    if " failed" in message:
        return Event(Kind.GRAPH_CAPTURE_FAILED, *ctx)
    if " begin" in message:
        kind = Kind.GRAPH_CAPTURE_BEGIN
    elif " end" in message:
        kind = Kind.GRAPH_CAPTURE_END
    else:
        return None  # the `bs [...]` and `num tokens [...]` lists
    event = _memory(kind)(message, ctx)
    assert event is not None
    m = _GRAPH_ROLE.match(message)
    role = " ".join(p.strip().lower() for p in m.groups() if p) if m else ""
    return event._replace(label=role)


def _summary(message: str, ctx: Ctx) -> Event:
    values = {k: float(v) for k, v in _SUMMARY_FIELD.findall(message)}
    return Event(Kind.SCHEDULER_SUMMARY, *ctx, values)


def _mrr_reduced(message: str, ctx: Ctx) -> Event:
    m = _MRR_REDUCED.search(message)
    values = {"requested": float(m.group(1)), "value": float(m.group(2))} if m else {}
    return Event(Kind.MRR_REDUCED, *ctx, values)


def _mrr_reset(message: str, ctx: Ctx) -> Event:
    m = _MRR_RESET.search(message)
    return Event(Kind.MRR_SPEC_RESET, *ctx, _values(value=float(m.group(1)) if m else None))


def _retract(message: str, ctx: Ctx) -> Event:
    return Event(Kind.RETRACT, *ctx, _values(retracted=_num(_RETRACT, message)))


def _kv_dtype(message: str, ctx: Ctx) -> Event:
    return Event(Kind.KV_DTYPE, *ctx, label=message.rsplit(" ", 1)[-1])


def _host_cache(message: str, ctx: Ctx) -> Event | None:
    if "host" not in message:
        return None
    m = _HOST_GB.search(message)
    values = {}
    if m:
        values = _values(gb=float(m.group(2)), tokens=float(m.group(1)) if m.group(1) else None)
    return Event(Kind.HOST_CACHE, *ctx, values)


def _rank_dead(message: str, ctx: Ctx) -> Event | None:
    return Event(Kind.RANK_DEAD, *ctx) if "is dead" in message else None


def _exit_code(message: str, ctx: Ctx) -> Event:
    code = message[11:].strip()
    values = {"code": float(code)} if code.lstrip("-").isdigit() else {}
    return Event(Kind.EXIT_CODE, *ctx, values)


# How a startup or lifecycle message begins -> how to read it (reference §4.2, §4.4, §4.5, §7).
_STARTS: tuple[tuple[str, Builder], ...] = (
    ("Load weight begin", _memory(Kind.WEIGHT_LOAD_BEGIN)),
    ("Load weight end", _memory(Kind.WEIGHT_LOAD_END, _TYPE)),
    ("KV Cache is allocated", _kv_allocated),
    ("KV cache pool is full", _retract),
    ("Capturing batches", _capturing),
    ("Capture ", _capture),
    ("Init torch distributed begin", _plain(Kind.DIST_INIT_BEGIN)),
    ("Init parallel begin", _plain(Kind.DIST_INIT_BEGIN)),
    ("Init torch distributed ends", _memory(Kind.DIST_INIT_END)),
    ("Init parallel ends", _memory(Kind.DIST_INIT_END)),
    ("Initialization failed", _plain(Kind.WARMUP_FAILED)),
    ("Memory pool end", _memory(Kind.MEMORY_POOL_END)),
    ("Memory baseline taken", _memory(Kind.MEMORY_BASELINE)),
    ("Max running requests is reset", _mrr_reset),
    ("max_total_num_tokens=", _summary),
    ("max_running_requests was reduced", _mrr_reduced),
    ("Using KV cache dtype", _kv_dtype),
    ("The server is fired up and ready to roll", _plain(Kind.READY)),
    ("The memory capacity is unbalanced", _plain(Kind.UNBALANCED_MEMORY)),
    ("Allocating ", _host_cache),
    ("HiCache auto-sizing", _plain(Kind.HICACHE_AUTOSIZE)),
    ("Scheduler hit an exception", _plain(Kind.SCHEDULER_EXCEPTION)),
    ("Scheduler watchdog timeout", _plain(Kind.WATCHDOG_TIMEOUT)),
    ("SIGQUIT received", _plain(Kind.SIGQUIT)),
    ("Received sigquit from a child process", _plain(Kind.SIGQUIT)),
    ("SIGTERM received", _plain(Kind.SIGTERM_RECEIVED)),
    ("Gracefully exiting", _plain(Kind.GRACEFUL_EXIT)),
    ("Rank ", _rank_dead),
    ("Exit code: ", _exit_code),
    ("Health check failed", _plain(Kind.HEALTH_CHECK_FAILED)),
    ("Entering DeepGEMM", _plain(Kind.DEEPGEMM_JIT)),
)
_BY_FIRST_CHAR: dict[str, tuple[tuple[str, Builder], ...]] = {
    c: tuple(row for row in _STARTS if row[0][0] == c) for c in {row[0][0] for row in _STARTS}
}


def _startup(message: str, ctx: Ctx) -> Event | None:
    """Startup and lifecycle lines, matched on how the message begins."""
    for prefix, build in _BY_FIRST_CHAR.get(message[0], ()):
        if message.startswith(prefix):
            return build(message, ctx)
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


def _failure(line: str, ctx: Ctx) -> Event | None:
    """Failure text, wherever it sits in the line (tracebacks carry no prefix)."""
    if "out of memory" in line:
        if "Tried to allocate" in line and "CUDA out of memory" in line:
            m = _TRIED.search(line)
            values = {}
            if m:
                scale = {"GiB": 1.0, "MiB": 1 / 1024, "KiB": 1 / 1024**2, "B": 1 / 1024**3}
                values = {"tried_gib": float(m.group(1)) * scale[m.group(2)]}
            kind = Kind.GRAPH_CAPTURE_FAILED if "Capture" in line else Kind.TORCH_OOM
            return Event(kind, *ctx, values)
        if "Capture" in line and "graph failed" in line:
            return Event(Kind.GRAPH_CAPTURE_FAILED, *ctx)
        if "CUDA error: out of memory" in line:
            return Event(Kind.CUDA_ERROR_OOM, *ctx)
        if "Prefill out of memory" in line:
            return Event(Kind.PREFILL_OOM, *ctx)
        if "Decode out of memory" in line:
            return Event(Kind.DECODE_OOM, *ctx)
        if "CUDA out of memory" in line or "OutOfMemoryError" in line:
            return Event(Kind.TORCH_OOM, *ctx)
        return None
    if "Not enough memory" in line or "leave no GPU memory for the KV cache" in line:
        return Event(Kind.NO_KV_ROOM, *ctx)
    if "Memory pool size is too small" in line or "max_running_request is zero" in line:
        return Event(Kind.POOL_TOO_SMALL, *ctx)
    if "Not enough host memory" in line:
        return Event(Kind.HOST_MEMORY, *ctx)
    if "host memory should be larger than the device memory" in line:
        return Event(Kind.HICACHE_TOO_SMALL, *ctx)
    if "Capture cuda graph failed" in line or ("CUDA graph" in line and "failed:" in line):
        return Event(Kind.GRAPH_CAPTURE_FAILED, *ctx)
    if "unhandled cuda error" in line:
        return Event(Kind.NCCL_ERROR, *ctx)
    if _looks_like_exception(line) or ": error: " in line:  # the latter: argparse usage errors
        return Event(Kind.ERROR, *ctx)
    return None


_EXCEPTION_LINE = re.compile(r"^(?:[\w.]+\.)?\w*(?:Error|Exception)(?::|$)")


def _looks_like_exception(line: str) -> bool:
    """The last line of a Python traceback: `ValueError: …`, `torch.AcceleratorError: …`."""
    return ("Error" in line or "Exception" in line) and bool(_EXCEPTION_LINE.match(line))


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
