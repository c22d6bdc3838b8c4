"""Speed of the server lifecycle and the log parser; prints figures against the goals.

    python scripts/bench_server.py [--backend sim|fake] [--runs 5] [--lines 1000000]

* readiness: how long after the "fired up" line reaches server.log `wait_ready()` returns with
  the readiness confirmed (goal ≤ 0.2 s). A watcher thread polls the file every millisecond to
  time the line independently of the code under test.
* teardown: `stop()` of a ready server, SIGTERM to verified release of GPU memory and port
  (goal ≤ 2 s on the simulator).
* parsing: one million log lines (a realistic mix of batch, access-log and startup lines)
  read from a file into events and batches (goal < 5 s).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from autotune.logparse.outcome import Outcome
from autotune.review.ledgerview import read_log
from autotune.server.gpu import GpuProbe, SimProbe
from autotune.server.launchspec import LaunchSpec
from autotune.server.lifecycle import Server
from autotune.server.preflight import free_port

ROOT = Path(__file__).resolve().parent.parent
FAKE = (sys.executable, "-m", "autotune.testing.fakeserver", "--log")
FIXTURE = ROOT / "tests" / "fixtures" / "logs" / "v0_5_9_kimi_tp8_eagle3.log"
READY = b"The server is fired up and ready to roll!"


class LineWatch(threading.Thread):
    """Records the monotonic time at which the ready line first appears in the file."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.seen_at: float | None = None
        self.done = threading.Event()

    def run(self) -> None:
        offset = 0
        tail = b""
        while not self.done.is_set() and self.seen_at is None:
            try:
                with open(self.path, "rb") as fh:
                    fh.seek(offset)
                    data = fh.read()
            except FileNotFoundError:
                data = b""
            if data:
                offset += len(data)
                if READY in tail + data:
                    self.seen_at = time.monotonic()
                tail = data[-len(READY) :]
            time.sleep(0.001)


def one_run(backend: str, work: Path) -> tuple[float, float]:
    """(readiness delay after the ready line, teardown seconds) of one launch."""
    probe: GpuProbe | None = None
    if backend == "sim":
        gpu_dir = work / "gpu"
        argv: tuple[str, ...] = (
            sys.executable, "-m", "autotune.sim", "--model-path", "/models/Kimi-K2.5",
            "--tp-size", "8", "--mem-fraction-static", "0.88",
            "--sim-gpu-dir", str(gpu_dir), "--sim-time-scale", "3000",
        )  # fmt: skip
        probe = SimProbe(gpu_dir)
    else:
        argv = FAKE
    spec = LaunchSpec(
        argv=argv,
        log_path=work / "server.log",
        run_dir=work / "run",
        port=free_port("127.0.0.1"),
        startup_s=300.0,
        stall_s=120.0,
        stop_grace_s=30.0,
        release_s=30.0,
    )
    watch = LineWatch(spec.log_path)
    watch.start()
    server = Server.launch(spec, probe)
    try:
        report = server.wait_ready()
        if report.outcome is not Outcome.READY:
            raise SystemExit(f"{backend} server did not become ready: {report.to_dict()}")
    finally:
        down = server.stop()
        watch.done.set()
    if not down.clean:
        raise SystemExit(f"teardown was not clean: {down.problems}")
    if watch.seen_at is None or report.ready_at is None:
        raise SystemExit("the ready line was never seen")
    return report.ready_at - watch.seen_at, down.seconds


def write_big_log(path: Path, lines: int) -> None:
    startup = FIXTURE.read_text().splitlines()[:48]
    mix = [
        "[2026-02-24 12:05:11 TP0] Decode batch, #running-req: 48, #token: 150123, token usage: "
        "0.94, accept len: 2.85, accept rate: 0.71, cuda graph: True, gen throughput (token/s): "
        "983.12, #queue-req: 102",
        "[2026-02-24 12:05:10 TP0] Prefill batch, #new-seq: 3, #new-token: 8192, #cached-token: "
        "120, token usage: 0.41, #running-req: 45, #queue-req: 104, input throughput (token/s): "
        "15012.33, cuda graph: False",
        '[2026-02-24 12:05:11] INFO:     127.0.0.1:40300 - "POST /generate HTTP/1.1" 200 OK',
    ]
    weights = [8, 4, 7]  # decode every step block, a prefill per few, an access line per request
    block = [line for line, n in zip(mix, weights, strict=True) for _ in range(n)]
    body = (block * (lines // len(block) + 1))[: lines - len(startup)]
    path.write_text("\n".join(startup + body) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--backend", choices=("sim", "fake"), default="sim")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--lines", type=int, default=1_000_000)
    args = parser.parse_args()

    ready_delays, teardowns = [], []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            delay, down = one_run(args.backend, Path(tmp))
        ready_delays.append(delay)
        teardowns.append(down)
    print(
        f"readiness after the ready line ({args.backend}, {args.runs} runs): "
        f"median {statistics.median(ready_delays):.3f} s, max {max(ready_delays):.3f} s "
        f"(goal <= 0.2 s)"
    )
    print(
        f"teardown of a ready {args.backend} server: median {statistics.median(teardowns):.3f} s,"
        f" max {max(teardowns):.3f} s (goal <= 2 s)"
    )

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big.log"
        write_big_log(path, args.lines)
        started = time.perf_counter()
        log = read_log(path)
        elapsed = time.perf_counter() - started
    print(
        f"parsed {log.lines:,} log lines in {elapsed:.2f} s "
        f"({len(log.batches):,} batches, {len(log.events):,} events; goal < 5 s)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
