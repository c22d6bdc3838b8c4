"""The written report: files, escaping of what came from logs, no secrets, the summary."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from optuna.trial import TrialState

from autotune.config.schema import StudyConfig
from autotune.masking import masked_argv, scrub
from autotune.review.page import figures, summary, write_report
from autotune.review.source import build_review
from tests.review.fakes import trial

KEY = "sk-live-4242424242"
NASTY = '</script><script>alert("pwned")</script><img src=x onerror=alert(1)>'


def _trials() -> list:  # type: ignore[type-arg]
    return [
        trial(0, 0.88),
        trial(1, 0.90, throughput=144.0),
        trial(2, 0.92, outcome="runtime_oom", reason=f"runtime_oom: {NASTY} api_key='{KEY}'",
              evidence=(f"server_args=ServerArgs(api_key='{KEY}')",)),
        trial(3, 0.91, state=TrialState.RUNNING),
    ]  # fmt: skip


def test_report_files_escape_logs_and_hide_secrets(
    cfg: StudyConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTOTUNE_TEST_KEY", KEY)
    review = build_review("t", "postgresql://autotune:***@db/optuna", _trials(), cfg=cfg,
                          study_attrs={})  # fmt: skip
    written = write_report(
        review,
        tmp_path,
        explanation="KV pool = …",
        generated_at="now",
        warnings=["--cuda-graph-max-bs is not a flag of this SGLang <b>"],
    )
    page = written.html.read_text(encoding="utf-8")
    assert written.html == tmp_path / "report.html"
    assert page.startswith("<!DOCTYPE html>") and "Plotly.newPlot" in page
    # plotly.js is embedded: the page loads nothing from the network
    assert not re.search(r"<script[^>]+src=", page)
    assert "cdn.plot.ly" not in page.split("</script>", 1)[1]
    # the hostile reason is shown, escaped, never as markup
    assert NASTY not in page and "<img src=x" not in page
    assert "&lt;/script&gt;&lt;script&gt;alert(&quot;pwned&quot;)" in page
    assert page.count("</script>") == page.count("<script")
    assert KEY not in page
    assert "Flag check:" in page and "this SGLang &lt;b&gt;" in page
    assert "The study is still running" in page and "UNCONFIRMED" in page
    # the log link is relative to the report
    rel = os.path.relpath("/results/t/trials/0000/server.log", tmp_path)
    assert f'<a href="{rel}">server.log</a>' in page
    names = {p.name for p in written.pngs}
    assert {"pareto.png", "feasibility.png", "capacity.png", "load.png", "history.png",
            "ledger-winner.png"} <= names  # fmt: skip
    for png in written.pngs:
        data = png.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_figures_put_the_exported_trial_first(cfg: StudyConfig) -> None:
    review = build_review("t", "x", _trials(), cfg=cfg, study_attrs={})
    figs = figures(review)
    # 0.90 backed off to 0.89, which never ran: the figures are predicted from trial 1
    assert review.winner is not None and review.winner.predicted and review.winner.trial == 1
    assert figs.waterfalls[0].number == 1
    assert figs.pareto.winner == 1 and figs.pareto.chosen == 1 and figs.pareto.confirmed is None
    assert figs.pareto.winner_label == "chosen; exported backed off (predicted) (UNCONFIRMED)"
    assert [r.number for r in figs.rows] == [0, 1, 2, 3]


def test_summary(cfg: StudyConfig) -> None:
    review = build_review("t", "x", _trials(), cfg=cfg, study_attrs={})
    text = summary(review)
    assert "3 trials finished, 2 feasible, 1 out of memory, 1 running" in text
    assert "export: mem_fraction_static=0.89 max_running_requests=48 → 173,647 tokens" in text
    # 0.89 ran nowhere at 48 requests: the note names the whole point, not the fraction alone
    assert "no trial ran mem_fraction_static=0.89 at max_running_requests=48" in text
    assert "UNCONFIRMED" in text


def test_summary_without_a_feasible_trial(cfg: StudyConfig) -> None:
    review = build_review("t", "x", [trial(0, 0.94, outcome="startup_oom")], cfg=cfg,
                          study_attrs={})  # fmt: skip
    assert "no feasible trial yet" in summary(review)


@pytest.mark.parametrize(
    ("text", "hidden"),
    [
        (f"ServerArgs(api_key='{KEY}', port=30000)", KEY),
        (f"launch --api-key {KEY} --port 1", KEY),
        (f"Authorization: Bearer {KEY}", KEY),
        ("postgresql://autotune:hunter2@db:5432/optuna", "hunter2"),
    ],
)
def test_scrub(text: str, hidden: str) -> None:
    out = scrub(text)
    assert hidden not in out and "***" in out


def test_scrub_keeps_variable_references_and_masks_literal_secrets() -> None:
    assert scrub('--api-key "${KEY_VAR}"') == '--api-key "${KEY_VAR}"'
    assert scrub("the key is abcdef123", ["abcdef123"]) == "the key is ***"
    assert masked_argv(["x", "--api-key", KEY, "--api-key=" + KEY]) == (
        "x", "--api-key", "***", "--api-key=***")  # fmt: skip
