"""Masking a secret in what autotune keeps: a command line and a server log.

A server's argv reaches its pidfile and the report, so the values of the key flags and every
given secret are masked in it first (`masked_argv`). SGLang also prints its arguments at startup
(`server_args=ServerArgs(..., api_key='...')`), so a server log written straight to disk holds
the API key. Once the server is gone, autotune rewrites its log with every occurrence masked
(`scrub_file`); the log is read line by line (a key never spans a line), and a file without the
key is left untouched.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Iterable
from pathlib import Path

MASK = "***"
SECRET_FLAGS = ("--api-key", "--admin-api-key")
_PATTERNS = (
    re.compile(r"(api[_-]key\s*[=:]\s*['\"]?)(?![\"']?\$)([^'\",\s)]+)", re.IGNORECASE),
    re.compile(r"(--api-key[= ]\s*)(?![\"']?\$)(\S+)"),
    re.compile(r"(Bearer\s+)([A-Za-z0-9._~+/=-]+)", re.IGNORECASE),
    re.compile(r"(\w+://[^:/@\s]+:)([^@\s]+)(@)"),
)


def mask_secrets(text: str, secrets: Iterable[str], *, shortest: int = 1) -> str:
    """`text` with every occurrence of each secret (of at least `shortest` characters) masked."""
    for secret in secrets:
        if secret and len(secret) >= shortest:
            text = text.replace(secret, MASK)
    return text


def scrub(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with API keys, bearer tokens, URL passwords and the given secrets masked: for
    text that reaches a report, an explanation or an export (server logs carry SGLang's
    printed `server_args`, client errors may echo an `Authorization` header)."""
    text = mask_secrets(text, secrets, shortest=4)
    for pattern in _PATTERNS:
        text = pattern.sub(lambda m: m.group(1) + MASK + (m.group(3) if m.lastindex == 3 else ""),
                           text)  # fmt: skip
    return text


def masked_argv(argv: Iterable[str], secrets: Collection[str] = ()) -> tuple[str, ...]:
    """`argv` with the values of key flags and every occurrence of a secret replaced by ***."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(MASK)
            hide_next = False
            continue
        flag, eq, _ = arg.partition("=")
        if flag in SECRET_FLAGS:
            if eq:
                out.append(f"{flag}={MASK}")
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(mask_secrets(arg, secrets))
    return tuple(out)


def scrub_file(path: Path, secret: str) -> int:
    """Replace every `secret` in `path` by ***; returns how many (0 also when there is no file)."""
    needle = secret.encode()
    if not needle:
        return 0
    try:
        with open(path, "rb") as f:
            found = sum(line.count(needle) for line in f)
    except FileNotFoundError:
        return 0
    if not found:
        return 0
    mask = MASK.encode()
    tmp = path.with_name(path.name + ".scrub")
    with open(path, "rb") as src, open(tmp, "wb") as dst:
        for line in src:
            dst.write(line.replace(needle, mask))
        dst.flush()
        os.fsync(dst.fileno())
    tmp.replace(path)
    return found


def redact(url: str) -> str:
    """A storage URL fit for output: the password replaced by ***."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    creds, _, host = rest.rpartition("@")
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:{MASK}@{host}" if ":" in creds else url


def redact_text(text: str, url: str) -> str:
    """`text` (an error message about `url`) with the URL's password replaced by ***."""
    creds = url.partition("://")[2].rpartition("@")[0]
    password = creds.partition(":")[2]
    return mask_secrets(text, [password])
