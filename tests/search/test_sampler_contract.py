"""Optuna's own sampler contract (`optuna.testing.pytest_samplers`) for the samplers we ship.

`BasicSamplerTestCase` (independent sampling of every distribution kind, conditional and
dynamic spaces, NaN objectives, `PartialFixedSampler`, single-value distributions),
`RelativeSamplerTestCase` (`sample_relative` called directly, types and bounds, n_jobs=2) and
`MultiObjectiveSamplerTestCase`. The contract names its parameters x, y, z, which are no memory
parameters: by design both samplers then sample them at random (`autotune.search.fallback`),
and what is tested is that they fall back instead of raising. The same distributions under the
memory parameters' names are in test_sparse_spaces.py.
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

SAMPLERS: dict[str, Callable[[], BaseSampler]] = {
    "capacity": lambda: CapacityAwareSampler(seed=0),
    "walkdown": lambda: WalkDownSampler(seed=0),
}


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
