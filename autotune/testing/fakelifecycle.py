"""The fake server's life under `--log` (`python -m autotune.testing.fakeserver --log`): SGLang
0.5.9's startup lines, the processes a launch starts (children, schedulers in their groups or
sessions, simulated GPU memory) and the endings of a server's life that the lifecycle must
recognise. It owns what happens around the HTTP front, which `fakeserver` owns (the answers, the
connections, the options and the entry point). Kept apart because it is another stand-in: the
lifecycle's and the reliability tests stage a launch's life with it, while the load generator's
and the clients' tests and benchmarks use the HTTP front alone.

With `--log` it is a server for the lifecycle: it prints SGLang 0.5.9's startup lines, binds
`--host`/`--port` once the KV pool is sized, prints the ready line, and SIGTERM ends it (exit
0). `/generate` then answers only with mode `generate` (logging a Prefill batch line for each
answer), `/health` and `/health_generate` answer 200 once ready, and `--lines FILE` prints
FILE's lines after the ready line, one every 50 ms (`{now}` replaced by the time stamp). Each
`--mode M` changes one behaviour, so tests can stage every ending the lifecycle must
recognise without the simulator:

    no-kv-room        startup fails with "Not enough memory" (then SIGKILLs itself, as SGLang)
    hang-load         stops printing during weight load and never finishes
    crawl-load        keeps printing progress during weight load and never finishes
    runtime-oom       becomes ready, then logs a torch OOM and SIGKILLs itself
    exit-after-ready  becomes ready, then exits 1 silently (an OOM-killed scheduler)
    health-fail       /health and /health_generate answer 503 once ready
    health-late       /health_generate answers 503 for half a second after ready
    generate          serves generation requests once ready
    fail-after=N      answers the first N generation requests; every later one gets HTTP 500
                      (`Exception in ASGI application` in the log)
    cut-after=N       answers the first N generation requests; every later one gets its 200
                      header, then the connection closes before the first token
    stall-stream=N    every streamed answer stops after N tokens and never ends (the server
                      lives; with `batches` its log keeps moving)
    exit-after=N      once N generation requests have started, the next one makes the process
                      exit 0 by itself (no line, no signal)
    stuck-after=N     answers the first N generation requests; every later one is accepted and
                      never answered, while the health routes keep answering (a wedged
                      scheduler behind a live HTTP front)
    batches           logs a Decode batch line every 0.1 s once ready (after `--lines`)
    die-after-lines   SIGKILLs itself after the last line of `--lines`, as SGLang's SIGQUIT
                      handler does after a scheduler failure
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

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from autotune.testing.fakeserver import FakeServer, Options, log, main_log, serve_in_thread


def crash(lines: list[str], *, after_s: float = 0.0) -> None:
    """A scheduler's traceback, the SIGQUIT line, then SIGKILL, as SGLang dies (`after_s`
    seconds from now)."""
    if after_s:
        time.sleep(after_s)
    log("Scheduler hit an exception: Traceback (most recent call last):")
    for line in lines:
        print(line, flush=True)
    main_log("SIGQUIT received. signum=None, frame=None. It usually means one child failed.")
    os.kill(os.getpid(), signal.SIGKILL)


def _group_of(pid: int) -> tuple[int, int]:
    """(process group, session) of `pid`, from /proc."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[2]), int(fields[3])


def start_child(escape: bool) -> None:
    """A child in the group, or (`escape`) one that left it with setsid(); returns once it
    has."""
    code = f"import os,time\nif {escape!r}: os.setsid()\ntime.sleep(600)"
    child = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 10
    while escape and time.monotonic() < deadline:
        if _group_of(child.pid)[1] == child.pid:
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
            pgid, sid = _group_of(child.pid)
            moved = {"group": True, "pgrp": pgid == child.pid}.get(layout, sid == child.pid)
            if moved and (not gpu or (Path(gpu) / f"proc-{child.pid}.json").exists()):
                break
            time.sleep(0.01)


def _startup(opt: Options) -> None:
    """The processes and the log lines before the HTTP server binds, as the modes say."""
    modes = opt.modes
    gpu = opt.mode_value("gpu")
    if gpu:
        from autotune.sim.gpustate import write_holder

        write_holder(Path(gpu), os.getpid(), {0: 1 << 30}, {0: 80 << 30})
    if "child" in modes:
        start_child(escape=False)
    if "escaped-child" in modes:
        start_child(escape=True)
    count = int(opt.mode_value("schedulers") or 0)
    if count:
        hold = opt.mode_value("sched-hold") or ""
        layout = "session" if "sched-setsid" in modes else "pgrp" if "sched-pgrp" in modes else ""
        start_schedulers(count, layout or "group", gpu, hold)

    main_log("server_args=ServerArgs(model_path='fake', tp_size=1)")
    log("Init torch distributed begin.")
    log("Init torch distributed ends. elapsed=0.01 s, mem usage=1.55 GB")
    log("Load weight begin. avail mem=94.04 GB")
    if "die-in-load" in modes:
        crash(["RuntimeError: CUDA error: an illegal memory access was encountered"], after_s=2.0)
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


def run_with_log(opt: Options, host: str, port: int, lines: Path | None) -> None:
    """`--log`: the startup, the HTTP server from a thread, the ready line, then the modes'
    ending or the serving log until SIGTERM."""
    modes = opt.modes
    if "ignore-sigterm" in modes:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    _startup(opt)
    server = FakeServer(opt)
    serve_in_thread(server, host, port)
    main_log(f"INFO:     Started server process [{os.getpid()}]")
    main_log(f"INFO:     Uvicorn running on http://{host}:{port} (Press CTRL+C to quit)")
    server.ready_at = time.monotonic()
    main_log("The server is fired up and ready to roll!")
    if "runtime-oom" in modes:
        oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0"
        crash([oom], after_s=0.3)
    if "exit-after-ready" in modes:
        time.sleep(0.3)
        os._exit(1)
    if lines is not None:
        for line in lines.read_text().splitlines():
            time.sleep(0.05)
            print(line.replace("{now}", time.strftime("%Y-%m-%d %H:%M:%S")), flush=True)
        if "die-after-lines" in modes:
            os.kill(os.getpid(), signal.SIGKILL)
    while True:
        if "batches" in modes:
            log(
                "Decode batch, #running-req: 4, #token: 900, token usage: 0.01, cuda graph: True, "
                "gen throughput (token/s): 100.00, #queue-req: 0"
            )
        time.sleep(0.1)
