"""What one server log tells `init`: the last start's arguments and memory ledger, and the serving
lines.

A log may hold several starts (a journal over restarts); the arguments and the ledger are the
last start's (from its `server_args=` line on), the serving lines are every start's: traffic is
traffic. The `server_args=` line is read by `logparse.serverargs.read_server_args` (0.5.23's
resolved dict and 0.5.9's `ServerArgs(…)` repr, literals only, never evaluated).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.bootstrap.traffic import DECODE_LOG_INTERVAL
from autotune.errors import UsageError
from autotune.logparse.accounting import build_ledger
from autotune.logparse.events import STARTUP_KINDS, Batch, Kind, ParsedLog
from autotune.logparse.ledger import Ledger
from autotune.logparse.lines import parse_lines
from autotune.logparse.outcome import Verdict, classify
from autotune.logparse.serverargs import read_server_args
from autotune.logparse.serving import ServingSummary, summarize
from autotune.memory.cell import implied_fraction


@dataclass(frozen=True)
class LogFacts:
    """What `init` takes from one server log: the last start's arguments, ledger and verdict, and
    the serving lines of every start."""

    path: Path
    args: Mapping[str, Any]
    """The last start's `server_args=` values ({} when the log does not show the line)."""
    args_format: str
    """`dict` (0.5.23's resolved dict), `ServerArgs` (0.5.9's repr) or ``."""
    ledger: Ledger
    verdict: Verdict
    serving: ServingSummary
    batches: tuple[Batch, ...]
    """The serving lines of every start, without the server's own warmup before "ready"."""
    starts: int
    startup_s: float | None
    """From the `server_args=` line to "fired up and ready", when both carry a time."""

    @property
    def release(self) -> str | None:
        """The simulated SGLang release whose formats the log's `server_args=` line has."""
        return {"dict": "0.5.23", "ServerArgs": "0.5.9"}.get(self.args_format)

    @property
    def decode_log_interval(self) -> int:
        """`--decode-log-interval` as the log's `server_args=` line shows it, else SGLang's
        default: the decode forwards each Decode line closes."""
        value = self.args.get("decode_log_interval")
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
        return DECODE_LOG_INTERVAL

    @property
    def shown_fraction(self) -> float | None:
        """`mem_fraction_static` as the log's `server_args=` line shows it."""
        value = self.args.get("mem_fraction_static")
        if isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < 1:
            return float(value)
        return self.ledger.mem_fraction_static

    @property
    def fraction(self) -> float | None:
        """The fraction the log's start used: shown, else what its pool implies."""
        shown = self.shown_fraction
        return shown if shown is not None else implied_fraction(self.ledger)


def read_log(path: Path) -> ParsedLog:
    """The log at `path` parsed (`logparse.events.parse_lines`); a missing or unreadable file is the
    operator's `UsageError`, naming `--from-log`."""
    if not path.is_file():
        raise UsageError(f"--from-log {path}: no such file; give the path of an SGLang server log")
    try:
        with open(path, encoding="utf-8", errors="replace", newline="\n") as fh:
            return parse_lines(fh)
    except OSError as exc:
        raise UsageError(f"--from-log {path}: cannot read it ({exc.strerror})") from None


def log_facts(path: Path) -> LogFacts:
    """The facts of the log at `path`; a log with no `server_args`, memory or batch line is refused
    (`UsageError`) rather than read as an empty study. A memory line is any of the start's
    (`STARTUP_KINDS`): an excerpt from the KV pool on, without `Load weight begin`, still has
    its pool, graphs and summary line."""
    log = read_log(path)
    starts = log.of(Kind.SERVER_ARGS)
    first_line = starts[-1].line_no if starts else 0
    events = tuple(e for e in log.events if e.line_no >= first_line)
    ledger = build_ledger(events, (b for b in log.batches if b.line_no >= first_line))
    if not starts and not log.batches and not any(e.kind in STARTUP_KINDS for e in events):
        raise UsageError(
            f"--from-log {path}: no server_args, memory or batch line SGLang prints; "
            "give the log of a server start (journalctl -u UNIT > server.log)"
        )
    args = read_server_args(starts[-1].text) if starts else {}
    ready = next((e for e in events if e.kind is Kind.READY), None)
    startup_s = None
    if starts and ready and starts[-1].time is not None and ready.time is not None:
        startup_s = max(ready.time - starts[-1].time, 0.0)
    batches = _serving(log)
    return LogFacts(
        path=path,
        args=args,
        args_format=(starts[-1].label or "") if starts else "",
        ledger=ledger,
        verdict=classify(events),
        serving=summarize(batches, log.events),
        batches=batches,
        starts=len(starts),
        startup_s=startup_s,
    )


def _serving(log: ParsedLog) -> tuple[Batch, ...]:
    """Batch lines outside each start's own warmup (from `server_args=` to "fired up")."""
    marks = sorted(
        [(e.line_no, 1) for e in log.of(Kind.SERVER_ARGS)]
        + [(e.line_no, 0) for e in log.of(Kind.READY)]
    )
    starting = [(line, kind) for line, kind in marks]
    out: list[Batch] = []
    at = 0
    inside = False
    for batch in log.batches:
        while at < len(starting) and starting[at][0] <= batch.line_no:
            inside = starting[at][1] == 1
            at += 1
        if not inside:
            out.append(batch)
    return tuple(out)
