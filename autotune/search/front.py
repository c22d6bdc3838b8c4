"""Which throughput launches can change the capacity/throughput front, judged before they run.

Once the capacity edge is known the planner's `explore` rule spends launches on throughput, and
on a box like the operator's every launch costs half an hour (ten minutes of startup and the
workload). A launch is worth that only where it can add a point to the front that is not a tie
with one already held:

* **more max_running_requests**: decode throughput grows with the running batch and saturates.
  A decode step costs a fixed part (the weights read once per step, the launch of the captured
  CUDA graph) and a part per running sequence (its KV reads, its sampling), so a batch of `r`
  sequences yields about `T(r) = r / (a + b·r)` tokens per second; SGLang's scheduler admits
  a request only to a free row of the request table, which holds `max_running_requests` rows
  (`srt/managers/scheduler.py`, `Scheduler.get_num_allocatable_reqs`). `fit_throughput`
  fits `1/T = a/r + b` by least squares to the launches that held, once two request counts are
  measured, and `gain` says how much more a candidate is predicted to serve than every held
  launch of at least its capacity. Without a fit, more requests are taken as no slower (the
  same law with any positive `a`, `b`), so of two candidates of equal capacity the one with
  more requests is the only one that can be on the front.
* **an axis the law does not cover** (the host cache, the prefill chunk): one probe measures
  it; where the probe served within `FRONT_GAIN` of the launch it departs from, at no more
  capacity, the axis shows no effect worth a launch and its other values are left (`no_effect`).

`FRONT_GAIN` is the export's own tie: `autotune export` takes, among the launches within 5% of
the best throughput, the one with the most capacity (`review.winner`, `DEFAULT_TOLERANCE`), so
a front point less than 5% faster than a launch of at least its capacity cannot become what is
exported, and a difference that small is within the run-to-run noise of a serving benchmark.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

FRONT_GAIN = 0.02
"""A throughput launch is worth its hours when it is predicted to serve this much more than
every held launch of at least its capacity: less is within the run-to-run noise of a serving
benchmark (the benchmark's front counts a point held at 98% of its throughput)."""
SAME_TOKENS = 0.01
"""Capacities within this share of each other are a tie on the front (the benchmark's front
counts a point held at 99% of its capacity)."""


@dataclass(frozen=True)
class ThroughputFit:
    """`T(r) = r / (a + b·r)`: tokens per second at `r` running requests (`a` > 0, `b` ≥ 0)."""

    a: float
    b: float

    def at(self, requests: float) -> float:
        """The predicted throughput at `requests` max_running_requests."""
        return requests / (self.a + self.b * requests)


def fit_throughput(measured: Sequence[tuple[int, float]]) -> ThroughputFit | None:
    """The saturating law fitted to (max_running_requests, tokens/s) of launches that held: the
    mean per request count, then least squares of `1/T` on `1/r`. None with fewer than two
    request counts, or where the launches say throughput falls with requests (the law has
    nothing to say then, and every candidate stays worth its probe)."""
    by: dict[int, list[float]] = {}
    for r, t in measured:
        if r > 0 and t > 0:
            by.setdefault(r, []).append(t)
    if len(by) < 2:
        return None
    xs = [1.0 / r for r in by]
    ys = [len(ts) / sum(ts) for ts in by.values()]  # 1 / mean throughput
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    a = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    if a <= 0:
        return None
    b = max(my - a * mx, 0.0)
    return ThroughputFit(a, b)


def gain(tokens: float, throughput: float, held: Sequence[tuple[int, float]]) -> float:
    """How much more `throughput` is than the fastest held (tokens, throughput) with at least
    `tokens` (within `SAME_TOKENS`), as a share: 1.0 (all of it new) where none holds as much."""
    ref = max((t for c, t in held if c >= (1 - SAME_TOKENS) * tokens and t > 0), default=0.0)
    return throughput / ref - 1.0 if ref > 0 else 1.0


def dominated(requests: float, tokens: float, others: Sequence[tuple[float, float]]) -> bool:
    """Whether a candidate of `requests` and `tokens` is off the front by the law alone: another
    (requests, tokens) has more requests (no less throughput) and a capacity no smaller
    (within `SAME_TOKENS`)."""
    return any(r > requests and c >= (1 - SAME_TOKENS) * tokens for r, c in others)


def no_effect(origin: tuple[int, float], probes: Sequence[tuple[int, float]]) -> bool:
    """Whether the (tokens, throughput) probes of one axis, each departing from the launch
    `origin` in that axis alone, show it moves neither: each within `FRONT_GAIN` of its
    throughput and none holding more capacity (False with no probe yet)."""
    tokens, throughput = origin
    if not probes or throughput <= 0:
        return False
    return all(
        abs(t / throughput - 1.0) < FRONT_GAIN and c <= (1 + SAME_TOKENS) * tokens
        for c, t in probes
    )
