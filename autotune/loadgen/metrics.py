"""What users felt: per-request records in, a summary out, with bench_serving's definitions.

Pure functions over `RequestRecord`s (reference §6, `calculate_metrics`):
- only successful requests count toward throughput and latency; a failed request adds 0 output;
- request/input/output/total throughput = completed, Σinput, Σoutput, Σ(input+output) per second
  of phase duration;
- TTFT = time from send to the first chunk with non-empty text; E2E = send to end of response;
- ITL = every inter-chunk gap, split evenly over the chunk's new tokens (native API);
- TPOT per request = (E2E − TTFT) / (output_tokens − 1), only for output_tokens > 1;
- mean with numpy's mean, p50 with numpy's median, p90/p99 with numpy's default (linear)
  percentile; `concurrency` = ΣE2E / duration; peak output tokens/s over 1-second buckets.
Unlike bench_serving an empty list gives None, never 0. Extras bench_serving lacks: error rate,
goodput under SLOs (a request is good when TTFT, TPOT and E2E are all within their limits), peak
concurrency (most requests in flight at once, failed ones included) and client lag (actual minus
scheduled send) with a coordinated-omission flag.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

UNFINISHED = "unfinished"
ENDED_EARLY = f"{UNFINISHED}: ended early"
"""How a request cancelled by its phase's early end (`loadgen.earlyend`) is recorded: unfinished,
but the tokens it streamed before the end count towards the phase's throughput, which is then
the rate the server generated at until the end, with no drain's tail."""
EXAMPLE_CHARS = 200
"""How much of each kind's first error message a summary keeps (`Summary.error_examples`)."""
LAG_THRESHOLD_S = 0.025  # a request sent this much later than scheduled was held up by the client


@dataclass(frozen=True)
class RequestRecord:
    """One request, times in seconds since the workload started (`*_s`) or durations."""

    phase: str
    index: int
    scheduled_s: float
    sent_s: float | None  # None: never sent
    end_s: float | None  # when the response ended, or the request failed
    ttft: float | None
    itl: Sequence[float]  # seconds; the driver stores an array('d') to keep long runs small
    e2e: float | None  # None unless it succeeded
    input_tokens: int
    output_tokens: int
    error: str | None = None
    session: int | None = None
    turn: int = 0

    @property
    def ok(self) -> bool:
        """Whether the request succeeded (no error): only those count toward throughput and
        latency."""
        return self.error is None

    def to_dict(self) -> dict[str, object]:
        """The record as JSON values, one line of the per-request file."""
        d = asdict(self)
        d["itl"] = list(self.itl)
        return d


@dataclass(frozen=True)
class Slo:
    """Latency limits for goodput, in milliseconds; None means no limit on that metric."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    def met_by(self, r: RequestRecord) -> bool:
        """Whether `r` succeeded within every limit set (TTFT, TPOT, E2E): a good request for
        goodput."""
        if not r.ok or r.ttft is None or r.e2e is None:
            return False
        if self.ttft_ms is not None and r.ttft * 1000 > self.ttft_ms:
            return False
        tpot = tpot_of(r)
        if self.tpot_ms is not None and tpot is not None and tpot * 1000 > self.tpot_ms:
            return False
        return not (self.e2e_ms is not None and r.e2e * 1000 > self.e2e_ms)


@dataclass(frozen=True)
class Stats:
    """Distribution of one latency, in milliseconds."""

    mean: float
    p50: float
    p90: float
    p99: float
    max: float
    count: int

    @staticmethod
    def of_seconds(values: Sequence[float] | np.ndarray) -> Stats | None:
        """The distribution of `values` (seconds) in milliseconds, with numpy's mean, median and
        linear percentiles as bench_serving takes them; None for no values, never zeros."""
        if len(values) == 0:
            return None
        a = np.asarray(values, dtype=np.float64) * 1000.0
        return Stats(
            mean=float(np.mean(a)),
            p50=float(np.median(a)),
            p90=float(np.percentile(a, 90)),
            p99=float(np.percentile(a, 99)),
            max=float(np.max(a)),
            count=len(values),
        )


@dataclass(frozen=True)
class Summary:
    """One phase's (or the whole workload's) figures; `*_ms` are Stats in milliseconds."""

    duration_s: float
    requests: int
    completed: int
    failed: int
    unfinished: int  # cut by the phase's time limit mid-stream; not in requests or failed
    error_rate: float | None  # failed / requests
    errors: dict[str, int]
    error_examples: dict[str, str]  # the first message of each kind in `errors`
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    input_throughput: float
    output_throughput: float
    total_throughput: float
    ttft_ms: Stats | None
    itl_ms: Stats | None
    tpot_ms: Stats | None
    e2e_ms: Stats | None
    concurrency: float
    peak_concurrency: int
    max_output_tokens_per_s: int
    goodput: float | None  # good requests per second; None without SLOs
    good_fraction: float | None  # good / all requests
    lag_ms: Stats | None
    lagged_fraction: float | None  # share of sent requests later than LAG_THRESHOLD_S
    capped_arrivals: int  # open-loop arrivals that waited for a free slot
    coordinated_omission: bool

    def to_dict(self) -> dict[str, object]:
        """The summary as JSON values, NaN and infinities made null so the file stays strict
        JSON."""
        safe = _json_safe(asdict(self))
        assert isinstance(safe, dict)
        return safe


def tpot_of(r: RequestRecord) -> float | None:
    """`r`'s time per output token after the first, (E2E − TTFT) / (output − 1) as bench_serving
    defines it; None with one output token or less."""
    if r.ttft is None or r.e2e is None or r.output_tokens <= 1:
        return None
    return (r.e2e - r.ttft) / (r.output_tokens - 1)


def error_kind(error: str) -> str:
    """The class of an error message: the text before the first colon, at most 60 chars."""
    return error.split(":", 1)[0][:60]


OVERLOAD_STATUSES = frozenset({408, 429, 503})
"""HTTP statuses a server answers when it is busy, draining or timing a request out: load, not
a refusal of the request itself."""
_REFUSAL_KINDS = ("aborted", "server error", "bad response", "bad stream chunk", "empty response")


def refused(error: str) -> bool:
    """Whether a request's error is the server's own answer refusing or breaking it: an HTTP
    error status other than overload (`OVERLOAD_STATUSES`), an abort or an error object in the
    stream, a malformed or empty answer. Not a timeout, a connection failure or a cut: those come
    from the load, a death or the harness."""
    kind = error_kind(error)
    if kind.startswith("HTTP "):
        code = kind[5:]
        return code.isdigit() and int(code) >= 400 and int(code) not in OVERLOAD_STATUSES
    return kind in _REFUSAL_KINDS


def peak_concurrency(records: Sequence[RequestRecord]) -> int:
    """Most requests in flight at once, from send to end (ends sort before starts at a tie)."""
    events: list[tuple[float, int]] = []
    for r in records:
        if r.sent_s is not None and r.end_s is not None:
            events.append((r.sent_s, 1))
            events.append((r.end_s, -1))
    events.sort()
    peak = current = 0
    for _, step in events:
        current += step
        peak = max(peak, current)
    return peak


def max_output_tokens_per_s(records: Sequence[RequestRecord]) -> int:
    """Most tokens produced in one wall-clock second (first token at TTFT, then each ITL)."""
    times = [
        r.sent_s + r.ttft + np.concatenate(([0.0], np.cumsum(np.asarray(r.itl, dtype=np.float64))))
        for r in records
        if r.ok and r.sent_s is not None and r.ttft is not None
    ]
    if not times:
        return 0
    _, counts = np.unique(np.floor(np.concatenate(times)), return_counts=True)
    return int(counts.max())


def _all_itls(records: Sequence[RequestRecord]) -> np.ndarray:
    parts = [np.asarray(r.itl, dtype=np.float64) for r in records if len(r.itl)]
    return np.concatenate(parts) if parts else np.empty(0)


def summarize(
    records: Sequence[RequestRecord],
    duration_s: float,
    slo: Slo | None = None,
    *,
    capped_arrivals: int = 0,
    lag_threshold_s: float = LAG_THRESHOLD_S,
) -> Summary:
    """The summary of `records` over a measured wall time of `duration_s` seconds.

    Requests cut by the phase's time limit while their tokens were still arriving (error
    "unfinished: ...") are neither successes nor failures: they count in `unfinished` only.
    Those cut by an early end (`ENDED_EARLY`) also add the output tokens they streamed to
    `output_throughput` and `total_throughput` (generated inside the measured time).
    """
    all_records = records
    records = [r for r in all_records if not (r.error and r.error.startswith(UNFINISHED))]
    unfinished = len(all_records) - len(records)
    ok = [r for r in records if r.ok]
    failed = len(records) - len(ok)
    dur = duration_s if duration_s > 0 else math.nan
    total_in = sum(r.input_tokens for r in ok)
    total_out = sum(r.output_tokens for r in ok)
    cut = sum(r.output_tokens for r in all_records if r.error and r.error.startswith(ENDED_EARLY))
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    e2es = [r.e2e for r in ok if r.e2e is not None]
    tpots = [t for t in map(tpot_of, ok) if t is not None]
    itls = _all_itls(ok)
    lags = [r.sent_s - r.scheduled_s for r in all_records if r.sent_s is not None]
    lag_stats = Stats.of_seconds([max(0.0, x) for x in lags])
    lagged = sum(1 for x in lags if x > lag_threshold_s)
    lagged_fraction = lagged / len(lags) if lags else None
    good = sum(1 for r in ok if slo.met_by(r)) if slo is not None else None
    errors: Counter[str] = Counter()
    examples: dict[str, str] = {}
    for r in records:
        if r.error is not None:
            kind = error_kind(r.error)
            errors[kind] += 1
            examples.setdefault(kind, r.error[:EXAMPLE_CHARS])
    return Summary(
        duration_s=duration_s,
        requests=len(records),
        completed=len(ok),
        failed=failed,
        unfinished=unfinished,
        error_rate=failed / len(records) if records else None,
        errors=dict(errors.most_common(8)),
        error_examples={k: examples[k] for k, _ in errors.most_common(8)},
        total_input_tokens=total_in,
        total_output_tokens=total_out,
        request_throughput=_finite(len(ok) / dur),
        input_throughput=_finite(total_in / dur),
        output_throughput=_finite((total_out + cut) / dur),
        total_throughput=_finite((total_in + total_out + cut) / dur),
        ttft_ms=Stats.of_seconds(ttfts),
        itl_ms=Stats.of_seconds(itls),
        tpot_ms=Stats.of_seconds(tpots),
        e2e_ms=Stats.of_seconds(e2es),
        concurrency=_finite(sum(e2es) / dur),
        peak_concurrency=peak_concurrency(all_records),
        max_output_tokens_per_s=max_output_tokens_per_s(records),
        goodput=None if good is None else _finite(good / dur),
        good_fraction=None if good is None or not records else good / len(records),
        lag_ms=lag_stats,
        lagged_fraction=lagged_fraction,
        capped_arrivals=capped_arrivals,
        coordinated_omission=capped_arrivals > 0
        or (lag_stats is not None and lag_stats.p99 > lag_threshold_s * 1000),
    )


def _finite(x: float) -> float:
    return x if math.isfinite(x) else 0.0


def _json_safe(value: object) -> object:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value
