"""The launches a night's search is expected to take and at worst (`search.estimate`)."""

from __future__ import annotations

import dataclasses

from autotune.config.studyfile import SHIPPED_STUDIES, load_study
from autotune.search.estimate import BENCH_TO_EDGE, CONFIRM, launch_estimate


def test_capacity_is_the_edge_plus_explore_plus_confirm_and_at_worst_the_budget() -> None:
    cfg = load_study(SHIPPED_STUDIES / "kimi.toml")
    est = launch_estimate(cfg.search, "capacity", cfg.budget.n_trials)
    # max_running_requests has 5 values: 4 others to explore; hicache_size 4: one probe
    assert est.expected == BENCH_TO_EDGE + 4 + 1 + CONFIRM == 8
    assert est.worst == cfg.budget.n_trials == 24
    assert "benchmark" in est.basis and "budget" in est.basis
    assert launch_estimate(cfg.search, "capacity", 4).expected == 4


def test_grid_runs_every_point_and_other_samplers_the_budget() -> None:
    cfg = load_study(SHIPPED_STUDIES / "kimi.toml")
    grid = launch_estimate(cfg.search, "grid", 1000)
    assert grid.expected == grid.worst == 15 * 5 * 4
    assert launch_estimate(cfg.search, "grid", 24).expected == 24
    tpe = launch_estimate(cfg.search, "tpe", 24)
    assert (tpe.expected, tpe.worst) == (24, 24)
    assert dataclasses.asdict(tpe)["basis"].startswith("tpe")
