"""Standard output and error that a reader gone cannot stop: `autotune run … | head -3`, a
terminal or SSH session that hung up, an output file on a full disk.

Python ignores SIGPIPE, so a write to a pipe nobody reads raises `BrokenPipeError` (EPIPE), and a
write to a hung-up terminal `OSError` (EIO). Raised from a progress line in the middle of a
trial, either would end the run with a traceback and leave the trial RUNNING and its server up.
`tolerant_streams` puts a `Tolerant` wrapper in place of `sys.stdout` and `sys.stderr` while a
command runs: a write or flush that fails marks the stream gone, its lines from then on are
dropped (the study's records, `trial.json` and the storage, keep everything they said), and one
line on the other stream says so when it still can. The descriptor of a stream gone is pointed
at /dev/null (`dup2`), so what Python still holds in its buffer, flushed when the interpreter
exits, goes nowhere instead of ending in a traceback and exit code 120.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterable, Iterator
from typing import TextIO, cast

STREAM_ERRORS = (OSError, ValueError)
"""What writing to a stream gone raises: EPIPE, EIO, ENOSPC (`OSError`), a closed file
(`ValueError`). A `UnicodeEncodeError` (a `ValueError` too) is no stream gone: the line is
written again with backslash escapes."""


class Tolerant:
    """A text stream (`inner`) whose writes never raise: once one fails, the stream is gone and
    what is written to it is dropped. `name` is the stream's name for the one line that says
    so, written to `other` (the other standard stream, when it is still there)."""

    def __init__(self, inner: TextIO, name: str) -> None:
        self._inner = inner
        self.name = name
        self.other: Tolerant | None = None
        self.gone = ""
        """Why the stream is gone ("" while it works)."""

    def write(self, text: str) -> int:
        """Write `text` to the inner stream; a failure marks the stream gone, and `text` counts as
        written."""
        if not self.gone:
            try:
                try:
                    return self._inner.write(text)
                except UnicodeEncodeError:
                    # A character the stream's encoding cannot carry (an ASCII locale, a
                    # non-ASCII path or `≥`): the stream is there, so the line goes out escaped.
                    self._inner.write(_escaped(text, getattr(self._inner, "encoding", None)))
                    return len(text)
            except STREAM_ERRORS as exc:
                self._lose(exc)
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        """Each line through `write`, so a failure part way drops the rest."""
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        """Flush the inner stream; a failure marks the stream gone instead of raising."""
        if not self.gone:
            try:
                self._inner.flush()
            except STREAM_ERRORS as exc:
                self._lose(exc)

    def isatty(self) -> bool:
        """Whether the inner stream is a terminal; a stream gone (or one that cannot tell) is
        not."""
        if self.gone:
            return False
        try:
            return self._inner.isatty()
        except STREAM_ERRORS:
            return False

    def fileno(self) -> int:
        """The inner stream's descriptor, for callers that `dup2` or poll it."""
        return self._inner.fileno()

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    def _lose(self, exc: BaseException) -> None:
        self.gone = (getattr(exc, "strerror", None) or str(exc)) or type(exc).__name__
        _to_devnull(self._inner)
        if self.other is not None and not self.other.gone:
            self.other.write(
                f"autotune: warning: standard {self.name} is gone ({self.gone}); its lines are "
                "dropped from here on and the run goes on (its records keep everything: "
                "`autotune status`)\n"
            )
            self.other.flush()


def _escaped(text: str, encoding: str | None) -> str:
    """`text` with what `encoding` cannot carry written as backslash escapes (`\\u2265`)."""
    codec = encoding or "ascii"
    return text.encode(codec, "backslashreplace").decode(codec, "replace")


def _to_devnull(stream: TextIO) -> None:
    """Point the stream's descriptor at /dev/null, so the interpreter's last flush of what its
    buffer still holds succeeds; a stream without a descriptor is left as it is."""
    with contextlib.suppress(*STREAM_ERRORS, AttributeError):
        fd = stream.fileno()
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, fd)
        finally:
            os.close(null)


@contextlib.contextmanager
def tolerant_streams() -> Iterator[None]:
    """`sys.stdout` and `sys.stderr` as `Tolerant` streams while the block runs; the originals
    are put back (flushed through the wrappers first) when it ends. A standard stream closed
    before autotune started (`>&-`) is /dev/null."""
    saved = sys.stdout, sys.stderr
    out = Tolerant(sys.stdout or _devnull(), "output")
    err = Tolerant(sys.stderr or _devnull(), "error")
    out.other, err.other = err, out
    sys.stdout, sys.stderr = cast(TextIO, out), cast(TextIO, err)
    try:
        yield
    finally:
        out.flush()
        err.flush()
        sys.stdout, sys.stderr = saved


def _devnull() -> TextIO:
    return open(os.devnull, "w", encoding="utf-8")
