"""How much load the workload driver can generate, measured against a minimal fast local server.

Starts `python -m autotune.testing.fakeserver` (raw asyncio, no model work) in a subprocess,
pins this process (the client) to one core and the server to another when there are two, and
runs `run_workload` through four cases: tiny non-streamed requests (requests/s), long streams of
one-token chunks (chunks/s), 128K-token prompts (requests/s and upload MB/s), and streams of
256 KiB events (download MB/s: no collapse from small read buffers). For each case it prints the
rate and the CPU share each side used: a client below ~95% of its core was not the limit. Last,
how fast a run stops once `is_dead()` reports, with ~1,000 requests in flight.
Goals on one client core: >= 3,000 requests/s and >= 50,000 streamed chunks/s.

`--versus-bench-serving` instead compares this client with SGLang's own bench_serving on native
`/generate` streams whose every event carries the whole text so far (SGLang's default,
non-incremental streaming), for events of 1 KiB to 256 KiB: both send the same requests (64
tokens each, so 64 events, at concurrency 4) to the same fake server, each from one pinned core.
bench_serving is its own `async_request_sglang_generate`, run unchanged in the SGLang venv by
scripts/bench_serving_client.py (aiohttp's line iterator, `orjson.loads` of every event). The
rate is events (tokens) received per second of the run's wall time; MB/s is that times the
event size; each client runs three times, alternating, and its best run counts. Goal: >= 2x
bench_serving at 256 KiB.

    .venv/bin/python scripts/bench_loadgen.py [--seconds 5] [--versus-bench-serving]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from autotune.loadgen import ServerFacts, Target, WorkloadResult, run_workload, workload_from_dict
from autotune.testing import fakeserver

BYTES_PER_ID = 6.0  # "12345," on average for ids in [1000, 30000)
ROOT = Path(__file__).resolve().parent.parent
EVENT_SIZES = (1024, 16384, 65536, 262144)
TOKENS = 64  # events per request in the side-by-side
REPEATS = 3  # alternating runs per client; the best counts (a shared machine only slows one)


@dataclass(frozen=True)
class Case:
    name: str
    server_args: tuple[str, ...]
    workload: dict[str, object]
    unit: str


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _start_server(args: tuple[str, ...], core: int | None) -> fakeserver.Running:
    try:
        server = fakeserver.start(*args)
    except RuntimeError as exc:
        raise SystemExit(str(exc)) from None
    if core is not None:
        os.sched_setaffinity(server.proc.pid, {core})
    return server


def _run(
    case: Case, seconds: float, server_core: int | None
) -> tuple[WorkloadResult, float, float]:
    server = _start_server(case.server_args, server_core)
    try:
        workload = dict(case.workload)  # the case's own table stays whole (cases share one)
        phases = [
            {"kind": "warmup", "requests": 20, "concurrency": 4},
            {"kind": "steady", "duration_s": seconds, **workload.pop("steady", {})},  # type: ignore[dict-item]
        ]
        spec = workload_from_dict({**workload, "phases": phases, "drain_timeout_s": 30})
        facts = ServerFacts(context_len=1 << 20)
        c0, s0, w0 = time.process_time(), _cpu_seconds(server.proc.pid), time.perf_counter()
        result = run_workload(
            spec,
            Target(server.url),
            facts,
            is_dead=server.is_dead,
        )
        wall = time.perf_counter() - w0
        return (
            result,
            (time.process_time() - c0) / wall,
            (_cpu_seconds(server.proc.pid) - s0) / wall,
        )
    finally:
        server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=5.0, help="steady phase per case")
    parser.add_argument("--only", default="", help="run only cases whose name contains this")
    parser.add_argument(
        "--versus-bench-serving",
        action="store_true",
        help="compare with SGLang's bench_serving on cumulative /generate streams",
    )
    args = parser.parse_args()
    allowed = sorted(os.sched_getaffinity(0))
    client_core = allowed[0]
    server_core = allowed[1] if len(allowed) > 1 else None
    os.sched_setaffinity(0, {client_core})
    print(
        f"cores: {os.cpu_count()} online, {len(allowed)} usable; client pinned to core "
        f"{client_core}, server to {server_core if server_core is not None else 'the same'}"
    )
    if args.versus_bench_serving:
        return _versus_bench_serving(args.seconds, client_core, server_core)
    long_completions = {
        "api": "completions",
        "input_len": 16,
        "output_len": 4000,
        "steady": {"concurrency": 16},
    }
    cases = [
        Case(
            "non-streamed requests",
            (),
            {"stream": False, "input_len": 16, "output_len": 1, "steady": {"concurrency": 64}},
            "requests/s",
        ),
        Case(
            "streamed chunks, 32 per write (/v1/completions)",
            ("--batch", "32"),
            long_completions,
            "chunks/s",
        ),
        Case(
            "streamed chunks, one write each (/v1/completions)",
            ("--batch", "1"),
            long_completions,
            "chunks/s",
        ),
        Case(
            "streamed chunks (/generate, cumulative text)",
            ("--batch", "32"),
            {"input_len": 16, "output_len": 512, "steady": {"concurrency": 16}},
            "chunks/s",
        ),
        Case(
            "128K-token prompts",
            (),
            {"input_len": 131072, "output_len": 16, "steady": {"concurrency": 8}},
            "requests/s",
        ),
        Case(
            "256 KiB cumulative events (/generate)",
            ("--pad-bytes", "262144"),
            {"input_len": 16, "output_len": 64, "steady": {"concurrency": 4}},
            "MB/s down",
        ),
        Case(
            "256 KiB stream events (/v1/completions)",
            ("--pad-bytes", "262144"),
            {"api": "completions", "input_len": 16, "output_len": 64, "steady": {"concurrency": 4}},
            "MB/s down",
        ),
    ]
    print(f"{'case':<50} {'rate':>12} {'unit':<11} {'client CPU':>10} {'server CPU':>10}  notes")
    for case in cases:
        if args.only not in case.name:
            continue
        result, client_cpu, server_cpu = _run(case, args.seconds, server_core)
        s = next(p.summary for p in result.phases if p.kind == "steady")
        notes = f"errors {s.failed}/{s.requests}"
        if case.unit == "requests/s":
            rate = s.request_throughput
            if s.total_input_tokens > 1_000_000:
                mb = s.input_throughput * BYTES_PER_ID / 1e6
                notes += f"; {s.input_throughput:,.0f} prompt tokens/s, ~{mb:,.0f} MB/s up"
        elif case.unit == "chunks/s":
            rate = s.output_throughput  # one token per chunk
            notes += f"; p50 ITL {s.itl_ms.p50 if s.itl_ms else float('nan'):.3f} ms"
        else:
            rate = s.output_throughput * 262144 / 1e6
            notes += f"; {s.output_throughput:,.0f} events/s"
        print(
            f"{case.name:<50} {rate:>12,.0f} {case.unit:<11} {client_cpu:>9.0%} {server_cpu:>10.0%}"
            f"  {notes}"
        )
    if args.only in "stop after is_dead":
        _stop_latency(server_core)
    return 0


def _stop_latency(server_core: int | None) -> None:
    """How long run_workload takes to return once is_dead() reports, with much in flight."""
    server = _start_server(("--ttft-ms", "1000000"), server_core)
    try:
        start = time.perf_counter()
        reported: list[float] = []

        def is_dead() -> str | None:
            if time.perf_counter() - start < 2.0:
                return None
            reported.append(time.perf_counter())
            return "stop now"

        spec = workload_from_dict({"phases": [{"kind": "poisson", "rate": 500, "duration_s": 60}]})
        res = run_workload(spec, Target(server.url), ServerFacts(), is_dead=is_dead)
        latency = time.perf_counter() - reported[0]
        n = res.died.in_flight if res.died else 0
        print(f"stop after is_dead reports: {latency:.3f} s with {n} requests in flight cancelled")
    finally:
        server.stop()


def _requests_for(size: int, seconds: float) -> int:
    """Requests enough for about `seconds` at ~1 GB/s, between 16 and 2,000."""
    return max(16, min(2000, int(seconds * 1e9 / (size * TOKENS))))


def _ours(port: int, requests: int) -> tuple[float, int, float]:
    """(events/s, failed requests, CPU share) of run_workload: `requests` at concurrency 4."""
    phase = {"kind": "steady", "duration_s": 600, "max_requests": requests, "concurrency": 4}
    spec = workload_from_dict(
        {"input_len": 16, "output_len": TOKENS, "phases": [phase], "drain_timeout_s": 30}
    )
    c0, w0 = time.process_time(), time.perf_counter()
    target = Target(f"http://127.0.0.1:{port}")
    result = run_workload(spec, target, ServerFacts(context_len=1 << 20), is_dead=lambda: None)
    wall = time.perf_counter() - w0
    s = result.phases[0].summary
    return s.total_output_tokens / wall, s.failed, (time.process_time() - c0) / wall


def _theirs(python: str, port: int, requests: int, core: int) -> tuple[float, int, float]:
    """(events/s, failed requests, CPU share) of bench_serving's async_request_sglang_generate."""
    argv = [
        python,
        str(ROOT / "scripts" / "bench_serving_client.py"),
        "--url",
        f"http://127.0.0.1:{port}",
        "--api",
        "generate",
        "--requests",
        str(requests),
        "--concurrency",
        "4",
        "--output-len",
        str(TOKENS),
    ]
    done = subprocess.run(
        ["taskset", "-c", str(core), *argv], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"bench_serving_client failed: {done.stderr.strip()[-800:]}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    outs = report["requests"]
    events = sum(r["output_len"] for r in outs if r["success"])
    failed = sum(1 for r in outs if not r["success"])
    return events / report["wall_s"], failed, report["cpu_s"] / report["wall_s"]


def _versus_bench_serving(seconds: float, client_core: int, server_core: int | None) -> int:
    venv = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "sglang_venv.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    if venv.returncode != 0:
        print("no SGLang venv: run scripts/sglang_venv.py first", file=sys.stderr)
        return 2
    python = venv.stdout.strip().splitlines()[-1]
    print(
        f"native /generate, cumulative text, {TOKENS} events per request, concurrency 4, "
        f"events/s over each run's wall time, best of {REPEATS} alternating runs"
    )
    head = f"{'event size':>10} {'requests':>8} {'client':<14} {'events/s':>10} {'MB/s':>8}"
    print(f"{head} {'failed':>6} {'CPU':>5} {'ratio':>6}")
    for size in EVENT_SIZES:
        requests = _requests_for(size, seconds)
        server = _start_server(("--pad-bytes", str(size)), server_core)
        try:
            runs = [
                (_theirs(python, server.port, requests, client_core), _ours(server.port, requests))
                for _ in range(REPEATS)
            ]
            theirs = max((r[0] for r in runs), key=lambda r: r[0])
            ours = max((r[1] for r in runs), key=lambda r: r[0])
        finally:
            server.stop()
        for name, (rate, failed, cpu) in (("bench_serving", theirs), ("autotune", ours)):
            ratio = f"{rate / theirs[0]:>5.2f}x" if theirs[0] else "   n/a"
            print(
                f"{size // 1024:>7} KiB {requests:>8} {name:<14} {rate:>10,.0f} "
                f"{rate * size / 1e6:>8,.0f} {failed:>6} {cpu:>5.0%} {ratio}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
