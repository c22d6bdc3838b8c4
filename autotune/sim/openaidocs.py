"""The OpenAI routes' response documents: the whole reply, each streamed chunk, the usage.

`OpenAiDocs` writes what `/v1/completions` and `/v1/chat/completions` answer for one request, in
SGLang's shapes (the chat or the completions variant, the finish reason, the cached-token
details of the usage), and `sse_data` frames a document as one server-sent event. They read only
a request's tokens and text, never the server or aiohttp, so they stand apart from `httpapi`,
which owns the routes, the admission of requests and the waiting on the scheduler.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from autotune.sim.scheduler import Request


def sse_data(doc: dict[str, Any]) -> bytes:
    """One server-sent event carrying `doc` as JSON."""
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


def _usage(req: Request) -> dict[str, Any]:
    return {
        "prompt_tokens": len(req.input_ids),
        "completion_tokens": len(req.output_ids),
        "total_tokens": len(req.input_ids) + len(req.output_ids),
        "prompt_tokens_details": {"cached_tokens": req.cached_tokens}
        if req.cached_tokens
        else None,
    }


@dataclass(frozen=True)
class OpenAiDocs:
    """The OpenAI documents for one request (`chat` picks the chat shapes over completions')."""

    cid: str
    created: int
    model: str
    chat: bool

    def _envelope(
        self, obj: str, choices: list[dict[str, Any]], usage: dict[str, Any] | None
    ) -> dict[str, Any]:
        return {
            "id": self.cid,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": usage,
        }

    def reply(self, req: Request) -> dict[str, Any]:
        """The whole, non-streamed reply for a finished request."""
        text = "".join(req.text_parts)
        finish = "abort" if req.finish_reason == "abort" else "length"
        choice: dict[str, Any] = {
            "index": 0,
            "logprobs": None,
            "finish_reason": finish,
            "matched_stop": None,
        }
        if self.chat:
            choice["message"] = {
                "role": "assistant",
                "content": text,
                "reasoning_content": None,
                "tool_calls": None,
            }
        else:
            choice["text"] = text
        obj = "chat.completion" if self.chat else "text_completion"
        return self._envelope(obj, [choice], _usage(req))

    @property
    def _chunk_object(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

    def chunk(self, delta: str | None, reason: str | None, first: bool = False) -> bytes:
        """One streamed delta (chat: `delta`, with the role on the first; completions: `text`)."""
        c: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": reason}
        if self.chat:
            d: dict[str, Any] = {}
            if first:
                d["role"] = "assistant"
            if delta is not None:
                d["content"] = delta
            c["delta"] = d
        else:
            c["text"] = delta or ""
        return sse_data(self._envelope(self._chunk_object, [c], None))

    def usage_chunk(self, req: Request) -> bytes:
        """The closing chunk with no choices and the usage, for stream_options.include_usage."""
        return sse_data(self._envelope(self._chunk_object, [], _usage(req)))
