"""The live log view (`server.logwatch.LogWatch`): which lines end a run (`failure_at`, the
moment `Server.check_alive` ends a trial on), and, through the real lifecycle, that a serving
server's retractions and handled out-of-memory fallbacks never end it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from server_helpers import Guard, fake_spec

from autotune.logparse.events import Kind
from autotune.logparse.outcome import Outcome
from autotune.server.lifecycle import Server
from autotune.server.logwatch import ENDS_RUN, LogWatch

TP0 = "[2026-11-20 14:00:00 TP0] "
MAIN = "[2026-11-20 14:00:00] "
SERVING_EVENTS = [
    TP0 + "Decode out of memory happened. #retracted_reqs: 1, #new_token_ratio: 0.4000 -> 0.5000",
    "decode out of memory happened, #retracted_reqs: 2, #new_token_ratio: 0.9998 -> 1.0000",
    TP0 + "KV cache pool is full. Retract requests. #retracted_reqs: 3, #new_tokens_gained: 900, "
    "#new_token_ratio: 0.4200 -> 0.6100",
    TP0 + "WARNING: CUDA out of memory while capturing the piecewise graph; falling back to eager",
    TP0 + "[CudaGraph][dedup] DecodeCudaGraphRunner init failed (CUDA out of memory. Tried to "
    "allocate 64.00 MiB); using plain executables.",
    MAIN + "Port 30001 is already in use, trying port 30002",
    MAIN + "ERROR:    Exception in ASGI application",
    "ValueError: The input (140000 tokens) is longer than the model's context length.",
]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _watch(tmp_path: Path, lines: list[str]) -> LogWatch:
    path = tmp_path / "server.log"
    clock = Clock()
    watch = LogWatch(path, clock)
    path.write_text("")
    watch.pump()
    with path.open("a") as log:
        for line in lines:
            log.write(line + "\n")
            log.flush()
            clock.now += 1.0
            watch.pump()
    return watch


def test_serving_events_never_set_failure_at(tmp_path: Path) -> None:
    watch = _watch(tmp_path, SERVING_EVENTS)
    assert watch.failure_at is None
    kinds = [e.kind for e in watch.events]
    assert kinds.count(Kind.RETRACT) == 3 and kinds.count(Kind.OOM_HANDLED) == 2
    assert not ENDS_RUN & {Kind.RETRACT, Kind.OOM_HANDLED, Kind.PORT_WAIT, Kind.ERROR}


@pytest.mark.parametrize(
    "line",
    [
        TP0 + "Decode out of memory. Try to lower your batch size.",
        "ValueError: Out of memory even after retracting all other requests in the decode batch.",
        TP0 + "retract_decode: aborted last request 7c1e due to OOM",
        MAIN + "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', "
        "30000): address already in use",
        "OSError: [Errno 28] No space left on device",
        MAIN + "SIGTERM received. signum=15 frame=None. Draining requests and shutting down...",
    ],
)
def test_a_death_or_a_foreign_sigterm_sets_failure_at_when_it_is_read(
    tmp_path: Path, line: str
) -> None:
    watch = _watch(tmp_path, [*SERVING_EVENTS, line])
    assert watch.failure_at == 100.0 + len(SERVING_EVENTS) + 1


def _stand_in(tmp_path: Path, lines: list[str], *modes: str) -> Server:
    """The fake server, serving, printing `lines` once ready, then Decode batch lines."""
    script = tmp_path / "lines.txt"
    script.write_text("\n".join(lines) + "\n")
    spec = fake_spec(tmp_path, "generate", "batches", *modes)
    return Server.launch(fake_spec(tmp_path, argv=(*spec.argv, "--lines", str(script))))


def test_a_live_server_retracting_and_falling_back_is_alive(tmp_path: Path, guard: Guard) -> None:
    """The trial is not ended: before, the first `Decode out of memory happened.` line was a
    `runtime_oom (decode_oom)` and the healthy server was stopped."""
    server = guard.server(_stand_in(tmp_path, SERVING_EVENTS))
    assert server.wait_ready().outcome is Outcome.READY
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        assert server.check_alive() is None
        time.sleep(0.05)
    serving = server.serving()
    assert (serving.retraction_events, serving.retracted_requests) == (3, 6)
    assert serving.handled_ooms == 2 and serving.decode_lines > 0
    teardown = server.stop()
    assert teardown.clean and teardown.outcome is Outcome.STOPPED


def test_a_live_server_that_dies_of_an_oom_after_retracting_is_an_oom(
    tmp_path: Path, guard: Guard
) -> None:
    lines = [*SERVING_EVENTS[:3], TP0 + "Decode out of memory. Try to lower your batch size."]
    server = guard.server(_stand_in(tmp_path, lines, "die-after-lines"))
    assert server.wait_ready().outcome is Outcome.READY
    deadline = time.monotonic() + 10.0
    death = None
    while death is None and time.monotonic() < deadline:
        death = server.check_alive()
        time.sleep(0.05)
    assert death is not None
    assert (death.outcome, death.cause) == (Outcome.RUNTIME_OOM, "decode_oom")
    server.stop()
