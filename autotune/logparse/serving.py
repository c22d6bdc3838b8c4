"""What the Prefill/Decode lines say about a server under load, summed up.

The batch lines are a time series (running and queued requests, token usage, throughput, CUDA
graph on/off, speculative accept length and rate, 0.5.18+'s pending prefill tokens); retractions
and per-request OOM aborts come as their own lines. `summarize` folds
them into the few figures a trial record or a log reader wants. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from autotune.logparse.lines import Batch, Event, Kind


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
    retractions: int
    max_pending_tokens: int | None = None
    """0.5.18+'s `#pending-token`: prefill tokens waiting to be scheduled, at their peak."""
    mean_accept_rate: float | None = None
    oom_aborts: int = 0
    """Requests aborted because even a lone decode request did not fit (the server lives)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _peak(values: Iterable[float | int | None]) -> Any:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def summarize(batches: Sequence[Batch], events: Iterable[Event] = ()) -> ServingSummary:
    decode = [b for b in batches if b.phase == "decode"]
    prefill = [b for b in batches if b.phase == "prefill"]
    graphs = [b.cuda_graph for b in decode if b.cuda_graph is not None]
    accepts = [b.accept_len for b in decode if b.accept_len is not None]
    rates = [b.accept_rate for b in decode if b.accept_rate is not None]
    events = tuple(events)
    retracted = sum(int(e.values.get("retracted", 0)) for e in events if e.kind is Kind.RETRACT)
    retracted += sum(b.retracted or 0 for b in batches)
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
        retractions=retracted,
        max_pending_tokens=_peak(b.pending_tokens for b in prefill),
        mean_accept_rate=round(sum(rates) / len(rates), 3) if rates else None,
        oom_aborts=sum(1 for e in events if e.kind is Kind.REQUEST_OOM_ABORT),
    )
