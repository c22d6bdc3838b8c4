"""Speaking SGLang's APIs: one registry of them, request bodies, and reading responses.

Each API requests can go to is one class here, registered in `APIS` under its study-file name
(`workload.api`): adding an API is adding its class to this module, nothing else. A class says
where requests go, whether the body names the served model, how the body is written, and how the
answer's events read. Three APIs (reference §5): native `/generate`
with `input_ids`, OpenAI `/v1/completions` (prompt as a token array) and `/v1/chat/completions`
(one user message of words). Responses are read exactly as bench_serving reads them
(reference §6):
- native stream: chunks carry the cumulative text and `meta_info.completion_tokens`; TTFT is the
  first chunk with non-empty text; each later gap is split evenly over the new tokens; chunks
  that add no tokens are skipped; output tokens = the last completion_tokens;
- OpenAI streams: each chunk with non-empty text (chat: delta content) adds one ITL entry;
  output tokens = `usage.completion_tokens` when the server sends usage (we ask with
  `stream_options.include_usage`), else the requested count;
- without streaming the whole answer is one chunk: TTFT = E2E, no ITL.
A `finish_reason` of `abort`, an `error` object in a chunk or a non-200 status make the request
fail with that message. `ResponseReader` owns what every API shares (the SSE lines, errors,
timing); the API's class owns what its events mean.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

from autotune.errors import ConfigError
from autotune.loadgen.shapes import RequestPlan, TokenPool

_decoder = json.JSONDecoder()
_decode = _decoder.decode
_raw_decode = _decoder.raw_decode
_NATIVE_HEADS = (b'data: {"text":"', b'data: {"text": "')  # orjson's, json.dumps' spacing


@dataclass(frozen=True)
class RequestOptions:
    """What every request of one workload shares: the API, the model named, and sampling."""

    api: str
    model: str
    stream: bool
    ignore_eos: bool
    temperature: float


class LoadApi(Protocol):
    """One HTTP API the load is sent to: its path, its request body and its answer's events.

    Implementations are stateless: one object per API serves every request, and everything
    one response accumulates lives in its `ResponseReader`."""

    @property
    def name(self) -> str:
        """The study file's `workload.api` value naming this API."""
        ...

    @property
    def path(self) -> str:
        """Where requests are posted."""
        ...

    @property
    def names_model(self) -> bool:
        """Whether the body names the served model (read from `/v1/models` unless given)."""
        ...

    @property
    def in_place_heads(self) -> tuple[bytes, ...]:
        """Starts of stream lines that `read_in_place` may read without decoding them whole;
        empty when every event is decoded."""
        ...

    def body(self, plan: RequestPlan, pool: TokenPool, opt: RequestOptions) -> bytes:
        """The JSON body for one request."""
        ...

    def read_in_place(
        self, r: ResponseReader, ts: float, buf: bytearray, start: int, end: int
    ) -> bool:
        """Read the stream line `buf[start:end]` (it starts with one of `in_place_heads`) into
        `r` without decoding it whole; False if it is not shaped so (it is then decoded)."""
        ...

    def read_chunk(self, r: ResponseReader, ts: float, obj: dict[str, object]) -> None:
        """Read one decoded event (or a whole non-streamed answer) that holds no error into
        `r`."""
        ...

    def settle(self, r: ResponseReader) -> None:
        """Settle what only the end of a well-formed response tells (the output token count)."""
        ...


def _flag(value: bool) -> str:
    return "true" if value else "false"


class Generate:
    """SGLang's native `/generate`: `input_ids` (or a dataset's `text`) and `sampling_params`.

    A stream event holds the whole text so far (SGLang's `TokenizerManager._handle_batch_output`
    keeps `text` cumulative unless `--incremental-streaming-output`), and
    `http_server.generate_request` writes it with orjson as
    `{"text":…,"output_ids":[…],"meta_info":{…}}` (the simulator with json.dumps' spaces): the
    text is only checked for being non-empty (its first byte) and only the small `meta_info`
    object is decoded. The key `,"meta_info":` cannot occur inside a JSON string (a quote there
    is always preceded by a backslash), so the last one in the line is the object's own. An
    event shaped otherwise (an error, other keys first) is decoded whole."""

    name = "generate"
    path = "/generate"
    names_model = False
    in_place_heads = _NATIVE_HEADS

    def body(self, plan: RequestPlan, pool: TokenPool, opt: RequestOptions) -> bytes:
        """Ids rendered by join, not json.dumps, for speed."""
        prompt = (
            f'"text":{json.dumps(plan.prompt.text)}'
            if plan.prompt.text is not None
            else f'"input_ids":{pool.ids_json(plan.prompt)}'
        )
        return (
            f'{{{prompt},"sampling_params":{{"max_new_tokens":{plan.output_len},'
            f'"temperature":{float(opt.temperature)!r},"ignore_eos":{_flag(opt.ignore_eos)}}},'
            f'"stream":{_flag(opt.stream)}}}'
        ).encode()

    def read_in_place(
        self, r: ResponseReader, ts: float, buf: bytearray, start: int, end: int
    ) -> bool:
        """Read a native stream event from its `meta_info` alone, the cumulative text only checked
        for being non-empty: decoding the whole text each event would cost the load generator
        quadratic time."""
        at = buf.rfind(b',"meta_info":', start, end)
        if at >= 0:
            at += 13
        else:
            at = buf.rfind(b', "meta_info": ', start, end)
            if at < 0:
                return False
            at += 15
        try:  # meta_info is small; decode a window first, everything after it if need be
            meta, _ = _raw_decode(buf[at : min(end, at + 4096)].decode("utf-8", "replace"))
        except ValueError:
            try:
                meta, _ = _raw_decode(buf[at:end].decode("utf-8"))
            except ValueError:
                return False
        if not isinstance(meta, dict):
            return False
        first = start + 15 if buf[start + 14] == 0x22 else start + 16  # the text's first byte
        self._meta(r, ts, meta, buf[first] != 0x22)  # the text is not ""
        return True

    def read_chunk(self, r: ResponseReader, ts: float, obj: dict[str, object]) -> None:
        """Read a decoded native event (or the whole answer): its `meta_info`'s prompt and
        completion tokens, and an abort's message."""
        meta = obj.get("meta_info")
        self._meta(r, ts, meta if isinstance(meta, dict) else {}, bool(obj.get("text")))

    @staticmethod
    def _meta(r: ResponseReader, ts: float, meta: dict[str, object], has_text: bool) -> None:
        prompt = meta.get("prompt_tokens")
        if isinstance(prompt, int):
            r.prompt_tokens = prompt
        finish = meta.get("finish_reason")
        if isinstance(finish, dict) and finish.get("type") == "abort":
            r.error = r.error or f"aborted: {finish.get('message', '')}"
        if not has_text:
            return
        tokens = meta.get("completion_tokens")
        r.tokens_so_far(ts, tokens if isinstance(tokens, int) else r.output_tokens + 1)

    def settle(self, r: ResponseReader) -> None:
        """The output tokens are the last event's `completion_tokens`, counted already."""


class _OpenAi(ABC):
    """What SGLang's OpenAI-compatible APIs share: the model and sampling fields of the body,
    usage (asked for with `stream_options.include_usage`), and one ITL entry per chunk that
    carries text."""

    names_model = True
    in_place_heads: tuple[bytes, ...] = ()

    def body(self, plan: RequestPlan, pool: TokenPool, opt: RequestOptions) -> bytes:
        common = (
            f'"model":{json.dumps(opt.model)},"max_tokens":{plan.output_len},'
            f'"temperature":{float(opt.temperature)!r},"ignore_eos":{_flag(opt.ignore_eos)},'
            f'"stream":{_flag(opt.stream)}'
            + (',"stream_options":{"include_usage":true}' if opt.stream else "")
        )
        return f"{{{self._prompt(plan, pool)},{common}}}".encode()

    @abstractmethod
    def _prompt(self, plan: RequestPlan, pool: TokenPool) -> str:
        """The body's prompt field(s), as `"key":value`."""

    @abstractmethod
    def _text(self, choice: Mapping[str, object], stream: bool) -> object:
        """The text one choice carries."""

    def read_in_place(
        self, r: ResponseReader, ts: float, buf: bytearray, start: int, end: int
    ) -> bool:
        return False

    def read_chunk(self, r: ResponseReader, ts: float, obj: dict[str, object]) -> None:
        usage = obj.get("usage")
        if isinstance(usage, dict):
            if isinstance(usage.get("completion_tokens"), int):
                r.usage_output = usage["completion_tokens"]
            if isinstance(usage.get("prompt_tokens"), int):
                r.prompt_tokens = usage["prompt_tokens"]
        choices = obj.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return
        choice = choices[0]
        if choice.get("finish_reason") == "abort":
            r.error = r.error or "aborted: finish_reason abort"
        if self._text(choice, r.stream):
            r.text_chunk(ts)

    def settle(self, r: ResponseReader) -> None:
        """The server's usage count, else the requested count (as bench_serving does)."""
        r.output_tokens = r.usage_output if r.usage_output is not None else r.requested_output


class Completions(_OpenAi):
    """OpenAI `/v1/completions`: the prompt as a token array (or a dataset's text); a chunk's
    text is `choices[0].text`."""

    name = "completions"
    path = "/v1/completions"

    def _prompt(self, plan: RequestPlan, pool: TokenPool) -> str:
        if plan.prompt.text is not None:
            return f'"prompt":{json.dumps(plan.prompt.text)}'
        return f'"prompt":{pool.ids_json(plan.prompt)}'

    def _text(self, choice: Mapping[str, object], stream: bool) -> object:
        return choice.get("text")


class Chat(_OpenAi):
    """OpenAI `/v1/chat/completions`: one user message of words; a chunk's text is the delta's
    content (the message's content when not streamed)."""

    name = "chat"
    path = "/v1/chat/completions"

    def _prompt(self, plan: RequestPlan, pool: TokenPool) -> str:
        content = json.dumps(pool.text(plan.prompt))
        return f'"messages":[{{"role":"user","content":{content}}}]'

    def _text(self, choice: Mapping[str, object], stream: bool) -> object:
        part = choice.get("delta") if stream else choice.get("message")
        return part.get("content") if isinstance(part, dict) else None


_ALL: tuple[LoadApi, ...] = (Generate(), Completions(), Chat())
APIS: Mapping[str, LoadApi] = MappingProxyType({api.name: api for api in _ALL})
"""Every API requests can go to, by its `workload.api` name: the one place to add one."""


def api_named(name: str) -> LoadApi:
    """The registered API a study's `workload.api` names; a `ConfigError` naming the value and
    the names there are otherwise (the launcher asks before anything is launched or written)."""
    try:
        return APIS[name]
    except KeyError:
        raise ConfigError(
            "workload.api", f"unknown API {name!r}; use one of {', '.join(APIS)}"
        ) from None


def build_body(plan: RequestPlan, pool: TokenPool, opt: RequestOptions) -> bytes:
    """The JSON body for one request, as `opt.api` writes it."""
    return APIS[opt.api].body(plan, pool, opt)


class ResponseReader:
    """A `BodySink` turning one response into TTFT, ITL gaps, token counts and an error.

    `start` is the send time; timestamps come from the socket callback. What an event means is
    the API's (`APIS[api]`); what every API shares is here.

    A stream is read line by line, as bench_serving's aiohttp `response.content` iterator
    does: bytes gather in one buffer, each read is searched once for the one byte `\\n` from
    where the last search stopped, and a line is looked at in place (offsets into the buffer,
    no copy of the buffer per event). A line that starts as the API's `in_place_heads` is
    offered to its `read_in_place` first (the native stream's cumulative text is never
    decoded); the usual `data: {` chunk is decoded once.
    """

    def __init__(self, api: str, stream: bool, start: float, requested_output: int) -> None:
        self.api = api
        self.stream = stream
        self.start = start
        self.requested_output = requested_output
        self.status = 0
        self.first_ts: float | None = None
        self.last_ts = 0.0
        self.itl: list[float] = []
        self.output_tokens = 0
        self.prompt_tokens: int | None = None
        self.error: str | None = None
        self.done = False
        self.usage_output: int | None = None
        """The output tokens the server's usage reported, if it did."""
        self._pending = bytearray()
        self._scanned = 0  # bytes of _pending already searched for a newline
        self._body = bytearray()
        self._impl = APIS[api]
        self._heads = self._impl.in_place_heads

    # BodySink
    def on_headers(self, status: int, headers: dict[str, str]) -> None:
        """Keep the status: anything but 200 is read as an error body, not as events."""
        self.status = status

    def on_data(self, ts: float, data: bytes | memoryview) -> None:
        """Split a streamed body into lines as they arrive, each read searched once for newlines; a
        non-200 or non-streamed body is gathered whole for the end."""
        if self.status != 200 or not self.stream:
            self._body += data
            return
        buf = self._pending
        buf += data
        find = buf.find
        start = 0
        nl = find(b"\n", self._scanned)
        while nl >= 0:
            if nl > start:
                self._line(ts, buf, start, nl)
            start = nl + 1
            nl = find(b"\n", start)
        if start == len(buf):
            self._pending = bytearray()
            self._scanned = 0
        else:
            if start:
                del buf[:start]  # O(1): CPython moves a bytearray's start for a front delete
            self._scanned = len(buf)

    def finish(self, end_ts: float) -> None:
        """Called when the response has ended, to settle the non-streamed parts."""
        if self.status != 200:
            text = bytes(self._body[:300]).decode("utf-8", "replace").strip().replace("\n", " ")
            self.error = f"HTTP {self.status}: {text}"
            return
        if not self.stream:
            try:
                obj = json.loads(self._body)
            except ValueError:
                self.error = "bad response: body is not JSON"
                return
            if not isinstance(obj, dict):
                self.error = "bad response: body is not a JSON object"
                return
            self._chunk(end_ts, obj)
        elif self._pending:
            self._line(end_ts, self._pending, 0, len(self._pending))
            self._pending = bytearray()
        if self.error is None and self.first_ts is None:
            self.error = "empty response: no token arrived"
        self._impl.settle(self)

    # Timing, as the APIs report their events
    def tokens_so_far(self, ts: float, count: int) -> None:
        """An event with text, saying `count` output tokens so far: the first sets TTFT, a later
        one splits its gap evenly over its new tokens, one adding none is skipped."""
        if self.first_ts is None:
            self.first_ts = ts
        else:
            new = count - self.output_tokens
            if new <= 0:
                return
            gap = (ts - self.last_ts) / new
            self.itl.extend([gap] * new)
        self.last_ts = ts
        self.output_tokens = count

    def text_chunk(self, ts: float) -> None:
        """A chunk with text: the first sets TTFT, each later one adds one ITL entry."""
        if self.first_ts is None:
            self.first_ts = ts
        else:
            self.itl.append(ts - self.last_ts)
        self.last_ts = ts

    # SSE lines and chunks
    def _line(self, ts: float, buf: bytearray, start: int, end: int) -> None:
        """One line of the stream, `buf[start:end]` without its newline."""
        if buf[end - 1] == 13:  # "\r\n" line ends
            end -= 1
        heads = self._heads
        if heads and buf.startswith(heads, start, end):
            if self._impl.read_in_place(self, ts, buf, start, end):
                return
        elif buf.startswith(b"data: {", start, end):  # the usual OpenAI chunk
            payload = buf[start + 6 : end]
            try:
                obj = _decode(payload.decode("utf-8"))
            except ValueError:
                self.error = self.error or f"bad stream chunk: {bytes(payload[:80])!r}"
                return
            if isinstance(obj, dict):
                self._chunk(ts, obj)
            return
        line = bytes(buf[start:end]).strip()
        if not line.startswith(b"data:"):
            return  # blank, a comment (":"), or another SSE field
        data = line[5:].strip()
        if data == b"[DONE]":
            self.done = True
            return
        try:
            obj = json.loads(data)
        except ValueError:
            self.error = self.error or f"bad stream chunk: {data[:80]!r}"
            return
        if isinstance(obj, dict):
            self._chunk(ts, obj)

    def _chunk(self, ts: float, obj: dict[str, object]) -> None:
        err = obj.get("error")
        if err is not None:
            msg = err.get("message", err) if isinstance(err, dict) else err
            self.error = self.error or f"server error: {msg}"
            return
        self._impl.read_chunk(self, ts, obj)

    @property
    def ttft(self) -> float | None:
        """Time to first token in seconds (the first event with text, from the send), None before
        it."""
        return None if self.first_ts is None else self.first_ts - self.start
