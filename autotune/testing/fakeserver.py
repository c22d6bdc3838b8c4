"""The one stand-in for an SGLang server that the tests and the benchmarks start: fast HTTP
answers shaped as SGLang writes them and, with `--log`, SGLang 0.5.9's log and the endings of a
server's life. `start` runs one for a test or a benchmark (the `Running` handle).

`python -m autotune.testing.fakeserver --port 0` prints `listening on PORT` and serves
/generate, /v1/completions, /v1/chat/completions (streamed or not), /health, /v1/models and
/server_info over keep-alive HTTP/1.1 on raw asyncio. Answers are shaped exactly as SGLang
0.5.23 writes them (`StreamEvents`, `whole_response`: the native cumulative stream, the OpenAI
chunk objects with `id`, `object`, `created`, `model`, the usage chunk only when
`stream_options.include_usage` asks, usage on every chunk with `continuous_usage_stats`, then
`data: [DONE]`), so real clients (the `openai` package, bench_serving) read it as they read
SGLang. It does no model work: a request gets `max_new_tokens` (`max_tokens`,
`max_completion_tokens`) tokens "w" after `--ttft-ms`, one every `--itl-ms`. It reads only what
it needs from a body (regexes, a comma count for input ids), so a 128K-token request costs it
little and the client is what gets measured. `--pad-bytes N` puts N bytes of earlier text in
every native event (a long answer's cumulative text) and an N-byte `pad` field in OpenAI
chunks. `--die-after N` kills the process with SIGKILL once N generation requests have
started, like an SGLang crash; `--api-key` demands `Authorization: Bearer KEY`.

With `--log` it is a server for the lifecycle instead: SGLang 0.5.9's startup lines, its
processes and the endings of a server's life, one `--mode` each. That part lives in
`fakelifecycle`, which owns what a launch does around its HTTP front; this module owns the front
(the answers, the connections, `Options`) and the entry point that hands a `--log` run over.

Unknown modes are ignored (a test may pass a secret as one to see it masked); `--marker WORD`
is ignored too: it puts a word on the command line by which a test finds its processes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

_MAX_NEW = re.compile(rb'"max_(?:new_|completion_)?tokens"\s*:\s*(\d+)')
_STREAM = re.compile(rb'"stream"\s*:\s*true')
_IDS = re.compile(rb'"(?:input_ids|prompt)"\s*:\s*\[')


@dataclass(frozen=True)
class Options:
    """What the command line asks of the server (see the module's docstring)."""

    ttft_s: float
    itl_s: float
    api_key: str | None
    die_after: int | None
    batch: int
    model: str
    pad_bytes: int = 0
    log: bool = False
    modes: frozenset[str] = frozenset()

    def mode_value(self, name: str) -> str | None:
        """The value of mode `name=VALUE`, None when it is not given."""
        return next((m.split("=", 1)[1] for m in self.modes if m.startswith(name + "=")), None)


SERVER_INFO = {
    "max_total_num_tokens": 159277,
    "chunked_prefill_size": 8192,
    "internal_states": [
        {
            "memory_usage": {"weight": 72.33, "kvcache": 10.42, "graph": 3.75},
            "effective_max_running_requests_per_dp": 48,
        }
    ],
}
"""`/server_info`: the sizes the `--log` startup lines print (`fakelifecycle._startup`)."""


def log(message: str, rank: str = " TP0") -> None:
    """One log line as SGLang prints it, with the rank's tag (`rank=""`: the main process)."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    print(f"[{stamp}{rank}] {message}", flush=True)


def main_log(message: str) -> None:
    """A line of the main process (no rank tag)."""
    log(message, rank="")


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
        reasons = {200: "OK", 401: "Unauthorized", 404: "Not Found", 503: "Service Unavailable"}
        reason = reasons.get(status, "Error")
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
                self._reply(200 if self.server.healthy() else 503, b"")
            elif path == "/v1/models":
                self._reply(
                    200, json.dumps({"object": "list", "data": [{"id": opt.model}]}).encode()
                )
            elif path in ("/server_info", "/get_server_info"):
                self._reply(200, json.dumps(SERVER_INFO).encode())
            elif path in _GENERATION and self.server.generates():
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
        stuck = opt.mode_value("stuck-after")
        if stuck is not None and self.server.started > int(stuck):
            await asyncio.Event().wait()  # accepted, never answered
        fail = opt.mode_value("fail-after")
        if fail is not None and self.server.started > int(fail):
            if opt.log:
                main_log("ERROR:    Exception in ASGI application")
            self._reply(500, b'{"object": "error", "message": "Internal Server Error"}')
            return
        cut = opt.mode_value("cut-after")
        if cut is not None and self.server.started > int(cut) and self.transport is not None:
            self._send(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
            )
            self.transport.close()  # the stream cut before its first token
            return
        exit_at = opt.mode_value("exit-after")
        if exit_at is not None and self.server.started > int(exit_at):
            os._exit(0)
        if opt.log:
            log(
                "Prefill batch, #new-seq: 1, #new-token: 1, #cached-token: 0, token usage: 0.00, "
                "#running-req: 0, #queue-req: 0, input throughput (token/s): 1.00, "
                "cuda graph: False"
            )
        m = _MAX_NEW.search(body)
        n = int(m.group(1)) if m else 128
        stream = _STREAM.search(body) is not None
        req = Request.parse(path, body, opt.model)
        if opt.ttft_s > 0:
            await asyncio.sleep(opt.ttft_s)
        if not stream:
            if opt.itl_s > 0:
                await asyncio.sleep(opt.itl_s * (n - 1))
            self._reply(200, whole_response(req, n))
            return
        self._send(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        events = StreamEvents(req, n, opt.pad_bytes)
        frames: list[bytes] = []  # the pieces of the frames to send in one write
        if req.api == "chat":
            frames += _frame(events.chat_role())
        stall = opt.mode_value("stall-stream")
        for i in range(1, n + 1):
            if stall is not None and i > int(stall):
                self._send(b"".join(frames))
                await asyncio.Event().wait()  # the stream stops mid-answer and never ends
            frames += _frame(*events.token(i))
            if i % opt.batch == 0 or i == n:
                self._send(b"".join(frames))  # a big event's text is copied once, here
                frames.clear()
                if opt.itl_s > 0 and i < n:
                    await asyncio.sleep(opt.itl_s)
                elif i % 256 == 0:
                    await asyncio.sleep(0)
        self._send(b"".join(b"".join(_frame(e)) for e in events.closing()) + b"0\r\n\r\n")


def _frame(*event: bytes) -> list[bytes]:
    """The pieces of one SSE event (`data: …` plus the blank line, given in pieces) as one HTTP
    chunk, as uvicorn sends each piece a StreamingResponse yields."""
    size = sum(len(piece) for piece in event) + 2
    return [b"%x\r\n" % size, *event, b"\n\n\r\n"]


_GENERATION = ("/generate", "/v1/completions", "/v1/chat/completions")
_MODEL = re.compile(rb'\s*:\s*"((?:[^"\\]|\\.)*)"')
_TRUE = re.compile(rb"\s*:\s*true")
_API_OF_PATH = {"/generate": "generate", "/v1/completions": "completions"}


@dataclass(frozen=True)
class Request:
    """What a generation request asks for, as far as the answer's shape depends on it."""

    api: str  # "generate", "completions" or "chat"
    rid: str
    created: int
    model: str
    prompt_tokens: int
    include_usage: bool
    continuous_usage: bool

    @staticmethod
    def parse(path: str, body: bytes, default_model: str) -> Request:
        """`stream_options` as SGLang's `should_include_usage` (entrypoints/openai/utils.py)
        reads it: the usage chunk only with `include_usage` true (the server default
        `stream_response_default_include_usage` is off), usage on every chunk with
        `continuous_usage_stats` true. `model` is echoed as `request.model` is."""
        api = _API_OF_PATH.get(path, "chat")
        model, include, continuous = default_model, False, False
        if api != "generate":  # keys found with bytes.find: a regex over a 128K prompt is slow
            at = body.find(b'"model"')
            m = _MODEL.match(body, at + 7) if at >= 0 else None
            model = json.loads(b'"%s"' % m.group(1)) if m else default_model
            include = _flag(body, b'"include_usage"')
            continuous = _flag(body, b'"continuous_usage_stats"')
        rid = uuid.uuid4().hex
        return Request(api, rid, int(time.time()), model, _input_tokens(body), include, continuous)

    def usage(self, completion: int, *, full: bool = True) -> dict[str, object]:
        """`UsageInfo` from `UsageProcessor` (protocol.py); `full` dumps its None fields too,
        as `model_dump_json()` does, else as `model_dump_json(exclude_none=True)`."""
        usage: dict[str, object] = {
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + completion,
            "completion_tokens": completion,
            "prompt_tokens_details": None,
            "reasoning_tokens": 0,
            "completion_tokens_details": None,
        }
        return usage if full else {k: v for k, v in usage.items() if v is not None}


def _flag(body: bytes, key: bytes) -> bool:
    at = body.find(key)
    return at >= 0 and _TRUE.match(body, at + len(key)) is not None


def _dumps(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


class StreamEvents:
    """The `data:` payloads of one streamed answer, exactly as SGLang 0.5.23 writes them.

    - native `/generate` (`http_server.generate_request`, `TokenizerManager`
      `_handle_batch_output`): every event holds the whole text so far, all output ids so far
      and `meta_info`, written by orjson; `finish_reason` is set on the last;
    - `/v1/completions` (`OpenAIServingCompletion._generate_completion_stream`):
      `CompletionStreamResponse.model_dump_json()` per token, `usage` null unless
      `continuous_usage_stats`, `finish_reason` on the last token's chunk; then, only with
      `include_usage`, a chunk with `choices: []` dumped with `exclude_none=True`;
    - `/v1/chat/completions` (`OpenAIServingChat._generate_chat_stream`, chunks from
      `sse_utils.build_sse_content`, msgspec with omitted defaults): a first chunk with
      `role: assistant` and empty content, one chunk per token with `finish_reason` null, a
      chunk with an empty delta and the finish reason, then, only with `include_usage`, the
      `ChatCompletionStreamResponse` usage chunk (`choices: []`, None fields dumped);
    - then `data: [DONE]`.
    `pad` bytes of text come before the answer in the native stream (a long answer's
    cumulative text) and in an extra `pad` field of OpenAI chunks.
    """

    def __init__(self, req: Request, n: int, pad: int = 0) -> None:
        self.req = req
        self.n = n
        self._pad = b"p" * pad
        self._ids = bytearray()
        self._heads = {
            kind: b'{"id":"%s","object":"%s","created":%d,"model":%s'
            % (req.rid.encode(), kind.encode(), req.created, _dumps(req.model))
            for kind in ("text_completion", "chat.completion.chunk")
        }

    def _openai(self, kind: str, rest: bytes) -> bytes:
        pad = b',"pad":"%s"' % self._pad if self._pad else b""
        return b"data: %s,%s%s}" % (self._heads[kind], rest, pad)

    def chat_role(self) -> bytes:
        """The first chat chunk SGLang sends: the assistant's role with empty content, before any
        text."""
        delta = b'{"reasoning_content":null,"role":"assistant","content":""}'
        return self._openai("chat.completion.chunk", self._chat_choice(delta, b"null"))

    @staticmethod
    def _chat_choice(delta: bytes, finish: bytes) -> bytes:
        return (
            b'"choices":[{"index":0,"delta":%s,"logprobs":null,"finish_reason":%s,'
            b'"matched_stop":null}]' % (delta, finish)
        )

    def token(self, i: int) -> tuple[bytes, ...]:
        """The event carrying token `i` (1-based), in pieces (the padding is not copied)."""
        req, last = self.req, i == self.n
        if req.api == "generate":
            self._ids += b"%s%d" % (b"," if i > 1 else b"", 1000 + i % 30000)
            fin = b'{"type":"length","length":%d}' % self.n if last else b"null"
            rest = (
                b'%s","output_ids":[%s],"meta_info":{"id":"%s","finish_reason":%s,'
                b'"prompt_tokens":%d,"completion_tokens":%d,"cached_tokens":0}}'
                % (b"w" * i, self._ids, req.rid.encode(), fin, req.prompt_tokens, i)
            )
            return (b'data: {"text":"', self._pad, rest)
        usage = _dumps(req.usage(i)) if req.continuous_usage else b"null"
        if req.api == "completions":
            finish = b'"length"' if last else b"null"
            rest = (
                b'"choices":[{"index":0,"text":"w","logprobs":null,"finish_reason":%s,'
                b'"matched_stop":null}],"usage":%s' % (finish, usage)
            )
            return (self._openai("text_completion", rest),)
        rest = self._chat_choice(b'{"reasoning_content":null,"content":"w"}', b"null")
        if req.continuous_usage:
            rest += b',"usage":' + usage
        return (self._openai("chat.completion.chunk", rest),)

    def closing(self) -> list[bytes]:
        """The events after the last token, `data: [DONE]` last."""
        req, out = self.req, []
        if req.api == "chat":
            choice = self._chat_choice(b'{"reasoning_content":null}', b'"length"')
            out.append(self._openai("chat.completion.chunk", choice))
        if req.api != "generate" and req.include_usage:
            full = req.api == "chat"
            usage = _dumps(req.usage(self.n, full=full))
            obj = "chat.completion.chunk" if full else "text_completion"
            out.append(self._openai(obj, b'"choices":[],"usage":' + usage))
        out.append(b"data: [DONE]")
        return out


def whole_response(req: Request, n: int) -> bytes:
    """A non-streamed answer: the native `{"text","output_ids","meta_info"}` object, or
    `CompletionResponse` / `ChatCompletionResponse` (protocol.py) with their usage."""
    if req.api == "generate":
        meta = {
            "id": req.rid,
            "finish_reason": {"type": "length", "length": n},
            "prompt_tokens": req.prompt_tokens,
            "completion_tokens": n,
            "cached_tokens": 0,
        }
        ids = [1000 + i % 30000 for i in range(1, n + 1)]
        return _dumps({"text": "w" * n, "output_ids": ids, "meta_info": meta})
    choice: dict[str, object] = {"index": 0}
    if req.api == "completions":
        choice["text"] = "w" * n
    else:
        choice["message"] = {
            "role": "assistant",
            "content": "w" * n,
            "reasoning_content": None,
            "tool_calls": None,
        }
    choice.update(logprobs=None, finish_reason="length", matched_stop=None)
    obj = "text_completion" if req.api == "completions" else "chat.completion"
    return _dumps(
        {
            "id": req.rid,
            "object": obj,
            "created": req.created,
            "model": req.model,
            "choices": [choice],
            "usage": req.usage(n),
        }
    )


@dataclass
class FakeServer:
    """The state the connections share: the options, how many generations have started, and
    when the server became ready (monotonic seconds; 0 before)."""

    opt: Options
    started: int = 0
    ready_at: float = field(default=0.0)

    def healthy(self) -> bool:
        """What `/health` and `/health_generate` say: ready, and no mode making them fail."""
        modes = self.opt.modes
        late = "health-late" in modes and time.monotonic() - self.ready_at < 0.5
        return self.ready_at > 0 and "health-fail" not in modes and not late

    def generates(self) -> bool:
        """Whether generation requests are served: always, but with `--log` only once ready
        and with mode `generate`."""
        return not self.opt.log or (self.ready_at > 0 and "generate" in self.opt.modes)


async def serve(opt: Options, host: str, port: int) -> None:
    """Serve on `host:port` (0: a free port) until the process ends; prints `listening on
    PORT` once bound."""
    server = FakeServer(opt)
    loop = asyncio.get_running_loop()
    srv = await loop.create_server(lambda: _Conn(server), host, port, backlog=4096)
    server.ready_at = time.monotonic()
    bound = srv.sockets[0].getsockname()[1]
    sys.stdout.write(f"listening on {bound}\n")
    sys.stdout.flush()
    async with srv:
        await srv.serve_forever()


def serve_in_thread(server: FakeServer, host: str, port: int) -> None:
    """Bind `host:port` and serve from a daemon thread, so that the main thread goes on
    writing the log; a failure to bind is raised here."""
    loop = asyncio.new_event_loop()
    bound = threading.Event()
    failed: list[BaseException] = []

    async def run() -> None:
        try:
            srv = await loop.create_server(lambda: _Conn(server), host, port, backlog=4096)
        except BaseException as exc:
            failed.append(exc)
            raise
        finally:
            bound.set()
        async with srv:
            await srv.serve_forever()

    def forever() -> None:
        with contextlib.suppress(BaseException):
            loop.run_until_complete(run())

    threading.Thread(target=forever, daemon=True).start()
    bound.wait()
    if failed:
        raise failed[0]


# ------------------------------------------------------------------------------------------------
# Starting one from a test or a benchmark
# ------------------------------------------------------------------------------------------------


@dataclass
class Running:
    """A fake server started by `start`: its process (the leader of its own process group) and
    the port it listens on."""

    proc: subprocess.Popen[str]
    port: int

    @property
    def url(self) -> str:
        """The base URL requests go to."""
        return f"http://127.0.0.1:{self.port}"

    def is_dead(self) -> str | None:
        """Why the server is gone (its exit status), None while it runs."""
        code = self.proc.poll()
        return None if code is None else f"server exited with {code}"

    def stop(self) -> bool:
        """SIGKILL its process group and reap it; whether the group is gone within 5 s."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                return True
            time.sleep(0.05)
        return False


def start(*args: str) -> Running:
    """`python -m autotune.testing.fakeserver --port 0 ARGS` in a session of its own, once it
    listens (raises RuntimeError when it does not start)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "autotune.testing.fakeserver", "--port", "0", *args],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("listening on "):
        Running(proc, 0).stop()
        raise RuntimeError(f"the fake server did not start: {line!r}")
    return Running(proc, int(line.split()[-1]))


def main(argv: list[str] | None = None) -> None:
    """`python -m autotune.testing.fakeserver`: parse the options and serve until killed (with
    `--log`, writing SGLang 0.5.9's log and acting out the `--mode` endings)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--ttft-ms", type=float, default=0.0)
    p.add_argument("--itl-ms", type=float, default=0.0)
    p.add_argument("--api-key")
    p.add_argument("--die-after", type=int)
    p.add_argument("--batch", type=int, default=1, help="SSE frames per socket write")
    p.add_argument("--model", default="fake-model")
    p.add_argument(
        "--pad-bytes", type=int, default=0, help="earlier text in each native event, or padding"
    )
    p.add_argument("--log", action="store_true", help="SGLang 0.5.9's log and the modes")
    p.add_argument("--mode", action="append", default=[], help="one behaviour (with --log)")
    p.add_argument("--lines", type=Path, help="log lines printed once ready (with --log)")
    p.add_argument("--marker", help="ignored: a word on the command line")
    a = p.parse_args(argv)
    opt = Options(
        a.ttft_ms / 1000,
        a.itl_ms / 1000,
        a.api_key,
        a.die_after,
        max(1, a.batch),
        a.model,
        max(0, a.pad_bytes),
        a.log,
        frozenset(a.mode),
    )
    if a.log:
        from autotune.testing.fakelifecycle import run_with_log  # it builds on this module

        run_with_log(opt, a.host, a.port, a.lines)
        return
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(opt, a.host, a.port))


if __name__ == "__main__":
    main()
