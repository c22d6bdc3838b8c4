"""A tiny stand-in for an SGLang server: prints SGLang 0.5.9 log lines and serves its health routes.

Run as `python fake_server.py [--mode M]... --host H --port P`. Modes change one behaviour each,
so tests can stage every ending the lifecycle must recognise without the simulator:

    no-kv-room        startup fails with "Not enough memory" (then SIGKILLs itself, as SGLang)
    hang-load         stops printing during weight load and never finishes
    crawl-load        keeps printing progress during weight load and never finishes
    runtime-oom       becomes ready, then logs a torch OOM and SIGKILLs itself
    exit-after-ready  becomes ready, then exits silently (an OOM-killed scheduler)
    health-fail       /health and /health_generate answer 503 once ready
    health-late       /health_generate answers 503 for half a second after ready
    generate          serves a one-token POST /generate once ready (SGLang's native answer, as
                      autotune.testing.fakeserver writes it)
    batches           logs a Decode batch line every 0.1 s once ready
    ignore-sigterm    ignores SIGTERM
    child             starts a child process in its group (a scheduler)
    escaped-child     starts a child that leaves the group with setsid()
    gpu=DIR           registers 1 GiB on simulated GPU 0 in DIR while alive
    schedulers=N      starts N scheduler processes in its group before the weight load; each logs
                      `scheduler pid P` and, with gpu=DIR, registers 1 GiB on simulated GPU i+1
                      (kept fresh by a heartbeat) until it dies
    sched-hold=S      the schedulers' GPU memory stays counted S s after they die, however they
                      die (the driver freeing a killed process's memory late)
    sched-pgrp        the schedulers move to process groups of their own (same session)
    sched-setsid      the schedulers leave the session too (setsid)
    die-in-load       2 s into the weight load a scheduler error kills the main process (SIGKILL,
                      as SGLang does), and the schedulers live on: nothing stops them
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

STATE = {"ready_at": 0.0}


def log(message: str, rank: str = " TP0") -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    print(f"[{stamp}{rank}] {message}", flush=True)


def main_log(message: str) -> None:
    log(message, rank="")


def crash(lines: list[str]) -> None:
    log("Scheduler hit an exception: Traceback (most recent call last):")
    for line in lines:
        print(line, flush=True)
    main_log("SIGQUIT received. signum=None, frame=None. It usually means one child failed.")
    os.kill(os.getpid(), signal.SIGKILL)


def make_handler(modes: set[str]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            return

        def _send(self, status: int, body: bytes = b"") -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            ready = STATE["ready_at"] > 0
            if self.path in ("/health", "/health_generate"):
                late = "health-late" in modes and time.monotonic() - STATE["ready_at"] < 0.5
                ok = ready and "health-fail" not in modes and not late
                self._send(200 if ok else 503)
            elif self.path == "/server_info":
                info = {
                    "max_total_num_tokens": 159277,
                    "chunked_prefill_size": 8192,
                    "internal_states": [
                        {
                            "memory_usage": {"weight": 72.33, "kvcache": 10.42, "graph": 3.75},
                            "effective_max_running_requests_per_dp": 48,
                        }
                    ],
                }
                self._send(200, json.dumps(info).encode())
            else:
                self._send(404)

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = self.rfile.read(length)
            if self.path == "/generate" and "generate" in modes and STATE["ready_at"] > 0:
                # the answer's shape has one definition: the load-testing fake server's
                from autotune.testing.fakeserver import Request, whole_response

                log("Prefill batch, #new-seq: 1, #new-token: 1, #cached-token: 0, token usage: "
                    "0.00, #running-req: 0, #queue-req: 0, input throughput (token/s): 1.00, "
                    "cuda graph: False")  # fmt: skip
                self._send(200, whole_response(Request.parse(self.path, body, "fake"), 1))
            else:
                self._send(404)

    return Handler


def start_child(escape: bool) -> None:
    code = f"import os,time\nif {escape!r}: os.setsid()\ntime.sleep(600)"
    child = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 10
    while escape and time.monotonic() < deadline:  # be ready only once it has left the group
        stat = Path(f"/proc/{child.pid}/stat").read_text()
        if int(stat[stat.rfind(")") + 2 :].split()[3]) == child.pid:
            break
        time.sleep(0.01)


SCHEDULER = """
import os, sys, time
from pathlib import Path
layout, gpu, index, hold = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
if layout == "pgrp":
    os.setpgid(0, 0)
elif layout == "session":
    os.setsid()
writer = None
if gpu:
    from autotune.sim.gpustate import GpuStateWriter
    seconds = float(hold) if hold else None
    writer = GpuStateWriter(Path(gpu), os.getpid(), {index: 80 << 30}, seconds)
    writer.set_all(1 << 30)
stamp = time.strftime("%Y-%m-%d %H:%M:%S")
print(f"[{stamp} TP{index - 1}] scheduler pid {os.getpid()}", flush=True)
while True:
    time.sleep(0.2)
    if writer is not None:
        writer.heartbeat()
"""


def start_schedulers(count: int, layout: str, gpu: str | None, hold: str) -> None:
    """Start `count` schedulers; return once each has moved where `layout` says and registered
    its GPU memory."""
    children = [
        subprocess.Popen([sys.executable, "-c", SCHEDULER, layout, gpu or "", str(i + 1), hold])
        for i in range(count)
    ]
    deadline = time.monotonic() + 20
    for child in children:
        while time.monotonic() < deadline:
            stat = Path(f"/proc/{child.pid}/stat").read_text()
            fields = stat[stat.rfind(")") + 2 :].split()
            moved = {"group": True, "pgrp": int(fields[2]) == child.pid}.get(
                layout, int(fields[3]) == child.pid
            )
            if moved and (not gpu or (Path(gpu) / f"proc-{child.pid}.json").exists()):
                break
            time.sleep(0.01)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--mode", action="append", default=[])
    args = parser.parse_args()
    modes = set(args.mode)
    gpu = next((m.split("=", 1)[1] for m in modes if m.startswith("gpu=")), None)
    if "ignore-sigterm" in modes:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if gpu:
        from autotune.sim.gpustate import write_holder

        write_holder(Path(gpu), os.getpid(), {0: 1 << 30}, {0: 80 << 30})
    if "child" in modes:
        start_child(escape=False)
    if "escaped-child" in modes:
        start_child(escape=True)
    count = next((int(m.split("=", 1)[1]) for m in modes if m.startswith("schedulers=")), 0)
    if count:
        hold = next((m.split("=", 1)[1] for m in modes if m.startswith("sched-hold=")), "")
        layout = "session" if "sched-setsid" in modes else "pgrp" if "sched-pgrp" in modes else ""
        start_schedulers(count, layout or "group", gpu, hold)

    main_log("server_args=ServerArgs(model_path='fake', tp_size=1)")
    log("Init torch distributed begin.")
    log("Init torch distributed ends. elapsed=0.01 s, mem usage=1.55 GB")
    log("Load weight begin. avail mem=94.04 GB")
    if "die-in-load" in modes:
        time.sleep(2.0)
        crash(["RuntimeError: CUDA error: an illegal memory access was encountered"])
    if "hang-load" in modes:
        time.sleep(3600)
    if "crawl-load" in modes:
        for i in range(36000):
            print(f"Loading safetensors checkpoint shards: {i % 100}% Completed", flush=True)
            time.sleep(0.1)
    log(
        "Load weight end. elapsed=0.01 s, type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, "
        "avail mem=21.71 GB, mem usage=72.33 GB."
    )
    if "no-kv-room" in modes:
        crash(
            [
                "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
                "Current value: self.server_args.mem_fraction_static=0.5",
            ]
        )
    log("KV Cache is allocated. #tokens: 159277, KV size: 10.42 GB")
    log("Memory pool end. avail mem=11.24 GB")
    log("Capture cuda graph begin. This can take up to several minutes. avail mem=11.24 GB")
    log("Capture cuda graph end. Time elapsed: 0.01 s. mem usage=3.75 GB. avail mem=7.49 GB.")
    log(
        "max_total_num_tokens=159277, chunked_prefill_size=8192, max_prefill_tokens=16384, "
        "max_running_requests=48, context_len=262144, available_gpu_mem=7.49 GB"
    )
    httpd = ThreadingHTTPServer((args.host, args.port), make_handler(modes))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    main_log(f"INFO:     Started server process [{os.getpid()}]")
    main_log(f"INFO:     Uvicorn running on http://{args.host}:{args.port} (Press CTRL+C to quit)")
    STATE["ready_at"] = time.monotonic()
    main_log("The server is fired up and ready to roll!")
    if "runtime-oom" in modes:
        time.sleep(0.3)
        crash(["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0"])
    if "exit-after-ready" in modes:
        time.sleep(0.3)
        os._exit(0)
    while True:
        if "batches" in modes:
            log(
                "Decode batch, #running-req: 4, #token: 900, token usage: 0.01, cuda graph: True, "
                "gen throughput (token/s): 100.00, #queue-req: 0"
            )
        time.sleep(0.1)


if __name__ == "__main__":
    main()
