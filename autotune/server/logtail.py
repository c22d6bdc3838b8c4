"""Following a log file as it grows, the way `tail -F` does, without a pipe to drain.

The server writes into the trial's server.log (appending: `O_APPEND`); autotune reads it again
from where it stopped, through a descriptor it opens as soon as the file exists and keeps. Only
complete lines are handed out; a partial last line waits for its newline (or for `flush` at the
end). tqdm bars rewrite themselves with carriage returns and no newline for minutes, so the byte
count (`consumed`), not the line count, is the progress signal for the stall watchdog.

Rotation and removal while the server runs are followed, not taken for silence:

* truncated in place (logrotate's `copytruncate`): the file is shorter than what was read, or the
  bytes just before the read offset are no longer the ones read there (it was truncated and has
  grown past the old offset since the last look). Reading starts again at byte 0; what was
  written between the copy and the truncation is lost to everyone, as with any copytruncate;
* deleted (or renamed away): the kept descriptor still reads the file the server writes to.
  `keep()` at the end writes it back under its name if nothing else took that name.

Each of these is noted once in `notes`, for the trial's record.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

_CHUNK = 4 << 20
_MAX_PARTIAL = 1 << 20
_CHECK = 64
"""Bytes before the read offset compared on each look, to notice a truncation that the file has
already grown past."""


class LogTail:
    """One log file followed as it grows, through a descriptor kept open, across truncation and
    removal: complete lines out, the bytes read in all as the progress signal."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.offset = 0
        self.consumed = 0
        """Bytes read in all, across truncations: the progress signal."""
        self.notes: list[str] = []
        self._partial = b""
        self._fd: int | None = None
        self._last = b""
        self._truncations = 0
        self._gone_noted = False
        self._open()

    def _open(self) -> bool:
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                return False
        return True

    def read(self, max_bytes: int = 16 * _CHUNK) -> list[str]:
        """Complete lines written since the last call (at most `max_bytes` read per call)."""
        if not self._open():
            return []
        assert self._fd is not None
        self._follow_truncation(self._fd)
        chunks = []
        budget = max_bytes
        while budget > 0:
            data = os.pread(self._fd, min(_CHUNK, budget), self.offset)
            if not data:
                break
            chunks.append(data)
            self.offset += len(data)
            self.consumed += len(data)
            budget -= len(data)
        if not chunks:
            return []
        new = b"".join(chunks)
        self._last = (self._last + new)[-_CHECK:]
        if self._truncations:  # a writer without O_APPEND leaves a hole of NULs behind
            new = new.replace(b"\0", b"")
        data = self._partial + new
        cut = data.rfind(b"\n")
        if cut < 0:
            if len(data) <= _MAX_PARTIAL:
                self._partial = data
                return []
            self._partial = b""  # a runaway line without newline: hand it out anyway
            return [_text(data)]
        self._partial = data[cut + 1 :]
        # Split on newlines only: a carriage return is part of a tqdm line, not a line end.
        return _text(data[:cut]).split("\n")

    def _follow_truncation(self, fd: int) -> None:
        """Start again at byte 0 when the file was truncated under us (see the module doc)."""
        if self.offset == 0:
            return
        size = os.fstat(fd).st_size
        if size >= self.offset:
            if size == self.offset or not self._last:
                return
            seen = os.pread(fd, len(self._last), self.offset - len(self._last))
            if seen == self._last:
                return
        self._truncations += 1
        if self._truncations == 1:
            self.notes.append(
                f"{self.path.name} was truncated while the server ran (copytruncate), after "
                f"{self.consumed} bytes; followed from its start again"
            )
        elif self._truncations in (2, 10, 100):
            self.notes.append(f"{self.path.name} truncated {self._truncations} times so far")
        self.offset = 0
        self._last = b""

    def flush(self) -> list[str]:
        """Everything left, including a last line without newline."""
        lines = self.read()
        if self._partial:
            lines.append(_text(self._partial))
            self._partial = b""
        return lines

    def gone(self) -> bool:
        """The name no longer leads to the file being read (deleted, or renamed away)."""
        if self._fd is None:
            return False
        try:
            named = os.stat(self.path)
        except FileNotFoundError:
            return True
        mine = os.fstat(self._fd)
        return (named.st_dev, named.st_ino) != (mine.st_dev, mine.st_ino)

    def keep(self) -> None:
        """Once the writer is done: if the file was deleted while the server ran, write it back
        under its name (owner-only) from the kept descriptor. A file someone else put under
        the name (a rotation that renamed ours away and created a new one) is left alone."""
        if self._fd is None or not self.gone():
            return
        if self.path.exists():
            self._note_gone("renamed away", "the file now under its name is left as it is")
            return
        tmp = self.path.with_name(self.path.name + ".restore")
        try:
            out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(out, "wb") as dst:
                at = 0
                while data := os.pread(self._fd, _CHUNK, at):
                    dst.write(data)
                    at += len(data)
            os.replace(tmp, self.path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            self._note_gone("deleted", f"could not write it back ({exc.strerror or exc})")
            return
        self._note_gone("deleted", "written back from the file autotune kept open")

    def _note_gone(self, what: str, then: str) -> None:
        if not self._gone_noted:
            self._gone_noted = True
            self.notes.append(f"{self.path.name} was {what} while the server ran; {then}")

    def close(self) -> None:
        """Close the kept descriptor (a later `read` opens the file again)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")
