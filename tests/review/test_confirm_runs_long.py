"""A confirm soak never ends a phase early, whatever the study file says: a soak exists to run
long (`review.confirm.soak`)."""

from __future__ import annotations

from pathlib import Path

import autotune
from autotune.config.studyfile import load_study
from autotune.review.confirm import soak
from autotune.review.soak import DEFAULT_SOAK_FACTOR


def test_the_soak_turns_the_early_end_off() -> None:
    cfg = load_study(Path(autotune.__file__).parent / "studies" / "kimi.toml")
    assert cfg.workload.end_early.enabled  # the study's own trials may end early
    soaked = soak(cfg, DEFAULT_SOAK_FACTOR)
    assert not soaked.workload.end_early.enabled
    steady = [p for p in soaked.workload.phases if getattr(p, "concurrency", 0) == 150]
    assert steady and getattr(steady[-1], "duration_s", 0) == DEFAULT_SOAK_FACTOR * 900


def test_the_soak_counts_its_factor_in_trials_as_they_ran() -> None:
    cfg = load_study(Path(autotune.__file__).parent / "studies" / "kimi.toml")
    # the trial ended its 900 s steady phase at 600 s: a 3× soak is three of those
    soaked = soak(cfg, 3.0, {"agents": 600.0})
    steady = [p for p in soaked.workload.phases if getattr(p, "name", "") == "agents"]
    assert getattr(steady[0], "duration_s", 0) == 1800.0
    # a phase the trial ran in full (or a length past the plan) is the plan's
    assert getattr(soak(cfg, 3.0, {"agents": 5000.0}).workload.phases[1], "duration_s", 0) == 2700
