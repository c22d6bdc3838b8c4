"""When a phase has measured what it is for and may end early (`[workload] end_early`), as pure
functions over the phase's own samples.

A steady or Poisson phase measures the throughput and the least free GPU memory under a load
held steady; once its last `windows` windows agree within `tolerance` and the memory is not
still falling, more of the same load repeats the verdict (`steady_end`). A stress phase measures
the transient peak of a burst; once two rounds in a row ended alike with the same least free
memory within noise, a third round repeats it (`stress_end`). The phase's start
(`autotune.loadgen.phasestart`) samples the phase and asks these; the benchmark's night accounting
(`autotune.testing.night`) models when they fire.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autotune.config.workload import EarlyEnd


@dataclass(frozen=True)
class Window:
    """One window of a steady phase: when it ended (seconds since the phase started), the output
    tokens per second generated in it (streamed tokens of requests still running included), the
    requests completed by its end, and the least free GPU memory sampled in it (None: no
    reading)."""

    end_s: float
    throughput: float
    completed: int
    least_free_gib: float | None = None


@dataclass(frozen=True)
class Round:
    """One stress round: how many of its requests ended well and how many failed, and the least
    free GPU memory sampled while it ran (None: no reading)."""

    ok: int
    failed: int
    least_free_gib: float | None = None


def min_requests(rule: EarlyEnd, concurrency: int) -> int:
    """The completed requests a steady phase needs before it may end: the rule's figure, or
    (0) as many as it has clients, so that the queue a closed loop builds when its clients
    outnumber the server's request slots has turned over once (its TTFT includes a whole wait)."""
    return rule.min_requests or max(concurrency, 1)


def steady_end(windows: Sequence[Window], rule: EarlyEnd, concurrency: int) -> str | None:
    """Why a steady (or Poisson) phase may end now, or None while it must go on.

    It may end when all hold: the rule is enabled; the last window ended at least `min_s` into the
    phase; at least `min_requests(rule, concurrency)` requests completed; the throughput of the
    last `rule.windows` windows spans (max − min) at most `rule.tolerance` of their mean (a
    phase producing nothing never ends early); and the least free memory of the windows after the
    first of those is not below the least before them by more than `rule.headroom_tol_gib`
    (the memory under load is not still falling). Without GPU readings the memory test is not
    made."""
    k = rule.windows
    if not rule.enabled or len(windows) < k:
        return None
    last = windows[-1]
    if last.end_s < rule.min_s or last.completed < min_requests(rule, concurrency):
        return None
    recent = [w.throughput for w in windows[-k:]]
    mean = sum(recent) / k
    if mean <= 0:
        return None
    spread = (max(recent) - min(recent)) / mean
    if spread > rule.tolerance:
        return None
    before = [w.least_free_gib for w in windows[: -(k - 1)] if w.least_free_gib is not None]
    after = [w.least_free_gib for w in windows[-(k - 1) :] if w.least_free_gib is not None]
    memory = "no GPU reading"
    if before and after:
        fall = min(before) - min(after)
        if fall > rule.headroom_tol_gib:
            return None
        memory = f"least free memory {min(before + after):.2f} GiB, not falling"
    return (
        f"throughput within {rule.tolerance:.0%} over {k} windows of {rule.window_s:g} s "
        f"(spread {spread:.1%}, {mean:.0f} tok/s; {last.completed} requests); {memory}"
    )


def stress_end(rounds: Sequence[Round], rule: EarlyEnd) -> str | None:
    """Why a stress phase may skip its remaining rounds, or None while it must go on.

    It may when the rule is enabled and the last two rounds ended alike with every request well
    (a failing round is evidence the next one must show again), and their least free memory at the
    burst agrees within `rule.headroom_tol_gib` (or neither has a reading)."""
    if not rule.enabled or len(rounds) < 2:
        return None
    a, b = rounds[-2], rounds[-1]
    if a.failed or b.failed or a.ok != b.ok or a.ok == 0:
        return None
    if (a.least_free_gib is None) != (b.least_free_gib is None):
        return None
    if a.least_free_gib is not None and b.least_free_gib is not None:
        gap = abs(a.least_free_gib - b.least_free_gib)
        if gap > rule.headroom_tol_gib:
            return None
        peak = (
            f"least free memory at the burst {a.least_free_gib:.2f} and "
            f"{b.least_free_gib:.2f} GiB, within {rule.headroom_tol_gib:g} GiB"
        )
    else:
        peak = "no GPU reading"
    n = len(rounds)
    return f"peak repeated in rounds {n - 1} and {n} ({b.ok} requests ok; {peak})"
