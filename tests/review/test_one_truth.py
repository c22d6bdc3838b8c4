"""One trial, one set of figures: status, explain, export (json) and the report's data print the
same capacity, free memory after startup, stress peak, free memory at the worst moment and
reserve P·(1 − f) for the same trials, and every surface starts with the same headline.

The trials reproduce what the demo recorded: the GPU probe's own peak (its rise from the start of
the workload, 2.38 GiB) is smaller than the drop from the free memory after startup to the least
free memory seen (2.49 GiB), and a trial that ran out of memory recorded the free memory it saw
before dying. Before, status/export/report printed 2.10 free at the peak where explain and the
waterfall printed 2.21 (free after startup − the probe's rise), and status printed a headroom for
the OOM trial that the report left blank.
"""

from __future__ import annotations

import json
import re

import pytest
from optuna.trial import FrozenTrial

from autotune.config.schema import StudyConfig
from autotune.review import figures as fig
from autotune.review import page
from autotune.review.explain import explain
from autotune.review.export import build_export
from autotune.review.exportformats import render
from autotune.review.headline import headline
from autotune.review.source import Review, build_review
from autotune.review.status import render as status_text
from autotune.review.status import rows
from autotune.review.winner import Margin
from tests import figures
from tests.review.fakes import P, trial, walk

BASELINE = {"baseline": {"mem_fraction_static": 0.88}}


def demo_like() -> list[FrozenTrial]:
    trials = walk()
    trials[4] = trial(4, 0.89, peak=2.49, rise=2.38)
    trials[6] = trial(6, 0.92, outcome="runtime_oom", reason="runtime_oom (torch_oom): CUDA",
                      least_free=1.25, rise=0.38)  # fmt: skip
    return trials


def _review(cfg: StudyConfig, trials: list[FrozenTrial], **kw: object) -> Review:
    return build_review("t", "sqlite:///x.db", trials, cfg=cfg, study_attrs=BASELINE, **kw)  # type: ignore[arg-type]


def _explain_figures(text: str) -> dict[str, str]:
    found = {
        "capacity": re.search(r"the log says ([\d,]+) tokens", text),
        "reserve": re.search(r"Reserve P × \(1 − f\) = ([\d.]+) GiB", text),
        "free": re.search(r"free after startup ([\d.]+)", text),
        "peak": re.search(r"Stress peak ([\d.]+) GiB", text),
        "worst": re.search(r"→ ([\d.]+) GiB free at the worst moment", text),
    }
    return {k: m.group(1) for k, m in found.items() if m is not None}


def test_status_explain_export_and_report_print_the_same_figures(cfg: StudyConfig) -> None:
    trials = demo_like()
    review = _review(cfg, trials)
    t = review.trial(4)
    assert review.winner is not None and review.winner.trial == 4
    # the figures hold together on the view: free after startup − stress peak = free at worst
    assert t.static_free_gib is not None and t.stress_peak_gib is not None
    assert t.static_free_gib - t.stress_peak_gib == pytest.approx(t.free_at_peak_gib)
    assert t.reserve_gib == pytest.approx(P * (1 - 0.89))
    want = figures.printed(t)
    assert want["peak"] == "2.49" and want["worst"] == fig.gib(t.static_free_gib - 2.49)

    head, body = rows(trials)
    status = dict(zip(head, body[4], strict=True))
    printed = {"capacity": status["capacity"], "free": status["free after startup"],
               "worst": status["free at worst"]}  # fmt: skip
    assert printed == {k: want[k] for k in ("capacity", "free", "worst")}

    text = explain(review, t)
    assert _explain_figures(text) == want
    own = next(line for line in text.splitlines() if line.startswith(" *"))
    assert own.split()[1:7] == ["0.89", fig.gib(t.ledger.kv_gib), want["capacity"],
                                want["reserve"], want["free"], want["worst"]]  # fmt: skip

    data = json.loads(render(build_export(review, cfg), "json"))
    assert f"{data['capacity_tokens']:,}" == want["capacity"]
    assert fig.gib(data["headroom_gib"]) == want["worst"]

    figs = page.figures(review)
    row = next(r for r in figs.rows if r.number == 4)
    assert (row.capacity, row.free, row.peak, row.headroom) == (
        want["capacity"], want["free"], want["peak"], want["worst"])  # fmt: skip
    wf = figs.waterfalls[0]
    assert wf.number == 4
    steps = {s.label: s.value for s in wf.steps}
    assert fig.gib(steps["free after startup"]) == want["free"]
    assert fig.gib(-steps["stress peak"]) == want["peak"]
    assert fig.gib(steps["free at the worst moment"]) == want["worst"]
    assert fig.gib(wf.reserve_gib) == want["reserve"]
    summary = page.summary(review)
    assert f"{want['capacity']} tokens" in summary
    assert f"{want['worst']} GiB free at the worst moment" in summary


def test_a_trial_that_ran_out_of_memory_has_no_free_memory_at_the_worst_moment(
    cfg: StudyConfig,
) -> None:
    trials = demo_like()
    review = _review(cfg, trials)
    t = review.trial(6)
    assert t.free_at_peak_gib is None and t.stress_peak_gib is None  # it recorded 1.25 and died
    head, body = rows(trials)
    status = dict(zip(head, body[6], strict=True))
    assert status["free at worst"] == "" and status["tok/s"] == ""
    row = next(r for r in page.figures(review).rows if r.number == 6)
    assert row.headroom == "" and row.peak == ""
    assert status["free after startup"] == row.free == fig.gib(t.static_free_gib)
    text = explain(review, t)
    assert "free at the worst moment (required" not in text.split("Other fractions")[0]
    assert "the transient peak exceeded the" in text


def test_a_predicted_export_prints_the_prediction_explain_prints(cfg: StudyConfig) -> None:
    """A margin to a fraction no trial ran: export, the headline and explain's table agree."""
    review = _review(cfg, [trial(0, 0.90, peak=2.49, rise=2.38)])
    w = review.winner
    assert w is not None and w.predicted and w.params["mem_fraction_static"] == 0.89
    data = json.loads(render(build_export(review, cfg), "json"))
    text = explain(review, review.trial(0))
    row = next(line for line in text.splitlines() if line.strip().startswith("0.89"))
    assert row.split()[2] == f"{data['capacity_tokens']:,}"
    assert row.split()[5] == fig.gib(data["headroom_gib"])
    assert row.endswith("predicted")
    assert (
        f"{fig.gib(data['headroom_gib'])} GiB free at the worst moment, predicted"
        in (data["headline"])
    )


def test_a_gib_margin_predicts_with_the_same_function(cfg: StudyConfig) -> None:
    review = _review(cfg, demo_like(), margin=Margin(steps=0, headroom_gib=3.5))
    w = review.winner
    assert w is not None
    t = review.trial(w.chosen.number)
    at = t.predict(float(w.params["mem_fraction_static"]), review.cell_bytes)
    assert at is not None
    if w.predicted:
        assert w.free_at_peak_gib == at.free_at_peak_gib
    else:
        assert w.source is not None and w.free_at_peak_gib == w.source.free_at_peak_gib
    assert w.free_at_peak_gib is not None and w.free_at_peak_gib >= 3.5


def test_every_surface_starts_with_the_headline(cfg: StudyConfig) -> None:
    trials = demo_like()
    review = _review(cfg, trials)
    line = headline(review)
    t0, t4 = review.trial(0), review.trial(4)
    gain = (t4.capacity_tokens or 0) / (t0.capacity_tokens or 1) - 1
    assert line == (
        f"baseline 0.88: {fig.tokens(t0.capacity_tokens)} tokens → export 0.89: "
        f"{fig.tokens(t4.capacity_tokens)} tokens ({gain:+.0%}), "
        f"{fig.gib(t4.free_at_peak_gib)} GiB free at the worst moment, UNCONFIRMED"
    )
    assert status_text("t", "x", trials, headline=line).splitlines()[0] == line
    assert explain(review, t4).splitlines()[0] == line
    assert page.summary(review).splitlines()[0] == line
    ex = build_export(review, cfg)
    assert ex.headline == line
    assert render(ex, "shell").splitlines()[1] == f"# {line}"
    assert render(ex, "systemd").splitlines()[0] == f"# {line}"
    assert json.loads(render(ex, "json"))["headline"] == line
    assert next(iter(json.loads(render(ex, "json")))) == "headline"


def test_the_headline_says_when_the_baseline_failed_or_nothing_is_feasible(
    cfg: StudyConfig,
) -> None:
    failed = trial(0, 0.88, outcome="startup_error",
                   reason="startup_error (hicache_too_small): host pool too small")  # fmt: skip
    review = _review(cfg, [failed])
    assert headline(review) == (
        "baseline 0.88: failed to start (startup_error: hicache_too_small) → nothing to export "
        "yet: no feasible trial"
    )
    review = _review(cfg, [trial(0, 0.88, outcome="runtime_oom"), trial(1, 0.86)])
    line = headline(review)
    assert line.startswith("baseline 0.88: ") and "ran out of memory (runtime_oom)" in line
    assert "(+" not in line and "(-" not in line  # no gain against a baseline that failed
    no_baseline = build_review("t", "x", [trial(0, 0.88)], cfg=None, study_attrs={})
    assert headline(no_baseline).startswith("no baseline in the study → export 0.87: ")
