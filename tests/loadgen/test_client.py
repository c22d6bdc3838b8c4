"""HTTP/1.1 framing fed byte by byte: Content-Length, chunked, read-to-close, bad input."""

from __future__ import annotations

import asyncio

import pytest

from autotune.loadgen.client import BufferSink, Client, Connection, Endpoint, HttpError


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.aborted = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def abort(self) -> None:
        self.aborted = True


async def exchange(
    chunks: list[bytes], close: bool = False
) -> tuple[Connection, BufferSink, float]:
    conn = Connection(clock=lambda: 1.0)
    transport = FakeTransport()
    conn.connection_made(transport)
    sink = BufferSink()
    task = asyncio.create_task(conn.request(b"GET / HTTP/1.1\r\n\r\n", b"", sink))
    await asyncio.sleep(0)
    for c in chunks:
        for i in range(len(c)):
            conn.data_received(c[i : i + 1])
    if close:
        conn.connection_lost(None)
    _, end = await task
    return conn, sink, end


def test_content_length_keeps_connection() -> None:
    conn, sink, _ = asyncio.run(exchange([b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"]))
    assert (sink.status, bytes(sink.body), conn.reusable) == (200, b"hello", True)


def test_chunked_with_extensions_and_trailers() -> None:
    raw = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"3;x=y\r\nabc\r\n2\r\nde\r\n0\r\nT: 1\r\n\r\n"
    )
    conn, sink, _ = asyncio.run(exchange([raw]))
    assert bytes(sink.body) == b"abcde" and conn.reusable


def test_read_to_close_and_connection_close_header() -> None:
    conn, sink, _ = asyncio.run(exchange([b"HTTP/1.0 200 OK\r\n\r\nall of it"], close=True))
    assert bytes(sink.body) == b"all of it" and not conn.reusable
    conn, sink, _ = asyncio.run(
        exchange([b"HTTP/1.1 401 No\r\nConnection: close\r\nContent-Length: 2\r\n\r\nno"])
    )
    assert sink.status == 401 and not conn.reusable


def test_lost_connection_and_garbage_raise_http_error() -> None:
    with pytest.raises(HttpError, match="connection lost"):
        asyncio.run(exchange([b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nabc"], close=True))
    with pytest.raises(HttpError, match="bad status line"):
        asyncio.run(exchange([b"SSH-2.0-OpenSSH\r\n\r\n"]))
    with pytest.raises(HttpError, match="bad chunk size"):
        asyncio.run(exchange([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"]))


def test_endpoint_parsing() -> None:
    assert Endpoint.parse("http://127.0.0.1:3000/") == Endpoint("127.0.0.1", 3000, "")
    assert Endpoint.parse("http://h:1/api") == Endpoint("h", 1, "/api")
    with pytest.raises(ValueError, match="http://HOST:PORT"):
        Endpoint.parse("https://h:1")


def test_request_on_a_connection_closed_while_idle_is_sent_again() -> None:
    """A server that drops kept-alive connections instead of answering their second request."""

    async def main() -> tuple[list[int], list[int]]:
        accepted: list[int] = []

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.append(1)
            try:
                for served in range(2):
                    await reader.readuntil(b"\r\n\r\n")
                    if served == 1:
                        break
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    await writer.drain()
            except asyncio.IncompleteReadError:
                pass
            finally:
                writer.transport.abort()
                await asyncio.sleep(0)

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = Client(f"http://127.0.0.1:{port}")
        statuses = []
        for _ in range(2):
            sink = BufferSink()
            await client.send("GET", "/", b"", sink)
            statuses.append(sink.status)
        client.close()
        await asyncio.sleep(0.05)
        server.close()
        await server.wait_closed()
        return statuses, accepted

    statuses, accepted = asyncio.run(main())
    assert statuses == [200, 200]
    assert len(accepted) == 2
