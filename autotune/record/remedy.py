"""What would fix a failed trial: the knob its failure points at, in one sentence (pure).

Read from the trial's view (its ending, the cause its log line gave, the constraints it broke and
its ledger), so the study's closing line, `explain` and the report name the same knob: a host
cache smaller than the device pool points at `hicache_size`, a KV pool that found no room at
`mem_fraction_static` (up), an out-of-memory under load at `mem_fraction_static` (down) and the
batch knobs, a hang at the log rather than at a memory setting. An out-of-memory that is the KV
pool's own (its allocator out of token slots, or the last decoding request not fitting it) is
named as such: lowering the fraction shrinks that pool. The arithmetic behind each is in
docs/sglang-memory.md.
"""

from __future__ import annotations

import re

from autotune.config.schema import Constraint
from autotune.logparse.events import POOL_OOM_KINDS, Kind
from autotune.logparse.outcome import Outcome
from autotune.record.view import TrialView

_HANG = ("watchdog_timeout", "stall", "phase_timeout", "unhealthy")
_OOM = ("torch_oom", "cuda_error_oom", "prefill_oom", "decode_oom", "nccl_error")
_LAST_REQUEST = frozenset({Kind.RETRACT_OOM, Kind.REQUEST_OOM_ABORT})
"""The decode batch did not fit the KV pool even with one request left
(`ScheduleBatch.retract_decode`): the pool is smaller than that request's context."""
_SLOTS = POOL_OOM_KINDS - _LAST_REQUEST
"""The rest of the KV pool's own out-of-memory: its allocator found no free token slots
(`mem_cache/allocation.py`: `… out of memory. Try to lower your batch size.`), SGLang's own
check, not a CUDA allocation."""


def remedy(t: TrialView) -> str:
    """The knob that would fix `t`'s failure ("" for a feasible or unfinished trial)."""
    if t.kind in ("feasible", "running", "skipped"):
        return ""
    cause = t.cause
    if cause == "hicache_too_small":
        return _host_cache_too_small(t)
    if cause in ("host_memory", "host_oom_killer", "host_enomem"):
        return (
            "the host cache does not fit in host RAM (it is pinned per rank, times the ranks): "
            "lower hicache_size, or set it to 0"
        )
    if cause == "no_kv_room":
        return (
            "the weights leave no room for a KV pool at this fraction: raise mem_fraction_static "
            "(the pool is A − P·(1 − f))"
        )
    if cause == "pool_too_small":
        return (
            "the KV pool cannot hold one request: raise mem_fraction_static, or lower "
            "--context-length"
        )
    if cause == "graph_capture_failed" and t.ending.is_oom:
        return (
            "CUDA-graph capture ran out of memory: lower mem_fraction_static, or "
            "max_running_requests (it caps the captured batch sizes)"
        )
    if cause == "graph_capture_failed":
        return (
            "not a memory setting: CUDA-graph capture failed without running out of memory "
            "(torch.compile, a kernel or a communication backend the capture cannot record); "
            "read the log (`autotune ledger LOG`), or add --disable-cuda-graph to [server.flags]"
        )
    if t.ending is Outcome.REFUSED:
        return (
            "not a memory setting: the server stayed up and answered most requests with an "
            "error of its own; check [workload] (api, model, input_len against the context "
            "length) and the server's answer in the trial's evidence"
        )
    if cause.startswith(_HANG):
        return (
            "not a memory setting: the server stopped making progress; read its log "
            "(`autotune ledger LOG`), and raise server.limits if startup is only slow"
        )
    if t.ending.fails_at_startup and cause in _OOM:
        return (
            "lower mem_fraction_static: the reserve P·(1 − f) did not hold what startup "
            "allocates after the KV pool (request table, draft, CUDA graphs)"
        )
    if t.ending.is_oom and cause in _SLOTS:
        return (
            "the KV pool had no free token slots for the batch (SGLang's allocator, not CUDA "
            "memory): lower max_running_requests so fewer tokens are admitted at once; a lower "
            "mem_fraction_static makes the pool smaller, not safer"
        )
    if t.ending.is_oom and cause in _LAST_REQUEST:
        return (
            "the KV pool could not hold the last decoding request even after retracting the "
            "others: it is smaller than that request's context; raise mem_fraction_static, or "
            "lower --context-length or the workload's longest prompt"
        )
    if t.ending.is_oom:
        return (
            "lower mem_fraction_static: the transient peak under load exceeded the free memory; "
            "a smaller chunked_prefill_size or max_running_requests lowers the peak itself"
        )
    if t.ending.fails_at_startup:
        return (
            "see the server's log (`autotune ledger LOG`): the flags in [server.flags] may not "
            "fit this SGLang, box or model"
        )
    if t.kind == "infeasible":
        return _constraint(t)
    if t.ending.is_crash:
        return (
            "see the server's log (`autotune ledger LOG`): it crashed for a reason other than "
            "memory"
        )
    return ""


def _host_cache_too_small(t: TrialView) -> str:
    led = t.ledger
    sizes = ""
    if led.host_cache_tokens is not None and led.max_total_num_tokens is not None:
        sizes = (
            f" ({led.host_cache_tokens:,} host tokens for {led.max_total_num_tokens:,} on the GPU)"
        )
    return (
        f"the host cache is smaller than the device KV pool{sizes}: raise hicache_size (host GB "
        "per rank) above the pool's size, or set hicache_size = 0 to run without it"
    )


def _constraint(t: TrialView) -> str:
    broke = set(t.violated)
    left = t.free_at_peak_gib
    at = f": {left:.2f} GiB were free at the worst moment" if left is not None else ""
    allowed = _input_cap(t) if Constraint.ERROR_RATE in broke else None
    if allowed is not None:
        capped = (
            f"the KV pool capped the prompt at {allowed:,} tokens and SGLang refused the "
            "workload's longer prompts (`Input length … exceeds the maximum allowed length`)"
        )
        if Constraint.HEADROOM in broke:
            return (
                f"{capped}, while the headroom was short too{at}: no fraction gives both on "
                "this box; shorten [workload] input_len or lower max_running_requests"
            )
        return (
            f"{capped}: raise mem_fraction_static until the pool holds them, or shorten "
            "[workload] input_len"
        )
    if Constraint.HEADROOM in broke:
        return (
            f"lower mem_fraction_static{at}; each step of 0.01 hands about P × 0.01 GiB "
            "back from the KV pool"
        )
    if Constraint.ERROR_RATE in broke:
        return "requests failed under load: read the server's log; lower max_running_requests"
    if broke & {Constraint.P99_TTFT, Constraint.P99_ITL}:
        return "too slow for the latency limits: lower max_running_requests or chunked_prefill_size"
    return ""


_ALLOWED = re.compile(r"exceeds the maximum allowed length \((\d+) tokens\)")


def _input_cap(t: TrialView) -> int | None:
    """The prompt length SGLang allowed, where a failed request's evidence shows it refused a
    longer one and the cap is the KV pool's (`max_req_input_len` is the pool less one where the
    pool is smaller than the context), else None."""
    pool = t.ledger.max_total_num_tokens
    for line in t.evidence:
        m = _ALLOWED.search(line)
        if m and pool is not None and int(m.group(1)) <= pool:
            return int(m.group(1))
    return None
