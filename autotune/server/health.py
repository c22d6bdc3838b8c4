"""HTTP checks of a running server: readiness probe, /server_info, /flush_cache, and a background
health watch.

Reference §5: `/health_generate` answers 200 once a one-token generation produced output (503
while starting, 503 after 20 s without detokenizer output). Readiness asks for a one-token
`/generate` first and `/health_generate` second; either proves the server generates. The watch
thread polls `/health` so that the liveness check the workload calls several times a second
never blocks on the network. An empty or failing
`/health` alone proves nothing (the operator saw exactly that on a healthy server), so a failed
check is confirmed with a one-token `/generate`, and the server handle weighs the result against
the process and the log.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from autotune.logparse.serverinfo import graph_usage
from autotune.masking import masked_fields


@dataclass(frozen=True)
class Answer:
    """One HTTP exchange: `ok` for a 2xx status with the expected body."""

    ok: bool
    status: int | None
    detail: str
    body: bytes = b""


def request(
    url: str,
    *,
    api_key: str | None = None,
    payload: Mapping[str, Any] | None = None,
    timeout_s: float = 10.0,
    limit: int = 1 << 20,
) -> Answer:
    """GET (or POST JSON when `payload` is given); never raises for network trouble. At most
    `limit` bytes of the body are read."""
    headers = {"Accept": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    data = None
    if payload is not None:
        data = json.dumps(payload).encode()
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            body = resp.read(limit)
            return Answer(200 <= resp.status < 300, resp.status, f"HTTP {resp.status}", body)
    except urllib.error.HTTPError as exc:
        return Answer(False, exc.code, f"HTTP {exc.code}")
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return Answer(False, None, f"{type(exc).__name__}: {reason}")


def generate_one(base_url: str, api_key: str | None, timeout_s: float) -> Answer:
    """A one-token `/generate`: what a health check does, by the public route."""
    payload = {"text": "ping", "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}
    answer = request(f"{base_url}/generate", api_key=api_key, payload=payload, timeout_s=timeout_s)
    return Answer(answer.ok and bool(answer.body), answer.status, answer.detail, answer.body)


def probe_ready(base_url: str, api_key: str | None, timeout_s: float) -> Answer:
    """A one-token `/generate`, else `/health_generate`. The generation goes first because it
    answers as soon as the token exists, while SGLang's `/health_generate` polls once a second
    (reference §5) and so adds up to a second to every readiness check."""
    answer = generate_one(base_url, api_key, timeout_s)
    if answer.ok:
        return answer
    health = request(f"{base_url}/health_generate", api_key=api_key, timeout_s=timeout_s)
    if health.ok:
        return Answer(True, health.status, f"/generate {answer.detail}; /health_generate ok")
    return Answer(
        False, health.status, f"/generate {answer.detail}; /health_generate {health.detail}"
    )


SERVER_INFO_LIMIT = 64 << 20
"""0.5.23's `/server_info` repeats the ~20 KB resolved-argument dict once per DP rank (and may
carry step-time tables); a 1 MiB cut would leave JSON that does not parse."""


def server_info(base_url: str, api_key: str | None, timeout_s: float = 10.0) -> dict[str, Any]:
    """`/server_info` (or the deprecated `/get_server_info`) as a dict; {} when unavailable.
    It lists every server argument, so key fields are masked before anyone can store it."""
    for route in ("/server_info", "/get_server_info"):
        answer = request(
            f"{base_url}{route}", api_key=api_key, timeout_s=timeout_s, limit=SERVER_INFO_LIMIT
        )
        if not answer.ok:
            continue
        try:
            data = json.loads(answer.body)
        except ValueError:
            continue
        if isinstance(data, dict):
            return dict(masked_fields(data))
    return {}


FLUSH_RETRY_S = 2.0
FLUSH_RETRY_POLL_S = 0.2


def flush_cache(
    base_url: str,
    api_key: str | None,
    timeout_s: float = 10.0,
    *,
    retry_s: float = FLUSH_RETRY_S,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Answer:
    """`/flush_cache`: SGLang resets its radix tree and pools and calls `torch.cuda.empty_cache()`,
    but only while the scheduler is fully idle (200, `Cache flushed.`); with requests still in
    it, 400 (`Cache flush failed. There are pending requests.`). A 400 is asked again every
    `FLUSH_RETRY_POLL_S` for up to `retry_s` (the last requests may still be draining); `ok` only
    for a 200."""
    deadline = clock() + retry_s
    while True:
        answer = request(f"{base_url}/flush_cache", api_key=api_key, timeout_s=timeout_s)
        if answer.status == 200:
            return answer
        if answer.status != 400 or clock() >= deadline:
            return Answer(False, answer.status, answer.detail, answer.body)
        sleep(FLUSH_RETRY_POLL_S)


def memory_usage(info: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each DP rank's `internal_states[i].memory_usage`, with `graph` always GiB per phase:
    0.5.18+ reports a dict (`prefill`, `decode`, `target_verify`, `draft_prefill`,
    `draft_decode`, `draft_extend`), 0.5.9 one number (its decode graphs), read as
    `{"decode": x}` (`logparse.serverinfo.graph_usage`)."""
    states = info.get("internal_states")
    out: list[dict[str, Any]] = []
    for state in states if isinstance(states, list) else []:
        usage = state.get("memory_usage") if isinstance(state, dict) else None
        if not isinstance(usage, dict):
            continue
        row = dict(usage)
        row["graph"] = graph_usage(usage)
        out.append(row)
    return out


@dataclass(frozen=True)
class HealthState:
    """What the watch has seen: `failing_since` is when the current run of failures began."""

    checks: int = 0
    failures_in_a_row: int = 0
    failing_since: float | None = None
    last_ok_at: float | None = None
    last_detail: str = ""


class HealthWatch:
    """Polls `/health` every `interval_s` in a daemon thread; `state()` never blocks. When
    `/health` fails, a one-token `/generate` decides: only both failing counts as a failure."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        interval_s: float = 5.0,
        timeout_s: float = 25.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._base_url = base_url
        self._url = f"{base_url}/health"
        self._api_key = api_key
        self._interval = interval_s
        self._timeout = timeout_s
        self._clock = clock
        self._state = HealthState()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="autotune-health", daemon=True)

    def start(self) -> None:
        """Start the polling thread (a daemon: it never holds the process up)."""
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to end; a check in flight finishes on its own (daemon thread)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=0.2)

    def state(self) -> HealthState:
        """The latest state the thread saw; never blocks on the network."""
        with self._lock:
            return self._state

    def _run(self) -> None:
        while not self._stop.is_set():
            started = self._clock()
            answer = request(self._url, api_key=self._api_key, timeout_s=self._timeout)
            if not answer.ok:
                answer = generate_one(self._base_url, self._api_key, self._timeout)
            with self._lock:
                s = self._state
                if answer.ok:
                    self._state = HealthState(s.checks + 1, 0, None, self._clock(), answer.detail)
                else:
                    since = s.failing_since if s.failing_since is not None else started
                    self._state = HealthState(
                        s.checks + 1, s.failures_in_a_row + 1, since, s.last_ok_at, answer.detail
                    )
            self._stop.wait(self._interval)
