"""A short real study with the capacity-aware sampler: `autotune run` launching the simulator.

Real processes over real HTTP on 127.0.0.1. Every process started carries the test's folder in
its command line, so the `no_leftovers` fixture (tests/conftest.py) finds any survivor, kills it
and fails the test.
"""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from tests import simstudy

pytestmark = pytest.mark.e2e


def test_capacity_search_reaches_the_edge_on_the_simulator(no_leftovers: Path) -> None:
    folder = no_leftovers
    config = folder / "search.toml"
    config.write_text(simstudy.sim_study(low=0.86, step=0.01, duration=1, sampler=None))
    done = simstudy.run(config, "run")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "sampler capacity" in done.stdout
    url = f"sqlite:///{folder / 'results' / 'search' / 'study.db'}"
    trials = optuna.load_study(study_name="search", storage=url).get_trials()
    assert trials[0].params["mem_fraction_static"] == 0.88
    record = trials[0].user_attrs["record"]
    assert record["stress_peak_gib"] > 1.0  # an 8K-token chunk's activations, measured
    second = trials[1]
    assert second.params["mem_fraction_static"] > 0.88
    assert "predicted" in second.user_attrs["search_why"]
    assert "stress peak" in second.user_attrs["search_why"]
    feasible = [
        t.user_attrs["capacity_tokens"]
        for t in trials
        if t.user_attrs["outcome"] == "ok" and all(v <= 0 for v in t.constraints.values())
    ]
    assert max(feasible) > 1.15 * 159_277
    assert not any(t.user_attrs["outcome"].endswith("oom") for t in trials)
