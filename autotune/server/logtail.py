"""Following a log file as it grows, the way `tail -f` does, without a pipe to drain.

The server writes straight into the trial's server.log; autotune reads it again from where it
stopped. Only complete lines are handed out; a partial last line waits for its newline (or for
`flush` at the end). tqdm bars rewrite themselves with carriage returns and no newline for
minutes, so the byte count, not the line count, is the progress signal for the stall watchdog.
"""

from __future__ import annotations

import os
from pathlib import Path

_CHUNK = 4 << 20
_MAX_PARTIAL = 1 << 20


class LogTail:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.offset = 0
        self._partial = b""
        self._fd: int | None = None

    def read(self, max_bytes: int = 16 * _CHUNK) -> list[str]:
        """Complete lines written since the last call (at most `max_bytes` read per call)."""
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                return []
        chunks = []
        budget = max_bytes
        while budget > 0:
            data = os.pread(self._fd, min(_CHUNK, budget), self.offset)
            if not data:
                break
            chunks.append(data)
            self.offset += len(data)
            budget -= len(data)
        if not chunks:
            return []
        data = self._partial + b"".join(chunks)
        cut = data.rfind(b"\n")
        if cut < 0:
            if len(data) <= _MAX_PARTIAL:
                self._partial = data
                return []
            self._partial = b""  # a runaway line without newline: hand it out anyway
            return [data.decode("utf-8", errors="replace")]
        self._partial = data[cut + 1 :]
        # Split on newlines only: a carriage return is part of a tqdm line, not a line end.
        return data[:cut].decode("utf-8", errors="replace").split("\n")

    def flush(self) -> list[str]:
        """Everything left, including a last line without newline."""
        lines = self.read()
        if self._partial:
            lines.append(self._partial.decode("utf-8", errors="replace"))
            self._partial = b""
        return lines

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
