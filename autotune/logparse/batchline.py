"""SGLang's Prefill and Decode batch lines -> `Batch`: the common shapes of 0.4.x to 0.5.23 by one
whole-line regex each (`read_common_batch`), anything else read as `key: value` pairs
(`read_batch`), so every release's field order parses with the same code.

Kept apart from the other messages because batch lines are most of a long log: this is the hot
path, and its speed (a million-line log in a few seconds) is measured on its own
(`scripts/bench_server.py`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from autotune.logparse.events import Batch
from autotune.logparse.prefix import header_time


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
    "swa token usage": (14, float),
    "mamba usage": (15, float),
}
_BATCH_SLOTS = 16

# Whole-line patterns for the common shapes of 0.4.x, 0.5.4, 0.5.9 and 0.5.18–0.5.23 batch lines:
# one regex call reads prefix and fields together, which is what keeps a million-line log under a
# few seconds. Anything else (hybrid SWA, PD modes, spec cap lengths, MFU suffixes) goes through
# the generic `key: value` reader `read_batch`.
_STAMP = r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{3})?)(?: ([A-Z_]+\d+(?: [A-Z_]+\d+)*))?\] "
_HEAD = r" batch(?:\. |, | \[\d+\], )"
_DECODE = re.compile(
    _STAMP + "Decode" + _HEAD + r"#running-req: (\d+), #token: (\d+), token usage: ([\d.]+), "
    r"(?:accept len: ([\d.]+), accept rate: ([\d.]+), )?cuda graph: (True|False), "
    r"gen throughput \(token/s\): ([\d.]+), #queue-req: (\d+),? ?$"
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


def _common(
    phase: str,
    line_no: int,
    stamp: str,
    rank: str | None,
    run: str,
    queue: str,
    use: str,
    rest: tuple[Any, ...],
) -> Batch:
    """A `Batch` built straight from a whole-line match: the fields every phase has (the prefix's
    time and rank, running and queued requests, token usage), then `rest` in `Batch`'s order."""
    return tuple.__new__(
        Batch,
        (
            phase,
            line_no,
            header_time(stamp),
            rank or "",
            int(run),
            int(queue),
            float(use),
            *rest,
            None,  # swa token usage and mamba usage: hybrid pools' lines take `read_batch`
            None,
        ),
    )


def read_common_batch(line: str, line_no: int) -> Batch | None:
    """A whole line (prefix included) of one of the common batch shapes, read by one regex; None
    for any other shape (then `read_batch` reads the message)."""
    if "Decode batch" in line:
        m = _DECODE.search(line)
        if m is None:
            return None
        stamp, rank, run, tok, use, acc, rate, graph, gen, queue = m.groups()
        decoded = (
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
        )
        return _common("decode", line_no, stamp, rank, run, queue, use, decoded)
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
    prefilled = (
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
    )
    return _common("prefill", line_no, stamp, rank, run, queue, use, prefilled)


def read_batch(
    phase: str, message: str, line_no: int, time: float | None, rank: str
) -> Batch | None:
    """A batch message (prefix split off) read as `key: value` pairs (`_BATCH_FIELDS`); None when
    no field is recognised."""
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
            # the last field of a line ends with its own ", " (`#queue-req: 5, `, 0.4.x–0.5.x),
            # or with a bare "," where trailing blanks were trimmed
            slots[field[0]] = field[1](raw.rstrip(", "))
        except ValueError:
            continue
        found = True
    return Batch(phase, line_no, time, rank, *slots) if found else None
