"""Benchmarks and calibration checks for the SGLang simulator; prints figures, asserts nothing.

    throughput  N concurrent streaming /generate clients; prints generated tok/s and the server
                process's CPU use (cores) from /proc/<pid>/stat
    decode      the operator's profile: decode rate with 48 running and with one stream
    oom         the operator's profile at --fraction: 48 concurrent long prompts (8K-token prefill
                chunks); prints when (if) the server died and how
    startup     launches at each --fractions value and prints the startup figures from the log

Example: .venv/bin/python scripts/bench_sim.py throughput --concurrency 256
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from autotune.server.preflight import free_port

KIMI = "kimi-k2.5-tp8-96g"
KIMI_FLAGS = [
    "--model-path",
    "moonshotai/Kimi-K2.5",
    "--tp",
    "8",
    "--max-running-requests",
    "48",
    "--chunked-prefill-size",
    "8192",
    "--enable-hierarchical-cache",
    "--hicache-size",
    "48",
    "--speculative-algorithm",
    "EAGLE3",
    "--speculative-draft-model-path",
    "draft",
]
READY = "The server is fired up and ready to roll!"


@dataclass
class Launched:
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path
    started: float = field(default_factory=time.monotonic)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 120.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if READY in self.log():
                return True
            if self.proc.poll() is not None:
                return False
            time.sleep(0.05)
        return False

    def cpu_seconds(self) -> float:
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)


def launch(args: list[str], workdir: Path, scale: float = 3000.0) -> Launched:
    port = free_port("127.0.0.1")
    log_path = workdir / f"sim-{port}.log"
    fh = log_path.open("wb")
    cmd = [
        sys.executable,
        "-m",
        "autotune.sim",
        *args,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--sim-time-scale",
        str(scale),
        "--sim-gpu-dir",
        str(workdir / "gpus"),
    ]
    proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    return Launched(proc, port, log_path)


async def stream_one(
    session: aiohttp.ClientSession, base: str, input_len: int, output_len: int, seed: int
) -> tuple[int, float, float]:
    """One bench_serving-style streaming /generate; returns (tokens, ttft, latency)."""
    payload = {
        "input_ids": [(seed * 7919 + i) % 50000 + 1 for i in range(input_len)],
        "sampling_params": {"temperature": 0.0, "max_new_tokens": output_len, "ignore_eos": True},
        "stream": True,
    }
    start = time.perf_counter()
    ttft = 0.0
    tokens = 0
    async with session.post(f"{base}/generate", json=payload) as resp:
        async for line in resp.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            if not ttft:
                ttft = time.perf_counter() - start
            tokens = json.loads(line[6:])["meta_info"]["completion_tokens"]
    return tokens, ttft, time.perf_counter() - start


async def run_clients(
    base: str,
    concurrency: int,
    requests: int,
    input_len: int,
    output_len: int,
    stagger: int = 0,
) -> tuple[int, float, list[tuple[int, float, float]]]:
    sem = asyncio.Semaphore(concurrency)
    timeout = aiohttp.ClientTimeout(total=None)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:

        async def one(i: int) -> tuple[int, float, float]:
            async with sem:
                out = output_len + (i % 7) * stagger
                return await stream_one(session, base, input_len, out, i)

        start = time.perf_counter()
        results = await asyncio.gather(*(one(i) for i in range(requests)), return_exceptions=True)
        wall = time.perf_counter() - start
    ok = [r for r in results if isinstance(r, tuple)]
    return sum(r[0] for r in ok), wall, ok


def cmd_throughput(ns: argparse.Namespace, workdir: Path) -> None:
    flags = [
        "--model-path",
        "Qwen/Qwen3-32B",
        "--sim-profile",
        ns.profile,
        "--max-running-requests",
        str(max(ns.concurrency, 1)),
        "--cuda-graph-max-bs",
        "256",
    ]
    srv = launch(flags, workdir)
    try:
        if not srv.wait_ready():
            print("server did not start:\n" + srv.log()[-2000:])
            return
        cpu0 = srv.cpu_seconds()
        total, wall, ok = asyncio.run(
            run_clients(srv.base, ns.concurrency, ns.requests, ns.input_len, ns.output_len)
        )
        cpu = srv.cpu_seconds() - cpu0
        print(
            f"profile={ns.profile} concurrency={ns.concurrency} requests={len(ok)}/{ns.requests} "
            f"input_len={ns.input_len} output_len={ns.output_len}"
        )
        print(f"generated tokens: {total}  wall: {wall:.2f} s  generated tok/s: {total / wall:.0f}")
        print(f"server CPU: {cpu:.2f} s = {cpu / wall:.2f} cores")
        if ok:
            ttfts = sorted(r[1] for r in ok)
            print(f"median TTFT: {ttfts[len(ttfts) // 2] * 1000:.0f} ms")
    finally:
        srv.stop()


def gen_throughputs(log: str) -> list[float]:
    return [float(m) for m in re.findall(r"gen throughput \(token/s\): ([\d.]+)", log)]


def cmd_decode(ns: argparse.Namespace, workdir: Path) -> None:
    srv = launch([*KIMI_FLAGS, "--mem-fraction-static", "0.88", "--sim-profile", KIMI], workdir)
    try:
        if not srv.wait_ready():
            print("server did not start:\n" + srv.log()[-2000:])
            return
        for conc, reqs, out in ((48, 150, 300), (1, 2, 400)):
            before = len(gen_throughputs(srv.log()))
            total, wall, _ = asyncio.run(run_clients(srv.base, conc, reqs, 200, out, 50))
            logged = gen_throughputs(srv.log())[before:]
            steady = logged[1:-2] if len(logged) > 4 else logged
            mean_log = sum(steady) / len(steady) if steady else 0.0
            per_stream = total / wall / conc
            print(
                f"concurrency={conc}: client {total / wall:.0f} tok/s total "
                f"({per_stream:.1f} per stream); Decode-line gen throughput mean "
                f"{mean_log:.0f} tok/s over {len(steady)} lines"
            )
    finally:
        srv.stop()


def cmd_oom(ns: argparse.Namespace, workdir: Path) -> None:
    srv = launch(
        [
            *KIMI_FLAGS,
            "--mem-fraction-static",
            str(ns.fraction),
            "--sim-profile",
            KIMI,
            "--sim-seed",
            str(ns.seed),
        ],
        workdir,
    )
    try:
        if not srv.wait_ready():
            print("server did not start:\n" + srv.log()[-2000:])
            return
        t0 = time.monotonic()

        async def load() -> None:
            timeout = aiohttp.ClientTimeout(total=None)
            async with aiohttp.ClientSession(timeout=timeout) as session:
                sem = asyncio.Semaphore(48)
                stop = t0 + ns.duration

                async def worker(i: int) -> None:
                    n = i
                    while time.monotonic() < stop and srv.proc.poll() is None:
                        async with sem:
                            try:
                                await stream_one(session, srv.base, ns.input_len, 64, n)
                            except (TimeoutError, aiohttp.ClientError):
                                await asyncio.sleep(0.2)
                        n += 48

                async def watch() -> None:
                    while time.monotonic() < stop and srv.proc.poll() is None:
                        await asyncio.sleep(0.2)

                tasks = [asyncio.create_task(worker(i)) for i in range(48)]
                await watch()
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run(load())
        elapsed = time.monotonic() - t0
        rc = srv.proc.poll()
        log = srv.log()
        prefills = len(re.findall(r"Prefill batch", log))
        if rc is None:
            print(
                f"fraction={ns.fraction}: alive after {elapsed:.0f} s of load "
                f"({prefills} prefill batches, {len(gen_throughputs(log))} decode lines)"
            )
        else:
            oom = "CUDA out of memory" in log
            print(
                f"fraction={ns.fraction}: died after {elapsed:.1f} s, returncode={rc}, "
                f"OOM in log={oom}"
            )
            for line in log.splitlines():
                if "OutOfMemoryError" in line or "SIGQUIT" in line:
                    print("  " + line[:200])
    finally:
        srv.stop()


def cmd_startup(ns: argparse.Namespace, workdir: Path) -> None:
    keys = {
        "max_total_num_tokens": r"max_total_num_tokens=(\d+)",
        "kv_gb": r"TP0\] KV Cache is allocated\. #tokens: \d+, KV size: ([\d.]+) GB",
        "graph_gb": r"TP0\] Capture cuda graph end\. .* mem usage=([\d.]+) GB",
        "free_after_capture_gb": r"available_gpu_mem=([\d.]+) GB",
    }
    for f in ns.fractions:
        srv = launch([*KIMI_FLAGS, "--mem-fraction-static", str(f), "--sim-profile", KIMI], workdir)
        try:
            ready = srv.wait_ready()
            log = srv.log()
            figures = {k: re.findall(p, log) for k, p in keys.items()}
            print(f"fraction={f} ready={ready} " + " ".join(f"{k}={v}" for k, v in figures.items()))
        finally:
            srv.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    sub = parser.add_subparsers(dest="mode", required=True)
    t = sub.add_parser("throughput")
    t.add_argument("--profile", default="qwen3-32b-h200")
    t.add_argument("--concurrency", type=int, default=256)
    t.add_argument("--requests", type=int, default=512)
    t.add_argument("--input-len", type=int, default=64)
    t.add_argument("--output-len", type=int, default=256)
    sub.add_parser("decode")
    o = sub.add_parser("oom")
    o.add_argument("--fraction", type=float, default=0.93)
    o.add_argument("--duration", type=float, default=60.0)
    o.add_argument("--input-len", type=int, default=20000)
    o.add_argument("--seed", type=int, default=0)
    s = sub.add_parser("startup")
    s.add_argument("--fractions", type=float, nargs="+", default=[0.85, 0.88, 0.93])
    ns = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        {
            "throughput": cmd_throughput,
            "decode": cmd_decode,
            "oom": cmd_oom,
            "startup": cmd_startup,
        }[ns.mode](ns, Path(tmp))


if __name__ == "__main__":
    main()
