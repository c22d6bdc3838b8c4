"""Huge streamed events: found with one scan, native cumulative events read without their text.

SGLang's native stream repeats the whole text so far in every event, so an event can be
hundreds of KiB; the reader must stay linear in the bytes received and read only `meta_info`.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from autotune.loadgen.apis import ResponseReader
from autotune.loadgen.client import BufferSink, Connection
from tests.loadgen.test_client import FakeTransport


def native(text: str, tokens: int, extra: dict[str, object] | None = None) -> bytes:
    """An event as SGLang's http_server writes it (orjson: no spaces, keys in this order)."""
    meta = {"id": "r", "finish_reason": None, "prompt_tokens": 7, "completion_tokens": tokens}
    obj: dict[str, object] = {"text": text, "output_ids": list(range(tokens)), "meta_info": meta}
    obj.update(extra or {})
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def read(api: str, pieces: list[bytes]) -> ResponseReader:
    r = ResponseReader(api, True, 0.0, 99)
    r.on_headers(200, {})
    for i, piece in enumerate(pieces):
        r.on_data(1.0 + i, piece)
    r.finish(1.0 + len(pieces))
    return r


def split(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def test_text_that_mimics_the_keys_does_not_confuse_the_reader() -> None:
    tricky = 'x","meta_info":{"completion_tokens":999},"a":"\\"}\n\n'
    stream = native(tricky, 1) + native(tricky + "y", 3) + b"data: [DONE]\n\n"
    for size in (1, 7, len(stream)):
        r = read("generate", split(stream, size))
        assert (r.error, r.output_tokens, r.prompt_tokens, r.done) == (None, 3, 7, True)
        assert len(r.itl) == 2  # the gap split over the two new tokens


def test_empty_text_is_no_token_and_a_long_meta_after_the_window_still_reads() -> None:
    big_meta = {"prompt_token_ids": list(range(3000))}  # after meta_info, past its window
    stream = native("", 0) + native("a", 1, big_meta) + native("abc", 3, big_meta)
    r = read("generate", [stream])
    assert (r.error, r.output_tokens, r.ttft, len(r.itl)) == (None, 3, 1.0, 2)


def test_crlf_lines_comments_and_an_error_event() -> None:
    stream = (
        b": keep-alive\r\n\r\n"
        + native("a", 1).replace(b"\n\n", b"\r\n\r\n")
        + b'data: {"error":{"message":"boom"}}\n\n'
    )
    r = read("generate", split(stream, 5))
    assert r.error == "server error: boom" and r.output_tokens == 1


def test_a_huge_event_in_small_reads_costs_linear_time() -> None:
    """8 MiB in 1 KiB reads: re-searching the buffer from its start each read would scan
    ~32 GB (minutes); one pass is milliseconds."""
    text = "w" * (8 << 20)
    stream = native(text, 1) + native(text + "w", 2)
    pieces = split(stream, 1024)
    start = time.perf_counter()
    r = read("generate", pieces)
    assert time.perf_counter() - start < 3.0
    assert (r.error, r.output_tokens, len(r.itl)) == (None, 2, 1)


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8, 13, 64, 10_000])
def test_chunk_bodies_handed_on_without_buffering_arrive_whole(size: int) -> None:
    body = b"".join(native("w" * i, i) for i in range(1, 40))
    raw = bytearray(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    for part in split(body, 97):
        raw += b"%x\r\n%s\r\n" % (len(part), part)
    raw += b"0\r\n\r\n"

    async def go() -> BufferSink:
        conn = Connection(clock=lambda: 1.0)
        conn.connection_made(FakeTransport())
        sink = BufferSink()
        task = asyncio.create_task(conn.request(b"GET / HTTP/1.1\r\n\r\n", b"", sink))
        await asyncio.sleep(0)
        for piece in split(bytes(raw), size):
            conn.data_received(piece)
        await task
        return sink

    assert bytes(asyncio.run(go()).body) == body


@pytest.mark.parametrize("separators", [(",", ":"), (", ", ": ")])
def test_native_events_are_read_in_place(
    monkeypatch: pytest.MonkeyPatch, separators: tuple[str, str]
) -> None:
    """orjson's compact events (SGLang) and json.dumps' spaced ones (the simulator) both take
    the in-place path: decoding a whole event would go through `_chunk`, made to fail here."""

    def whole(self: ResponseReader, ts: float, obj: dict[str, object]) -> None:
        raise AssertionError("the whole event was decoded")

    monkeypatch.setattr(ResponseReader, "_chunk", whole)
    events = []  # one read each, at 1.0, 2.0, ...
    for text, tokens in (("", 0), ("a", 1), ("ab", 2), ("abcde", 5)):
        meta = {"prompt_tokens": 4, "completion_tokens": tokens, "finish_reason": None}
        obj = {"text": text, "output_ids": list(range(tokens)), "meta_info": meta}
        events.append(b"data: " + json.dumps(obj, separators=separators).encode() + b"\n\n")
    r = read("generate", events)
    assert (r.error, r.output_tokens, r.prompt_tokens, r.ttft) == (None, 5, 4, 2.0)
    assert r.itl == pytest.approx([1.0] + [1 / 3] * 3)
