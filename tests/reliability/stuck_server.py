"""A stand-in SGLang server whose HTTP front stays up while generation gets stuck.

Run as `python stuck_server.py --answers N --host H --port P`. It prints the startup lines of an
SGLang 0.5.9 log, serves a one-token (non-streamed) `POST /generate` and logs a Prefill batch line
for each of the first N generations, then every later `/generate` is accepted and never
answered, and the log goes silent, while `/health`, `/health_generate` and `/server_info` keep
answering 200: a scheduler wedged behind a tokenizer manager that is alive.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ANSWERED = [0]
LOCK = threading.Lock()


def log(message: str, rank: str = " TP0") -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    print(f"[{stamp}{rank}] {message}", flush=True)


def handler(answers: int) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            return

        def _send(self, status: int, body: bytes = b"") -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path in ("/health", "/health_generate"):
                self._send(200)
            elif self.path == "/server_info":
                info = {"max_total_num_tokens": 159277, "version": "0.5.9"}
                self._send(200, json.dumps(info).encode())
            else:
                self._send(404)

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.path != "/generate":
                self._send(404)
                return
            with LOCK:
                ANSWERED[0] += 1
                stuck = ANSWERED[0] > answers
            if stuck:
                time.sleep(3600)  # accepted, never answered
                return
            log(
                "Prefill batch, #new-seq: 1, #new-token: 8, #cached-token: 0, token usage: 0.00, "
                "#running-req: 0, #queue-req: 0, input throughput (token/s): 100.00, "
                "cuda graph: False"
            )
            body = {"text": "x", "meta_info": {"prompt_tokens": 8, "completion_tokens": 1}}
            self._send(200, json.dumps(body).encode())

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--answers", type=int, default=5)
    args, _ = parser.parse_known_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    log("server_args=ServerArgs(model_path='stuck', tp_size=1)", rank="")
    log("Load weight begin. avail mem=94.04 GB")
    log("Load weight end. type=DeepseekV3ForCausalLM, avail mem=21.71 GB, mem usage=72.33 GB.")
    log("KV Cache is allocated. #tokens: 159277, KV size: 10.42 GB")
    log(
        "max_total_num_tokens=159277, chunked_prefill_size=8192, max_prefill_tokens=16384, "
        "max_running_requests=48, context_len=262144, available_gpu_mem=7.49 GB"
    )
    httpd = ThreadingHTTPServer((args.host, args.port), handler(args.answers))
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    log(f"INFO:     Started server process [{os.getpid()}]", rank="")
    log("The server is fired up and ready to roll!", rank="")
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
