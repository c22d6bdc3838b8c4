"""The prefix of an SGLang log line: its time and rank tag (`split_prefix`), in every shape
SGLang has printed since 0.2.x, and the order of rank tags (`rank_order`).

Kept apart from the message readers because the prefix is read on every line, before anything
else, by code tuned to cost a few string tests; the serving summary and the ledger use it
without reading messages.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

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


def header_time(stamp: str) -> float | None:
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
    * `SGLANG_LOGGING_CONFIG_PATH` with the format of SGLang's example (`_LOGGING_CONFIG`):
      `2025-12-04 20:34:02 INFO 147907 [scheduler_metrics_mixin.py:287] `, rank tag `PID147907`.
    * `[TP0] `, `[DP0 TP0] `: the prefix with its time cut away (a log pasted without its
      times); the rank tag is read, the time is None.
    * 0.2.x: `logging.basicConfig(format="%(message)s")`, no prefix, but the worker's lines name
      their GPU: `[gpu=0] Decode batch. …` (`managers/tp_worker.py`, `model_runner.py`). The GPU
      index is the tensor-parallel rank there (`controller_single.py` gives rank i GPU i of its
      node), so the tag reads "TP0".

    A journald or container prefix before SGLang's own is skipped, and one before a line that
    has none of SGLang's (a traceback, a torch warning) is cut off (`strip_wrapper`). Plain
    string tests on the common shape rather than a regex: this runs on every line of logs that
    reach millions.
    """
    if line.startswith("[20"):
        if line[5:6] != "-" or line[14:15] != ":":
            return None, "", line
        if line[11:12] != " ":  # `[2025-11-06T02:08:27.278Z] `: a collector's, not SGLang's
            return _other_prefix(line)
        end = line.find("]", 20)
        if end < 0:
            return None, "", line
        cut = 24 if line[20] == "." else 20
        time = header_time(line[1:cut])
        if time is None:
            return None, "", line
        rank = line[cut + 1 : end] if end > cut else ""
        return time, rank, line[end + 2 :] if line[end + 1 : end + 2] == " " else line[end + 1 :]
    if line.startswith("[gpu="):
        return _gpu_prefix(None, line)
    if line.startswith("[") and line[1:2].isupper():
        m = _RANK_ONLY.match(line)
        if m is not None and is_rank_tag(m.group(1)):
            return None, m.group(1), line[m.end() :]
    if line[:2] == "20" and line[4:5] == "-":
        m = _LOGGING_CONFIG.match(line)
        if m is not None:
            stamp = m.group(1) + (f".{m.group(2)}" if m.group(2) else "")
            return header_time(stamp), f"PID{m.group(3)}", line[m.end() :]
    if "[" not in line:
        return None, "", strip_wrapper(line)
    return _other_prefix(line)


_LOGGING_CONFIG = re.compile(
    r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:,(\d{3}))? (?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d+) "
    r"\[[\w.-]+:\d+\] "
)
"""The line format of the logging config SGLang's own example for `SGLANG_LOGGING_CONFIG_PATH`
gives (sgl-project/sglang#4592: `%(asctime)s %(levelname)s %(process)d [%(filename)s:%(lineno)d]
%(message)s`). `configure_logger` (`utils/common.py`) then applies that config and returns before
it adds the rank prefix, so the process id is all that tells the ranks apart: the tag is
`PID<pid>`, one per scheduler process."""

_WRAPPER = re.compile(
    r"\[\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?\] ?"
    r"|[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \S+ [^\s\[:]+(?:\[\d+\])?: "
    r"|\w[\w.-]* +\| "
    r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)(?: std(?:out|err) [FP])? "
    r"|(?:DEFAULT|DEBUG|INFO|NOTICE|WARNING|ERROR|CRITICAL|ALERT|EMERGENCY) "
    r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z "
    r"|\([\w.:-]+ pid=\d+(?:, ip=[\w.:-]+)?\) "
)
"""What a log collector writes before each line it passes on: an ISO time in brackets
(`[2025-11-06T02:08:28.503Z] `), journald's `Feb 24 11:52:01 host python3[48211]: `, docker
compose's service column (`llm0-1  | `), the container runtime's line under Kubernetes
(`2025-07-25T07:53:08.21748708+08:00 stdout F `, as kubelet keeps it in `/var/log/pods`), the
time alone that `docker logs -t` and `kubectl logs --timestamps` write
(`2025-11-10T09:50:25.136422568Z `), Google
Cloud Logging's export (`ERROR 2026-06-15T14:10:59.392125190Z `: the severity and the receive
time), a Ray actor's (`(SGLangEngine pid=206831) `, `(WorkerDict pid=1, ip=10.0.0.1) `).
SGLang's own lines carry their prefix after it; its
tracebacks, tqdm bars and torch's warnings, which have none, carry only the collector's."""


def strip_wrapper(line: str) -> str:
    """`line` without a log collector's prefix (`_WRAPPER`), for a line that has none of
    SGLang's: a traceback frame or exception line, a torch warning, a tqdm bar."""
    if not line or line[0] == " ":
        return line
    m = _WRAPPER.match(line)
    return line[m.end() :] if m is not None else line


_PREFIX = re.compile(
    r"\[(?:(\d{4}-\d\d-\d\d) )?(\d\d):(\d\d):(\d\d)(?:\.(\d{3}))?((?: [A-Z][A-Z_]*\d+)*)\] ?"
)
"""A prefix anywhere in the line: `[2024-07-20 04:40:55 TP0] ` or 0.3.0–0.3.3's `[04:40:55 TP0] `,
`[04:40:55 DP0 TP0] `, `[04:40:55] `, also after a journald or container prefix. The rank tags
must look like SGLang's (`TP0`, `DP1`, `EP3`), so tqdm's `[01:02<00:00, …]` and torch's
`[W1203 10:00:00.123 file.cpp:119]` are not prefixes."""
_GPU = re.compile(r"\[gpu=(\d+)\] ?")
_RANK_ONLY = re.compile(r"\[([A-Z][A-Z_]*\d+(?: [A-Z][A-Z_]*\d+)*)\] ")
"""SGLang's prefix with its time cut away (`[TP0] `, `[DP0 TP0 EP0] `), as a log pasted with
its times removed shows it: the rank tag stands, the line has no time."""


def _other_prefix(line: str) -> tuple[float | None, str, str]:
    """The prefix of a line that does not begin with a dated one: a time-only or an embedded
    one (either possibly followed by 0.2.x's `[gpu=N] `), a lone `[gpu=N] `, or none."""
    m = _PREFIX.match(line) if line[0] == "[" else None
    if m is None:
        m = _PREFIX.search(line)
    if m is None:
        at = line.find("[gpu=")
        return _gpu_prefix(None, line[at:]) if at >= 0 else (None, "", strip_wrapper(line))
    day, h, mi, sec, ms, tags = m.groups()
    if day is not None:
        time = header_time(f"{day} {h}:{mi}:{sec}" + (f".{ms}" if ms else ""))
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


def is_rank_tag(rank: str) -> bool:
    """Whether `rank` is a tag SGLang's logger writes (`TP3`, `DP0 TP0 EP0`, `PP1 TP0`): every
    part one of its rank names and a number; not "" and not a logging config's `PID…`."""
    parts = rank.split()
    return bool(parts) and all(
        any(t.startswith(name) and t[len(name) :].isdigit() for name in _RANK_TAGS) for t in parts
    )


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
