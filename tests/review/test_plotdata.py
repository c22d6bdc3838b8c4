"""Plot data extracted from trials: what each figure will draw."""

from __future__ import annotations

import pytest
from optuna.trial import TrialState

import autotune.memory.fit
from autotune.record.view import views
from autotune.review import plotdata as pd
from tests.review.fakes import CELL, P, trial, walk


def test_pareto_front_and_kinds() -> None:
    d = pd.pareto(views(walk()), winner=4, chosen=1, confirmed=None)
    kinds = {p.number: p.kind for p in d.points}
    assert kinds == {0: "feasible", 1: "feasible", 2: "feasible", 3: "feasible", 4: "feasible",
                     5: "infeasible", 6: "oom", 7: "oom"}  # fmt: skip
    # every feasible trial but #1 has 145 tok/s; #1 (144 tok/s) has the most capacity
    assert d.front == (4, 1)  # #0, #2, #3 have 145 tok/s like #4 with less capacity
    assert 5 not in d.front and 6 not in d.front
    assert d.winner == 4 and d.chosen == 1


def test_pareto_front_drops_dominated_points() -> None:
    trials = [trial(0, 0.88, throughput=150.0), trial(1, 0.90, throughput=140.0),
              trial(2, 0.86, throughput=149.0)]  # fmt: skip
    d = pd.pareto(views(trials))
    assert d.front == (0, 1)  # #2 has less capacity and less throughput than #0


def test_running_trials_are_left_out_of_the_pareto_plot_but_not_the_map() -> None:
    trials = [trial(0, 0.88), trial(1, 0.90, state=TrialState.RUNNING)]
    assert [p.number for p in pd.pareto(views(trials)).points] == [0]
    fm = pd.feasibility(views(trials))
    assert [(p.number, p.kind) for p in fm.points] == [(0, "feasible"), (1, "running")]


def test_a_running_trial_links_its_live_log() -> None:
    t = trial(0, 0.88, state=TrialState.RUNNING)
    t.user_attrs.clear()
    t.user_attrs["trial_dir"] = "/r/t/trials/0000"
    [v] = views([t])
    assert v.kind == "running" and v.log_path == "/r/t/trials/0000/server.log"


def test_feasibility_map_axes_and_outcomes() -> None:
    trials = [trial(0, 0.88, requests=32), trial(1, 0.92, requests=64, outcome="runtime_oom")]
    d = pd.feasibility(views(trials))
    assert [(p.x, p.y) for p in d.points] == [(0.88, 32.0), (0.92, 64.0)]
    assert d.outcomes == ("ok", "runtime_oom")


def test_capacity_line_from_the_memory_model_and_the_oom_edge() -> None:
    d = pd.capacity(views(walk()))
    assert "memory model" in d.line_source
    assert d.oom_edge == 0.92 and d.stable_edge == 0.90
    assert len(d.line_x) == pd.MODEL_POINTS
    # the line goes through the measured points: N(f) = (A − P(1 − f))·2^30 / cell
    for p in d.points:
        i = min(range(len(d.line_x)), key=lambda k: abs(d.line_x[k] - p.x))
        slope = P * 2**30 / CELL
        assert d.line_y[i] + slope * (p.x - d.line_x[i]) == pytest.approx(p.y, rel=2e-3)


def test_capacity_falls_back_to_least_squares(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(obs: object) -> object:
        raise ValueError("no model")

    monkeypatch.setattr(autotune.memory.fit, "fit", broken)
    d = pd.capacity(views(walk()))
    assert d.line_source.startswith("least-squares line over")
    assert d.line_y[0] < d.line_y[-1]


def test_waterfall_adds_up_to_the_free_memory() -> None:
    t = views([trial(0, 0.88, peak=2.5)])[0]
    d = pd.waterfall(t, cell_bytes=CELL, min_headroom_gib=0.5)
    labels = [s.label for s in d.steps]
    assert labels[:6] == [
        "P (free before weights)",
        "weights",
        "KV pool",
        "draft (weights, KV, graphs)",
        "request table",
        "CUDA graphs",
    ]
    assert labels[-3:] == ["free after startup", "stress peak", "free at the worst moment"]
    level = 0.0
    for s in d.steps:
        if s.measure == "relative":
            level += s.value
        else:
            assert s.value == pytest.approx(level if s.measure == "total" else s.value, abs=1e-9)
            level = s.value
    assert d.free_at_peak_gib == pytest.approx(t.static_free_gib - 2.5)  # type: ignore[operator]
    assert d.reserve_gib == pytest.approx(P * 0.12)
    assert d.min_headroom_gib == 0.5


def test_waterfall_of_a_startup_oom_shows_what_the_log_showed() -> None:
    t = views([trial(0, 0.94, outcome="startup_oom")])[0]
    d = pd.waterfall(t)
    assert [s.label for s in d.steps] == ["P (free before weights)", "weights"]
    assert d.free_at_peak_gib is None


def test_load_points_only_for_trials_that_served() -> None:
    d = pd.load(views(walk()))
    assert {p.number for p in d.points} == {0, 1, 2, 3, 4, 5}
    assert all(p.requests == 48 and p.p99_ttft_ms == 2300.0 for p in d.points)
    assert d.note.startswith("max_running_requests was 48 in every trial")
    spread = pd.load(views([trial(0, 0.88, requests=32), trial(1, 0.88, requests=64)]))
    assert [p.requests for p in spread.points] == [32.0, 64.0] and spread.note == ""


def test_history_best_so_far_never_drops() -> None:
    d = pd.history(views([*walk(), trial(8, 0.93, state=TrialState.RUNNING)]))
    assert [p.number for p in d.points] == list(range(9))
    assert d.points[-1].kind == "running"
    no_capacity = trial(9, 0.95, outcome="startup_oom")
    no_capacity.user_attrs["capacity_tokens"] = 0
    assert 9 not in [p.number for p in pd.history(views([no_capacity])).points]
    assert list(d.best_y) == sorted(d.best_y)
    assert d.best_y[-1] == max(p.y for p in d.points if p.kind == "feasible")


def test_table_rows() -> None:
    rows = pd.table(views(walk()))
    assert [r.number for r in rows] == list(range(8))
    r6 = rows[6]
    assert r6.outcome == "runtime_oom" and r6.kind == "oom" and r6.throughput == ""
    assert r6.log_path == "/results/t/trials/0006/server.log"
    assert rows[0].capacity == "159,276"
