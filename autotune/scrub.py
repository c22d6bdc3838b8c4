"""Taking a secret back out of a file autotune keeps.

SGLang prints its arguments at startup (`server_args=ServerArgs(..., api_key='...')`), so a
server log written straight to disk holds the API key. Once the server is gone, autotune rewrites
its log with every occurrence masked; the log is read line by line (a key never spans a line),
and a file without the key is left untouched.
"""

from __future__ import annotations

import os
from pathlib import Path

MASK = b"***"


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
    tmp = path.with_name(path.name + ".scrub")
    with open(path, "rb") as src, open(tmp, "wb") as dst:
        for line in src:
            dst.write(line.replace(needle, MASK))
        dst.flush()
        os.fsync(dst.fileno())
    tmp.replace(path)
    return found
