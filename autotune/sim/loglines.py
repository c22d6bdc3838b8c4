"""SGLang's log lines per release: startup sequence strings, serving lines, crash text.

The `fmt_*` functions are pure and return one line (or a block) without the prefix: they are
SGLang 0.5.9's text. `Lines` gathers them as methods and `Lines0523` overrides what 0.5.23
prints differently (format strings copied from that release's source, path in each docstring);
`lines_for(version)` picks the class, so a later release is one more subclass. GPU sizes are
GiB printed with `:.2f` as "GB". All of the simulator's log text lives here (the traceback
frames in `tracebacks`) so the tuner's log parser meets SGLang's exact lines; `logwriter`
prefixes and writes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autotune.sim.tracebacks import (
    BUDGET_FRAMES_0523,
    GRAPH_FRAMES,
    GRAPH_FRAMES_0523,
    HICACHE_FRAMES,
    HICACHE_FRAMES_0523,
    LOAD_FRAMES,
    LOAD_FRAMES_0523,
    POOL_FRAMES,
    POOL_FRAMES_0523,
    RUN_FRAMES,
    RUN_FRAMES_0523,
    SCHEDULER_INIT_FRAMES,
    SCHEDULER_INIT_FRAMES_0523,
    TOKENS_FRAMES_0523,
    WARMUP_FRAMES,
    Frames,
    traceback_block,
)


def gb(x: float) -> str:
    """A GiB figure as SGLang prints it, two decimals (labelled "GB" in its lines)."""
    return f"{x:.2f}"


def fmt_init_begin() -> str:
    """0.5.9's `Init torch distributed begin.`: distributed init starts (each rank)."""
    return "Init torch distributed begin."


def fmt_init_end(elapsed: float, mem_usage: float) -> str:
    """0.5.9's `Init torch distributed ends.` with its time and what the CUDA context and NCCL
    took."""
    return f"Init torch distributed ends. elapsed={elapsed:.2f} s, mem usage={gb(mem_usage)} GB"


def fmt_load_begin(avail: float) -> str:
    """`Load weight begin. avail mem=`: the free memory before the weights, P, which the pool is
    sized from."""
    return f"Load weight begin. avail mem={gb(avail)} GB"


def fmt_load_end(elapsed: float, arch: str, dtype: str, avail: float, usage: float) -> str:
    """0.5.9's `Load weight end.` with the model class, dtype, free memory after the weights (A) and
    what they took."""
    return (
        f"Load weight end. elapsed={elapsed:.2f} s, type={arch}, dtype={dtype}, "
        f"avail mem={gb(avail)} GB, mem usage={gb(usage)} GB."
    )


@dataclass(frozen=True)
class KvAllocation:
    """What a KV pool's allocation line reports: its tokens and GiB (K and V apart for an MHA
    pool, else one KV figure), its dtype, and whether it is a virtual-address upper bound (the
    last two printed by 0.5.23 only)."""

    tokens: int
    kv: float | None
    k: float | None = None
    v: float | None = None
    dtype: str = ""
    va: bool = False


def fmt_kv_allocated(pool: KvAllocation) -> str:
    """0.5.9's `KV Cache is allocated.` with the pool's tokens and GiB, K and V apart for an MHA
    pool."""
    if pool.k is not None and pool.v is not None:
        return (
            f"KV Cache is allocated. #tokens: {pool.tokens}, K size: {gb(pool.k)} GB, "
            f"V size: {gb(pool.v)} GB"
        )
    return f"KV Cache is allocated. #tokens: {pool.tokens}, KV size: {gb(pool.kv or 0.0)} GB"


def fmt_pool_end(avail: float) -> str:
    """`Memory pool end. avail mem=`: the free memory once the KV pool and request table are
    allocated."""
    return f"Memory pool end. avail mem={gb(avail)} GB"


def fmt_capture_begin(avail: float) -> str:
    """0.5.9's `Capture cuda graph begin.` with the free memory before the graphs."""
    return (
        f"Capture cuda graph begin. This can take up to several minutes. avail mem={gb(avail)} GB"
    )


def fmt_capture_bs(sizes: Sequence[int]) -> str:
    """0.5.9's `Capture cuda graph bs [...]`: the batch sizes it will capture."""
    return f"Capture cuda graph bs {list(sizes)}"


def _bar(desc: str, n: int, elapsed: float) -> str:
    """tqdm's last state for a capture loop of `n` items that took `elapsed` seconds."""
    secs = int(elapsed)
    rate = n / elapsed if elapsed > 0 else 0.0
    return (
        f"{desc}: 100%|{'█' * 10}| {n}/{n} [{secs // 60:02d}:{secs % 60:02d}<00:00, {rate:.2f}it/s]"
    )


def fmt_capture_bar(sizes: Sequence[int], avail: float, elapsed: float) -> str:
    """tqdm's last state of the capture loop over `sizes` (`Capturing batches (bs=…
    avail_mem=…)`)."""
    return _bar(
        f"Capturing batches (bs={min(sizes)} avail_mem={gb(avail)} GB)", len(sizes), elapsed
    )


def fmt_capture_end(elapsed: float, usage: float, avail: float) -> str:
    """0.5.9's `Capture cuda graph end.` with its time, what the graphs took and the free memory
    left."""
    return (
        f"Capture cuda graph end. Time elapsed: {elapsed:.2f} s. mem usage={gb(usage)} GB. "
        f"avail mem={gb(avail)} GB."
    )


def fmt_summary(
    tokens: int, chunk: int, max_prefill: int, max_running: int, ctx: int, avail: float
) -> str:
    """The scheduler's summary line (`max_total_num_tokens=…, … available_gpu_mem=`): the pool and
    the limits the server runs with."""
    return (
        f"max_total_num_tokens={tokens}, chunked_prefill_size={chunk}, "
        f"max_prefill_tokens={max_prefill}, max_running_requests={max_running}, "
        f"context_len={ctx}, available_gpu_mem={gb(avail)} GB"
    )


def fmt_hicache(gb_requested: float) -> str:
    """0.5.9's `Allocating … GB host memory for hierarchical KV cache.`"""
    return f"Allocating {gb_requested:.2f} GB host memory for hierarchical KV cache."


@dataclass(frozen=True)
class PrefillBatch:
    """What one `Prefill batch` line reports: new sequences and tokens, cached tokens, token
    usage, running and queued requests, input throughput, whether a CUDA graph ran it and the
    tokens still pending (the last two printed by 0.5.23 only)."""

    new_seq: int
    new_token: int
    cached: int
    usage: float
    running: int
    queued: int
    input_tput: float
    cuda_graph: bool = False
    pending: int = 0


@dataclass(frozen=True)
class DecodeBatch:
    """What one `Decode batch` line reports: running requests, their tokens, token usage, CUDA
    graph on or off, throughput, queued requests, and the accept length and rate with
    speculative decoding."""

    running: int
    tokens: int
    usage: float
    cuda_graph: bool
    gen_tput: float
    queued: int
    accept: tuple[float, float] | None = None


def fmt_prefill(b: PrefillBatch) -> str:
    """0.5.9's `Prefill batch` line: no pending tokens, and `cuda graph: False` whatever ran the
    batch (that release captures no prefill graphs)."""
    return (
        f"Prefill batch, #new-seq: {b.new_seq}, #new-token: {b.new_token}, "
        f"#cached-token: {b.cached}, token usage: {b.usage:.2f}, #running-req: {b.running}, "
        f"#queue-req: {b.queued}, input throughput (token/s): {b.input_tput:.2f}, "
        "cuda graph: False"
    )


def fmt_decode(b: DecodeBatch) -> str:
    """0.5.9's `Decode batch` line (0.5.23 prints the same)."""
    spec = f"accept len: {b.accept[0]:.2f}, accept rate: {b.accept[1]:.2f}, " if b.accept else ""
    return (
        f"Decode batch, #running-req: {b.running}, #token: {b.tokens}, token usage: "
        f"{b.usage:.2f}, {spec}cuda graph: {b.cuda_graph}, gen throughput (token/s): "
        f"{b.gen_tput:.2f}, #queue-req: {b.queued}"
    )


def fmt_retract(n: int, gained: int, old: float, new: float) -> str:
    """The scheduler's `KV cache pool is full. Retract requests.` line (`scheduler.py`): how many
    went back to the queue, the tokens gained and the new-token ratio's change."""
    return (
        f"KV cache pool is full. Retract requests. #retracted_reqs: {n}, "
        f"#new_tokens_gained: {gained}, #new_token_ratio: {old:.4f} -> {new:.4f}"
    )


def fmt_oom_error(tried: float, total: float, free: float, in_use: float, graphs: float) -> str:
    """torch's `CUDA out of memory` message as the caching allocator words it, with the GPU's
    capacity, free memory, the process's use and the graphs' private pools."""
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

CAPTURE_ADVICE_0523 = (
    "Possible solutions:\n"
    "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
    "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)\n"
    "3. disable decode CUDA graph by --cuda-graph-backend-decode=disabled. "
    "(Not recommended. Huge performance loss)\n"
    "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose \n"
)


@dataclass(frozen=True)
class CaptureShape:
    """What one capture covers: batch sizes, prefill token counts, tokens per request."""

    bs: tuple[int, ...] = ()
    tokens: tuple[int, ...] = ()
    per_req: int = 1


class Lines:
    """SGLang 0.5.9's startup, serving and death text (the module's `fmt_*` functions)."""

    version = "0.5.9"
    init_frames: Frames = SCHEDULER_INIT_FRAMES
    load_frames: Frames = LOAD_FRAMES
    pool_frames: Frames = POOL_FRAMES
    budget_frames: Frames = ()
    tokens_frames: Frames = ()
    graph_frames: Frames = GRAPH_FRAMES
    hicache_frames: Frames = (*SCHEDULER_INIT_FRAMES[:2], *HICACHE_FRAMES)
    run_frames: Frames = RUN_FRAMES
    capture_advice = CAPTURE_ADVICE

    def init_begin(self) -> str:
        """Distributed init begins (0.5.9: `Init torch distributed begin.`)."""
        return fmt_init_begin()

    def init_end(self, elapsed: float, mem_usage: float) -> str:
        """Distributed init ends, with its time and memory use (0.5.9's text)."""
        return fmt_init_end(elapsed, mem_usage)

    def memory_baseline(self, mem_usage: float) -> str | None:
        """0.5.23's `Memory baseline taken` (0.5.9 has none)."""
        return None

    def load_begin(self, avail: float) -> str:
        """The weight load begins, with P (the free memory before it)."""
        return fmt_load_begin(avail)

    def load_end(
        self, elapsed: float, arch: str, dtype: str, quant: str, avail: float, usage: float
    ) -> str:
        """The weight load ends, with A and what the weights took (0.5.9 prints no quantization)."""
        return fmt_load_end(elapsed, arch, dtype, avail, usage)

    def kv_dtype(self, dtype: str) -> str | None:
        """0.5.9's `Using KV cache dtype:` line; None where a release prints none."""
        return f"Using KV cache dtype: {dtype}"

    def kv_allocated(self, pool: KvAllocation) -> str:
        """The KV pool's allocation line (0.5.9 names neither the dtype nor a virtual-address
        pool)."""
        return fmt_kv_allocated(pool)

    def pool_end(self, avail: float) -> str:
        """The free memory once the pool is allocated."""
        return fmt_pool_end(avail)

    def capture_begin(self, avail: float, role: str, phase: str, shape: CaptureShape) -> str:
        """A CUDA-graph capture begins (0.5.9: one capture for all, without role, phase or
        shape)."""
        return fmt_capture_begin(avail)

    def capture_bs(self, sizes: Sequence[int]) -> str | None:
        """The batch sizes about to be captured; None where a release prints no such line."""
        return fmt_capture_bs(sizes)

    def capture_bar(self, sizes: Sequence[int], avail: float, elapsed: float, phase: str) -> str:
        """The tqdm bar of a capture loop (0.5.9: one bar, any phase)."""
        return fmt_capture_bar(sizes, avail, elapsed)

    def capture_end(
        self, elapsed: float, usage: float, avail: float, role: str, phase: str, shape: CaptureShape
    ) -> str:
        """A CUDA-graph capture ends, with what it took (0.5.9: one line for all)."""
        return fmt_capture_end(elapsed, usage, avail)

    def summary(
        self, tokens: int, chunk: int, max_prefill: int, max_running: int, ctx: int, avail: float
    ) -> str:
        """The scheduler's summary of the pool and the limits."""
        return fmt_summary(tokens, chunk, max_prefill, max_running, ctx, avail)

    def hicache(self, size_gb: float, tokens: int, label: str = "kv") -> str:
        """The host cache's allocation line (0.5.9 states only its size)."""
        return fmt_hicache(size_gb)

    def prefill(self, batch: PrefillBatch) -> str:
        """One `Prefill batch` line (0.5.9 prints neither the pending tokens nor whether a CUDA
        graph ran the batch)."""
        return fmt_prefill(batch)

    def decode(self, batch: DecodeBatch) -> str:
        """One `Decode batch` line."""
        return fmt_decode(batch)

    def startup_timings(self, timings: dict[str, float], graphs: dict[str, float]) -> str | None:
        """0.5.23's `Engine startup timings` line (0.5.9 has none)."""
        return None

    def kill_tree(self, pid: int, include_parent: bool) -> str | None:
        """0.5.23's `kill_process_tree called` line (0.5.9 logs none)."""
        return None


class Lines0523(Lines):
    """SGLang 0.5.23's text where it differs from 0.5.9."""

    version = "0.5.23"
    init_frames = SCHEDULER_INIT_FRAMES_0523
    load_frames = LOAD_FRAMES_0523
    pool_frames = POOL_FRAMES_0523
    budget_frames = BUDGET_FRAMES_0523
    tokens_frames = TOKENS_FRAMES_0523
    graph_frames = GRAPH_FRAMES_0523
    hicache_frames = (*SCHEDULER_INIT_FRAMES_0523, *HICACHE_FRAMES_0523)
    run_frames = RUN_FRAMES_0523
    capture_advice = CAPTURE_ADVICE_0523

    def init_begin(self) -> str:
        """distributed/bootstrap.py:115."""
        return "Init parallel begin."

    def init_end(self, elapsed: float, mem_usage: float) -> str:
        """distributed/bootstrap.py:190."""
        return f"Init parallel ends. elapsed={elapsed:.2f} s"

    def memory_baseline(self, mem_usage: float) -> str | None:
        """distributed/bootstrap.py:218."""
        return f"Memory baseline taken. mem usage={mem_usage:.2f} GB"

    def load_end(
        self, elapsed: float, arch: str, dtype: str, quant: str, avail: float, usage: float
    ) -> str:
        """model_executor/model_runner.py:1373 (no dtype; the quantization string if any)."""
        return (
            f"Load weight end. elapsed={elapsed:.2f} s, type={arch}, "
            f"{quant + ', ' if quant else ''}avail mem={gb(avail)} GB, mem usage={gb(usage)} GB."
        )

    def kv_dtype(self, dtype: str) -> str | None:
        """None: 0.5.23 prints no `Using KV cache dtype` line (the dtype is in its allocation
        line)."""
        return None

    def kv_allocated(self, pool: KvAllocation) -> str:
        """mem_cache/memory_pool.py:2087 and :2096 (`_finalize_allocation_log`)."""
        head = f"KV Cache {'VA upper bound' if pool.va else 'is allocated'}. dtype: {pool.dtype}"
        if pool.k is not None and pool.v is not None:
            return (
                f"{head}, #tokens: {pool.tokens}, K size: {gb(pool.k)} GB, V size: {gb(pool.v)} GB"
            )
        return f"{head}, #tokens: {pool.tokens}, KV size: {gb(pool.kv or 0.0)} GB"

    def capture_begin(self, avail: float, role: str, phase: str, shape: CaptureShape) -> str:
        """model_executor/model_runner_components/cuda_graph_setup.py:683 (prefill) and :771
        (decode/verify); speculative/eagle_worker_v2.py:515 and :635 (draft decode/extend)."""
        if phase == "prefill":
            return (
                f"Capture {role} prefill CUDA graph begin. backend=breakable, "
                f"num_tokens={list(shape.tokens)}, avail mem={gb(avail)} GB"
            )
        if role == "draft":
            return (
                f"Capture draft {phase} CUDA graph begin. backend=full, "
                f"num_tokens_per_req={shape.per_req}, bs={list(shape.bs)}, "
                f"avail mem={gb(avail)} GB"
            )
        return (
            f"Capture {role} {phase} CUDA graph begin. backend=full, "
            f"num_tokens_per_req={shape.per_req}, avail mem={gb(avail)} GB"
        )

    def capture_bs(self, sizes: Sequence[int]) -> str | None:
        """None: 0.5.23 prints the captured batch sizes in its `CUDA graph end` line instead."""
        return None

    def capture_bar(self, sizes: Sequence[int], avail: float, elapsed: float, phase: str) -> str:
        """decode_cuda_graph_runner.py:1343 / prefill_cuda_graph_runner.py:1734 (tqdm on TP0)."""
        if phase == "prefill":
            desc = f"Capturing prefill shape (num_tokens={min(sizes)} avail_mem={avail:.2f} GB)"
        else:
            desc = f"Capturing batches (bs={min(sizes)} avail_mem={avail:.2f} GB)"
        return _bar(desc, len(sizes), elapsed)

    def capture_end(
        self, elapsed: float, usage: float, avail: float, role: str, phase: str, shape: CaptureShape
    ) -> str:
        """model_executor/model_runner_components/cuda_graph_setup.py:696 (prefill) and :788
        (decode/verify, with `bs=`); speculative/eagle_worker_v2.py:533 and :654 (draft
        decode/extend)."""
        tail = f"elapsed={elapsed:.2f} s, mem usage={gb(usage)} GB, avail mem={gb(avail)} GB."
        if phase == "prefill" or role == "draft":
            return f"Capture {role} {phase} CUDA graph end. {tail}"
        return f"Capture {role} {phase} CUDA graph end. bs={list(shape.bs)}, {tail}"

    def hicache(self, size_gb: float, tokens: int, label: str = "kv") -> str:
        """mem_cache/pool_host/base.py:272."""
        return (
            f"Allocating {label} hierarchical KV host pool: {tokens} tokens, "
            f"{size_gb:.2f} GB host memory."
        )

    def prefill(self, batch: PrefillBatch) -> str:
        """managers/scheduler_components/metrics_reporter.py:753-778."""
        return (
            f"Prefill batch, #new-seq: {batch.new_seq}, #new-token: {batch.new_token}, "
            f"#cached-token: {batch.cached}, token usage: {batch.usage:.2f}, "
            f"#running-req: {batch.running}, #queue-req: {batch.queued}, "
            f"#pending-token: {batch.pending}, cuda graph: {batch.cuda_graph}, "
            f"input throughput (token/s): {batch.input_tput:.2f}"
        )

    def startup_timings(self, timings: dict[str, float], graphs: dict[str, float]) -> str | None:
        """entrypoints/engine.py:1117."""
        phases = ", ".join(f"{phase}={duration:.2f}" for phase, duration in graphs.items())
        return (
            f"Engine startup timings (s): load_weight={timings['load_weight']:.2f}, "
            f"kv_cache_allocation={timings['kv_cache_allocation']:.2f}, "
            f"scheduler_e2e={timings['scheduler_e2e']:.2f}, cuda_graph={{{phases}}}, "
            f"tokenizer_e2e={timings['tokenizer_e2e']:.2f}"
        )

    def kill_tree(self, pid: int, include_parent: bool) -> str | None:
        """utils/common.py:2522."""
        return (
            f"kill_process_tree called: parent_pid={pid}, include_parent={include_parent}, "
            f"pid={pid}"
        )


def fmt_bind_failed(errno: int | None, host: str, port: int, reason: str) -> str:
    """uvicorn's `Server.startup` logging uvloop's `create_server` error (`loop.pyx`:
    `'error while attempting to bind on address %r: %s' % (pyaddr, err.strerror.lower())`)."""
    return f"[Errno {errno}] error while attempting to bind on address ('{host}', {port}): {reason}"


def fmt_warmup_gave_up(host: str, port: int, answered: bool) -> str:
    """0.5.23 entrypoints/http_server.py `_execute_server_warmup` (0.5.9 the same): the warm-up
    thread's `/model_info` request failed 120 times; `requests`' last exception, refused or
    timed out (a listener that accepts and never answers)."""
    url = f"HTTPConnectionPool(host='{host}', port={port})"
    if answered:
        final = f"requests.exceptions.ReadTimeout: {url}: Read timed out. (read timeout=5)"
    else:
        final = (
            f"requests.exceptions.ConnectionError: {url}: Max retries exceeded with url: "
            "/model_info (Caused by NewConnectionError('<urllib3.connection.HTTPConnection "
            "object>: Failed to establish a new connection: [Errno 111] Connection refused'))"
        )
    return f"Initialization failed. warmup error: {traceback_block(WARMUP_FRAMES, final)}"


def fmt_died_during_init(rank: int, exit_code: int) -> str:
    """0.5.23 entrypoints/engine.py:2005 (`_scheduler_died_error`)."""
    return (
        f"Rank {rank} scheduler died during initialization (exit code: {exit_code}). "
        "If exit code is -9 (SIGKILL), a common cause is the OS OOM killer. "
        "Run `dmesg -T | grep -i oom` to check."
    )


def fmt_watchdog_crash(name: str, pid: int, exit_code: int) -> str:
    """0.5.23 utils/watchdog.py:214 (`SubprocessWatchdog._check_processes`)."""
    return (
        f"Subprocess {name} (pid={pid}) crashed with exit code {exit_code}. "
        "Triggering SIGQUIT for cleanup..."
    )


def fmt_hicache_headroom(host_gib: float, cgroup_gib: float) -> str:
    """0.5.23 mem_cache/host_memory.py `available_host_memory_bytes` (logged when a cgroup
    limit bounds the process)."""
    return f"HiCache memory headroom: host {host_gib:.1f} GiB, cgroup {cgroup_gib:.1f} GiB"


def fmt_scheduler_watchdog(timeout: float) -> str:
    """A scheduler's watchdog giving up on a forward that makes no progress (0.5.23
    utils/watchdog.py `WatchdogRaw._watchdog_once`: `f"{self.debug_name} watchdog timeout
    ({self.watchdog_timeout=}, {self.soft=})"`, debug name `Scheduler`; 0.5.9 the same). The
    default `--watchdog-timeout` is the int 300 (`arg_groups/fields/device.py`); a value given
    on the command line is a float."""
    shown = int(timeout) if timeout == 300 else timeout
    return f"Scheduler watchdog timeout (self.watchdog_timeout={shown!r}, self.soft=False)"


SEGFAULT_FRAMES = (
    ("/usr/local/lib/python3.12/dist-packages/sglang/srt/layers/communicator.py", 612,
     "_gather_hidden_states_and_residual"),
    ("/usr/local/lib/python3.12/dist-packages/sglang/srt/model_executor/model_runner.py", 2467,
     "forward"),
    ("/usr/local/lib/python3.12/dist-packages/sglang/srt/managers/tp_worker.py", 431,
     "forward_batch_generation"),
    ("/usr/local/lib/python3.12/dist-packages/sglang/srt/managers/scheduler.py", 2891,
     "run_batch"),
    ("/usr/local/lib/python3.12/dist-packages/sglang/srt/managers/scheduler.py", 1207,
     "event_loop_overlap"),
)  # fmt: skip


def fmt_segfault() -> str:
    """What CPython's faulthandler writes when a scheduler dies of SIGSEGV (SGLang enables it in
    `configure_scheduler_process`: `faulthandler.enable()`): unprefixed, the innermost frame
    first, each `  File "…", line N in name` (faulthandler's own format, no comma)."""
    frames = "".join(f'  File "{path}", line {line} in {name}\n' for path, line, name in
                     SEGFAULT_FRAMES)  # fmt: skip
    return (
        "Fatal Python error: Segmentation fault\n\n"
        "Thread 0x00007f3b2e7fc640 (most recent call first):\n"
        f"{frames}\n"
    )


def fmt_hicache_auto(requested: float, ratio: float, budget_gib: float, fraction: float,
                     ranks: int, pools_gib: float) -> str:  # fmt: skip
    """0.5.23 mem_cache/hicache_auto_size.py:117."""
    return (
        f"HiCache auto-sizing: ratio {requested:.3f} -> {ratio:.3f}; {budget_gib:.1f} GiB host "
        f"memory per rank (fraction {fraction:.2f}, {ranks} ranks on this host), host pools "
        f"{pools_gib:.1f} GiB."
    )


def fmt_pool_below_context(tokens: int, context: int) -> str:
    """0.5.23 `managers/tp_worker.py` `get_worker_info`'s warning: the pool holds fewer tokens
    than one full-length request needs."""
    return (
        f"KV pool holds {tokens} tokens, fewer than --context-length {context}. One full-length "
        "request cannot fit, so long requests will be refused or truncated at serving time. "
        "Lower --context-length, raise --mem-fraction-static, or free memory taken before the "
        "pool is sized."
    )


def fmt_post_capture(tokens: int, dtype: str, kv: float, avail: float) -> tuple[str, str]:
    """0.5.23 model_runner_components/kv_pool_runtime.py:190-201."""
    return (
        f"Post-capture KV sizing: full_layer_tokens={tokens}, swa_layer_tokens=0",
        f"Post-capture KV sizing: KV cache allocated. dtype: {dtype}, #tokens: {tokens}, "
        f"KV size: {kv:.2f} GB, avail mem={avail:.2f} GB",
    )


LINES: dict[str, Lines] = {"0.5.9": Lines(), "0.5.23": Lines0523()}


def lines_for(version: str) -> Lines:
    """The text of SGLang `version` (one of the simulated releases)."""
    return LINES[version]
