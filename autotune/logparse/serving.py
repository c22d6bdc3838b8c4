"""What the Prefill/Decode lines say about a server under load, summed up.

The batch lines are a time series (running and queued requests, token usage, throughput, CUDA
graph on/off, speculative accept length and rate, 0.5.18+'s pending prefill tokens); retractions,
per-request OOM aborts and handled out-of-memory fallbacks come as their own lines. `summarize`
folds them into the few figures a trial record or a log reader wants. Pure.

Retractions are the pool's own capacity signal: the scheduler found a decode batch that did not
fit and sent requests back to the queue (`scheduler.py` `update_running_batch`). They are
serving events, never an ending (`logparse.outcome`); many of them mean the pool runs at its
edge. Every rank of a tensor-parallel group prints the same retraction line, so one is counted
per data-parallel group and pipeline stage (`_one_per_group`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from autotune.logparse.events import Batch, Event, Kind
from autotune.logparse.prefix import split_prefix


@dataclass(frozen=True)
class ServingSummary:
    """Peaks over the batch lines; None where no line carried the field."""

    prefill_lines: int
    decode_lines: int
    max_running: int | None
    max_queued: int | None
    max_token_usage: float | None
    max_gen_throughput: float | None
    max_input_throughput: float | None
    cuda_graph_share: float | None  # decode lines that ran as a captured graph
    mean_accept_len: float | None
    retraction_events: int
    """How many times the scheduler retracted (one line per event, TP ranks counted once)."""
    retracted_requests: int
    """Requests those retractions sent back to the queue (their `#retracted_reqs`, summed)."""
    max_pending_tokens: int | None = None
    """0.5.18+'s `#pending-token`: prefill tokens waiting to be scheduled, at their peak."""
    mean_accept_rate: float | None = None
    oom_aborts: int = 0
    """Requests failed with the OOM error because even a lone decode request did not fit
    (0.5.23's `retract_decode: aborted last request … due to OOM`; an OOM ending)."""
    max_retracted_queue: int | None = None
    """A disaggregated decode server's `#retracted-req` (its queue of retracted requests), at
    its peak."""
    handled_ooms: int = 0
    """Out-of-memory messages SGLang logged and recovered from (a fallback, a retry, a skipped
    optional step): serving events, not endings."""
    max_swa_token_usage: float | None = None
    """A hybrid sliding-window pool's `swa token usage`, at its peak (`max_token_usage` is then
    the full-attention pool's `full token usage`)."""
    max_mamba_usage: float | None = None
    """A hybrid linear-attention model's `mamba usage` (its state slots in use), at its peak: the
    slots can run out before the KV pool does."""

    def to_dict(self) -> dict[str, Any]:
        """The summary as JSON values, for `trial.json` and the ledger's `--json`."""
        return asdict(self)


def _peak(values: Iterable[float | int | None]) -> Any:
    present = [v for v in values if v is not None]
    return max(present) if present else None


_PER_RANK_TAGS = ("TP", "EP", "ATTN_CP", "MOE_DP", "PID")
"""Tags that tell apart the ranks of one data-parallel group and pipeline stage (`PID<pid>`: the
process, where a custom logging config drops SGLang's tags, `logparse.prefix`)."""


def _one_per_group(events: Iterable[Event]) -> list[Event]:
    """The events of one kind with the copies other ranks of the same group printed dropped: one
    per time, data-parallel and pipeline tag, and message."""
    seen: set[tuple[float | None, str, str]] = set()
    out: list[Event] = []
    for e in events:
        group = " ".join(t for t in e.rank.split() if not t.startswith(_PER_RANK_TAGS))
        key = (e.time, group, split_prefix(e.text)[2].strip())
        if key not in seen:
            seen.add(key)
            out.append(e)
    return out


def summarize(batches: Sequence[Batch], events: Iterable[Event] = ()) -> ServingSummary:
    """The serving figures of a log's batch lines and its retraction, abort and handled-OOM events,
    retractions and aborts counted once per data-parallel group and pipeline stage."""
    decode = [b for b in batches if b.phase == "decode"]
    prefill = [b for b in batches if b.phase == "prefill"]
    graphs = [b.cuda_graph for b in decode if b.cuda_graph is not None]
    accepts = [b.accept_len for b in decode if b.accept_len is not None]
    rates = [b.accept_rate for b in decode if b.accept_rate is not None]
    events = tuple(events)
    retractions = _one_per_group(e for e in events if e.kind is Kind.RETRACT)
    aborts = _one_per_group(e for e in events if e.kind is Kind.REQUEST_OOM_ABORT)
    return ServingSummary(
        prefill_lines=len(prefill),
        decode_lines=len(decode),
        max_running=_peak(b.running for b in batches),
        max_queued=_peak(b.queued for b in batches),
        max_token_usage=_peak(b.token_usage for b in batches),
        max_gen_throughput=_peak(b.gen_throughput for b in decode),
        max_input_throughput=_peak(b.input_throughput for b in prefill),
        cuda_graph_share=round(sum(graphs) / len(graphs), 3) if graphs else None,
        mean_accept_len=round(sum(accepts) / len(accepts), 3) if accepts else None,
        retraction_events=len(retractions),
        retracted_requests=sum(int(e.values.get("retracted", 0)) for e in retractions),
        max_pending_tokens=_peak(b.pending_tokens for b in prefill),
        mean_accept_rate=round(sum(rates) / len(rates), 3) if rates else None,
        oom_aborts=len(aborts),
        max_retracted_queue=_peak(b.retracted for b in batches),
        handled_ooms=sum(1 for e in events if e.kind is Kind.OOM_HANDLED),
        max_swa_token_usage=_peak(b.swa_token_usage for b in batches),
        max_mamba_usage=_peak(b.mamba_usage for b in batches),
    )
