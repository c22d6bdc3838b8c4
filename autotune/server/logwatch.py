"""The live view of one server's log: what it said so far, which phase it is in, when it moved.

`LogWatch.pump()` reads what the server wrote since the last call (`LogTail`), parses it
(`logparse`), feeds the startup phases (`PhaseClock`) and notes the moments the lifecycle
decides on: the last byte of growth (stall watchdog), the last batch line (a live server), the
"fired up" line and the first line that ends the run (`failure_at`). Time comes from the injected
clock.

A line ends the run when SGLang treats it as a death (`logparse.events.FAILURE_KINDS`, but not a
bare `…Error:` line, which can be a handled request error) or SGLang logged a SIGTERM (autotune
reads the log while it stops the server only after its stop began, so one seen while following
is foreign: the server now drains and refuses requests). Serving events never end it: a
retraction (`KV cache pool is full. Retract requests.`, `Decode out of memory happened.`), a
handled out-of-memory fallback, SGLang waiting for a port.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from pathlib import Path

from autotune.logparse.events import FAILURE_KINDS, Batch, Event, Kind
from autotune.logparse.lines import DraftProfile, parse_line
from autotune.logparse.phase import Phase, PhaseClock
from autotune.server.logtail import LogTail

MAX_BATCHES = 200_000
"""Batch lines kept (a week of serving at the default decode log interval is far fewer)."""

ENDS_RUN = (FAILURE_KINDS - {Kind.ERROR}) | {Kind.SIGTERM_RECEIVED}
"""The kinds of line that set `LogWatch.failure_at`."""


class LogWatch:
    """One server's log as read so far: its events, recent batches and startup phase, and the
    moments the lifecycle decides on (growth, last batch, ready, the first line that ends the
    run)."""

    def __init__(self, path: Path, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._tail = LogTail(path)
        now = clock()
        self.phases = PhaseClock(now)
        self.events: list[Event] = []
        self.batches: deque[Batch] = deque(maxlen=MAX_BATCHES)
        self.lines = 0
        self.last_growth = now
        self.last_batch_at: float | None = None
        self.last_decode_at: float | None = None
        """When the last Decode batch line was read: the scheduler was generating then."""
        self.ready_line_at: float | None = None
        self.failure_at: float | None = None
        """When the first line that ends the run (`ENDS_RUN`) was read; None while none was."""
        self._recent: deque[str] = deque(maxlen=5)
        self._draft = DraftProfile()

    @property
    def phase(self) -> Phase:
        """The startup phase the log has reached."""
        return self.phases.phase

    def pump(self, final: bool = False) -> None:
        """Take in what was written since the last call; `final` also takes a last line that
        has no newline (the writer is gone)."""
        before = self._tail.consumed
        lines = self._tail.flush() if final else self._tail.read()
        now = self._clock()
        if self._tail.consumed != before:
            self.last_growth = now
        self._recent.extend(line for line in lines[-5:] if line.strip())
        for line in lines:
            self.lines += 1
            item = parse_line(line, self.lines)
            if item is None:
                continue
            if isinstance(item, Batch):
                self.batches.append(item)
                self.last_batch_at = now
                if item.phase == "decode":
                    self.last_decode_at = now
                continue
            item = self._draft.settle(item)
            self.events.append(item)
            self.phases.feed(item, now)
            if item.kind is Kind.READY and self.ready_line_at is None:
                self.ready_line_at = now
            if item.kind in ENDS_RUN and self.failure_at is None:
                self.failure_at = now

    def last_lines(self) -> tuple[str, ...]:
        """The last few non-empty lines: the only evidence when a process died silently."""
        return tuple(line.strip() for line in self._recent)

    @property
    def notes(self) -> tuple[str, ...]:
        """What happened to the file itself while it was followed (truncated, deleted)."""
        return tuple(self._tail.notes)

    def close(self) -> None:
        """Stop following; a log deleted while the server ran is written back first."""
        self._tail.keep()
        self._tail.close()
