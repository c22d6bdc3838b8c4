"""The shipped demo shows the product: the capacity-aware search over mem_fraction_static ×
max_running_requests from a baseline that runs out of memory, to its end on the simulator, with
an OOM recorded as data, a two-dimensional feasibility map and a Pareto front that trades
capacity for throughput across request slots."""

from __future__ import annotations

import shutil
from pathlib import Path

import optuna
import pytest

from autotune.config.studyfile import SHIPPED_STUDIES, load_study
from autotune.logparse.outcome import Outcome
from autotune.record.view import views
from autotune.review.plotdata import feasibility, pareto
from autotune.testing.audit import leftovers, problems
from tests import simstudy

pytestmark = pytest.mark.e2e


def test_the_demo_records_an_oom_and_draws_a_two_dimensional_map_and_a_front(
    tmp_path: Path,
) -> None:
    config = tmp_path / "demo.toml"
    shutil.copy(SHIPPED_STUDIES / "demo.toml", config)
    cfg = load_study(config)
    assert cfg.sampler.name == "capacity"
    done = simstudy.run(config, "run", timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr
    study = optuna.load_study(
        study_name="demo", storage=f"sqlite:///{tmp_path / 'results/demo/study.db'}"
    )
    trials = views(study.get_trials(deepcopy=False))
    launched = [t for t in trials if t.launched and t.counted]
    # the baseline's OOM, the edge from both sides, and the request slots the front needs
    assert len(launched) >= 5, [t.params for t in launched]
    ooms = [t for t in launched if Outcome.of(t.outcome or "").is_oom]
    assert ooms and all(t.state == "complete" and not t.feasible for t in ooms)
    assert ooms[0].number == 0  # the baseline, as the operator's try 2 did
    fmap = feasibility(trials)
    assert fmap.note == ""
    assert len({p.x for p in fmap.points}) >= 2 and len({p.y for p in fmap.points}) >= 2
    front = pareto(trials)
    assert front.note == ""
    on_front = [t for t in trials if t.number in front.front]
    assert len({t.requests for t in on_front}) >= 2, [
        (t.params, t.capacity_tokens) for t in on_front
    ]
    assert problems(study.get_trials(deepcopy=False), tmp_path / "results/demo") == []
    assert leftovers(str(tmp_path)) == []
