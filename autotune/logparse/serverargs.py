"""The arguments a `server_args=` line shows (`read_server_args`): 0.5.23's resolved dict or
0.5.9–0.5.18's `ServerArgs(key=value, …)` repr, read as Python literals, never evaluated.

Kept apart from the line readers because it is read lazily, once per log, by the ledger and the
study-file bootstrap, on the text of the one `Kind.SERVER_ARGS` event.
"""

from __future__ import annotations

import ast
import re
from typing import Any

_ARG_PAIR = re.compile(
    r"""['"]?(\w+)['"]?(?:=|: )(None|True|False|-?\d+(?:\.\d+)?(?:e-?\d+)?|'[^']*'|"[^"]*")"""
)


def read_server_args(text: str) -> dict[str, Any]:
    """The arguments a `server_args=` line shows: 0.5.23's resolved dict (nested dicts kept) or
    0.5.9–0.5.18's `ServerArgs(key=value, …)` repr. Values that are not Python literals are left
    out; a cut-off line falls back to its scalar `key: value` pairs."""
    at = text.find("server_args=")
    if at < 0:
        return {}
    body = text[at + len("server_args=") :].strip()
    try:
        if body.startswith("{"):
            value = ast.literal_eval(body)
            if isinstance(value, dict):
                return {str(k): v for k, v in value.items()}
        elif body.startswith("ServerArgs("):
            call = ast.parse(body, mode="eval").body
            if isinstance(call, ast.Call):
                out: dict[str, Any] = {}
                for kw in call.keywords:
                    if kw.arg is None:
                        continue
                    try:
                        out[kw.arg] = ast.literal_eval(kw.value)
                    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                        continue
                return out
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass
    pairs: dict[str, Any] = {}
    for key, raw in _ARG_PAIR.findall(body):
        if key in pairs:
            continue  # the first occurrence is the top level one
        try:
            pairs[key] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            continue
    return pairs
