"""Tiny synchronous HTTP helpers for the end-to-end tests (stdlib only)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


def request(
    url: str,
    body: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 30.0,
    method: str | None = None,
) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def get_json(url: str, headers: dict[str, str] | None = None) -> Any:
    status, raw = request(url, headers=headers)
    assert status == 200, (status, raw[:500])
    return json.loads(raw)


def sse_events(url: str, body: dict[str, Any], timeout: float = 30.0) -> list[Any]:
    """POST and collect `data:` events of an SSE stream; '[DONE]' is kept as a string."""
    req = urllib.request.Request(url, data=json.dumps(body).encode())
    req.add_header("Content-Type", "application/json")
    events: list[Any] = []
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            payload = line[6:]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events
