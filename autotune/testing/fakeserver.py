"""A minimal, fast SGLang-like HTTP server for testing and benchmarking the load generator.

`python -m autotune.testing.fakeserver --port 0` prints `listening on PORT` and serves
/generate, /v1/completions, /v1/chat/completions (streamed or not, SGLang's chunk formats),
/health, /v1/models and /server_info over keep-alive HTTP/1.1 on raw asyncio. It does no model
work: a request gets `max_new_tokens` tokens after `--ttft-ms`, one every `--itl-ms`. It reads
only what it needs from a body (regexes, a comma count for input ids), so a 128K-token request
costs it little and the client is what gets measured. `--die-after N` kills the process with
SIGKILL once N generation requests have started, like an SGLang crash; `--api-key` demands
`Authorization: Bearer KEY`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import sys
from dataclasses import dataclass

_MAX_NEW = re.compile(rb'"max_(?:new_)?tokens"\s*:\s*(\d+)')
_STREAM = re.compile(rb'"stream"\s*:\s*true')
_IDS = re.compile(rb'"(?:input_ids|prompt)"\s*:\s*\[')


@dataclass(frozen=True)
class Options:
    ttft_s: float
    itl_s: float
    api_key: str | None
    die_after: int | None
    batch: int
    model: str
    pad_bytes: int = 0


def _input_tokens(body: bytes) -> int:
    m = _IDS.search(body)
    if m is None:
        m2 = re.search(rb'"(?:text|prompt|content)"\s*:\s*"', body)
        if m2 is None:
            return 1
        end = body.find(b'"', m2.end())
        return body.count(b" ", m2.end(), end) + 1
    end = body.find(b"]", m.end())
    return body.count(b",", m.end(), end) + 1


class _Conn(asyncio.Protocol):
    def __init__(self, server: FakeServer) -> None:
        self.server = server
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self._next()

    def _next(self) -> None:
        while not self.busy and self.transport is not None:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buf[:end]).decode("latin-1")
            lines = head.split("\r\n")
            headers = {}
            for line in lines[1:]:
                k, _, v = line.partition(":")
                headers[k.strip().lower()] = v.strip()
            length = int(headers.get("content-length", "0"))
            if len(self.buf) < end + 4 + length:
                return
            body = bytes(self.buf[end + 4 : end + 4 + length])
            del self.buf[: end + 4 + length]
            method, path = [*lines[0].split(" "), "", ""][:2]
            self.busy = True
            asyncio.get_running_loop().create_task(self._serve(method, path, headers, body))

    def _send(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def _reply(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        reason = {200: "OK", 401: "Unauthorized", 404: "Not Found"}.get(status, "Error")
        self._send(
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )

    async def _serve(self, method: str, path: str, headers: dict[str, str], body: bytes) -> None:
        opt = self.server.opt
        try:
            if opt.api_key is not None and headers.get("authorization") != f"Bearer {opt.api_key}":
                self._reply(401, b'{"error": "Unauthorized"}')
            elif path in ("/health", "/health_generate"):
                self._reply(200, b"")
            elif path == "/v1/models":
                self._reply(
                    200, json.dumps({"object": "list", "data": [{"id": opt.model}]}).encode()
                )
            elif path in ("/server_info", "/get_server_info"):
                self._reply(200, b'{"max_running_requests": 64, "chunked_prefill_size": 8192}')
            elif path in ("/generate", "/v1/completions", "/v1/chat/completions"):
                await self._generate(path, body)
            else:
                self._reply(404, b'{"error": "not found"}')
        finally:
            self.busy = False
            if self.buf:
                self._next()

    async def _generate(self, path: str, body: bytes) -> None:
        opt = self.server.opt
        self.server.started += 1
        if opt.die_after is not None and self.server.started > opt.die_after:
            os.kill(os.getpid(), signal.SIGKILL)
        m = _MAX_NEW.search(body)
        n = int(m.group(1)) if m else 128
        stream = _STREAM.search(body) is not None
        prompt = _input_tokens(body)
        if opt.ttft_s > 0:
            await asyncio.sleep(opt.ttft_s)
        if not stream:
            if opt.itl_s > 0:
                await asyncio.sleep(opt.itl_s * (n - 1))
            self._reply(200, _whole(path, n, prompt, opt.model))
            return
        self._send(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        frames: list[bytes] = []
        for i in range(1, n + 1):
            event = _chunk(path, i, n, prompt, opt.model)
            if opt.pad_bytes:
                event = event[:-1] + b',"pad":"' + b"p" * opt.pad_bytes + b'"}'
            frames.append(_frame(event))
            if len(frames) >= opt.batch or i == n:
                self._send(b"".join(frames))
                frames.clear()
                if opt.itl_s > 0 and i < n:
                    await asyncio.sleep(opt.itl_s)
                elif i % 256 == 0:
                    await asyncio.sleep(0)
        if path != "/generate":
            usage = {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}
            self._send(_frame(b"data: " + json.dumps({"choices": [], "usage": usage}).encode()))
        self._send(_frame(b"data: [DONE]") + b"0\r\n\r\n")


def _frame(event: bytes) -> bytes:
    data = event + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


def _chunk(path: str, i: int, n: int, prompt: int, model: str) -> bytes:
    last = i == n
    if path == "/generate":
        fin = b'{"type":"length","length":%d}' % n if last else b"null"
        return (
            b'data: {"text":"%s","output_ids":[%d],"meta_info":{"id":"x","finish_reason":%s,'
            b'"prompt_tokens":%d,"completion_tokens":%d,"cached_tokens":0}}'
            % (b"w" * i, i, fin, prompt, i)
        )
    finish = b'"length"' if last else b"null"
    if path == "/v1/completions":
        choice = b'{"index":0,"text":"w","finish_reason":%s}' % finish
        obj = b'"object":"text_completion"'
    else:
        choice = b'{"index":0,"delta":{"content":"w"},"finish_reason":%s}' % finish
        obj = b'"object":"chat.completion.chunk"'
    return b'data: {"id":"x",%s,"model":"%s","choices":[%s]}' % (obj, model.encode(), choice)


def _whole(path: str, n: int, prompt: int, model: str) -> bytes:
    if path == "/generate":
        meta = {
            "id": "x",
            "finish_reason": {"type": "length", "length": n},
            "prompt_tokens": prompt,
            "completion_tokens": n,
            "cached_tokens": 0,
        }
        return json.dumps({"text": "w" * n, "output_ids": [1] * n, "meta_info": meta}).encode()
    usage = {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}
    if path == "/v1/completions":
        choice: dict[str, object] = {"index": 0, "text": "w" * n, "finish_reason": "length"}
    else:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": "w" * n},
            "finish_reason": "length",
        }
    return json.dumps({"id": "x", "model": model, "choices": [choice], "usage": usage}).encode()


class FakeServer:
    def __init__(self, opt: Options) -> None:
        self.opt = opt
        self.started = 0


async def serve(opt: Options, host: str, port: int) -> None:
    server = FakeServer(opt)
    loop = asyncio.get_running_loop()
    srv = await loop.create_server(lambda: _Conn(server), host, port, backlog=4096)
    bound = srv.sockets[0].getsockname()[1]
    sys.stdout.write(f"listening on {bound}\n")
    sys.stdout.flush()
    async with srv:
        await srv.serve_forever()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--ttft-ms", type=float, default=0.0)
    p.add_argument("--itl-ms", type=float, default=0.0)
    p.add_argument("--api-key")
    p.add_argument("--die-after", type=int)
    p.add_argument("--batch", type=int, default=1, help="SSE frames per socket write")
    p.add_argument("--model", default="fake-model")
    p.add_argument("--pad-bytes", type=int, default=0, help="padding added to each SSE event")
    a = p.parse_args(argv)
    opt = Options(
        a.ttft_ms / 1000,
        a.itl_ms / 1000,
        a.api_key,
        a.die_after,
        max(1, a.batch),
        a.model,
        max(0, a.pad_bytes),
    )
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(opt, a.host, a.port))


if __name__ == "__main__":
    main()
