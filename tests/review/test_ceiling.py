"""The winner's share of the box's ceiling: the figures it is worked out from, the line every
review surface prints, and the figure it names where one was not measured."""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

import pytest

from autotune.config.schema import StudyConfig
from autotune.memory.ceiling import ceiling as memory_ceiling
from autotune.record.stored import StudyRecord
from autotune.review import ceiling
from autotune.review import page as report
from autotune.review.explain import explain
from autotune.review.export import build_export
from autotune.review.exportformats import render
from autotune.review.source import Review, build_review
from autotune.review.status import status_text
from autotune.review.winner import parse_margin
from tests.review.fakes import trial, walk

LINE = re.compile(
    r"ceiling: winner ([\d,]+) tokens = (\d+)% of the ceiling ([\d,]+) tokens; ([\d.]+) GiB/GPU "
    r"of its reserve \(([\d.]+) GiB\) held nothing the trials measured \(it needs request table "
    r"0\.04, draft [\d.]+, CUDA graphs 3\.70, workspaces [\d.]+, stress peak 2\.50 \+ margin "
    r"([\d.]+)\)(?:; trial \d+ held [\d,]+ tokens, above the ceiling: it kept less than the "
    r"[\d.]+ GiB margin free at its stress peak)?"
)


def _review(cfg: StudyConfig, margin: str = "soak") -> Review:
    return build_review("t", "x", walk(), cfg=cfg, study_attrs={}, margin=parse_margin(margin))


def test_the_winner_against_the_ceiling_of_its_own_trial(cfg: StudyConfig) -> None:
    review = _review(cfg)
    w = review.winner
    assert w is not None and w.soak is not None
    s = ceiling.of_winner(review)
    basis = w.source if w.source is not None and w.source.feasible else w.chosen
    assert s.basis == basis.number and s.missing == ()
    a = basis.arithmetic(review.cell_bytes)
    assert a is not None
    want = memory_ceiling(a, w.soak.need_gib)  # the soak's margin, what the export keeps
    assert s.ceiling == want and want is not None
    assert s.tokens == w.capacity_tokens and w.capacity_tokens is not None
    assert s.share == pytest.approx(w.capacity_tokens / want.tokens)
    m = LINE.fullmatch(s.line())
    assert m is not None, s.line()
    assert m[1] == f"{w.capacity_tokens:,}" and m[3] == f"{want.tokens:,}"
    assert m[2] == f"{s.share * 100:.0f}" and m[6] == f"{w.soak.need_gib:.2f}"
    # what the reserve held beyond the needs is the free memory at the peak beyond the margin
    assert s.unused_gib is not None and w.free_at_peak_gib is not None
    assert s.unused_gib == pytest.approx(w.free_at_peak_gib - w.soak.need_gib, abs=1e-3)


@pytest.mark.parametrize(("margin", "want"), [("0", 0.5), ("1step", 0.5), ("3GiB", 3.0),
                                              ("0.1GiB", 0.5)])  # fmt: skip
def test_the_margin_is_the_one_the_export_keeps(cfg: StudyConfig, margin: str, want: float) -> None:
    review = _review(cfg, margin)
    assert ceiling.winner_margin_gib(review) == want  # never below the required 0.5 GiB
    needs = ceiling.of_winner(review).needs
    assert needs is not None and needs.margin == want


def test_more_steps_of_margin_leave_more_of_the_reserve_unused(cfg: StudyConfig) -> None:
    one, two = ceiling.of_winner(_review(cfg, "1step")), ceiling.of_winner(_review(cfg, "2steps"))
    # the same box and needs, read from the trial that ran each exported setting (0.89, 0.88)
    assert (one.basis, two.basis) == (4, 0)
    assert one.ceiling is not None and two.ceiling is not None
    assert one.ceiling.tokens == pytest.approx(two.ceiling.tokens, rel=1e-3)
    assert one.unused_gib is not None and two.unused_gib is not None
    assert two.unused_gib == pytest.approx(one.unused_gib + 0.01 * 94.05, abs=0.01)
    assert one.share is not None and two.share is not None and two.share < one.share


def test_at_the_ceiling_and_beyond_it(cfg: StudyConfig) -> None:
    review = _review(cfg)
    t = review.trial(0)
    assert t.free_at_peak_gib is not None and t.fraction is not None
    at = ceiling.share_of(review, t, who="winner", tokens=t.capacity_tokens, fraction=t.fraction,
                          margin_gib=t.free_at_peak_gib)  # fmt: skip
    assert at.share == pytest.approx(1.0, abs=1e-4)
    assert "= 100% of the ceiling" in at.line()
    assert "holds only what the trials measured it needs" in at.line()
    over = ceiling.share_of(review, t, who="winner", tokens=t.capacity_tokens,
                            fraction=t.fraction, margin_gib=t.free_at_peak_gib + 0.4)  # fmt: skip
    assert over.share is not None and over.share > 1.0
    assert "is 0.40 GiB/GPU short of what the trials measured" in over.line()


def test_a_figure_not_measured_is_named_instead_of_a_number(cfg: StudyConfig) -> None:
    review = _review(cfg)
    oom = ceiling.of_trial(review, review.trial(6))  # ran out of memory under load
    assert oom.ceiling is None and oom.share is None
    assert oom.line() == "ceiling: not known: the stress peak was not measured"
    never = ceiling.of_trial(review, review.trial(7))  # never finished starting
    assert never.line() == (
        "ceiling: not known: the free memory after startup and the stress peak were not measured"
    )
    no_p = trial(0, 0.88)
    no_p.user_attrs["record"]["ledger"].pop("p_gib")
    blind = build_review("t", "x", [no_p], cfg=cfg, study_attrs={})
    assert ceiling.line(blind) == (  # without P the backed-off pool cannot be predicted either
        "ceiling: not known: P (the free memory before the weights) and the winner's KV pool "
        "were not measured"
    )
    d = ceiling.of_trial(review, review.trial(6)).to_dict()
    assert d["tokens"] is None and d["missing"] == ["the stress peak"]


def test_without_a_winner_it_says_so(cfg: StudyConfig) -> None:
    review = build_review("t", "x", [trial(0, 0.93, outcome="runtime_oom")], cfg=cfg,
                          study_attrs={})  # fmt: skip
    assert ceiling.line(review) == (
        "ceiling: not known: no feasible trial yet, so no winner to measure it by"
    )


def test_every_surface_prints_the_same_line(cfg: StudyConfig, tmp_path: Path) -> None:
    review = _review(cfg)
    line = ceiling.line(review)
    assert LINE.fullmatch(line)
    assert explain(review, review.trial(0)).splitlines()[1] == line
    status = status_text("t", "x", walk(), StudyRecord.of({}), cfg, now=datetime(2026, 2, 25))
    assert status.splitlines()[1] == line
    ex = build_export(review, cfg)
    assert render(ex, "shell").splitlines()[2] == f"# {line}"
    assert json.loads(render(ex, "json"))["ceiling"]["line"] == line
    assert f"# {line}" in render(ex, "systemd")
    assert report.summary(review).splitlines()[1] == line
    html = report.render_page(review, report.figures(review), tmp_path, explanation="",
                              generated_at="now")  # fmt: skip
    assert f'<p class="ceiling">{line}</p>' in html
    forced = build_export(review, cfg, trial=6, force=True)
    assert forced.ceiling["line"] == "ceiling: not known: the stress peak was not measured"


def test_a_trial_that_held_more_than_the_ceiling_is_named_with_why(cfg: StudyConfig) -> None:
    """A wide margin lowers the ceiling below what the best trial held: the line says which
    trial held more and that it kept less than the margin free at its stress peak."""
    review = _review(cfg, "3GiB")
    wide = ceiling.of_winner(review)
    assert wide.ceiling is not None
    top = max((t for t in review.trials if t.feasible), key=lambda t: t.capacity_tokens or 0)
    held = top.capacity_tokens
    assert held is not None and held > wide.ceiling.tokens
    assert wide.line().endswith(
        f"; trial {top.number} held {held:,} tokens, above the ceiling: it kept less than the "
        "3.00 GiB margin free at its stress peak"
    ), wide.line()
    # where no trial held more than the ceiling, the line says nothing of it
    none = ceiling.of_winner(_review(cfg, "0"))
    assert none.ceiling is not None and none.ceiling.tokens >= held
    assert "above the ceiling" not in none.line()
