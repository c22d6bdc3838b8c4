"""Keeping secrets out of reports and exports.

Server logs can carry an API key (SGLang prints its `server_args`, `--api-key` may sit in a
command line, a client error may echo an `Authorization` header), and storage URLs can carry a
password. `scrub` masks the patterns, and any literal secret it is given, in text that reaches
a report, an explanation or an export.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MASK = "***"
_PATTERNS = (
    re.compile(r"(api[_-]key\s*[=:]\s*['\"]?)(?![\"']?\$)([^'\",\s)]+)", re.IGNORECASE),
    re.compile(r"(--api-key[= ]\s*)(?![\"']?\$)(\S+)"),
    re.compile(r"(Bearer\s+)([A-Za-z0-9._~+/=-]+)", re.IGNORECASE),
    re.compile(r"(\w+://[^:/@\s]+:)([^@\s]+)(@)"),
)


def scrub(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with API keys, bearer tokens, URL passwords and the given secrets masked."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, MASK)
    for pattern in _PATTERNS:
        text = pattern.sub(lambda m: m.group(1) + MASK + (m.group(3) if m.lastindex == 3 else ""),
                           text)  # fmt: skip
    return text
