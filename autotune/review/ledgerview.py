"""`autotune ledger`'s output: a parsed SGLang log as a memory ledger table or one JSON object."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

from autotune.errors import UsageError
from autotune.logparse.accounting import build_ledger
from autotune.logparse.clamps import Clamps
from autotune.logparse.events import STARTUP_KINDS, Kind, ParsedLog
from autotune.logparse.ledger import Ledger
from autotune.logparse.lines import parse_lines
from autotune.logparse.outcome import Verdict, classify
from autotune.logparse.prefix import is_rank_tag, split_prefix, strip_wrapper
from autotune.logparse.serving import ServingSummary, summarize

SNIFF_BYTES = 64 * 1024
_GENERIC = frozenset({Kind.ERROR, Kind.EXIT_CODE})
"""Lines any Python program may print (`…Error: …`, an exit code): alone, they do not make a
file an SGLang log."""


def read_log(path: Path) -> ParsedLog:
    """The parsed log; a `UsageError` (one line, exit 2) when the file is missing, empty, binary,
    or has no line SGLang prints."""
    if not path.exists():
        raise UsageError(f"{path}: no such file; give the path of an SGLang server log")
    if not path.is_file():
        raise UsageError(f"{path}: not a file; give the path of an SGLang server log")
    try:
        with open(path, "rb") as raw:
            head = raw.read(SNIFF_BYTES)
        with open(path, encoding="utf-8", errors="replace", newline="\n") as fh:
            log = parse_lines(fh)
    except OSError as exc:
        raise UsageError(f"{path}: cannot read it ({exc.strerror})") from exc
    if is_sglang_log(log):  # a log with garbage in it (a crash, a cut) still reads
        return log
    if _sglang_shaped(path):  # an excerpt of lines this reader has no reading for
        return log
    if not head.strip():
        raise UsageError(f"{path}: the file is empty; give the path of an SGLang server log")
    if _binary(head):
        raise UsageError(
            f"{path}: binary data, not an SGLang log; give the path of a server log "
            "(e.g. `journalctl -u sglang > server.log`)"
        )
    raise UsageError(
        f"{path}: not an SGLang log: none of its {log.lines:,} lines is one SGLang prints "
        "(no startup, memory, serving or failure line); give the path of a server log"
    )


def is_sglang_log(log: ParsedLog) -> bool:
    """Whether any line is one SGLang prints (a batch line, or an event beyond a bare error)."""
    return bool(log.batches) or any(e.kind not in _GENERIC for e in log.events)


_SGLANG_FRAME = re.compile(r'^\s*File "[^"]*/sglang/srt/')
"""A traceback frame in SGLang's server code (`File ".../sglang/srt/managers/scheduler.py"`)."""


def _sglang_shaped(path: Path, most: int = 5000) -> bool:
    """Whether the log (its first `most` lines) is SGLang's by its shape though no line is one
    SGLang's reader knows: a line its logger prefixed with a date, a time and a rank tag
    (`[2025-09-17 16:23:13 TP1] `, `[… PP1 TP0] `, at the start of the line or after a log
    collector's prefix; not `PID…`, which any custom logging config gives), or a traceback
    through SGLang's server code. An excerpt of a disaggregation transfer error or a
    watchdog's debug dump is then read, with nothing to show, rather than refused."""
    with open(path, encoding="utf-8", errors="replace", newline="\n") as fh:
        for line in itertools.islice(fh, most):
            if _SGLANG_FRAME.match(line):
                return True
            line = strip_wrapper(line.rstrip("\n"))
            if line.startswith("[20"):  # dated, 0.3.4 on: `[HH:MM:SS TP0]` alone is too thin
                time, rank, message = split_prefix(line)
                if time is not None and is_rank_tag(rank) and message:
                    return True
    return False


def _binary(head: bytes) -> bool:
    """More than a tenth of the bytes are NULs, control bytes or not UTF-8."""
    text = head.decode("utf-8", errors="replace")
    bad = sum(1 for c in text if c == "\ufffd" or (ord(c) < 32 and c not in "\t\n\r\f\v\x1b"))
    return bad > 0.1 * max(len(text), 1)


def startup_missing(log: ParsedLog) -> bool:
    """Whether the log shows none of the start's lines (`STARTUP_KINDS`): it begins after them
    (a rotated file, `journalctl --since`, an excerpt), so only its serving figures and its
    ending can be read."""
    return not any(e.kind in STARTUP_KINDS for e in log.events)


STARTUP_MISSING = (
    "startup: not in this log (none of its lines, from the arguments to graph capture); the "
    "memory figures need the log from the launch on"
)


def summarize_log(log: ParsedLog) -> tuple[Ledger, Verdict, ServingSummary]:
    """A parsed log's memory ledger, verdict and serving summary: what `autotune ledger` prints."""
    verdict = classify(log.events, batches=log.batches)
    return build_ledger(log.events, log.batches), verdict, summarize(log.batches, log.events)


def as_json(ledger: Ledger, verdict: Verdict, serving: ServingSummary, log: ParsedLog) -> str:
    """`autotune ledger --json`'s object: the ledger's fields, the verdict, the serving summary,
    whether the server got ready, whether the log lacks the start, and its line count."""
    doc: dict[str, Any] = ledger.to_dict()
    doc["ready"] = log.first(Kind.READY) is not None
    doc.update(verdict.to_dict())
    doc["serving"] = serving.to_dict()
    doc["startup_missing"] = startup_missing(log)
    doc["lines"] = log.lines
    doc["clamps"] = [
        {"name": c.name, "asked": c.asked, "ran": c.effective, "reason": c.reason,
         "source": c.source}
        for c in Clamps.of(ledger).clamped
    ]  # fmt: skip
    return json.dumps(doc)


_ROWS = (
    ("p_gib", "free before weights (P)", "GiB"),
    ("weights_gib", "weights", "GiB"),
    ("avail_after_weights_gib", "free after weights", "GiB"),
    ("max_total_num_tokens", "KV pool", "tokens"),
    ("kv_gib", "KV pool", "GiB"),
    ("kv_dtype", "KV dtype", ""),
    ("mamba_gib", "Mamba state pool", "GiB"),
    ("req_to_token_gib", "request table (derived)", "GiB"),
    ("avail_after_pool_gib", "free after the KV pool", "GiB"),
    ("draft_weights_gib", "draft weights", "GiB"),
    ("draft_kv_gib", "draft KV pool", "GiB"),
    ("graph_gib", "CUDA graphs", "GiB"),
    ("draft_graph_gib", "draft CUDA graphs", "GiB"),
    ("avail_after_graphs_gib", "free after graph capture", "GiB"),
    ("available_gpu_mem_gib", "free at the summary line", "GiB"),
    ("host_cache_gb", "host cache per rank", "GB"),
    ("host_cache_tokens", "host cache", "tokens"),
    ("max_running_requests", "max running requests", ""),
    ("chunked_prefill_size", "chunked prefill size", "tokens"),
    ("max_prefill_tokens", "max prefill tokens", "tokens"),
    ("context_len", "context length", "tokens"),
    ("model_type", "model class", ""),
    ("ranks", "ranks in the log", ""),
)


_ONLY_WHEN_SHOWN = frozenset({"mamba_gib"})
"""Rows of pools only some models have: left out where the log shows none."""


def as_text(
    ledger: Ledger, verdict: Verdict, serving: ServingSummary, log: ParsedLog | None = None
) -> str:
    """The outcome with its evidence, the ledger table, the serving summary; with `log`, one line
    saying so when the log lacks the start (`startup_missing`)."""
    lines = [f"outcome: {verdict.outcome}" + (f" ({verdict.cause})" if verdict.cause else "")]
    for line in verdict.evidence:
        lines.append(f"  | {line}")
    if log is not None and startup_missing(log):
        lines.append(STARTUP_MISSING)
    lines.append("")
    values = ledger.to_dict()
    for key, label, unit in _ROWS:
        value = values[key]
        if value is None and key in _ONLY_WHEN_SHOWN:
            continue
        if value is None:
            shown = "-"
        elif isinstance(value, float):
            shown = f"{value:.2f}"
        else:
            shown = f"{value:,}" if isinstance(value, int) else str(value)
        lines.append(f"{label:<28} {shown:>14} {unit}".rstrip())
    clamped = Clamps.of(ledger).clamped
    if clamped:
        lines.append("")
        lines += [f"asked vs ran: {c.text()} [SGLang {c.source}]" for c in clamped]
    if serving.decode_lines or serving.prefill_lines or serving.retraction_events:
        lines.append("")  # an excerpt of retractions alone still shows them
        lines.append(_serving(serving))
    return "\n".join(lines) + "\n"


def _serving(serving: ServingSummary) -> str:
    """The batch lines summed up; a figure no line carried is left out, never printed as None. A
    hybrid model's lines name the full-attention pool's usage `full token usage` and give their
    other pool's (SWA tokens, Mamba slots) beside it."""
    hybrid = serving.max_swa_token_usage is not None or serving.max_mamba_usage is not None
    peaks = [
        (f"running {serving.max_running:,}" if serving.max_running is not None else ""),
        (f"queued {serving.max_queued:,}" if serving.max_queued is not None else ""),
        (
            f"{'full ' if hybrid else ''}token usage {serving.max_token_usage:.2f}"
            if serving.max_token_usage is not None
            else ""
        ),
        (
            f"swa token usage {serving.max_swa_token_usage:.2f}"
            if serving.max_swa_token_usage is not None
            else ""
        ),
        (
            f"mamba usage {serving.max_mamba_usage:.2f}"
            if serving.max_mamba_usage is not None
            else ""
        ),
        (
            f"gen throughput {serving.max_gen_throughput:,.1f} tok/s"
            if serving.max_gen_throughput is not None
            else ""
        ),
    ]
    shown = [p for p in peaks if p]
    peak = f"; peak {', '.join(shown)}" if shown else "; no figures on them"
    return (
        f"serving: {serving.prefill_lines} prefill and {serving.decode_lines} decode lines{peak};"
        f" {serving.retracted_requests} request(s) retracted in"
        f" {serving.retraction_events} retraction(s)"
    )
