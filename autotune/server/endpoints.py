"""Each HTTP route autotune reads on a running server, asked once and judged by the shape it
must answer with (`autotune check`).

The routes and what autotune reads of each (reference §5; SGLang 0.5.23
`entrypoints/http_server.py`):

* `/health` (the health watch, `server.health.HealthWatch`): 200. A failing or empty `/health`
  alone is not fatal: the watch confirms each failure with a one-token `/generate`;
* `/health_generate` (readiness, after `/generate`): 200;
* `/generate` (readiness and the `generate` API): a JSON object with `text` and `meta_info`;
* `/server_info`, else the deprecated `/get_server_info`: a JSON object whose `internal_states`
  list carries `memory_usage` (the ledger's cross-check,
  `logparse.serverinfo.ledger_from_server_info`) and `version`;
* `/flush_cache` (the growth reading, `server.health.flush_cache`): 200 on an idle server.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from autotune.server.health import flush_cache, generate_one, request

SERVER_INFO_ROUTES = ("/server_info", "/get_server_info")


@dataclass(frozen=True)
class Endpoint:
    """One route asked: whether it answered as autotune needs (`ok`), what it answered, and
    whether the night needs it (`needed`: False for `/health`, whose failures are confirmed)."""

    route: str
    ok: bool
    detail: str
    needed: bool = True


def check_endpoints(base_url: str, api_key: str | None, timeout_s: float = 10.0) -> list[Endpoint]:
    """Ask every route autotune reads once, in the order a trial meets them; never raises."""
    out = [_status(base_url, "/health", api_key, timeout_s, needed=False)]
    out.append(_status(base_url, "/health_generate", api_key, timeout_s))
    out.append(_generate(base_url, api_key, timeout_s))
    out.append(_server_info(base_url, api_key, timeout_s))
    flushed = flush_cache(base_url, api_key, timeout_s)
    out.append(Endpoint("/flush_cache", flushed.ok, "200" if flushed.ok else flushed.detail))
    return out


def _status(
    base_url: str, route: str, api_key: str | None, timeout_s: float, *, needed: bool = True
) -> Endpoint:
    answer = request(f"{base_url}{route}", api_key=api_key, timeout_s=timeout_s)
    if answer.ok:
        return Endpoint(route, True, "200", needed)
    detail = answer.detail
    if not needed:
        detail += " (each failure is confirmed with a one-token /generate)"
    return Endpoint(route, False, detail, needed)


def _generate(base_url: str, api_key: str | None, timeout_s: float) -> Endpoint:
    answer = generate_one(base_url, api_key, timeout_s)
    if not answer.ok:
        return Endpoint("/generate", False, answer.detail)
    doc = _json(answer.body)
    if isinstance(doc, list) and doc:
        doc = doc[0]
    if not isinstance(doc, dict) or not isinstance(doc.get("text"), str):
        return Endpoint("/generate", False, "200 but no `text` in the answer")
    if not isinstance(doc.get("meta_info"), dict):
        return Endpoint("/generate", False, "200 but no `meta_info` in the answer")
    return Endpoint("/generate", True, "200, text and meta_info")


def _server_info(base_url: str, api_key: str | None, timeout_s: float) -> Endpoint:
    problems: list[str] = []
    for route in SERVER_INFO_ROUTES:
        answer = request(f"{base_url}{route}", api_key=api_key, timeout_s=timeout_s, limit=64 << 20)
        if not answer.ok:
            problems.append(f"{route} {answer.detail}")
            continue
        doc = _json(answer.body)
        shape = _info_shape(doc)
        if shape:
            problems.append(f"{route} 200 but {shape}")
            continue
        assert isinstance(doc, dict)
        return Endpoint(route, True, f"200, version {doc.get('version')}, memory_usage")
    return Endpoint(" or ".join(SERVER_INFO_ROUTES), False, "; ".join(problems))


def _info_shape(doc: Any) -> str:
    """What is missing from a `/server_info` answer ("" when it has what autotune reads)."""
    if not isinstance(doc, dict):
        return "not a JSON object"
    states = doc.get("internal_states")
    if not isinstance(states, list) or not states or not isinstance(states[0], dict):
        return "no `internal_states` list"
    if not isinstance(states[0].get("memory_usage"), dict):
        return "no `internal_states[0].memory_usage`"
    if not doc.get("version"):
        return "no `version`"
    return ""


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return None
