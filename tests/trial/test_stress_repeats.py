"""A setting the search wants to see hold again runs its stress phases again on the same launch
(`keys.STRESS_REPEATS`): the live trial drives each pass after the other, and the stored trial
says how many ran, which the search counts as that many holds."""

from __future__ import annotations

import time
from pathlib import Path

import optuna
import pytest

from autotune.config.space import settings_for
from autotune.config.studyfile import load_study
from autotune.config.workload import Steady, Stress, WorkloadSpec
from autotune.record import keys
from autotune.record.stored import stored
from autotune.study.runner import trial_dir
from autotune.trial.live import live_launcher
from autotune.trial.plan import plan_trial
from autotune.trial.run import run_trial
from tests import simstudy


def test_each_stress_phase_runs_again_under_its_own_name() -> None:
    spec = WorkloadSpec(phases=(Steady("traffic", 4, 1.0), Stress("burst", rounds=2)))
    assert spec.with_stress_repeats(1) is spec
    names = [p.name for p in spec.with_stress_repeats(3).phases]
    assert names == ["traffic", "burst", "burst #2", "burst #3"]
    repeated, limit_s = spec.stress_passes(600.0, 3)
    assert repeated == spec.with_stress_repeats(3) and limit_s == 1800.0
    assert spec.stress_passes(600.0, 1) == (spec, 600.0)


def test_the_stored_count_is_read_back_and_defaults_to_once() -> None:
    def frozen(attrs: dict[str, object]) -> optuna.trial.FrozenTrial:
        return optuna.trial.create_trial(
            params={}, distributions={}, values=[1.0, 1.0], user_attrs=attrs
        )

    assert stored(frozen({})).stress_repeats == 1
    assert stored(frozen({keys.STRESS_REPEATS: 3})).stress_repeats == 3
    assert stored(frozen({keys.STRESS_REPEATS: "x"})).stress_repeats == 1


@pytest.mark.e2e
def test_a_live_trial_runs_its_stress_passes_on_one_launch(no_leftovers: Path) -> None:
    """Kimi-K2.5 on the simulator at 0.88, asked for two stress passes: one launch, the study's
    stress phase and its second pass both driven and both in the trial's record."""
    path = no_leftovers / "configs" / "repeats.toml"
    path.parent.mkdir(parents=True)
    path.write_text(simstudy.sim_study(time_scale=3000, n_trials=1, duration=0.3))
    cfg = load_study(path)
    study_dir = no_leftovers / "results" / cfg.name
    launcher = live_launcher(cfg, study_dir)
    plan = plan_trial(
        cfg,
        settings_for(optuna.trial.FixedTrial({"mem_fraction_static": 0.88}), cfg.search),
        number=0,
        trial_dir=trial_dir(study_dir, 0),
        extra=launcher.extra_args(),
        stress_repeats=2,
    )
    record = run_trial(plan, launcher, clock=time.monotonic, phase=lambda _: None)
    assert (record.state, record.outcome) == ("complete", "ok"), record.reason
    phases = record.workload["phases"]
    assert isinstance(phases, list)
    stress = [p["name"] for p in phases if p["kind"] == "stress"]
    assert len(stress) == 2 and stress[1] == f"{stress[0]} #2", stress
