"""TOML text by hand: values, keys and comment lines (the standard library reads TOML only)."""

from __future__ import annotations

import math
import re
import textwrap
from collections.abc import Iterable

from autotune.config.schema import FlagValue

WIDTH = 99
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def string(text: str) -> str:
    """A TOML basic string: quotes, backslashes and control characters escaped."""
    out = ['"']
    for ch in text:
        code = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\t":
            out.append("\\t")
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\u{code:04X}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def value(v: FlagValue | list[object]) -> str:
    """`v` as a TOML value (bool, integer, float, basic string or array); a float TOML cannot spell
    (inf, nan) is a `ValueError`."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"{v} has no TOML form here")
        return repr(v)
    if isinstance(v, str):
        return string(v)
    return "[" + ", ".join(value(x) for x in v) + "]"  # type: ignore[arg-type]


def key(name: str) -> str:
    """`name` as a TOML key: bare when it is only letters, digits, `_` and `-`, else quoted."""
    return name if _BARE_KEY.match(name) else string(name)


def one_line(text: str) -> str:
    """`text` with its runs of whitespace, newlines included, collapsed to single spaces."""
    return " ".join(text.split())


def comment(text: str, width: int = WIDTH) -> list[str]:
    """`text` as `# ` lines no wider than `width`."""
    body = one_line(text)
    if not body:
        return ["#"]
    return [
        "# " + line
        for line in textwrap.wrap(body, width - 2, break_long_words=False, break_on_hyphens=False)
    ]


def comments(texts: Iterable[str]) -> list[str]:
    """Each of `texts` as wrapped `# ` lines (`comment`), one after another."""
    out: list[str] = []
    for t in texts:
        out += comment(t)
    return out


def clipped(text: str, limit: int = 120) -> str:
    """`text` on one line, cut to `limit` characters with an ellipsis: a value too long to show
    whole in a comment."""
    text = one_line(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"
