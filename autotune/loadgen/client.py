"""The HTTP/1.1 client: keep-alive connections on asyncio protocols, bodies pushed to a sink.

Why not aiohttp: the load generator must never be the bottleneck, and a generic client spends
most of its time per streamed chunk in layers we do not need (a task wake-up, a StreamReader
and a line splitter per chunk). Here the socket callback decodes the framing (Content-Length,
chunked, or read-to-close) and hands each body piece, stamped with its arrival time, straight
to a `BodySink` in the same callback; the request's coroutine wakes once, when the response
ends. Reads take whatever the kernel has (asyncio reads up to 256 KiB at a time) and the
buffer grows as needed, so a 128K-token context or a long cumulative stream never stalls on a
small buffer. Only plain http:// on a host:port is supported: autotune talks to loopback.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

MAX_HEADER_BYTES = 64 * 1024
Clock = Callable[[], float]


class HttpError(Exception):
    """The connection failed or the response was malformed (not an HTTP error status)."""


class BodySink(Protocol):
    """Receives a response as it arrives; called from the socket callback, must not block."""

    def on_headers(self, status: int, headers: dict[str, str]) -> None:
        """The response's status and headers, once, before any of the body."""

    def on_data(self, ts: float, data: bytes | memoryview) -> None:
        """A piece of the body; a memoryview is valid only during the call (copy to keep)."""


@dataclass(frozen=True)
class Endpoint:
    """Where a server listens, from its base URL: host, port and the path prefix every request
    gets."""

    host: str
    port: int
    path_prefix: str

    @staticmethod
    def parse(base_url: str) -> Endpoint:
        """`base_url` (`http://HOST:PORT[/prefix]`) as an endpoint; anything but plain http is a
        `ValueError`."""
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"base URL must look like http://HOST:PORT, got {base_url!r}")
        return Endpoint(parts.hostname, parts.port or 80, parts.path.rstrip("/"))


class Heard:
    """When the server last sent a byte on any connection of a client (the client's clock);
    written by the socket callbacks, read from any thread (one float)."""

    __slots__ = ("at",)

    def __init__(self) -> None:
        self.at = float("-inf")


class _Exchange:
    __slots__ = ("done", "end_ts", "sink", "status")

    def __init__(self, sink: BodySink, done: asyncio.Future[float]) -> None:
        self.sink = sink
        self.done = done
        self.status = 0
        self.end_ts = 0.0


class Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection; one request at a time."""

    def __init__(self, clock: Clock = time.perf_counter, heard: Heard | None = None) -> None:
        self.clock = clock
        self._heard = heard if heard is not None else Heard()
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reusable = False
        self._buf = bytearray()
        self._ex: _Exchange | None = None
        self._state = 0  # 0 idle, 1 headers, 2 length body, 3 chunk size, 4 chunk data,
        #                  5 chunk CRLF, 6 trailers, 7 read to close
        self._left = 0
        self._keep_alive = True
        self.served = 0  # requests sent on this connection
        self.answered = False  # any byte of the current response arrived
        self._can_write = asyncio.Event()
        self._can_write.set()

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Keep the transport the requests are written to (asyncio's callback)."""
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def pause_writing(self) -> None:
        """The transport's buffer is full: hold writes until `resume_writing` (asyncio's flow
        control)."""
        self._can_write.clear()

    def resume_writing(self) -> None:
        """The transport's buffer drained: let held writes go on."""
        self._can_write.set()

    def connection_lost(self, exc: Exception | None) -> None:
        """The socket closed: a read-to-close body ends there, any other open exchange fails with
        `HttpError`, and the connection is never reused."""
        self.closed = True
        self.reusable = False
        self._can_write.set()
        ex = self._ex
        if ex is None:
            return
        self._ex = None
        if ex.done.done():
            return
        if self._state == 7:
            ex.done.set_result(self.clock())
        else:
            ex.done.set_exception(HttpError(f"connection lost ({exc or 'closed by server'})"))

    def data_received(self, data: bytes) -> None:
        """Bytes from the socket, stamped on arrival: the current exchange's framing decoded and its
        body handed to the sink in this callback (a chunk's bytes straight from the read when
        nothing is buffered); bytes nobody asked for close the connection."""
        ts = self.clock()
        if self._ex is None:
            self.close()  # bytes nobody asked for: this connection is out of step
            return
        self.answered = True
        self._heard.at = ts
        if self._state == 4 and not self._buf:
            # Inside a chunk with nothing buffered (a big event spread over many reads): hand
            # the chunk's bytes to the sink straight from this read, without buffering them.
            left = self._left
            if len(data) < left:
                self._left = left - len(data)
                self._ex.sink.on_data(ts, data)
                return
            with memoryview(data) as view:
                self._ex.sink.on_data(ts, view[:left])
                self._left, self._state = 0, 5
                self._buf += view[left:]
        else:
            self._buf += data
        try:
            self._parse(ts)
        except HttpError as exc:
            ex, self._ex = self._ex, None
            self.close()
            if ex is not None and not ex.done.done():
                ex.done.set_exception(exc)

    # parsing
    def _parse(self, ts: float) -> None:
        buf = self._buf
        while self._ex is not None:
            ex = self._ex
            state = self._state
            if state == 1:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(buf) > MAX_HEADER_BYTES:
                        raise HttpError("response headers too large")
                    return
                self._headers(bytes(buf[:end]), ex)
                del buf[: end + 4]
            elif state == 2 or state == 4:
                if not buf:
                    return
                n = min(self._left, len(buf))
                with memoryview(buf) as view:
                    ex.sink.on_data(ts, view[:n])
                del buf[:n]
                self._left -= n
                if self._left == 0:
                    if state == 2:
                        self._finish(ts)
                    else:
                        self._state = 5
                else:
                    return
            elif state == 3 and self._whole_chunks(ts, ex):
                continue
            elif state == 3 or state == 5 or state == 6:
                end = buf.find(b"\r\n")
                if end < 0:
                    if len(buf) > MAX_HEADER_BYTES:
                        raise HttpError("chunk framing line too long")
                    return
                line = bytes(buf[:end])
                del buf[: end + 2]
                if state == 5:
                    self._state = 3
                elif state == 6:
                    if not line:
                        self._finish(ts)
                else:
                    try:
                        size = int(line.split(b";", 1)[0], 16)
                    except ValueError as exc:
                        raise HttpError(f"bad chunk size {line[:20]!r}") from exc
                    if size == 0:
                        self._state = 6
                    else:
                        self._left, self._state = size, 4
            elif state == 7:
                if buf:
                    with memoryview(buf) as view:
                        ex.sink.on_data(ts, view)
                    buf.clear()
                return
            else:
                return

    def _whole_chunks(self, ts: float, ex: _Exchange) -> bool:
        """Fast path: hand every complete non-final chunk in the buffer to the sink at once
        (one chunk as a view of the buffer, several joined once).

        Returns False when there is none (a partial chunk or the last one is next).
        """
        buf = self._buf
        n = len(buf)
        pos = 0
        parts: list[tuple[int, int]] = []
        while True:
            end = buf.find(b"\n", pos)
            if end < 1 or buf[end - 1] != 13:
                break  # no whole size line yet, or a bad one: the slow path reports it
            try:
                size = int(buf[pos : end - 1].split(b";", 1)[0], 16)
            except ValueError:
                break
            stop = end + 1 + size
            if size == 0 or stop + 2 > n:
                break
            parts.append((end + 1, stop))
            pos = stop + 2
        if not parts:
            return False
        with memoryview(buf) as view:
            if len(parts) == 1:
                ex.sink.on_data(ts, view[parts[0][0] : parts[0][1]])
            else:
                ex.sink.on_data(ts, b"".join([view[a:b] for a, b in parts]))
        del buf[:pos]
        return True

    def _headers(self, head: bytes, ex: _Exchange) -> None:
        lines = head.decode("latin-1").split("\r\n")
        status_line = lines[0].split(" ", 2)
        if len(status_line) < 2 or not status_line[0].startswith("HTTP/"):
            raise HttpError(f"bad status line {lines[0][:60]!r}")
        try:
            ex.status = int(status_line[1])
        except ValueError as exc:
            raise HttpError(f"bad status line {lines[0][:60]!r}") from exc
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        self._keep_alive = (
            status_line[0] == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
        )
        ex.sink.on_headers(ex.status, headers)
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self._state = 3
        elif "content-length" in headers:
            try:
                self._left = int(headers["content-length"])
            except ValueError as exc:
                raise HttpError("bad content-length") from exc
            self._state = 2
            if self._left == 0:
                self._finish(self.clock())
        elif ex.status in (204, 304) or 100 <= ex.status < 200:
            self._finish(self.clock())
        else:
            self._state, self._keep_alive = 7, False

    def _finish(self, ts: float) -> None:
        ex, self._ex = self._ex, None
        self._state = 0
        if self._keep_alive and not self._buf:
            self.reusable = True
        else:
            self.close()
        if ex is not None and not ex.done.done():
            ex.done.set_result(ts)

    # requests
    async def request(
        self,
        head: bytes,
        body: bytes,
        sink: BodySink,
        on_send: Callable[[float], None] | None = None,
    ) -> tuple[float, float]:
        """Send one request; returns (sent_ts, end_ts). Raises HttpError on connection trouble.

        `on_send(ts)` is called just before the bytes are written.
        """
        if self.closed or self.transport is None or self._ex is not None:
            raise HttpError("connection not usable")
        loop = asyncio.get_running_loop()
        done: asyncio.Future[float] = loop.create_future()
        self._ex = _Exchange(sink, done)
        self._state = 1
        self.reusable = False
        self.answered = False
        self.served += 1
        sent = self.clock()
        if on_send is not None:
            on_send(sent)
        self.transport.write(head + body if len(body) < 65536 else head)
        if len(body) >= 65536:
            self.transport.write(body)
        if not self._can_write.is_set():
            await self._can_write.wait()
        try:
            end = await done
        except asyncio.CancelledError:
            self._ex = None
            self.close()
            raise
        return sent, end

    def close(self) -> None:
        """Abort the socket (no graceful close) and mark the connection not reusable."""
        self.reusable = False
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.abort()


class Client:
    """A pool of keep-alive connections to one server, with prebuilt request heads."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: dict[str, str] | None = None,
        clock: Clock = time.perf_counter,
        connect_timeout_s: float = 10.0,
    ) -> None:
        self.endpoint = Endpoint.parse(base_url)
        self.clock = clock
        self.connect_timeout_s = connect_timeout_s
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._host_line = f"Host: {self.endpoint.host}:{self.endpoint.port}\r\n{extra}"
        self._idle: list[Connection] = []
        self._all: set[Connection] = set()
        self.heard = Heard()
        """When the server last sent anything (a hang watchdog reads it)."""

    def head(
        self, method: str, path: str, body_len: int, content_type: str = "application/json"
    ) -> bytes:
        """A request's head bytes (request line, host and any extra headers, content type and
        length), built from the strings prepared once per client."""
        return (
            f"{method} {self.endpoint.path_prefix}{path} HTTP/1.1\r\n{self._host_line}"
            f"Content-Type: {content_type}\r\nContent-Length: {body_len}\r\n"
            "Accept: */*\r\n\r\n"
        ).encode("latin-1")

    async def _connect(self) -> Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(
                    lambda: Connection(self.clock, self.heard),
                    self.endpoint.host,
                    self.endpoint.port,
                ),
                self.connect_timeout_s,
            )
        except (OSError, TimeoutError) as exc:
            raise HttpError(f"cannot connect ({exc.__class__.__name__}: {exc})") from exc
        self._all.add(conn)
        return conn

    async def acquire(self) -> Connection:
        """An idle reusable connection from the pool, else a new one."""
        while self._idle:
            conn = self._idle.pop()
            if conn.reusable and not conn.closed:
                return conn
            self._all.discard(conn)
        return await self._connect()

    def release(self, conn: Connection) -> None:
        """Put `conn` back in the pool when it can serve another request, else close and forget
        it."""
        if conn.reusable and not conn.closed:
            self._idle.append(conn)
        else:
            conn.close()
            self._all.discard(conn)

    async def send(
        self,
        method: str,
        path: str,
        body: bytes,
        sink: BodySink,
        on_send: Callable[[float], None] | None = None,
    ) -> tuple[float, float]:
        """One request on a pooled connection; returns (sent_ts, end_ts).

        A kept-alive connection the server closed while idle (uvicorn does after 5 s) fails
        before any answer arrives; that request is sent once more on a new connection.
        """
        head = self.head(method, path, len(body))
        for attempt in range(2):
            conn = await self.acquire()
            reused = conn.served > 0
            try:
                result = await conn.request(head, body, sink, on_send)
            except HttpError:
                self._drop(conn)
                if attempt == 0 and reused and not conn.answered:
                    continue
                raise
            except BaseException:
                self._drop(conn)
                raise
            self.release(conn)
            return result
        raise AssertionError("unreachable")

    def _drop(self, conn: Connection) -> None:
        conn.close()
        self._all.discard(conn)

    async def get_json(self, path: str, timeout_s: float = 10.0) -> tuple[int, bytes]:
        """A small GET (e.g. /v1/models); returns (status, body)."""
        sink = BufferSink()
        conn = await self.acquire()
        head = (
            f"GET {self.endpoint.path_prefix}{path} HTTP/1.1\r\n"
            f"{self._host_line}Accept: */*\r\n\r\n"
        ).encode("latin-1")
        try:
            await asyncio.wait_for(conn.request(head, b"", sink), timeout_s)
        except BaseException:
            conn.close()
            self._all.discard(conn)
            raise
        self.release(conn)
        return sink.status, bytes(sink.body)

    def close(self) -> None:
        """Close every connection of the pool, idle or busy."""
        for conn in self._all:
            conn.close()
        self._all.clear()
        self._idle.clear()


class BufferSink:
    """Collects a whole response body."""

    def __init__(self) -> None:
        self.status = 0
        self.body = bytearray()

    def on_headers(self, status: int, headers: dict[str, str]) -> None:
        """Keep the response's status."""
        self.status = status

    def on_data(self, ts: float, data: bytes | memoryview) -> None:
        """Append a piece of the body (copied: a memoryview lives only during the call)."""
        self.body += data
