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

_decode = json.JSONDecoder().decode
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
        self._body = bytearray()
        self._usage_output: int | None = None

    # BodySink
    def on_headers(self, status: int, headers: dict[str, str]) -> None:
        self.status = status

    def on_data(self, ts: float, data: bytes) -> None:
        if self.status != 200 or not self.stream:
            self._body += data
            return
        # Search only the new bytes (plus one) so an event spread over many reads costs linear
        # time, and copy only the unfinished tail.
        pending = self._pending
        buf: bytes | bytearray
        if pending:
            search = len(pending) - 1
            pending += data
            buf = pending
        else:
            search, buf = 0, data
        start = 0
        while True:
            end = buf.find(b"\n\n", search)
            if end < 0:
                break
            self._event(ts, buf[start:end])
            start = search = end + 2
        if start == 0 and buf is pending:
            return
        self._pending = bytearray(buf[start:])

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
        elif self._pending.strip():
            self._event(end_ts, bytes(self._pending))
            self._pending = bytearray()
        if self.error is None and self.first_ts is None:
            self.error = "empty response: no token arrived"
        if self.api is not Api.GENERATE:
            self.output_tokens = (
                self._usage_output if self._usage_output is not None else self.requested_output
            )

    # SSE events and chunks
    def _event(self, ts: float, event: bytes | bytearray) -> None:
        if event.startswith(b"data: {") and b"\n" not in event:  # the usual one-line event
            try:
                obj = _decode(event[6:].decode("utf-8"))
            except ValueError:
                self.error = self.error or f"bad stream chunk: {bytes(event[:80])!r}"
                return
            if isinstance(obj, dict):
                self._chunk(ts, obj)
            return
        for line in event.split(b"\n"):
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.done = True
                continue
            try:
                obj = json.loads(payload)
            except ValueError:
                self.error = self.error or f"bad stream chunk: {payload[:80]!r}"
                continue
            if isinstance(obj, dict):
                self._chunk(ts, obj)

    def _chunk(self, ts: float, obj: dict[str, object]) -> None:
        err = obj.get("error")
        if err is not None:
            msg = err.get("message", err) if isinstance(err, dict) else err
            self.error = self.error or f"server error: {msg}"
            return
        if self.api is Api.GENERATE:
            self._native(ts, obj)
        else:
            self._openai(ts, obj)

    def _native(self, ts: float, obj: dict[str, object]) -> None:
        meta = obj.get("meta_info")
        meta = meta if isinstance(meta, dict) else {}
        prompt = meta.get("prompt_tokens")
        if isinstance(prompt, int):
            self.prompt_tokens = prompt
        finish = meta.get("finish_reason")
        if isinstance(finish, dict) and finish.get("type") == "abort":
            self.error = self.error or f"aborted: {finish.get('message', '')}"
        if not obj.get("text"):
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
