"""Charts adapt to the study: an axis that was not searched or an objective that did not vary
beyond its noise turns its figure into a sentence; never-launched trials are not drawn."""

from __future__ import annotations

from pathlib import Path

from optuna.trial import FrozenTrial, TrialState

from autotune.config.schema import StudyConfig
from autotune.record.view import views
from autotune.review import page
from autotune.review import plotdata as pd
from autotune.review.source import build_review
from tests.review.fakes import trial, walk


def _skipped(number: int, f: float) -> FrozenTrial:
    why = "not launched: search done: what is left to learn is smaller than one step"
    t = trial(number, f, outcome="skipped", state=TrialState.FAIL, reason=why)
    t.user_attrs["record"] = {"params": {"mem_fraction_static": f, "max_running_requests": 48}}
    return t


def _searched() -> list[FrozenTrial]:
    """max_running_requests searched, and throughput that does depend on it."""
    return [
        trial(0, 0.88, requests=32, throughput=100.0),
        trial(1, 0.88, requests=64, throughput=150.0),
        trial(2, 0.90, requests=32, throughput=101.0),
        trial(3, 0.90, requests=64, throughput=149.0),
    ]


def test_a_fixed_max_running_requests_replaces_the_map_and_the_load_chart() -> None:
    seen = views(walk())  # every trial ran max_running_requests=48
    fm = pd.feasibility(seen)
    assert fm.note.startswith("max_running_requests was 48 in every trial (not searched)")
    load = pd.load(seen)
    assert load.note.startswith("max_running_requests was 48 in every trial (not searched)")
    assert pd.capacity(seen).note == ""  # the fraction was searched
    searched = views(_searched())
    assert pd.feasibility(searched).note == "" and pd.load(searched).note == ""


def test_a_fixed_fraction_replaces_the_capacity_chart() -> None:
    seen = views([trial(0, 0.88, requests=32), trial(1, 0.88, requests=64)])
    assert pd.capacity(seen).note.startswith("mem_fraction_static was 0.88 in every trial")
    assert pd.feasibility(seen).note.startswith("mem_fraction_static was 0.88 in every trial")


def test_throughput_within_its_noise_replaces_the_pareto_front() -> None:
    d = pd.pareto(views(walk()))  # 144–145 tok/s: a 1 tok/s "trade-off"
    assert d.note.startswith("Throughput did not vary beyond its noise: 144–145 tok/s")
    assert "capacity decides" in d.note
    assert pd.pareto(views(_searched())).note == ""
    # the load chart keeps latency and drops the flat throughput
    assert pd.load(views(walk())).flat.startswith("Throughput did not vary beyond its noise")
    assert pd.load(views(_searched())).flat == ""


def test_noise_is_the_tolerance_or_the_spread_of_repeats() -> None:
    assert pd.throughput_noise(views(_searched()), 0.05) == 150.0 * 0.05
    repeats = [trial(0, 0.88, throughput=100.0), trial(1, 0.88, throughput=130.0),
               trial(2, 0.90, throughput=125.0)]  # fmt: skip
    assert pd.throughput_noise(views(repeats), 0.05) == 30.0
    assert pd.pareto(views(repeats)).note.startswith("Throughput did not vary")


def test_never_launched_trials_are_not_drawn() -> None:
    trials = [*walk(), _skipped(8, 0.93)]
    seen = views(trials)
    assert seen[-1].kind == "skipped" and not seen[-1].launched
    assert 8 not in {p.number for p in pd.feasibility(seen).points}
    assert 8 not in {p.number for p in pd.pareto(seen).points}
    assert 8 not in {p.number for p in pd.capacity(seen).points}
    assert 8 not in {p.number for p in pd.history(seen).points}
    assert 8 in {r.number for r in pd.table(seen)}  # the table still lists it, as skipped
    assert all(p.kind != "failed" for p in pd.feasibility(seen).points if p.number == 8)


def test_the_page_and_the_pngs_print_the_sentence(cfg: StudyConfig, tmp_path: Path) -> None:
    review = build_review("t", "x", walk(), cfg=cfg, study_attrs={})
    written = page.write_report(review, tmp_path, explanation="", generated_at="now")
    html = written.html.read_text()
    assert 'class="fig nofig"' in html
    assert "max_running_requests was 48 in every trial (not searched)" in html
    assert "Throughput did not vary beyond its noise" in html
    assert 'Plotly.newPlot("feasibility"' not in html and 'Plotly.newPlot("pareto"' not in html
    assert 'Plotly.newPlot("capacity"' in html and 'Plotly.newPlot("ledger"' in html
    names = {p.name for p in written.pngs}
    assert {"pareto.png", "feasibility.png", "load.png", "capacity.png"} <= names
    searched = build_review("t", "x", _searched(), cfg=cfg, study_attrs={})
    html = page.render_page(searched, page.figures(searched), tmp_path, explanation="",
                            generated_at="now")  # fmt: skip
    assert 'Plotly.newPlot("feasibility"' in html and 'Plotly.newPlot("load"' in html
