"""Masking a secret in what autotune keeps: a command line and a server log.

A server's argv reaches its pidfile and the report, so the values of the key flags and every
given secret are masked in it first (`masked_argv`). SGLang also prints its arguments at startup
(`server_args=ServerArgs(..., api_key='...')`, 0.5.23 included, and it reads the key from no
environment variable), so a log written straight to disk would hold the API key while the
server runs. A server launched with a secret therefore writes into a pipe, and a small writer
process (`python -P masking.py LOG FD`, this file run as a script: `mask_stream`) masks every
secret before a byte reaches the log file. The writer runs in a session of its own, ignores
every signal but SIGKILL and only ends when the server's last process has closed the pipe, so it
can neither stop nor block a server whose autotune died; the lifecycle (`server.lifecycle`)
waits for it, or kills it, at the teardown and lists it in the pidfile for a resume.

Once the server is gone, autotune also rewrites its log with every occurrence masked
(`scrub_file`: the logs of servers started before the writer existed, orphans); the log is read
line by line (a key never spans a line), and a file without the key is left untouched.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path
from typing import Any

MASK = "***"
SECRET_FLAGS = ("--api-key", "--admin-api-key")
_PATTERNS = (
    re.compile(r"(api[_-]key['\"]?\s*[=:]\s*['\"]?)(?![\"']?\$)([^'\",\s)}]+)", re.IGNORECASE),
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


def masked_fields(value: Any) -> Any:
    """`value` (decoded JSON, such as SGLang's `/server_info`, which lists every server argument)
    with every `*api_key` field that holds something replaced by the mask."""
    if isinstance(value, dict):
        return {
            k: MASK if k.endswith("api_key") and v else masked_fields(v) for k, v in value.items()
        }
    if isinstance(value, list):
        return [masked_fields(v) for v in value]
    return value


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
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with open(path, "rb") as src, os.fdopen(fd, "wb") as dst:
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


# ------------------------------------------------------------------------------------------------
# The live log's writer
# ------------------------------------------------------------------------------------------------

_READ = 1 << 16


class StreamMask:
    """Masks secrets in a byte stream cut anywhere: `feed` returns what can be written now and
    holds back the few bytes at the end that could be the start of a secret."""

    def __init__(self, secrets: Iterable[bytes]) -> None:
        self._secrets = sorted({s for s in secrets if s}, key=len, reverse=True)
        self._held = b""

    def feed(self, data: bytes) -> bytes:
        """The next piece of the stream, each secret masked: what is safe to write now, less the
        tail that may begin a secret the next piece completes (held for it)."""
        buf = self._held + data
        for secret in self._secrets:
            buf = buf.replace(secret, MASK.encode())
        hold = 0
        for secret in self._secrets:
            for k in range(min(len(secret) - 1, len(buf)), hold, -1):
                if buf.endswith(secret[:k]):
                    hold = k
                    break
        self._held = buf[len(buf) - hold :] if hold else b""
        return buf[: len(buf) - hold] if hold else buf

    def end(self) -> bytes:
        """What is still held, once the stream is over (it was no secret after all)."""
        rest, self._held = self._held, b""
        return rest


def mask_stream(src: int, log: Path, secrets: Sequence[bytes]) -> int:
    """Copy `src` into `log` (appended, created owner-only) with every secret masked, until
    end of file; a write that fails (a full disk) drops its bytes, as SGLang's logging does,
    and reading goes on, so the server never blocks on its output. Returns the bytes dropped."""
    out = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    mask = StreamMask(secrets)
    dropped = 0
    while True:
        try:
            data = os.read(src, _READ)
        except OSError:
            break
        chunk = mask.feed(data) if data else mask.end()
        if chunk:
            try:
                os.write(out, chunk)
            except OSError:
                dropped += len(chunk)
        if not data:
            break
    os.close(out)
    return dropped


def _writer_main(argv: Sequence[str]) -> int:
    """`masking.py LOG FD`: the secrets arrive NUL-separated on descriptor FD (never on the
    command line or in the environment), the server's output on stdin."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_IGN)
    log, fd = Path(argv[0]), int(argv[1])
    raw = b""
    while chunk := os.read(fd, _READ):
        raw += chunk
    os.close(fd)
    mask_stream(0, log, [s for s in raw.split(b"\0") if s])
    return 0


if __name__ == "__main__":
    raise SystemExit(_writer_main(sys.argv[1:]))
