"""SGLang 0.5.9 log lines: prefixes, startup sequence strings, serving lines, crash text.

The `fmt_*` functions are pure and return one line (or a block) without the prefix; `LogWriter`
adds `[YYYY-MM-DD HH:MM:SS]` or `[YYYY-MM-DD HH:MM:SS TPn]` (no TP tag when tp == 1) and writes
each line with one call, flushed, so a reader tailing the file never sees half a line. Format
strings are copied from reference §4 (0.5.9): GPU sizes are GiB printed with `:.2f` as "GB".
All of the simulator's log text lives here so the tuner's log parser meets SGLang's exact lines.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import sys
import threading
from collections.abc import Callable, Sequence
from typing import TextIO


def _now() -> dt.datetime:
    return dt.datetime.now()


class LogWriter:
    """Writes SGLang-formatted lines to one stream (scheduler/main logs) and access logs."""

    def __init__(
        self,
        tp: int,
        stream: TextIO | None = None,
        access_stream: TextIO | None = None,
        clock: Callable[[], dt.datetime] = _now,
    ) -> None:
        self.tp = tp
        self.stream = stream if stream is not None else sys.stderr
        self.access_stream = access_stream if access_stream is not None else sys.stdout
        self.clock = clock
        self._lock = threading.Lock()

    def _stamp(self) -> str:
        return self.clock().strftime("%Y-%m-%d %H:%M:%S")

    def _emit(self, stream: TextIO, text: str) -> None:
        # SGLang logs through Python's logging, which drops a line it cannot write (a full
        # disk) and carries on serving; so does the simulator.
        with self._lock, contextlib.suppress(OSError):
            stream.write(text if text.endswith("\n") else text + "\n")
            stream.flush()

    def main(self, message: str) -> None:
        """A main-process (tokenizer/HTTP) line: no rank tag."""
        self._emit(self.stream, f"[{self._stamp()}] {message}")

    def rank(self, rank: int, message: str) -> None:
        tag = f" TP{rank}" if self.tp > 1 else ""
        self._emit(self.stream, f"[{self._stamp()}{tag}] {message}")

    def every_rank(self, message: str | Callable[[int], str]) -> None:
        for r in range(self.tp):
            self.rank(r, message(r) if callable(message) else message)

    def uvicorn(self, message: str, level: str = "INFO") -> None:
        prefix = f"{level}:" + " " * (8 - len(level))
        self._emit(self.stream, f"[{self._stamp()}] {prefix} {message}")

    def access(self, client: str, method: str, path: str, status: int) -> None:
        line = f'[{self._stamp()}] INFO:     {client} - "{method} {path} HTTP/1.1" {status}'
        self._emit(self.access_stream, line)

    def raw(self, text: str) -> None:
        """Unprefixed text (traceback bodies, tqdm bars)."""
        self._emit(self.stream, text)


def gb(x: float) -> str:
    return f"{x:.2f}"


def fmt_init_begin() -> str:
    return "Init torch distributed begin."


def fmt_init_end(elapsed: float, mem_usage: float) -> str:
    return f"Init torch distributed ends. elapsed={elapsed:.2f} s, mem usage={gb(mem_usage)} GB"


def fmt_load_begin(avail: float) -> str:
    return f"Load weight begin. avail mem={gb(avail)} GB"


def fmt_load_end(elapsed: float, arch: str, dtype: str, avail: float, usage: float) -> str:
    return (
        f"Load weight end. elapsed={elapsed:.2f} s, type={arch}, dtype={dtype}, "
        f"avail mem={gb(avail)} GB, mem usage={gb(usage)} GB."
    )


def fmt_kv_allocated(tokens: int, kv: float | None, k: float | None, v: float | None) -> str:
    if k is not None and v is not None:
        return f"KV Cache is allocated. #tokens: {tokens}, K size: {gb(k)} GB, V size: {gb(v)} GB"
    return f"KV Cache is allocated. #tokens: {tokens}, KV size: {gb(kv or 0.0)} GB"


def fmt_pool_end(avail: float) -> str:
    return f"Memory pool end. avail mem={gb(avail)} GB"


def fmt_capture_begin(avail: float) -> str:
    return (
        f"Capture cuda graph begin. This can take up to several minutes. avail mem={gb(avail)} GB"
    )


def fmt_capture_bs(sizes: Sequence[int]) -> str:
    return f"Capture cuda graph bs {list(sizes)}"


def fmt_capture_bar(sizes: Sequence[int], avail: float, elapsed: float) -> str:
    n = len(sizes)
    bar = "█" * 10
    secs = int(elapsed)
    rate = n / elapsed if elapsed > 0 else 0.0
    return (
        f"Capturing batches (bs={min(sizes)} avail_mem={gb(avail)} GB): 100%|{bar}| {n}/{n} "
        f"[{secs // 60:02d}:{secs % 60:02d}<00:00, {rate:.2f}it/s]"
    )


def fmt_capture_end(elapsed: float, usage: float, avail: float) -> str:
    return (
        f"Capture cuda graph end. Time elapsed: {elapsed:.2f} s. mem usage={gb(usage)} GB. "
        f"avail mem={gb(avail)} GB."
    )


def fmt_summary(
    tokens: int, chunk: int, max_prefill: int, max_running: int, ctx: int, avail: float
) -> str:
    return (
        f"max_total_num_tokens={tokens}, chunked_prefill_size={chunk}, "
        f"max_prefill_tokens={max_prefill}, max_running_requests={max_running}, "
        f"context_len={ctx}, available_gpu_mem={gb(avail)} GB"
    )


def fmt_hicache(gb_requested: float) -> str:
    return f"Allocating {gb_requested:.2f} GB host memory for hierarchical KV cache."


def fmt_prefill(
    new_seq: int,
    new_token: int,
    cached: int,
    usage: float,
    running: int,
    queued: int,
    input_tput: float,
    cuda_graph: bool = False,
) -> str:
    return (
        f"Prefill batch, #new-seq: {new_seq}, #new-token: {new_token}, #cached-token: {cached}, "
        f"token usage: {usage:.2f}, #running-req: {running}, #queue-req: {queued}, "
        f"input throughput (token/s): {input_tput:.2f}, cuda graph: {cuda_graph}"
    )


def fmt_decode(
    running: int,
    tokens: int,
    usage: float,
    cuda_graph: bool,
    gen_tput: float,
    queued: int,
    accept: tuple[float, float] | None = None,
) -> str:
    spec = f"accept len: {accept[0]:.2f}, accept rate: {accept[1]:.2f}, " if accept else ""
    return (
        f"Decode batch, #running-req: {running}, #token: {tokens}, token usage: {usage:.2f}, "
        f"{spec}cuda graph: {cuda_graph}, gen throughput (token/s): {gen_tput:.2f}, "
        f"#queue-req: {queued}"
    )


def fmt_retract(n: int, gained: int, old: float, new: float) -> str:
    return (
        f"KV cache pool is full. Retract requests. #retracted_reqs: {n}, "
        f"#new_tokens_gained: {gained}, #new_token_ratio: {old:.4f} -> {new:.4f}"
    )


def fmt_oom_error(tried: float, total: float, free: float, in_use: float, graphs: float) -> str:
    allocated = max(in_use - graphs - 1.2, 0.0)
    return (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {tried:.2f} GiB. "
        f"GPU 0 has a total capacity of {total:.2f} GiB of which {free:.2f} GiB is free. "
        f"Including non-PyTorch memory, this process has {in_use:.2f} GiB memory in use. "
        f"Of the allocated memory {allocated:.2f} GiB is allocated by PyTorch, with "
        f"{graphs:.2f} GiB allocated in private pools (e.g., CUDA Graphs), and 1.20 GiB is "
        "reserved by PyTorch but unallocated. If reserved but unallocated memory is large try "
        "setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
        "documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )


CAPTURE_ADVICE = (
    "Possible solutions:\n"
    "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
    "2. set --cuda-graph-max-bs to a smaller value (e.g., 16)\n"
    "3. disable torch compile by not using --enable-torch-compile\n"
    "4. disable CUDA graph by --disable-cuda-graph. (Not recommended. Huge performance loss)\n"
    "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose \n"
)


def traceback_block(frames: Sequence[tuple[str, int, str, str]], final: str) -> str:
    """A Python traceback: frames are (file, line, function, source)."""
    lines = ["Traceback (most recent call last):"]
    for file, line, func, src in frames:
        lines.append(f'  File "{file}", line {line}, in {func}')
        lines.append(f"    {src}")
    lines.append(final)
    return "\n".join(lines)


_SITE = "/usr/local/lib/python3.12/dist-packages/sglang/srt"

SCHEDULER_INIT_FRAMES = (
    (f"{_SITE}/managers/scheduler.py", 3178, "run_scheduler_process", "scheduler = Scheduler("),
    (f"{_SITE}/managers/scheduler.py", 363, "__init__", "self.init_model_worker()"),
    (f"{_SITE}/managers/tp_worker.py", 247, "__init__", "self.model_runner = ModelRunner("),
    (
        f"{_SITE}/model_executor/model_runner.py",
        370,
        "__init__",
        "self.initialize(min_per_gpu_memory)",
    ),
)
LOAD_FRAMES = (
    (f"{_SITE}/model_executor/model_runner.py", 465, "initialize", "self.load_model()"),
    (
        f"{_SITE}/model_executor/model_runner.py",
        1012,
        "load_model",
        "self.model = self.loader.load_model(",
    ),
)
POOL_FRAMES = (
    (
        f"{_SITE}/model_executor/model_runner.py",
        590,
        "initialize",
        "self.init_memory_pool(min_per_gpu_memory)",
    ),
    (
        f"{_SITE}/model_executor/model_runner_kv_cache_mixin.py",
        415,
        "init_memory_pool",
        "raise RuntimeError(",
    ),
)
GRAPH_FRAMES = (
    (
        f"{_SITE}/model_executor/model_runner.py",
        2150,
        "init_device_graphs",
        "self.graph_runner = CudaGraphRunner(self)",
    ),
    (f"{_SITE}/model_executor/cuda_graph_runner.py", 371, "__init__", "raise Exception("),
)
HICACHE_FRAMES = (
    (
        f"{_SITE}/managers/scheduler.py",
        702,
        "init_cache_with_memory_pool",
        "self.tree_cache = HiRadixCache(",
    ),
    (f"{_SITE}/mem_cache/memory_pool_host.py", 160, "__init__", "raise ValueError("),
)
RUN_FRAMES = (
    (
        f"{_SITE}/managers/scheduler.py",
        3188,
        "run_scheduler_process",
        "scheduler.event_loop_normal()",
    ),
    (f"{_SITE}/managers/scheduler.py", 1004, "event_loop_normal", "result = self.run_batch(batch)"),
    (
        f"{_SITE}/managers/scheduler.py",
        2340,
        "run_batch",
        "batch_result = self.model_worker.forward_batch_generation(",
    ),
    (f"{_SITE}/model_executor/model_runner.py", 2402, "forward", "output = self._forward_raw("),
    (f"{_SITE}/models/deepseek_v2.py", 2890, "forward", "hidden_states = self.model("),
)
