"""Writing SGLang-formatted lines: the `[YYYY-MM-DD HH:MM:SS TPn]` prefix, one flushed write each.

`LogWriter` adds `[YYYY-MM-DD HH:MM:SS]` or `[YYYY-MM-DD HH:MM:SS TPn]` (no TP tag when tp == 1)
to a line and writes it with one call, flushed, so a reader tailing the file never sees half a
line; uvicorn's and the access log's prefixes too. It owns the streams, the clock and the lock,
the simulator's only log I/O, and stands apart from the text (`loglines`, `tracebacks`), which
is pure and per release.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import sys
import threading
from collections.abc import Callable
from typing import TextIO

_P_LINE = "Load weight begin. avail mem="
_END_LINE = "Load weight end."


def _now() -> dt.datetime:
    return dt.datetime.now()


class LogWriter:
    """Writes SGLang-formatted lines to one stream (scheduler/main logs) and access logs."""

    def __init__(
        self,
        tp: int,
        stream: TextIO | None = None,
        access_stream: TextIO | None = None,
        clock: Callable[[], dt.datetime] = _now,
    ) -> None:
        self.tp = tp
        self.stream = stream if stream is not None else sys.stderr
        self.access_stream = access_stream if access_stream is not None else sys.stdout
        self.clock = clock
        self.reworded = False
        """Print P and the weights' usage reworded (the `reword-log` fault), as a release that
        rewords its lines."""
        self._lock = threading.Lock()

    def _stamp(self) -> str:
        return self.clock().strftime("%Y-%m-%d %H:%M:%S")

    def _emit(self, stream: TextIO, text: str) -> None:
        # SGLang logs through Python's logging, which drops a line it cannot write (a full
        # disk) and carries on serving; so does the simulator.
        with self._lock, contextlib.suppress(OSError):
            stream.write(text if text.endswith("\n") else text + "\n")
            stream.flush()

    def main(self, message: str) -> None:
        """A main-process (tokenizer/HTTP) line: no rank tag."""
        self._emit(self.stream, f"[{self._stamp()}] {message}")

    def rank(self, rank: int, message: str) -> None:
        """Write `message` as rank `rank`'s line (`TPn` in the prefix only when tp > 1)."""
        self._emit(self.stream, self.rank_text(rank, message))

    def rank_text(self, rank: int, message: str, stamp: str | None = None) -> str:
        """Rank `rank`'s line as `rank` writes it, newline included, for a rank's own process to
        write (`stamp` in place of the time, for a line written later)."""
        tag = f" TP{rank}" if self.tp > 1 else ""
        if self.reworded and message.startswith(_P_LINE):
            message = f"Weight loading begins, free memory: {message[len(_P_LINE) :]}"
        elif self.reworded and message.startswith(_END_LINE):
            # the usage is P less A: left as it was, it would give P back
            message = message.replace(", mem usage=", ", the weights took ")
        text = f"[{self._stamp() if stamp is None else stamp}{tag}] {message}"
        return text if text.endswith("\n") else text + "\n"

    def every_rank(self, message: str | Callable[[int], str]) -> None:
        """Write `message` once per rank, in rank order (a callable gets the rank and gives its
        text), as each TP worker prints its own line."""
        for r in range(self.tp):
            self.rank(r, message(r) if callable(message) else message)

    def uvicorn(self, message: str, level: str = "INFO") -> None:
        """Write one of uvicorn's lines, its level padded as uvicorn pads it (`INFO:     …`)."""
        prefix = f"{level}:" + " " * (8 - len(level))
        self._emit(self.stream, f"[{self._stamp()}] {prefix} {message}")

    def access(self, client: str, method: str, path: str, status: int) -> None:
        """Write one access-log line as uvicorn's access logger prints it, to the access stream."""
        line = f'[{self._stamp()}] INFO:     {client} - "{method} {path} HTTP/1.1" {status}'
        self._emit(self.access_stream, line)

    def raw(self, text: str) -> None:
        """Unprefixed text (traceback bodies, tqdm bars)."""
        self._emit(self.stream, text)
