"""Worlds drawn at random for the benchmark, and how far each departs from the memory model.

`scripts/bench_search.py --mismatch random` runs every study in a world of its own: the
simulator's `[mismatch]` keys (`autotune.sim.profiles.Mismatch`, docs/sim-profiles.md) drawn
from `RANGES`, seeded by the benchmark's world seed, the profile and the study's seed
(`world_seed`), so every sampler meets the same world on the same study and a run can be
repeated exactly. The draw is set on top of the profile's own `[mismatch]` table
(`autotune.testing.oracle.over`: a key drawn at its default keeps the profile's value).

`departure_gib` scores a world by the extra memory it asks of the baseline setting over one
trial beyond what the model assumes, in GiB; `bucket` sorts the scores into mild, moderate and
severe (`BUCKETS`).
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from autotune.sim.profiles import Mismatch
from autotune.sim.runtime import forward_mean_gib, growth_gib, student_cdf
from autotune.testing.oracle import (
    STRESS_CONTEXT,
    STRESS_FORWARDS,
    TRIAL_REQUESTS,
    Bench,
    plan_for,
)

TAIL_DOFS = (0, 3, 4, 5, 8)
"""The peak tails a world draws from, equally likely: normal (0) or Student-t with 3, 4, 5 or 8
degrees of freedom."""


@dataclass(frozen=True)
class Range:
    """A key's range: drawn uniformly from `low` to `high`."""

    low: float
    high: float


RANGES: dict[str, Range] = {
    "growth_mib_per_request": Range(0.0, 1.0),
    "rank_imbalance_gib": Range(0.0, 2.0),
    "context_mib_per_1k_tokens": Range(0.0, 10.0),
    "spike_probability": Range(0.0, 5e-4),
    "spike_factor": Range(0.0, 1.0),
}
"""The uniform ranges of the drawn keys (`peak_tail_dof` is drawn from `TAIL_DOFS`): up to 1 MiB
of allocator growth per request served, the last rank up to 2 GiB short, up to 10 MiB more peak
per 1,000 tokens of live context, up to one forward in 2,000 spiking, up to twice its draw."""

BUCKETS = (("mild", 1.0), ("moderate", 2.5), ("severe", math.inf))
"""A departure score below 1 GiB (twice the benchmark's required headroom) is mild, below 2.5
GiB moderate, severe above (the names in order, each with its upper bound). Over the 23 boxes
and seeds 0–9 of world seed 0 the scores run from 0.2 to 5.5 GiB, median 2.0: 39 mild, 118
moderate, 73 severe."""


def world_seed(base: int, profile: str, seed: int) -> int:
    """The seed of one study's world: from the benchmark's world seed, the profile's name and the
    study's seed (a hash, the same on every machine and every run)."""
    digest = hashlib.sha256(f"{base}:{profile}:{seed}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def draw_world(seed: int) -> Mismatch:
    """One world from `RANGES` and `TAIL_DOFS`, the same for the same seed."""
    rng = random.Random(seed)
    drawn = {name: rng.uniform(r.low, r.high) for name, r in RANGES.items()}
    dof = rng.choice(TAIL_DOFS)
    return Mismatch(
        growth_mib_per_request=round(drawn["growth_mib_per_request"], 3),
        rank_imbalance_gib=round(drawn["rank_imbalance_gib"], 3),
        peak_tail_dof=dof,
        context_mib_per_1k_tokens=round(drawn["context_mib_per_1k_tokens"], 2),
        spike_probability=float(f"{drawn['spike_probability']:.2e}"),
        spike_factor=round(drawn["spike_factor"], 3),
    )


def inside(world: Mismatch) -> bool:
    """Whether every key of `world` lies in its range (`RANGES`, `TAIL_DOFS`)."""
    ok = world.peak_tail_dof in TAIL_DOFS
    for name, r in RANGES.items():
        ok = ok and r.low <= getattr(world, name) <= r.high
    return ok


def describe(world: Mismatch) -> str:
    """`growth 0.41 MiB/req, rank −1.2 GiB, t5 tail, context 3.1 MiB/1k, spikes 2.1e-04 × 1.35`:
    the keys that are on, or `the model`."""
    parts = []
    if world.growth_mib_per_request:
        parts.append(f"growth {world.growth_mib_per_request:.2f} MiB/req")
    if world.rank_imbalance_gib:
        parts.append(f"rank -{world.rank_imbalance_gib:.2f} GiB")
    if world.peak_tail_dof:
        parts.append(f"t{world.peak_tail_dof} tail")
    if world.context_mib_per_1k_tokens:
        parts.append(f"context {world.context_mib_per_1k_tokens:.1f} MiB/1k")
    if world.spike_probability and world.spike_factor:
        parts.append(f"spikes {world.spike_probability:.1e} x {1 + world.spike_factor:.2f}")
    return ", ".join(parts) if parts else "the model"


@dataclass(frozen=True)
class Departure:
    """The extra memory a world asks of the baseline setting over one trial, by key (GiB)."""

    growth: float
    rank: float
    context: float
    tail: float
    spikes: float

    @property
    def total(self) -> float:
        """The departure score: the sum of the parts."""
        return self.growth + self.rank + self.context + self.tail + self.spikes


def departure(bench: Bench) -> Departure:
    """How far the bench's world (its profile's `[mismatch]`, the drawn keys included) departs
    from the model at the baseline setting, as the extra GiB it asks over one trial:

    growth: the allocator's growth over a trial's `TRIAL_REQUESTS` requests; rank: the last
    rank's shortfall (TP > 1; the pool is sized by it, the model reads rank 0); context: the
    live-context term at the stress batch's live tokens; tail: how far the worst of a stress
    phase's forwards (2 × `STRESS_FORWARDS`) lies above a normal tail's worst, at the prefill
    chunk's mean peak; spikes: the chance a stress phase meets a spike times the spike's extra
    peak. Zero for the model itself."""
    prof = bench.profile
    w = prof.mismatch
    plan = plan_for(bench, bench.search.baseline)
    chunk = plan.chunked_prefill_size or 0
    r = plan.max_running_requests or 1
    live = min(plan.max_total_num_tokens or 0, r * STRESS_CONTEXT)
    mean = forward_mean_gib(prof, chunk, 0, 0)
    context = forward_mean_gib(prof, chunk, 0, live) - mean
    peak = mean + context
    n = 2 * STRESS_FORWARDS
    q = 1.0 - 1.0 / n
    sd = prof.activation.variation * peak
    tail = 0.0
    if w.peak_tail_dof > 0 and sd > 0:
        tail = (_student_z(q, w.peak_tail_dof) - _normal_z(q)) * sd
    spikes = (1.0 - (1.0 - w.spike_probability) ** n) * w.spike_factor * peak
    return Departure(
        growth=growth_gib(prof, TRIAL_REQUESTS),
        rank=w.rank_imbalance_gib if prof.hardware.gpu_count > 1 else 0.0,
        context=context,
        tail=max(tail, 0.0),
        spikes=spikes,
    )


def bucket(score_gib: float) -> str:
    """The name of the bucket a departure score falls in (`BUCKETS`)."""
    return next(name for name, upper in BUCKETS if score_gib < upper)


def _normal_z(q: float) -> float:
    return _solve(lambda z: 0.5 * (1.0 + math.erf(z / math.sqrt(2.0))), q)


def _student_z(q: float, dof: int) -> float:
    """The `q` quantile of a Student-t with `dof` degrees of freedom scaled to unit sd (as
    `autotune.sim.runtime` draws it)."""
    scale = math.sqrt((dof - 2.0) / dof)
    return _solve(lambda z: student_cdf(z / scale, dof), q)


def _solve(cdf: Callable[[float], float], q: float) -> float:
    lo, hi = 0.0, 100.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if cdf(mid) < q:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2
