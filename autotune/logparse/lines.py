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

The steps live in their own modules: the prefix (`logparse.prefix`), batch lines
(`logparse.batchline`), startup and lifecycle messages (`logparse.messages`), failure text
(`logparse.failures`); what they produce is `logparse.events`. This module runs them on a line
and on a whole log.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable

from autotune.logparse.batchline import read_batch, read_common_batch
from autotune.logparse.events import Batch, Event, Kind, Parsed, ParsedLog
from autotune.logparse.failures import failure, serving_frame
from autotune.logparse.messages import startup_event, uvicorn_event
from autotune.logparse.prefix import split_prefix


def parse_line(line: str, line_no: int = 0) -> Parsed | None:
    """One line (a trailing newline is ignored) -> an Event, a Batch, or None for anything else."""
    if " batch" in line:
        common = read_common_batch(line, line_no)
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
        return read_batch("decode", message, line_no, time, rank)
    if c == "P" and message.startswith("Prefill batch"):
        return read_batch("prefill", message, line_no, time, rank)
    ctx = (line_no, time, rank, line)
    if c == "I" and message.startswith("INFO:"):
        return uvicorn_event(message, ctx)
    if (c == " " and message.startswith("  File ")) or (c == "F" and message.startswith('File "')):
        return serving_frame(message, ctx)  # the latter: a collector that strips indentation
    event = startup_event(message, ctx)
    if event is not None:
        return event
    return failure(message, ctx)


_TARGET_POOL = frozenset(
    {
        Kind.KV_ALLOCATED,
        Kind.MEMORY_POOL_END,
        Kind.GRAPH_CAPTURE_BEGIN,
        Kind.GRAPH_CAPTURING,
        Kind.GRAPH_CAPTURE_END,
    }
)
"""Lines that show a rank's first (target) model already has its KV pool or its CUDA graphs."""


class DraftProfile:
    """Reads `max_total_tokens=R is larger than the profiled value P` with P at or below zero as
    the failure it is only for a rank's first model. A speculative draft model profiles the
    memory again after the target's pool and graphs, and there P is what the reserve leaves, often
    negative; the release that prints it then sizes the draft's pool from the target's
    (`ModelRunnerKVCacheMixin.init_memory`: `max_total_num_tokens = draft_runner_cache_size`)
    before its `<= 0` check, so the start goes on (the EAGLE section of SGLang's own
    `speculative_decoding` docs notebook prints `… profiled value -89624` and serves). After a
    pool or capture line of the same rank, or an unprefixed tqdm capture bar, the line is
    `Kind.KV_CAP_IGNORED`. 0.4.x set the draft's size before the warning, so its draft never
    printed a negative value."""

    def __init__(self) -> None:
        self._pooled: set[str] = set()

    def settle(self, event: Event) -> Event:
        """`event`, or the draft's profile line it turns out to be."""
        kind = event.kind
        if kind in _TARGET_POOL:
            self._pooled.add(event.rank)
        elif (
            kind is Kind.NO_KV_ROOM
            and "profiled" in event.values
            and (event.rank in self._pooled or "" in self._pooled)
        ):
            return event._replace(kind=Kind.KV_CAP_IGNORED, label="draft")
        return event


def parse_lines(lines: Iterable[str], first_line_no: int = 1) -> ParsedLog:
    """Every line of a log; line numbers start at `first_line_no`."""
    events: list[Event] = []
    batches: list[Batch] = []
    line_no = first_line_no - 1
    parse = parse_line
    settle = DraftProfile().settle
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
                events.append(settle(item))  # type: ignore[arg-type]
    finally:
        if collecting:
            gc.enable()
    return ParsedLog(tuple(events), tuple(batches), line_no - first_line_no + 1)


def parse_text(text: str) -> ParsedLog:
    """A whole log held in one string."""
    return parse_lines(text.split("\n"))
