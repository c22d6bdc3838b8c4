"""A launch as the planner sees it, and the memory order between settings.

`Point` is one finished trial (with its `Observation`) or one another worker is running;
`setting_of` maps parameters to the memory-relevant `Setting`; `needs_more` says whether one
setting needs at least the memory of another of the kind that failed, which is what lets a
failure rule out everything beyond it without a model. The planner's rules compare launches by
the same order: `more_demand`, `less_demand` and `same_gpu` (the GPU memory a setting asks for
besides its fraction), `best_of` (the most capacity, the fastest within launch jitter) and
`key_of` (a point's identity on the searched parameters); they are here, below every rule
module, so that each rule reads one definition of them.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from autotune.config.schema import CHUNK, FRACTION, HICACHE, MEMORY_CONSTRAINTS, REQUESTS, Scalar
from autotune.config.space import PointKey, point_key
from autotune.logparse.outcome import Outcome
from autotune.memory.model import Observation, Setting
from autotune.record.direction import Push, floor_fraction, push_of

__all__ = [
    "CHUNK",
    "FRACTION",
    "HICACHE",
    "MEMORY_CONSTRAINTS",
    "MEMORY_PARAMS",
    "REQUESTS",
    "SAME_CAPACITY",
    "Point",
    "Push",
    "best_of",
    "fmt",
    "host_failure",
    "key_of",
    "less_demand",
    "more_demand",
    "needs_more",
    "num",
    "push_for",
    "same_gpu",
    "setting_of",
    "tokens_of",
]

MEMORY_PARAMS = (FRACTION, REQUESTS, CHUNK, HICACHE)
"""The parameters the memory model knows; the searches act on these and sample the rest."""
_HOST_KILLED = "scheduler is dead"
SAME_CAPACITY = 0.002
"""Launches of one fraction differ by launch jitter (a few hundred tokens); this much is a tie."""


@dataclass(frozen=True)
class Point:
    """One launch as the planner sees it: finished (with an observation) or pending."""

    number: int
    params: Mapping[str, Scalar]
    observation: Observation | None = None
    throughput: float = 0.0
    violated: frozenset[str] = frozenset()
    """Names of the constraints it broke."""
    repeats: int = 1
    """How many stress passes the launch ran (`keys.STRESS_REPEATS`): a launch that held counts
    as that many holds."""

    @property
    def feasible(self) -> bool:
        """Whether the launch finished and met every constraint (a pending one is not, yet)."""
        return self.observation is not None and self.observation.feasible

    @property
    def push(self) -> Push:
        """Which way this launch's failure pushes the settings (`record.direction`); NONE for
        one that held, or one still running."""
        o = self.observation
        if o is None or o.feasible:
            return Push.NONE
        return push_for(o, self.violated)

    @property
    def memory_failure(self) -> bool:
        """A failure that rules out every setting needing at least as much memory of its kind:
        GPU memory (the fraction was too high) or host RAM (the host cache was the wrong size).
        A pool that found no room (`too_low`) rules out the other side instead."""
        return self.push in (Push.LOWER, Push.SHRINK_HOST, Push.GROW_HOST)

    @property
    def too_low(self) -> bool:
        """The fraction was too low: no room for the KV pool at it, nor at any fraction below."""
        return self.push is Push.RAISE

    @property
    def floor(self) -> float | None:
        """For a launch whose pool found no room: the lowest fraction that can hold one (from its
        ledger, never below the fraction it ran at); None otherwise."""
        o = self.observation
        if o is None or not self.too_low:
            return None
        f = floor_fraction(o.ledger, o.reason)
        return max(f, o.setting.mem_fraction) if f is not None else o.setting.mem_fraction


def setting_of(params: Mapping[str, Scalar]) -> Setting | None:
    """The memory-relevant `Setting` of `params`; None without a numeric `mem_fraction_static`,
    which the memory order and the model cannot place."""
    f = params.get(FRACTION)
    if not isinstance(f, int | float) or isinstance(f, bool):
        return None
    r = params.get(REQUESTS)
    c = params.get(CHUNK)
    h = params.get(HICACHE, 0)
    return Setting(
        mem_fraction=float(f),
        max_running_requests=int(r)
        if isinstance(r, int | float) and not isinstance(r, bool)
        else None,
        chunked_prefill_size=int(c)
        if isinstance(c, int | float) and not isinstance(c, bool)
        else None,
        hicache_gb=float(h) if isinstance(h, int | float) and not isinstance(h, bool) else 0.0,
    )


def needs_more(s: Setting, other: Setting, *, host: str | None = None) -> bool:
    """Whether s needs at least the memory of `other` of the kind that failed: GPU memory
    (same or higher fraction, requests and chunk), or host memory (`host` from `host_failure`)."""
    if host == "too_big":
        return s.hicache_gb >= other.hicache_gb > 0
    if host == "too_small":
        return 0 < s.hicache_gb <= other.hicache_gb and s.mem_fraction >= other.mem_fraction
    slots = s.max_running_requests
    oslots = other.max_running_requests
    if slots is not None and oslots is not None and slots < oslots:
        return False
    c, oc = s.chunked_prefill_size, other.chunked_prefill_size
    if c is not None and oc is not None and c < oc:
        return False
    return s.mem_fraction >= other.mem_fraction


def push_for(o: Observation, violated: Collection[str] = ()) -> Push:
    """`record.direction.push_of` for one observation; a rank that died while a host cache was
    being pinned (0.5.9's `Rank i scheduler is dead`, older records without the cause) is the
    host's OOM killer."""
    if o.feasible:
        return Push.NONE
    push = push_of(o.outcome, o.reason, violated, o.ledger)
    if (
        push is Push.NONE
        and o.setting.hicache_gb > 0
        and Outcome.of(o.outcome).fails_at_startup
        and _HOST_KILLED in o.reason
    ):
        return Push.SHRINK_HOST
    return push


def host_failure(o: Observation) -> str | None:
    """ "too_big" when the host cache did not fit in RAM, "too_small" when it was not bigger than
    the GPU pool, None for a failure that was not about the host cache."""
    if o.setting.hicache_gb <= 0:
        return None
    push = push_for(o)
    if push is Push.SHRINK_HOST:
        return "too_big"
    if push is Push.GROW_HOST:
        return "too_small"
    return None


def tokens_of(p: Point | None) -> int:
    """The KV pool tokens `p`'s launch showed; 0 for none, a pending launch, or one that showed no
    pool."""
    if p is None or p.observation is None:
        return 0
    return p.observation.tokens or 0


def num(v: Scalar | None) -> float:
    """A parameter value as a float for ordering (0 for a missing, boolean or non-numeric value)."""
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0.0


def fmt(v: Scalar | None) -> str:
    """A parameter value as the why prints it: floats in `%g`."""
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def key_of(params: Mapping[str, Scalar], names: Iterable[str]) -> PointKey:
    """The identity of `params` on the searched `names` (`config.space.point_key`)."""
    return point_key(params).only(names)


def best_of(points: Sequence[Point]) -> Point | None:
    """The most capacity; among launches within launch jitter of it, the fastest."""
    top = max((tokens_of(p) for p in points), default=0)
    level = [p for p in points if tokens_of(p) >= top * (1 - SAME_CAPACITY)]
    return max(level, key=lambda p: (p.throughput, tokens_of(p)), default=None)


def more_demand(a: Setting, b: Setting) -> bool:
    """a asks for more request slots or a bigger prefill chunk than b."""
    ra, rb = a.max_running_requests, b.max_running_requests
    ca, cb = a.chunked_prefill_size, b.chunked_prefill_size
    if ra is not None and rb is not None and ra > rb:
        return True
    return ca is not None and cb is not None and ca > cb


def less_demand(a: Setting, b: Setting) -> bool:
    """a needs less transient and graph memory than b: no more requests and no bigger chunk,
    and less of one of them."""
    ra, rb = a.max_running_requests, b.max_running_requests
    ca, cb = a.chunked_prefill_size, b.chunked_prefill_size
    if ra is None or rb is None or ra > rb:
        return False
    if ca is not None and cb is not None and ca > cb:
        return False
    return ra < rb or (ca is not None and cb is not None and ca < cb)


def same_gpu(a: Setting, b: Setting) -> bool:
    """Same GPU memory demand: fraction, requests and chunk (the host cache is host memory)."""
    return (
        abs(a.mem_fraction - b.mem_fraction) < 1e-9
        and a.max_running_requests == b.max_running_requests
        and a.chunked_prefill_size == b.chunked_prefill_size
    )
