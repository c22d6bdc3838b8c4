"""A launch as the planner sees it, and the memory order between settings.

`Point` is one finished trial (with its `Observation`) or one another worker is running;
`setting_of` maps parameters to the memory-relevant `Setting`; `needs_more` says whether one
setting needs at least the memory of another of the kind that failed, which is what lets a
failure rule out everything beyond it without a model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from autotune.config.studyfile import HICACHE, Scalar
from autotune.logparse.outcome import Outcome
from autotune.memory.model import Observation, Setting

__all__ = [
    "CHUNK",
    "FRACTION",
    "HICACHE",
    "MEMORY_CONSTRAINTS",
    "MEMORY_PARAMS",
    "REQUESTS",
    "Point",
    "fmt",
    "host_failure",
    "key",
    "needs_more",
    "norm",
    "num",
    "setting_of",
    "tokens_of",
]

FRACTION = "mem_fraction_static"
REQUESTS = "max_running_requests"
CHUNK = "chunked_prefill_size"
MEMORY_PARAMS = (FRACTION, REQUESTS, CHUNK, HICACHE)
"""The parameters the memory model knows; the searches act on these and sample the rest."""
MEMORY_CONSTRAINTS = frozenset({"oom", "crash", "headroom_gib"})
_HOST_TOO_BIG = ("Not enough host memory", "scheduler is dead", "host memory available")
_HOST_TOO_SMALL = "host memory should be larger than the device memory"


@dataclass(frozen=True)
class Point:
    """One launch as the planner sees it: finished (with an observation) or pending."""

    number: int
    params: Mapping[str, Scalar]
    observation: Observation | None = None
    throughput: float = 0.0
    violated: frozenset[str] = frozenset()
    """Names of the constraints it broke."""

    @property
    def feasible(self) -> bool:
        return self.observation is not None and self.observation.feasible

    @property
    def memory_failure(self) -> bool:
        o = self.observation
        if o is None or o.feasible:
            return False
        if Outcome.of(o.outcome).is_parameter_result:
            return True
        return bool(self.violated & MEMORY_CONSTRAINTS)


def setting_of(params: Mapping[str, Scalar]) -> Setting | None:
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


def key(params: Mapping[str, Scalar], names: Sequence[str]) -> tuple[Scalar | None, ...]:
    return tuple(norm(params.get(n)) for n in names)


def norm(v: Scalar | None) -> Scalar | None:
    return round(float(v), 9) if isinstance(v, float) else v


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


def host_failure(o: Observation) -> str | None:
    """ "too_big" when the host cache did not fit in RAM, "too_small" when it was not bigger than
    the GPU pool, None for a failure that was not about the host cache."""
    if not Outcome.of(o.outcome).fails_at_startup or o.setting.hicache_gb <= 0:
        return None
    if _HOST_TOO_SMALL in o.reason:
        return "too_small"
    if any(t in o.reason for t in _HOST_TOO_BIG):
        return "too_big"
    return None


def tokens_of(p: Point | None) -> int:
    if p is None or p.observation is None:
        return 0
    return p.observation.tokens or 0


def num(v: Scalar | None) -> float:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0.0


def fmt(v: Scalar | None) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)
