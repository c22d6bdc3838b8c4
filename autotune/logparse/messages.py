"""SGLang's startup and lifecycle messages -> events, matched on how the message begins (`_STARTS`,
`startup_event`): the memory accounting from distributed init to graph capture, the KV pool and
its sizing, the scheduler's summary, retractions, the signals and exits SGLang logs, uvicorn's
lines (`uvicorn_event`).

Kept apart from failure text (`logparse.failures`) because these are read by their first words,
one table row each, with the figures each carries under stable names (`Event.values`).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from autotune.logparse.events import POOL_AUX, POOL_MAIN, POOL_SWA, Ctx, Event, Kind
from autotune.logparse.failures import EXIT_CODE, NUM, wrapped_fault

_AVAIL = re.compile(r"avail[ _]mem=" + NUM)
_USAGE = re.compile(r"mem usage=" + NUM)
_ELAPSED = re.compile(r"(?:elapsed=|Time elapsed: )" + NUM)
_TYPE = re.compile(r"type=([\w.]+)")
_KV_TOKENS = re.compile(r"#tokens: (\d+)")
_KV_SIZE = re.compile(r"\bKV size: " + NUM)
_K_SIZE = re.compile(r"\bK size: " + NUM)
_V_SIZE = re.compile(r"\bV size: " + NUM)
_KV_DTYPE = re.compile(r"dtype: ([\w.]+)")
_GRAPH_ROLE = re.compile(
    r"^Capture (?:(target|draft) )?(?:(\w+) )?(?:cuda|cpu|npu|xpu|musa) graph\b", re.I
)
_BS_LIST = re.compile(r"\bbs=\[([\d, ]*)\]")
_TOKENS_LIST = re.compile(r"\bnum_tokens=\[([\d, ]*)\]")
_PER_REQ = re.compile(r"num_tokens_per_(?:req|bs)=(\d+)")
_GRAPH_BS = re.compile(r"graph bs \[([\d, ]*)\]")
_CAPTURING = re.compile(r"(bs|num_tokens)=(\d+) avail_mem=" + NUM)
_SUMMARY_FIELD = re.compile(r"(\w+)=" + NUM)
_HOST_POOL = re.compile(
    r"Allocating (\w+) hierarchical KV host pool: (\d+) tokens, " + NUM + " GB host memory"
)
_HOST_GB = re.compile(r"Allocating " + NUM + " GB host memory")
_HOST_SMALLER = re.compile(
    r"HiCache (?:(\w+) )?host (?:KV )?pool \((\d+) tokens\) is smaller than the device "
    r"pool \((\d+) tokens\)"
)
_AUTOSIZE = re.compile(
    rf"ratio {NUM} -> {NUM}; {NUM} GiB host memory per rank \(fraction {NUM}, "
    rf"(\d+) ranks on this host\), host pools {NUM} GiB"
)
_HEADROOM = re.compile(r"host " + NUM + " GiB, cgroup " + NUM + " GiB")
_MRR_REDUCED = re.compile(r"requested (\d+) to (\d+)")
_PID = re.compile(r"\[(\d+)\]")
_URL = re.compile(r"(https?://\S+)")
_RETRACT = re.compile(r"#retracted_reqs: (\d+)")
_MRR_RESET = re.compile(r"reset to (\d+)")
_SUBPROCESS = re.compile(r"^Subprocess (\S+) \(pid=(\d+)\) crashed with exit code (-?\d+)")
_TERMINATED = re.compile(r"^Scheduler or DataParallelController (\d+) terminated with (-?\d+)")
_POST_MRR = re.compile(r"max_running_requests (\d+) -> (\d+)")
_POST_GB = re.compile(NUM + " GB")
_POST_MAX_BS = re.compile(r"max_bs=(\d+) < max_running_requests=(\d+)")
_SWA_TOKENS = re.compile(r"(full|swa)_layer_tokens=(\d+)")
_SWA_KV_POOL = re.compile(
    r"^SWAKVPool (mem usage|VA upper bound): " + NUM + r" GB, swa size: (\d+), full size: (\d+)"
)
_BELOW_CONTEXT = re.compile(r"KV pool holds (\d+) tokens, fewer than --context-length (\d+)")
_CAP_IGNORED = re.compile(r"max_total_tokens=(\d+) is larger than the profiled value (-?\d+)")
_MAMBA = re.compile(
    r"(conv_state|ssm_state|intermediate_ssm_state_cache|intermediate_conv_window_cache) size: "
    + NUM
    + " ?GB"
)
_MAMBA_SIZE = re.compile(r"max_mamba_cache_size: (\d+)")
_TIMING = re.compile(r"(\w+)=" + NUM)


def _num(pattern: re.Pattern[str], text: str) -> float | None:
    m = pattern.search(text)
    return float(m.group(1)) if m else None


def _values(**numbers: float | None) -> dict[str, float]:
    return {k: v for k, v in numbers.items() if v is not None}


Builder = Callable[[str, Ctx], Event | None]


def _plain(kind: Kind) -> Builder:
    return lambda message, ctx: Event(kind, *ctx)


def _release_line(marker: str) -> Builder:
    """A line only later releases print, which says nothing else the ledger reads: its
    `marker` (the part that is the release's) tells `logparse.semantics` the release."""

    def build(message: str, ctx: Ctx) -> Event | None:
        return Event(Kind.RELEASE_LINE, *ctx, label=marker) if marker in message else None

    return build


def _memory(kind: Kind, label: re.Pattern[str] | None = None) -> Builder:
    """Events with `avail mem=`, `mem usage=`, `elapsed=` figures (and a regex-read label)."""

    def build(message: str, ctx: Ctx) -> Event:
        values = _values(
            avail_gib=_num(_AVAIL, message),
            usage_gib=_num(_USAGE, message),
            elapsed_s=_num(_ELAPSED, message),
        )
        m = label.search(message) if label is not None else None
        return Event(kind, *ctx, values, m.group(1) if m else "")

    return build


def _ints(raw: str) -> list[int]:
    return [int(x) for x in raw.replace(" ", "").split(",") if x]


def _weight_end(message: str, ctx: Ctx) -> Event:
    if message.startswith("Load weight end. Committed"):
        # --startup-weight-load-mode overlap: the real weights land after graph capture
        return Event(Kind.WEIGHT_COMMIT, *ctx, _values(elapsed_s=_num(_SUMMARY_NUM, message)))
    return _memory(Kind.WEIGHT_LOAD_END, _TYPE)(message, ctx)  # type: ignore[return-value]


_SUMMARY_NUM = re.compile(r"in " + NUM + " s")


def _logged_traceback(message: str, ctx: Ctx) -> Event | None:
    """A traceback logged alone behind SGLang's prefix: 0.3.x–0.4.0's fatal handlers
    (`run_scheduler_process`, `run_detokenizer_process`, `run_data_parallel_controller_process`:
    `logger.error(get_exception_traceback())`, then `kill_parent_process()`), the form 0.4.1 began
    with `Scheduler hit an exception: `. Python's own header has no prefix and is nothing."""
    _, time, rank, _ = ctx
    return Event(Kind.SCHEDULER_EXCEPTION, *ctx) if time is not None or rank else None


def _kv_allocated(message: str, ctx: Ctx) -> Event | None:
    at = message.find("KV Cache ")
    if at < 0:
        return None
    rest = message[at + 9 :]
    if rest.startswith("is allocated"):
        va = False
    elif rest.startswith("VA upper bound"):
        va = True
    else:
        return None
    name = message[:at].strip()
    pool = POOL_MAIN if name in ("", "Full") else POOL_SWA if name == "SWA" else POOL_AUX
    kv = _num(_KV_SIZE, message)
    k, v = _num(_K_SIZE, message), _num(_V_SIZE, message)
    if kv is None and k is not None and v is not None:
        kv = k + v  # MHA prints K and V separately
    m = _KV_DTYPE.search(message)
    values = _values(
        tokens=_num(_KV_TOKENS, message),
        kv_gib=kv,
        k_gib=k,
        v_gib=v,
        pool=pool,
        va_upper_bound=1.0 if va else None,
    )
    return Event(Kind.KV_ALLOCATED, *ctx, values, m.group(1) if m else "")


def _mamba(message: str, ctx: Ctx) -> Event:
    """`Mamba Cache is allocated. max_mamba_cache_size: N, conv_state size: XGB, ssm_state size:
    YGB ` and, with speculative decoding, `intermediate_ssm_state_cache size: ZGB
    intermediate_conv_window_cache size: WGB ` (`mem_cache/memory_pool.py` `MambaPool`, 0.5.4 to
    0.5.23; GB is GiB there): the state pool of a hybrid linear-attention model (Qwen3-Next,
    Qwen3.5, Nemotron-H, LFM2), all four parts, in GiB."""
    parts = {name: float(gb) for name, gb in _MAMBA.findall(message)}
    size = _num(_MAMBA_SIZE, message)
    values = _values(gib=sum(parts.values()) if parts else None, slots=size)
    return Event(Kind.MAMBA_ALLOCATED, *ctx, values)


def _swa_pool(message: str, ctx: Ctx) -> Event:
    values = {f"{k}_tokens": float(v) for k, v in _SWA_TOKENS.findall(message)}
    return Event(Kind.SWA_POOL, *ctx, values)


def _swa_kv_pool(message: str, ctx: Ctx) -> Event | None:
    """`SWAKVPool mem usage: X GB, swa size: S, full size: F` (`mem_cache/swa_memory_pool.py`
    `SWAKVPool.__init__`, printed once both halves are built, after their `KV Cache` lines): the
    hybrid sliding-window pool's split, as `Use sliding window memory pool` gives it, and both
    halves together in GiB (`gib`; GB is GiB there). With post-capture sizing it says `VA upper
    bound` (`va_upper_bound`): reserved address space, not memory."""
    m = _SWA_KV_POOL.match(message)
    if m is None:
        return None
    va = m.group(1) == "VA upper bound"
    values = _values(
        gib=float(m.group(2)),
        swa_tokens=float(m.group(3)),
        full_tokens=float(m.group(4)),
        va_upper_bound=1.0 if va else None,
    )
    return Event(Kind.SWA_POOL, *ctx, values, "SWAKVPool")


def _capturing(message: str, ctx: Ctx) -> Event:
    m = _CAPTURING.search(message)
    values = {m.group(1): float(m.group(2)), "avail_gib": float(m.group(3))} if m else {}
    return Event(Kind.GRAPH_CAPTURING, *ctx, values, "prefill" if "prefill" in message else "")


def _capture(message: str, ctx: Ctx) -> Event | None:
    """`Capture [target|draft] [decode|prefill|verify|extend|piecewise] CUDA graph begin|end`
    (0.5.14+ roles; plain `Capture cuda graph …` before), `Capture cuda graph bs [...]`."""
    if " failed" in message:
        return wrapped_fault(message, ctx) or Event(Kind.GRAPH_CAPTURE_FAILED, *ctx)
    if " graph bs [" in message:
        m = _GRAPH_BS.search(message)
        sizes = _ints(m.group(1)) if m else []
        values = {"max_bs": float(max(sizes)), "count": float(len(sizes))} if sizes else {}
        return Event(Kind.GRAPH_BATCH_SIZES, *ctx, values)
    head = message[:80]
    if " begin" in head:
        kind = Kind.GRAPH_CAPTURE_BEGIN
    elif " end" in head:
        kind = Kind.GRAPH_CAPTURE_END
    else:
        return None  # the `num tokens [...]` lists, assertion texts
    end = kind is Kind.GRAPH_CAPTURE_END
    values = _values(
        avail_gib=_num(_AVAIL, message),
        usage_gib=_num(_USAGE, message) if end else None,
        elapsed_s=_num(_ELAPSED, message) if end else None,
        tokens_per_req=_num(_PER_REQ, message) if "_per_" in message else None,
    )
    bs = _BS_LIST.search(message) if "bs=[" in message else None
    if bs and (sizes := _ints(bs.group(1))):
        values.update(max_bs=float(max(sizes)), count=float(len(sizes)))
    tokens = _TOKENS_LIST.search(message) if "num_tokens=[" in message else None
    if tokens and (sizes := _ints(tokens.group(1))):
        values.update(max_tokens=float(max(sizes)), count=float(len(sizes)))
    m = _GRAPH_ROLE.match(message)
    role = " ".join(p.lower() for p in m.groups() if p) if m else ""
    return Event(kind, *ctx, values, role)


def _summary(message: str, ctx: Ctx) -> Event:
    values = {k: float(v) for k, v in _SUMMARY_FIELD.findall(message)}
    if "available_cpu_mem" in values:
        values["available_gpu_mem"] = values.pop("available_cpu_mem")
    return Event(Kind.SCHEDULER_SUMMARY, *ctx, values)


def _mrr_reduced(message: str, ctx: Ctx) -> Event:
    m = _MRR_REDUCED.search(message)
    values = {"requested": float(m.group(1)), "value": float(m.group(2))} if m else {}
    return Event(Kind.MRR_REDUCED, *ctx, values)


def _mrr_reset(message: str, ctx: Ctx) -> Event:
    m = _MRR_RESET.search(message)
    return Event(Kind.MRR_SPEC_RESET, *ctx, _values(value=float(m.group(1)) if m else None))


def _retract(message: str, ctx: Ctx) -> Event:
    """A decode batch that did not fit, requests sent back to the queue: a serving event, never
    a failure. Every release's shape (after `ScheduleBatch.retract_decode`): 0.1–0.2
    `decode out of memory happened, #retracted_reqs: n, #new_token_ratio: a -> b`
    (`forward_decode_batch`) and 0.3–0.4.x `Decode out of memory happened. #retracted_reqs: n, …`
    (`Scheduler.update_running_batch`), both INFO; 0.4.x to 0.5.23 (`update_running_batch`)
    `KV cache pool is full. Retract requests. #retracted_reqs: n,
    #new_tokens_gained: m[, #mamba_num_gained: k], #new_token_ratio: a -> b` (WARNING), and
    `Testing retraction. …` under SGLANG_TEST_RETRACT (label "test")."""
    label = "test" if message.startswith("Testing") else ""
    return Event(Kind.RETRACT, *ctx, _values(retracted=_num(_RETRACT, message)), label)


def _kv_dtype(message: str, ctx: Ctx) -> Event:
    return Event(Kind.KV_DTYPE, *ctx, label=message.rsplit(" ", 1)[-1])


def _host_cache(message: str, ctx: Ctx) -> Event | None:
    """`Allocating {label} hierarchical KV host pool: N tokens, X GB host memory.` (0.5.18+; the
    label is kv, full, swa, draft or draft_swa) or `Allocating X GB host memory for …`."""
    if "host" not in message:
        return None
    m = _HOST_POOL.search(message)
    if m:
        values = {"tokens": float(m.group(2)), "gb": float(m.group(3))}
        return Event(Kind.HOST_CACHE, *ctx, values, m.group(1))
    g = _HOST_GB.search(message)
    if g is None:
        return None
    # 0.5.9's KV pool, or one named after "for": a Mamba, DSA indexer, V4 or MiniMax pool
    label = "" if "for hierarchical KV cache" in message else "other"
    return Event(Kind.HOST_CACHE, *ctx, {"gb": float(g.group(1))}, label)


def _hicache(message: str, ctx: Ctx) -> Event | None:
    if message.startswith("HiCache auto-sizing: ratio"):
        m = _AUTOSIZE.search(message)
        keys = ("ratio_requested", "ratio", "per_rank_gib", "fraction", "ranks", "pools_gib")
        values = dict(zip(keys, map(float, m.groups()), strict=True)) if m else {}
        return Event(Kind.HICACHE_AUTOSIZE, *ctx, values)
    if message.startswith("HiCache memory headroom"):
        m = _HEADROOM.search(message)
        values = {"host_gib": float(m.group(1)), "cgroup_gib": float(m.group(2))} if m else {}
        return Event(Kind.HOST_HEADROOM, *ctx, values)
    m = _HOST_SMALLER.search(message)
    if m:
        values = {"tokens": float(m.group(2)), "device_tokens": float(m.group(3))}
        return Event(Kind.HICACHE_SMALLER, *ctx, values, m.group(1) or "")
    return None


def _post_capture(message: str, ctx: Ctx) -> Event:
    """SGLANG_ENABLE_POST_CAPTURE_KV_SIZING: the pool resized after graph capture. The label
    says which line: kv, draft_kv, max_running_requests, canary, swa, eager_gap."""
    body = message[24:]
    values: dict[str, float] = {}
    if body.startswith("KV cache allocated"):
        label = "kv"
        values = _values(
            tokens=_num(_KV_TOKENS, body),
            kv_gib=_num(_KV_SIZE, body),
            avail_gib=_num(_AVAIL, body),
        )
    elif body.startswith("draft KV cache allocated"):
        label = "draft_kv"
        values = _values(tokens=_num(_KV_TOKENS, body), kv_gib=_num(_KV_SIZE, body))
    elif body.startswith("max_running_requests"):
        label = "max_running_requests"
        m = _POST_MRR.search(body)
        values = {"requested": float(m.group(1)), "value": float(m.group(2))} if m else {}
    elif body.startswith("KV-canary"):
        label = "canary"
        values = _values(gib=_num(_POST_GB, body))
    elif body.startswith("full_layer_tokens"):
        label = "swa"
        values = {f"{k}_tokens": float(v) for k, v in _SWA_TOKENS.findall(body)}
    else:
        label = "eager_gap"
        m = _POST_MAX_BS.search(body)
        values = {"max_bs": float(m.group(1)), "requests": float(m.group(2))} if m else {}
    return Event(Kind.POST_CAPTURE, *ctx, values, label)


def _timings(message: str, ctx: Ctx) -> Event:
    """`Engine startup timings (s): load_weight=…, …, cuda_graph={prefill=…, …}, …`; the graph
    phases are named `cuda_graph.<phase>`."""
    values: dict[str, float] = {}
    inner_at, inner_end = message.find("{"), message.find("}")
    for m in _TIMING.finditer(message):
        inside = inner_at < m.start() < inner_end
        values[f"cuda_graph.{m.group(1)}" if inside else m.group(1)] = float(m.group(2))
    return Event(Kind.STARTUP_TIMINGS, *ctx, values)


def _rank_dead(message: str, ctx: Ctx) -> Event | None:
    """0.5.9 `Rank i scheduler is dead. …` (its exit code on the next line); 0.5.18+ `Rank i
    scheduler died during initialization (exit code: X). …`."""
    if "is dead" in message:
        return Event(Kind.RANK_DEAD, *ctx)
    if "died during initialization" in message:
        m = EXIT_CODE.search(message)
        return Event(Kind.RANK_DEAD, *ctx, {"code": float(m.group(1))} if m else {})
    return None


def _subprocess(message: str, ctx: Ctx) -> Event | None:
    m = _SUBPROCESS.match(message)
    if m is None:
        return None
    values = {"pid": float(m.group(2)), "code": float(m.group(3))}
    return Event(Kind.SUBPROCESS_CRASHED, *ctx, values, m.group(1))


def _terminated(message: str, ctx: Ctx) -> Event | None:
    """A non-zero node's scheduler ending (multi-node); exit code 0 is a clean stop."""
    m = _TERMINATED.match(message)
    if m is None or m.group(2) == "0":
        return None
    values = {"pid": float(m.group(1)), "code": float(m.group(2))}
    return Event(Kind.SUBPROCESS_CRASHED, *ctx, values, "scheduler")


def _exit_code(message: str, ctx: Ctx) -> Event:
    code = message[11:].strip()
    values = {"code": float(code)} if code.lstrip("-").isdigit() else {}
    return Event(Kind.EXIT_CODE, *ctx, values)


def _pool_below_context(message: str, ctx: Ctx) -> Event:
    m = _BELOW_CONTEXT.search(message)
    values = {"tokens": float(m.group(1)), "context": float(m.group(2))} if m else {}
    return Event(Kind.POOL_BELOW_CONTEXT, *ctx, values)


def _cap_ignored(message: str, ctx: Ctx) -> Event:
    """`max_total_tokens=R is larger than the profiled value P. Use the profiled value
    instead.`; P at or below zero means the weights left less than the reserve: no KV pool
    fits, and SGLang's next statement raises `Not enough memory` (0.4.x `ModelRunner.
    init_memory_pool`), so the line is read as that failure (a log cut before the raise keeps
    its proof)."""
    m = _CAP_IGNORED.search(message)
    values = {"requested": float(m.group(1)), "profiled": float(m.group(2))} if m else {}
    if values and values["profiled"] <= 0:
        return Event(Kind.NO_KV_ROOM, *ctx, values)
    return Event(Kind.KV_CAP_IGNORED, *ctx, values)


def _server_args(message: str, ctx: Ctx) -> Event:
    """`server_args={...}` (0.5.23: the resolved dict) or `server_args=ServerArgs(...)` (≤0.5.18);
    read lazily by `read_server_args`."""
    shape = "dict" if message.startswith("server_args={") else "ServerArgs"
    return Event(Kind.SERVER_ARGS, *ctx, label=shape)


def _watchdog(message: str, ctx: Ctx) -> Event | None:
    """`{debug_name} watchdog timeout (…)`: Scheduler, DetokenizerManager, TokenizerManager,
    DataParallelController (`utils/watchdog.py`). Releases before that class (0.4.x into 0.5.x)
    printed `Watchdog timeout (self.watchdog_timeout=300)` from the scheduler's own thread and
    then sent its parent SIGQUIT (`Scheduler.watchdog_thread`): `_STARTS` reads that one.

    A soft watchdog (`self.soft=True`: `--soft-watchdog-timeout`, and the tokenizer's,
    detokenizer's and DP controller's own) only prints its dump and goes on watching; SIGQUIT is
    sent by the hard one alone: not a death, nothing to read."""
    if " watchdog timeout (" not in message or "self.soft=True" in message:
        return None
    return Event(Kind.WATCHDOG_TIMEOUT, *ctx)


def _initialization_failed(message: str, ctx: Ctx) -> Event:
    """`Initialization failed. warmup error: …` is the warm-up; `… Please see the error messages
    above.` is a scheduler that did not report ready (the error is above)."""
    kind = Kind.WARMUP_FAILED if "warmup" in message else Kind.ERROR
    return Event(kind, *ctx)


# How a startup or lifecycle message begins -> how to read it.
_STARTS: tuple[tuple[str, Builder], ...] = (
    ("Load weight begin", _memory(Kind.WEIGHT_LOAD_BEGIN)),
    ("Load weight end", _weight_end),
    ("KV Cache ", _kv_allocated),
    ("KV cache pool is full", _retract),
    ("Decode out of memory happened", _retract),
    ("decode out of memory happened", _retract),
    ("Testing retraction", _retract),
    ("KV pool holds", _pool_below_context),
    ("Capturing batches", _capturing),
    ("Capturing prefill shape", _capturing),
    ("Capture ", _capture),
    ("Init torch distributed begin", _plain(Kind.DIST_INIT_BEGIN)),
    ("Init parallel begin", _plain(Kind.DIST_INIT_BEGIN)),
    ("Init torch distributed ends", _memory(Kind.DIST_INIT_END)),
    ("Init parallel ends", _memory(Kind.DIST_INIT_END)),
    ("Initialization failed", _initialization_failed),
    ("Memory pool end", _memory(Kind.MEMORY_POOL_END)),
    ("Memory baseline taken", _memory(Kind.MEMORY_BASELINE)),
    ("Mamba Cache is allocated", _mamba),
    ("Max running requests is reset", _mrr_reset),
    ("max_total_num_tokens=", _summary),
    ("max_running_requests was reduced", _mrr_reduced),
    ("max_total_tokens=", _cap_ignored),
    ("Using KV cache dtype", _kv_dtype),
    ("Use sliding window memory pool", _swa_pool),
    ("SWAKVPool ", _swa_kv_pool),
    ("The server is fired up and ready to roll", _plain(Kind.READY)),
    ("The memory capacity is unbalanced", _plain(Kind.UNBALANCED_MEMORY)),
    ("Allocating ", _host_cache),
    ("HiCache ", _hicache),
    ("Post-capture KV sizing: ", _post_capture),
    ("Engine startup timings", _timings),
    ("server_args=", _server_args),
    # lines 0.5.18 and later print and 0.5.9 does not (both wheels checked)
    ("Disable prefill CUDA graph", _release_line("Disable prefill CUDA graph")),
    ("Tree cache initialized", _release_line("Tree cache initialized")),
    ("Reserving ", _release_line("of the KV budget")),
    ("Scheduler hit an exception", _plain(Kind.SCHEDULER_EXCEPTION)),
    ("Traceback (most recent call last)", _logged_traceback),
    # 0.2.x–0.3.x's form of it: `ModelTpServer.exposed_step` (`managers/[controller/]tp_worker.py`)
    # logs `Exception in ModelTpServer:\n{traceback}` and raises
    ("Exception in ModelTpServer", _plain(Kind.SCHEDULER_EXCEPTION)),
    # and the process loops around it: 0.2.x–0.3.x `tp_worker.run_tp_server` (the other TP
    # ranks' `Exception in run_tp_server:\n{traceback}`, then raise), and rank 0's controller
    # (`controller_single.py` / `controller_multi.py` `loop_for_forward`, after `init ok`)
    ("Exception in run_tp_server", _plain(Kind.SCHEDULER_EXCEPTION)),
    ("Exception in ControllerSingle", _plain(Kind.SCHEDULER_EXCEPTION)),
    ("Exception in ControllerMulti", _plain(Kind.SCHEDULER_EXCEPTION)),
    # the overlap worker's thread (0.4.x–0.5.0 `tp_worker_overlap_thread.py`
    # `forward_thread_func`) logs it, then signals its scheduler (SIGQUIT, SIGUSR1 in some)
    ("TpModelWorkerClient hit an exception", _plain(Kind.SCHEDULER_EXCEPTION)),
    ("TokenizerManager hit an exception", _plain(Kind.SCHEDULER_EXCEPTION)),
    ("DetokenizerManager hit an exception", _plain(Kind.SCHEDULER_EXCEPTION)),
    ("DataParallelController hit an exception", _plain(Kind.SCHEDULER_EXCEPTION)),
    ("MultiTokenizerRouter hit an exception", _plain(Kind.SCHEDULER_EXCEPTION)),
    ("MultiDetokenizerRouter hit an exception", _plain(Kind.SCHEDULER_EXCEPTION)),
    ("Scheduler or DataParallelController ", _terminated),
    ("Scheduler watchdog timeout", _watchdog),
    ("Watchdog timeout (", _plain(Kind.WATCHDOG_TIMEOUT)),
    ("SIGQUIT received", _plain(Kind.SIGQUIT)),
    # 0.4.x printed "child proces." (`engine.py` `sigquit_handler`), later "child process."
    ("Received sigquit from a child proces", _plain(Kind.SIGQUIT)),
    ("SIGTERM received", _plain(Kind.SIGTERM_RECEIVED)),
    ("Signal SIGTERM received", _plain(Kind.SIGTERM_RECEIVED)),
    ("Gracefully exiting", _plain(Kind.GRACEFUL_EXIT)),
    ("Rank ", _rank_dead),
    ("Subprocess ", _subprocess),
    ("Exit code: ", _exit_code),
    ("Health check failed", _plain(Kind.HEALTH_CHECK_FAILED)),
    ("Entering DeepGEMM", _plain(Kind.DEEPGEMM_JIT)),
    ("retract_decode: aborted last request", _plain(Kind.REQUEST_OOM_ABORT)),
)
_BY_FIRST_CHAR: dict[str, tuple[tuple[str, Builder], ...]] = {
    c: tuple(row for row in _STARTS if row[0][0] == c) for c in {row[0][0] for row in _STARTS}
}


def startup_event(message: str, ctx: Ctx) -> Event | None:
    """Startup and lifecycle lines, matched on how the message begins."""
    for prefix, build in _BY_FIRST_CHAR.get(message[0], ()):
        if message.startswith(prefix):
            return build(message, ctx)
    if " watchdog timeout (" in message:
        return _watchdog(message, ctx)
    if " KV Cache " in message[:60]:
        return _kv_allocated(message, ctx)  # `Full KV Cache is allocated`, `SWA KV Cache …`
    return None


def uvicorn_event(message: str, ctx: Ctx) -> Event | None:
    """uvicorn's `INFO:` lines: the server process's pid and the address it runs on."""
    body = message[5:].lstrip()
    if body.startswith("Started server process"):
        m = _PID.search(body)
        return Event(Kind.SERVER_PROCESS, *ctx, _values(pid=float(m.group(1)) if m else None))
    if body.startswith("Uvicorn running on"):
        m = _URL.search(body)
        return Event(Kind.UVICORN_RUNNING, *ctx, label=m.group(1) if m else "")
    return None
