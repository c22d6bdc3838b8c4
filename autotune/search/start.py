"""The planner's choices before any launch showed a KV pool: nothing to fit a model to yet.

Until a launch reports its pool there is no memory model, so the first launches are placed by
the range and by which way the failures push: `start` a conservative point, `up` above every
pool that found no room (its ledger says how far), `down` below every launch that ran out of
memory, or the untried combinations, the least memory first, when mem_fraction_static is not
searched. `nothing_between` is the closing reason when the failures leave no fraction of the
range, worded the same for the walk-down baseline, which reaches that end by its own walk.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

from autotune.config.schema import Scalar
from autotune.config.space import PointKey
from autotune.search.points import (
    FRACTION,
    HICACHE,
    Point,
    fmt,
    host_failure,
    key_of,
)
from autotune.search.proposal import Proposal
from autotune.search.retries import not_memory, retry_once, retry_why


def without_model(
    axes: Mapping[str, Sequence[Scalar]],
    names: Sequence[str],
    known: Sequence[Point],
    pending: Sequence[Mapping[str, Scalar]],
) -> Proposal:
    """The next setting while no launch showed a KV pool: the end after a streak of failures not
    about memory, a retry of one such failure, the bracket the memory failures leave, or the
    conservative start nearest a quarter up the fraction range that is not taken."""
    base: dict[str, Scalar] = {n: _start_value(n, axes[n]) for n in names}
    if known or pending:
        source = known[-1].params if known else pending[0]
        base.update({k: v for k, v in source.items() if k in axes and k != FRACTION})
    taken = {key_of(p.params, names) for p in known if not retry_once(p, known)}
    taken |= {key_of(p, names) for p in pending}
    report = not_memory(known)
    if report is not None:
        return Proposal(dict(base), "confirm", report, done=report)
    retry = next((p for p in reversed(known) if retry_once(p, known)), None)
    if retry is not None and key_of(retry.params, names) not in {key_of(p, names) for p in pending}:
        params = {k: v for k, v in retry.params.items() if k in axes}
        return Proposal(params, "retry", retry_why(retry))
    if FRACTION not in axes:
        return _untried(axes, names, base, taken, nothing_started=bool(known))
    fractions = sorted(float(v) for v in axes[FRACTION])
    if fractions and any(p.too_low or p.memory_failure for p in known):
        return _bracket(base, names, fractions, known, taken)
    params = dict(base)
    start = params.get(FRACTION)
    if isinstance(start, float | int) and not isinstance(start, bool):
        # nearest to the conservative start first, lower before higher
        for f in sorted(fractions, key=lambda f: (abs(f - float(start)), f)):
            params[FRACTION] = f
            if key_of(params, names) not in taken:
                break
    return Proposal(params, "start", "no launch recorded yet: a conservative first setting")


FLOOR_SHARE = 0.1
"""Above a pool that found no room, the first launch leaves this share of the window between
the lowest fraction that holds a pool and 1 to the pool: the reserve keeps 90% of what the
weights left free for the request table, the workspaces, CUDA graphs and the peak."""


def _bracket(
    base: Mapping[str, Scalar],
    names: Sequence[str],
    fractions: Sequence[float],
    known: Sequence[Point],
    taken: set[PointKey],
) -> Proposal:
    """Nothing started yet, and the failures say which way: above every pool that found no room
    (the ledger's `1 − A/P` gives the lowest fraction that holds one, so one such failure is
    enough to jump there), below every launch that ran out of memory."""
    floor = max((f for p in known if (f := p.floor) is not None), default=None)
    high = [
        p.observation.setting.mem_fraction
        for p in known
        if p.memory_failure and p.observation is not None and host_failure(p.observation) is None
    ]
    ceiling = min(high, default=None)
    inside = [
        f
        for f in fractions
        if (floor is None or f > floor + 1e-9)
        and (ceiling is None or f < ceiling - 1e-9)
        and key_of({**base, FRACTION: f}, names) not in taken
    ]
    if not inside:
        done = nothing_between(floor, ceiling, fractions, known)
        return Proposal(dict(base), "confirm", done, done=done)
    if floor is None:
        assert ceiling is not None
        pick = inside[len(inside) // 2]
        why = f"{FRACTION} {fmt(ceiling)} ran out of memory at startup; halfway down to {fmt(pick)}"
        return Proposal({**base, FRACTION: pick}, "down", why)
    target = floor + FLOOR_SHARE * (1.0 - floor)
    if ceiling is not None:
        target = min(target, (floor + ceiling) / 2)
    pick = next((f for f in inside if f >= target - 1e-9), inside[-1])
    low = max(p.observation.setting.mem_fraction for p in known if p.too_low and p.observation)
    why = (
        f"{FRACTION} {fmt(low)} left no room for the KV pool (the fraction was too low, not too "
        f"high): its ledger puts the lowest fraction that holds a pool at {floor:.4f}; up to "
        f"{fmt(pick)}, which keeps most of the memory the weights left for the reserve"
    )
    return Proposal({**base, FRACTION: pick}, "up", why)


def nothing_between(
    floor: float | None, ceiling: float | None, fractions: Sequence[float], known: Sequence[Point]
) -> str:
    """The closing reason when no fraction of the range is left, in the failures' own terms."""
    if floor is not None and ceiling is None:
        o = next(p.observation for p in known if p.too_low and p.observation)
        led = o.ledger
        left = (
            f": the weights leave {led.avail_after_weights_gib:.2f} of {led.p_gib:.2f} GiB free"
            if led.avail_after_weights_gib is not None and led.p_gib is not None
            else ""
        )
        return (
            f"no {FRACTION} in the range holds a KV pool{left}, which needs {FRACTION} above "
            f"{floor:.4f} (the highest searched is {fmt(max(fractions))}); raise the range's top, "
            "or spread the weights over more GPUs"
        )
    if ceiling is not None and floor is None:
        return f"even the lowest {FRACTION} ({fmt(min(fractions))}) runs out of memory"
    return (
        f"no {FRACTION} is left between {floor:.4f} (below it the KV pool finds no room) and "
        f"{fmt(ceiling)} (at and above it startup runs out of memory)"
    )


def _untried(
    axes: Mapping[str, Sequence[Scalar]],
    names: Sequence[str],
    base: dict[str, Scalar],
    taken: set[PointKey],
    *,
    nothing_started: bool,
) -> Proposal:
    """mem_fraction_static is not searched (fixed, or SGLang's own choice) and no launch showed a
    KV pool yet: the conservative start, then untried combinations, the least memory first."""
    if key_of(base, names) not in taken:
        return Proposal(base, "start", "no launch recorded yet: a conservative first setting")
    ordered = [sorted(axes[n], key=_order) for n in names]
    for combo in itertools.product(*ordered):
        params = dict(zip(names, combo, strict=True))
        if key_of(params, names) not in taken:
            why = "an untried combination, the least memory first"
            if nothing_started:
                why = f"nothing started yet at the fixed {FRACTION}; {why}"
            return Proposal(params, "down", why)
    if nothing_started:
        done = "no combination of the searched parameters starts"
        return Proposal(base, "confirm", "nothing starts", done=done)
    return Proposal(base, "start", "every combination is taken by another worker: the start again")


def _order(v: Scalar) -> tuple[str, Scalar]:
    return (str(type(v)), v)


def _start_value(name: str, values: Sequence[Scalar]) -> Scalar:
    ordered = sorted(values, key=_order)
    if name == FRACTION:
        return ordered[len(ordered) // 4]
    if name == HICACHE and 0 in ordered:
        return 0
    return ordered[len(ordered) // 2]
