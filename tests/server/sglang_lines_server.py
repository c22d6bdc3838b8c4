"""A stand-in for a serving SGLang that prints given log lines once it is ready.

Run as `python sglang_lines_server.py --host H --port P --lines FILE [--die]`. It prints SGLang
0.5.9's startup lines and its ready line, answers `/generate`, `/health`, `/health_generate`
and `/server_info` with 200, then prints FILE's lines as written (`{now}` replaced by the time
stamp) one every 50 ms, and a Decode batch line every 100 ms after them. With `--die` it
SIGKILLs itself after the last line, as SGLang's SIGQUIT handler does after a scheduler failure.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def stamp() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


def say(line: str) -> None:
    print(line.replace("{now}", stamp()), flush=True)


class Handler(BaseHTTPRequestHandler):
    def _answer(self) -> None:
        body = json.dumps({"text": "x", "meta_info": {"completion_tokens": 1}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self._answer()

    def log_message(self, format: str, *args: object) -> None:
        return


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--lines", type=Path, required=True)
    parser.add_argument("--die", action="store_true")
    args, _ = parser.parse_known_args()
    say("[{now}] server_args=ServerArgs(model_path='/models/stand-in', tp_size=2)")
    for rank in ("TP0", "TP1"):
        say(f"[{{now}} {rank}] Load weight begin. avail mem=94.04 GB")
    for rank in ("TP0", "TP1"):
        say(
            f"[{{now}} {rank}] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, "
            "avail mem=78.00 GB, mem usage=16.04 GB."
        )
        say(f"[{{now}} {rank}] KV Cache is allocated. #tokens: 400000, KV size: 60.00 GB")
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://{args.host}:{args.port}"
    say(f"[{{now}}] INFO:     Uvicorn running on {url} (Press CTRL+C to quit)")
    say("[{now}] The server is fired up and ready to roll!")
    for line in args.lines.read_text().splitlines():
        time.sleep(0.05)
        say(line)
    if args.die:
        os.kill(os.getpid(), signal.SIGKILL)
    while True:
        time.sleep(0.1)
        say(
            "[{now} TP0] Decode batch, #running-req: 48, #token: 399000, token usage: 1.00, "
            "cuda graph: True, gen throughput (token/s): 1500.00, #queue-req: 12"
        )


if __name__ == "__main__":
    main()
