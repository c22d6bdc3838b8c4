"""Valid study files that do not search mem_fraction_static: only max_running_requests, only the
host cache, or the fraction fixed. Both samplers run whole studies of them on the simulator's
pure model, without an exception and inside the distributions."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import optuna
import pytest
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.samplers import BaseSampler
from optuna.trial import TrialState

from autotune.config.schema import Choices, Fixed, IntRange, Param, Scalar, SearchConfig
from autotune.config.space import distributions, settings_for
from autotune.search import CapacityAwareSampler, WalkDownSampler
from autotune.search.capacity import RULE_ATTR, WHY_ATTR
from autotune.search.fallback import RANDOM_RULE
from autotune.search.points import FRACTION, HICACHE, REQUESTS
from autotune.search.walkdown import walk
from autotune.study.loop import tell
from autotune.testing.oracle import Bench, launch
from tests.search.helpers import KIMI

SGLANG_FRACTION = 0.85
"""The fraction the simulated server runs with when the study does not set one."""

SAMPLERS: dict[str, Callable[[], BaseSampler]] = {
    "capacity": lambda: CapacityAwareSampler(seed=0),
    "walkdown": lambda: WalkDownSampler(seed=0),
}
REQUESTS_ONLY = (IntRange(REQUESTS, 16, 128, 16),)
HICACHE_ONLY = (IntRange(HICACHE, 0, 96, 24),)
FIXED = Fixed(FRACTION, 0.88)
SPACES: dict[str, tuple[Param, ...]] = {
    "requests only": REQUESTS_ONLY,
    "hicache only": HICACHE_ONLY,
    "requests only, fraction fixed": (FIXED, *REQUESTS_ONLY),
    "hicache only, fraction fixed": (FIXED, *HICACHE_ONLY),
    "fraction fixed": (
        FIXED,
        Choices(REQUESTS, (32, 48, 64, 96, 128)),
        Choices(HICACHE, (0, 24, 48, 96)),
    ),
}


@pytest.fixture(autouse=True)
def quiet() -> None:
    optuna.logging.set_verbosity(optuna.logging.ERROR)


def bench_of(params: tuple[Param, ...]) -> Bench:
    return dataclasses.replace(KIMI, search=SearchConfig(params=params, baseline={}))


def run_study(bench: Bench, sampler: BaseSampler, n: int) -> optuna.Study:
    """n launches; without a fraction in the space the server picks its own, and the record
    (like a real one) does not name it."""
    study = optuna.create_study(directions=["maximize", "maximize"], sampler=sampler)
    study.set_user_attr("objectives", ["capacity", "throughput"])
    for _ in range(n):
        trial = study.ask()
        params = dict(settings_for(trial, bench.search).params)
        own = FRACTION not in params
        _, result = launch(bench, {FRACTION: SGLANG_FRACTION, **params}, trial.number)
        record = result.attrs["record"]
        assert isinstance(record, dict)
        if own:
            record["params"].pop(FRACTION)
        tell(study, trial, result, bench.study_config)
    return study


def inside(dist: BaseDistribution, value: object) -> bool:
    return bool(dist._contains(dist.to_internal_repr(value)))


@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
@pytest.mark.parametrize("space", sorted(SPACES))
def test_a_space_without_a_searched_fraction_runs_inside_its_distributions(
    space: str, sampler: str
) -> None:
    bench = bench_of(SPACES[space])
    study = run_study(bench, SAMPLERS[sampler](), 8)
    dists = distributions(bench.search)
    assert len(study.trials) == 8
    for t in study.trials:
        assert t.state == TrialState.COMPLETE
        assert set(t.params) == set(dists)
        for name, value in t.params.items():
            assert inside(dists[name], value), (t.number, name, value)
    for t in study.trials[1:]:
        assert t.user_attrs[RULE_ATTR] and t.user_attrs[WHY_ATTR]


def test_walkdown_without_a_searched_fraction_does_not_index_an_empty_list() -> None:
    params, rule, why = walk({REQUESTS: (32, 64)}, [])
    assert params == {REQUESTS: 32}
    assert rule == "walkdown"
    assert "max_running_requests=32" in why


def test_walkdown_with_the_fraction_fixed_launches_each_combination_once() -> None:
    bench = bench_of((FIXED, *REQUESTS_ONLY))
    study = run_study(bench, WalkDownSampler(seed=0), 9)
    requests = [t.params[REQUESTS] for t in study.trials]
    assert sorted(requests[:8]) == list(range(16, 129, 16))
    assert study.trials[-1].user_attrs[RULE_ATTR] == "confirm"


def test_capacity_with_the_fraction_fixed_plans_on_the_memory_model() -> None:
    bench = bench_of(SPACES["fraction fixed"])
    study = run_study(bench, CapacityAwareSampler(seed=0), 6)
    rules = [t.user_attrs[RULE_ATTR] for t in study.trials[1:]]
    assert RANDOM_RULE not in rules
    assert any("predicted" in t.user_attrs[WHY_ATTR] for t in study.trials[1:])
    launched = [tuple(sorted(t.params.items())) for t in study.trials]
    repeats = [r for r in rules if r in ("confirm", "recheck")]
    assert len(set(launched)) >= len(launched) - len(repeats)


@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
def test_without_any_fraction_on_record_both_fall_back_to_random(sampler: str) -> None:
    study = run_study(bench_of(SPACES["requests only"]), SAMPLERS[sampler](), 4)
    assert [t.user_attrs[RULE_ATTR] for t in study.trials[1:]] == [RANDOM_RULE] * 3


# Optuna's contract (test_sampler_contract.py) names its parameters x and y, which the memory
# searches leave to the fallback; these are its distributions under the names they act on.
OUR_NAMES: list[tuple[str, BaseDistribution]] = [
    (FRACTION, FloatDistribution(0.5, 0.95)),
    (FRACTION, FloatDistribution(0.5, 0.95, step=0.01)),
    (FRACTION, FloatDistribution(0.1, 0.9, log=True)),
    (FRACTION, CategoricalDistribution((0.8, 0.85, 0.9))),
    (REQUESTS, IntDistribution(1, 256)),
    (REQUESTS, IntDistribution(1, 256, log=True)),
    (REQUESTS, IntDistribution(8, 128, step=8)),
    (REQUESTS, CategoricalDistribution((32, 64, 128))),
    (HICACHE, IntDistribution(0, 96, step=24)),
    (HICACHE, FloatDistribution(0.0, 96.0)),
    (HICACHE, FloatDistribution(1.0, 96.0, log=True)),
    (HICACHE, CategoricalDistribution((0, 48))),
]


@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
@pytest.mark.parametrize(("name", "dist"), OUR_NAMES, ids=[f"{n}-{d}" for n, d in OUR_NAMES])
def test_memory_parameters_of_any_distribution_stay_inside_it(
    sampler: str, name: str, dist: BaseDistribution
) -> None:
    """With a plain objective (no autotune records) beside the other memory parameters."""
    fixed: Mapping[str, BaseDistribution] = {
        FRACTION: FloatDistribution(0.75, 0.95, step=0.01),
        REQUESTS: CategoricalDistribution((32, 64)),
    }
    space = {**{k: d for k, d in fixed.items() if k != name}, name: dist}
    study = optuna.create_study(sampler=SAMPLERS[sampler]())
    for i in range(6):
        trial = study.ask(dict(space))
        study.tell(trial, float(i))
    for t in study.trials:
        for n, d in space.items():
            value: Scalar = t.params[n]
            assert inside(d, value), (n, value)
            if isinstance(d, IntDistribution):
                assert type(value) is int
            elif isinstance(d, FloatDistribution):
                assert type(value) is float
