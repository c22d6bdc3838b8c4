"""Speaking SGLang's APIs: request bodies, and reading responses into token timings.

Three APIs (reference §5): native `/generate` with `input_ids`, OpenAI `/v1/completions` (prompt
as a token array) and `/v1/chat/completions` (one user message of words). Responses are read
exactly as bench_serving reads them (reference §6):
- native stream: chunks carry the cumulative text and `meta_info.completion_tokens`; TTFT is the
  first chunk with non-empty text; each later gap is split evenly over the new tokens; chunks
  that add no tokens are skipped; output tokens = the last completion_tokens;
- OpenAI streams: each chunk with non-empty text (chat: delta content) adds one ITL entry;
  output tokens = `usage.completion_tokens` when the server sends usage (we ask with
  `stream_options.include_usage`), else the requested count;
- without streaming the whole answer is one chunk: TTFT = E2E, no ITL.
A `finish_reason` of `abort`, an `error` object in a chunk or a non-200 status make the request
fail with that message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from autotune.config.workload import Api
from autotune.loadgen.shapes import RequestPlan, TokenPool

_decoder = json.JSONDecoder()
_decode = _decoder.decode
_raw_decode = _decoder.raw_decode
_NATIVE_HEADS = (b'data: {"text":"', b'data: {"text": "')  # orjson's, json.dumps' spacing
PATHS = {
    Api.GENERATE: "/generate",
    Api.COMPLETIONS: "/v1/completions",
    Api.CHAT: "/v1/chat/completions",
}


@dataclass(frozen=True)
class RequestOptions:
    api: Api
    model: str
    stream: bool
    ignore_eos: bool
    temperature: float


def build_body(plan: RequestPlan, pool: TokenPool, opt: RequestOptions) -> bytes:
    """The JSON body for one request (ids rendered by join, not json.dumps, for speed)."""
    stream = "true" if opt.stream else "false"
    ignore_eos = "true" if opt.ignore_eos else "false"
    temp = repr(float(opt.temperature))
    n = plan.output_len
    if opt.api is Api.GENERATE:
        prompt = (
            f'"text":{json.dumps(plan.prompt.text)}'
            if plan.prompt.text is not None
            else f'"input_ids":{pool.ids_json(plan.prompt)}'
        )
        body = (
            f'{{{prompt},"sampling_params":{{"max_new_tokens":{n},"temperature":{temp},'
            f'"ignore_eos":{ignore_eos}}},"stream":{stream}}}'
        )
    else:
        model = json.dumps(opt.model)
        common = (
            f'"model":{model},"max_tokens":{n},"temperature":{temp},"ignore_eos":{ignore_eos},'
            f'"stream":{stream}'
            + (',"stream_options":{"include_usage":true}' if opt.stream else "")
        )
        if opt.api is Api.COMPLETIONS:
            prompt = (
                json.dumps(plan.prompt.text)
                if plan.prompt.text is not None
                else pool.ids_json(plan.prompt)
            )
            body = f'{{"prompt":{prompt},{common}}}'
        else:
            content = json.dumps(pool.text(plan.prompt))
            body = f'{{"messages":[{{"role":"user","content":{content}}}],{common}}}'
    return body.encode()


class ResponseReader:
    """A `BodySink` turning one response into TTFT, ITL gaps, token counts and an error.

    `start` is the send time; timestamps come from the socket callback.

    A stream is read line by line, as bench_serving's aiohttp `response.content` iterator
    does: bytes gather in one buffer, each read is searched once for the one byte `\\n` from
    where the last search stopped, and a line is looked at in place (offsets into the buffer,
    no copy of the buffer per event). A native `/generate` event holds the whole text so far
    (SGLang's `TokenizerManager._handle_batch_output` keeps `text` cumulative unless
    `--incremental-streaming-output`), and `http_server.generate_request` writes it with orjson
    as `{"text":…,"output_ids":[…],"meta_info":{…}}` (the simulator with json.dumps' spaces):
    the text is only checked for being non-empty (its first byte) and only the small
    `meta_info` object is decoded. The key `,"meta_info":` cannot occur inside a JSON string
    (a quote there is always preceded by a backslash), so the last one in the line is the
    object's own. An event shaped otherwise (an error, other keys first) is decoded whole.
    """

    def __init__(self, api: Api, stream: bool, start: float, requested_output: int) -> None:
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
        self._pending = bytearray()
        self._scanned = 0  # bytes of _pending already searched for a newline
        self._body = bytearray()
        self._usage_output: int | None = None
        self._native_api = api is Api.GENERATE

    # BodySink
    def on_headers(self, status: int, headers: dict[str, str]) -> None:
        self.status = status

    def on_data(self, ts: float, data: bytes | memoryview) -> None:
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
        if self.api is not Api.GENERATE:
            self.output_tokens = (
                self._usage_output if self._usage_output is not None else self.requested_output
            )

    # SSE lines and chunks
    def _line(self, ts: float, buf: bytearray, start: int, end: int) -> None:
        """One line of the stream, `buf[start:end]` without its newline."""
        if buf[end - 1] == 13:  # "\r\n" line ends
            end -= 1
        if self._native_api and buf.startswith(_NATIVE_HEADS, start, end):
            if self._native_in_place(ts, buf, start, end):
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

    def _native_in_place(self, ts: float, buf: bytearray, start: int, end: int) -> bool:
        """A native event read without decoding its text; False if it is not shaped so."""
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
        self._native(ts, meta, buf[first] != 0x22)  # the text is not ""
        return True

    def _chunk(self, ts: float, obj: dict[str, object]) -> None:
        err = obj.get("error")
        if err is not None:
            msg = err.get("message", err) if isinstance(err, dict) else err
            self.error = self.error or f"server error: {msg}"
            return
        if self.api is Api.GENERATE:
            meta = obj.get("meta_info")
            self._native(ts, meta if isinstance(meta, dict) else {}, bool(obj.get("text")))
        else:
            self._openai(ts, obj)

    def _native(self, ts: float, meta: dict[str, object], has_text: bool) -> None:
        prompt = meta.get("prompt_tokens")
        if isinstance(prompt, int):
            self.prompt_tokens = prompt
        finish = meta.get("finish_reason")
        if isinstance(finish, dict) and finish.get("type") == "abort":
            self.error = self.error or f"aborted: {finish.get('message', '')}"
        if not has_text:
            return
        tokens = meta.get("completion_tokens")
        count = tokens if isinstance(tokens, int) else self.output_tokens + 1
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

    def _openai(self, ts: float, obj: dict[str, object]) -> None:
        usage = obj.get("usage")
        if isinstance(usage, dict):
            if isinstance(usage.get("completion_tokens"), int):
                self._usage_output = usage["completion_tokens"]
            if isinstance(usage.get("prompt_tokens"), int):
                self.prompt_tokens = usage["prompt_tokens"]
        choices = obj.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return
        choice = choices[0]
        if choice.get("finish_reason") == "abort":
            self.error = self.error or "aborted: finish_reason abort"
        if self.api is Api.COMPLETIONS:
            text = choice.get("text")
        else:
            part = choice.get("delta") if self.stream else choice.get("message")
            text = part.get("content") if isinstance(part, dict) else None
        if not text:
            return
        if self.first_ts is None:
            self.first_ts = ts
        else:
            self.itl.append(ts - self.last_ts)
        self.last_ts = ts

    @property
    def ttft(self) -> float | None:
        return None if self.first_ts is None else self.first_ts - self.start
