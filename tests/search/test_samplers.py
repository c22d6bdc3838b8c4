"""The samplers inside Optuna studies: whole studies on the simulator's pure model."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.config.schema import SamplerConfig
from autotune.config.space import settings_for
from autotune.search import CapacityAwareSampler, WalkDownSampler, search_done
from autotune.search.capacity import DONE_ATTR, RULE_ATTR, WHY_ATTR
from autotune.study.samplers import make_sampler
from autotune.testing.oracle import Bench, best_stable, run_trial
from tests.search.helpers import KIMI, QWEN, study_with


@pytest.fixture(autouse=True)
def quiet() -> None:
    optuna.logging.set_verbosity(optuna.logging.ERROR)


def test_capacity_is_the_default_and_walkdown_is_selectable() -> None:
    assert isinstance(make_sampler(SamplerConfig()), CapacityAwareSampler)
    assert isinstance(make_sampler(SamplerConfig(name="walkdown")), WalkDownSampler)


@pytest.mark.parametrize("bench", [KIMI, QWEN], ids=["kimi", "qwen"])
def test_reaches_the_best_stable_capacity_within_six_launches(bench: Bench) -> None:
    best = best_stable(bench)
    _, launches = study_with(bench, CapacityAwareSampler(seed=0), 6)
    held = [x.tokens for x in launches if x.feasible and x.stable]
    assert max(held) >= 0.99 * best
    assert sum(x.crashed for x in launches) <= 1


def test_operator_profile_ends_well_above_the_hand_tuned_setting() -> None:
    study, launches = study_with(KIMI, CapacityAwareSampler(seed=3), 12)
    held = [x.tokens for x in launches if x.feasible and x.stable]
    assert max(held) > 1.15 * 159_277
    last = study.trials[-1]
    assert last.user_attrs[RULE_ATTR] == "confirm"
    assert "smaller than one step" in last.user_attrs[DONE_ATTR]
    assert search_done(study.trials) == last.user_attrs[DONE_ATTR]


def test_every_proposal_records_why() -> None:
    study, _ = study_with(KIMI, CapacityAwareSampler(seed=0), 4)
    for t in study.trials[1:]:
        why = t.user_attrs[WHY_ATTR]
        assert "predicted" in why and "headroom" in why and "stress peak" in why
        assert "capacity_aware:forecast" in t.system_attrs
    assert WHY_ATTR not in study.trials[0].user_attrs  # the enqueued baseline


def test_headroom_requirement_is_read_back_from_the_constraints() -> None:
    sampler = CapacityAwareSampler(seed=0)
    _study, _ = study_with(KIMI, sampler, 2)
    assert sampler.last_proposal is not None
    assert "0.5 GiB required" in sampler.last_proposal.why


def test_first_trial_without_a_baseline_is_conservative() -> None:
    study = optuna.create_study(sampler=CapacityAwareSampler(seed=0))
    trial = study.ask()
    params = settings_for(trial, KIMI.search).params
    assert float(params["mem_fraction_static"]) <= 0.82
    assert params["hicache_size"] == 0


def test_two_workers_on_one_storage_do_not_duplicate(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study, _ = study_with(KIMI, CapacityAwareSampler(seed=0), 2, storage=url)
    other = optuna.load_study(
        study_name=study.study_name, storage=url, sampler=CapacityAwareSampler(seed=1)
    )
    a = study.ask()
    pa = settings_for(a, KIMI.search).params
    b = other.ask()
    pb = settings_for(b, KIMI.search).params
    assert pa != pb
    assert float(pb["mem_fraction_static"]) <= float(pa["mem_fraction_static"])
    run_trial(study, KIMI, a, 7)
    run_trial(other, KIMI, b, 8)
    assert all(t.state == TrialState.COMPLETE for t in study.trials)


def test_walkdown_starts_at_the_top_and_steps_down_after_each_failure() -> None:
    _study, launches = study_with(KIMI, WalkDownSampler(seed=0), 6)
    fractions = [float(x.params["mem_fraction_static"]) for x in launches[1:]]
    assert fractions[0] == 0.98
    for prev, nxt, x in zip(fractions, fractions[1:], launches[1:], strict=False):
        assert not x.feasible
        assert nxt == pytest.approx(prev - 0.01)


def test_walkdown_moves_to_the_next_combination_once_one_holds() -> None:
    _study, launches = study_with(QWEN, WalkDownSampler(seed=0), 8)
    first_hold = next(i for i, x in enumerate(launches) if i > 0 and x.feasible)
    nxt = launches[first_hold + 1].params
    held = launches[first_hold].params
    assert nxt["mem_fraction_static"] == held["mem_fraction_static"]
    assert (nxt["max_running_requests"], nxt["hicache_size"]) != (
        held["max_running_requests"],
        held["hicache_size"],
    )
