"""The masking writer between a server and its log (`LogWriter`), a process of its own.

Kept apart from the handle (`server.lifecycle.Server`) because it is a second process with its
own life: started before the server, reaped by its pid, taken over should it die first, and
ended only once the server's last process closed the pipe.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import struct
import sys
import termios
from pathlib import Path

from autotune import masking as scrub
from autotune.errors import HarnessError
from autotune.server import procs
from autotune.server.teardown import Clock, Sleep

WRITER_SETTLE_S = 2.0
"""How long a server's exit waits for its log writer to write what is still in the pipe."""
WRITER_END_S = 2.0
"""How long the teardown waits for the log writer to end by itself once the server is gone."""


class LogWriter:
    """The masking writer between a server and its log (`autotune.masking`: the script
    `masking.py LOG FD`): a process of its own session, so neither autotune's death nor a
    signal meant for either can end it before the server. autotune keeps a read end of the pipe
    too: it never reads it while the writer lives (it only asks how much is waiting), and takes
    over, masking the same way, should the writer die first, so the server never blocks on a
    full pipe or dies of a broken one. Started with `posix_spawn` and reaped here by its pid:
    a handle dropped without `finish` (a crashed autotune) leaves nothing to warn about."""

    def __init__(self, pid: int, read_fd: int, log: Path, secrets: tuple[str, ...]) -> None:
        self.pid = pid
        info = procs.read_proc(pid)
        self.identity = (pid, info.start_ticks if info else 0)
        self._read_fd = read_fd
        self._log = log
        self._secrets = tuple(s.encode() for s in secrets)
        self._relay: scrub.StreamMask | None = None
        self._closed = False
        self._ended = False

    @classmethod
    def start(cls, log: Path, secrets: tuple[str, ...]) -> tuple[LogWriter, int]:
        """Start the writer; returns it and the pipe's write end for the server's output."""
        read_fd, write_fd = os.pipe()
        keys_r, keys_w = os.pipe()
        try:
            os.write(keys_w, b"\0".join(s.encode() for s in secrets))
            os.close(keys_w)
            keys_w = -1
            pid = os.posix_spawn(
                sys.executable,
                [sys.executable, "-P", str(scrub.__file__), str(log), "3"],
                {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8"},
                file_actions=[
                    (os.POSIX_SPAWN_DUP2, read_fd, 0),
                    (os.POSIX_SPAWN_DUP2, keys_r, 3),  # a dup2 to another number is inherited
                    (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                    (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
                ],
                setsid=True,
            )
        except OSError as exc:
            for fd in (read_fd, write_fd, keys_w):
                if fd >= 0:
                    os.close(fd)
            raise HarnessError(f"could not start the log writer for {log}: {exc}") from exc
        finally:
            os.close(keys_r)
        return cls(pid, read_fd, log, secrets), write_fd

    def alive(self) -> bool:
        """The writer still runs (it is reaped here once it ended)."""
        if self._ended:
            return False
        try:
            done, _ = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            done = self.pid
        self._ended = done == self.pid
        return not self._ended

    def waiting(self) -> int:
        """Bytes in the pipe that nobody has read yet."""
        if self._closed:
            return 0
        raw = fcntl.ioctl(self._read_fd, termios.FIONREAD, b"\0\0\0\0")
        return int(struct.unpack("i", raw)[0])

    def settle(self, clock: Clock, sleep: Sleep, limit_s: float = WRITER_SETTLE_S) -> None:
        """Wait until what the server wrote is in the log: the writer ended (end of file), or
        nothing is waiting in the pipe twice in a row; at most `limit_s`."""
        deadline = clock() + limit_s
        empty = 0
        while clock() < deadline and self.alive():
            empty = empty + 1 if self.waiting() == 0 else 0
            if empty >= 2:
                return
            sleep(0.02)

    def relay(self) -> None:
        """Should the writer have died while the server runs, write what waits in the pipe to
        the log ourselves (masked), so the server is never blocked by a full pipe."""
        if self._closed or self.alive():
            return
        if self._relay is None:
            self._relay = scrub.StreamMask(self._secrets)
            os.set_blocking(self._read_fd, False)
        out = b""
        with contextlib.suppress(BlockingIOError, OSError):
            while chunk := os.read(self._read_fd, 1 << 16):
                out += self._relay.feed(chunk)
        if out:
            self._append(out)

    def _append(self, data: bytes) -> None:
        if not data:
            return
        with contextlib.suppress(OSError):  # a full disk drops lines, as the writer does
            fd = os.open(self._log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)

    def finish(self, clock: Clock, sleep: Sleep, limit_s: float) -> str:
        """Once the server is gone: wait up to `limit_s` for the writer to end by itself, else
        kill it (by pid and start time) and write what is left ourselves. Returns a line for
        the teardown's record when it had to be killed ("" otherwise)."""
        note = ""
        deadline = clock() + limit_s
        while self.alive() and clock() < deadline:
            sleep(0.02)
        if self.alive():
            me = procs.ProcInfo(self.identity[0], 0, 0, 0, self.identity[1], "?")
            procs.signal_verified(me, signal.SIGKILL)
            gone_by = clock() + 5.0
            while self.alive() and clock() < gone_by:
                sleep(0.02)
            note = (
                f"log writer pid {self.identity[0]} killed: the pipe was still open "
                f"{limit_s:g} s after the server's processes were stopped"
            )
        self.relay()
        if self._relay is not None:
            self._append(self._relay.end())
        if not self._closed:
            self._closed = True
            os.close(self._read_fd)
        return note
