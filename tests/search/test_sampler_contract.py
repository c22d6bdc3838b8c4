"""Optuna's own sampler contract (`optuna.testing.pytest_samplers`) for the samplers we ship.

`BasicSamplerTestCase` (independent sampling of every distribution kind, conditional and
dynamic spaces, NaN objectives, `PartialFixedSampler`, single-value distributions),
`RelativeSamplerTestCase` (`sample_relative` called directly, types and bounds, n_jobs=2) and
`MultiObjectiveSamplerTestCase`. The contract names its parameters x, y, z, which are no memory
parameters: by design both samplers then sample them at random (`autotune.search.fallback`),
and what is tested is that they fall back instead of raising. The same distributions under the
memory parameters' names are in test_sparse_spaces.py.

Both are `autotune.search.base.MemorySampler`s, which holds the ask, the fallback and the
recorded rule; every concrete `MemorySampler` the package defines must be in `SAMPLERS`, so a new
one runs the contract too.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from optuna.samplers import BaseSampler
from optuna.testing.pytest_samplers import (
    BasicSamplerTestCase,
    MultiObjectiveSamplerTestCase,
    RelativeSamplerTestCase,
)

from autotune.search import CapacityAwareSampler, WalkDownSampler
from autotune.search.base import MemorySampler

SAMPLERS: dict[str, Callable[[], BaseSampler]] = {
    "capacity": lambda: CapacityAwareSampler(seed=0),
    "walkdown": lambda: WalkDownSampler(seed=0),
}


def _concrete(cls: type) -> set[type]:
    """The package's concrete subclasses of `cls` (a test's own subclass does not count)."""
    out: set[type] = set()
    subs: list[type] = cls.__subclasses__()
    for sub in subs:
        if sub.__module__.startswith("autotune.") and not getattr(sub, "__abstractmethods__", ()):
            out.add(sub)
        out |= _concrete(sub)
    return out


def test_every_memory_sampler_runs_the_contract() -> None:
    made = [make() for make in SAMPLERS.values()]
    assert all(isinstance(s, MemorySampler) for s in made)
    assert {type(s) for s in made} == _concrete(MemorySampler)


class OurSamplers:
    @pytest.fixture(params=sorted(SAMPLERS))
    def sampler(self, request: pytest.FixtureRequest) -> Callable[[], BaseSampler]:
        return SAMPLERS[request.param]


class TestBasicContract(OurSamplers, BasicSamplerTestCase):
    pass


class TestRelativeContract(OurSamplers, RelativeSamplerTestCase):
    pass


class TestMultiObjectiveContract(OurSamplers, MultiObjectiveSamplerTestCase):
    pass
