"""explain's words and export's formats, from recorded trials."""

from __future__ import annotations

import json
import shlex

import optuna
import pytest

from autotune.config.schema import StudyConfig
from autotune.config.space import settings_for
from autotune.errors import UsageError
from autotune.review.explain import explain
from autotune.review.export import build_export, round_trip
from autotune.review.exportformats import render
from autotune.review.source import Review, build_review
from autotune.sim.profiles import load_profile
from autotune.testing.oracle import bench_for, run_trial
from tests.review.fakes import trial, walk
from tests.review.test_soak import UNSEEN

KEY = "sk-very-secret-0123"


def _review(cfg: StudyConfig | None, **attrs: object) -> Review:
    return build_review("t", "sqlite:///x.db", walk(), cfg=cfg, study_attrs=attrs)


def test_explain_puts_the_operators_arithmetic_in_words(cfg: StudyConfig) -> None:
    review = _review(cfg)
    text = explain(review, review.trial(0))
    assert "KV pool = A − P × (1 − f) = 21.71 − 94.05 × (1 − 0.88) = 10.42 GiB → 159,276 " \
        "tokens at 70,272 B/token" in text  # fmt: skip
    assert "Reserve P × (1 − f) = 11.29 GiB = request table 0.04 + draft 0.84" in text
    assert "CUDA graphs 3.70" in text
    assert "Headroom P" not in text  # the reserve is not the headroom the constraint checks
    assert "Stress peak 2.50 GiB: what the workload took at its worst" in text
    assert "GiB free at the worst moment (required ≥ 0.50)" in text
    assert "does not size the KV pool" in text
    # other fractions, with the trials that ran them, and the limit
    assert (
        "#5 ok, measured" in text and "0.91 (trial 5), was infeasible: broke headroom_gib" in text
    )
    assert "highest mem_fraction_static that does is 0.9" in text


def test_explain_names_the_exported_setting_and_its_confirmation(cfg: StudyConfig) -> None:
    review = _review(cfg)
    assert review.winner is not None and review.winner.trial == 4
    text = explain(review, review.trial(4))
    assert "this is the exported setting, UNCONFIRMED" in text
    assert "#6 runtime_oom" in text and "predicted: OOM under stress" not in text


def test_explain_says_when_the_export_is_a_backed_off_prediction(cfg: StudyConfig) -> None:
    review = build_review("t", "x", [trial(0, 0.90)], cfg=cfg, study_attrs={})
    text = explain(review, review.trial(0))
    assert "backed off to mem_fraction_static=0.89 (never run; its figures are predicted)" in text


def test_explain_a_startup_oom(cfg: StudyConfig) -> None:
    review = _review(cfg)
    text = explain(review, review.trial(7))
    assert "out of memory" in text and "did not get far enough" in text
    # predictions start from the nearest trial that started (0.92) with the others' stress peak
    assert "predictions below start from trial 6 (mem_fraction_static=0.92)" in text
    assert "stress peak measured by trials #0, #1, #2, #3, #4, #5" in text
    row = next(line for line in text.splitlines() if line.startswith(" *"))
    assert "0.94" in row and "#7 startup_oom, measured" in row
    # it never finished starting: no free memory after startup, none at the worst moment
    assert row.split()[5] == "–" and row.split()[6] == "–"
    predicted = next(line for line in text.splitlines() if line.strip().startswith("0.95"))
    assert "predicted: OOM at startup" in predicted
    assert float(predicted.split()[5]) < 0  # free memory at startup: negative


def test_unknown_trial_is_a_usage_error(cfg: StudyConfig) -> None:
    with pytest.raises(UsageError, match="--trial 99: study t has no such trial"):
        _review(cfg).trial(99)


def test_export_round_trips_and_uses_the_space_function(cfg: StudyConfig) -> None:
    ex = build_export(_review(cfg), cfg)
    assert ex.trial == 4 and ex.params["mem_fraction_static"] == 0.89
    assert ex.argv[:3] == ("python3", "-m", "sglang.launch_server")
    assert round_trip(ex.argv, cfg) == {"mem_fraction_static": 0.89, "max_running_requests": 48}
    assert ex.argv[-4:] == ("--host", "127.0.0.1", "--port", "30000")
    shell = render(ex, "shell")
    words = shlex.split(shell.split("exec ", 1)[1].replace("\\\n", " "))
    assert words[: len(ex.argv)] == list(ex.argv)


def test_export_formats(cfg: StudyConfig) -> None:
    ex = build_export(_review(cfg), cfg)
    flags = render(ex, "flags")
    assert flags.startswith("--model-path '/models/Kimi K2.5' --tp-size 8")
    assert "--mem-fraction-static 0.89 --max-running-requests 48" in flags
    data = json.loads(render(ex, "json"))
    for key in ("study", "trial", "params", "argv", "capacity_tokens", "throughput_tok_s",
                "headroom_gib", "margin", "confirmed", "sglang_version"):  # fmt: skip
        assert key in data
    assert data["confirmed"] is None
    # the default margin: what a confirm soak needs, and how long that soak is
    margin = data["margin"]
    assert margin["soak"] is True and margin["steps"] == 1 and margin["soak_factor"] == 3.0
    assert "for a 3× soak" in margin["soak_plan"]
    assert data["sglang_version"] == "0.5.9"
    unit = render(ex, "systemd")
    lines = unit.splitlines()
    assert "[Service]" in lines and "ExecStart=" in lines
    start = next(x for x in lines if x.startswith("ExecStart=python3"))
    assert '"/models/Kimi K2.5"' in start
    assert "Environment=SGLANG_ENABLE_SPEC_V2=1" in lines
    assert "UNCONFIRMED" in unit and "UNCONFIRMED" in render(ex, "shell")
    with pytest.raises(UsageError, match="--format xml"):
        render(ex, "xml")


def test_export_refers_to_the_api_key_variable_never_its_value(
    cfg: StudyConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTOTUNE_TEST_KEY", KEY)
    review = _review(cfg)
    ex = build_export(review, cfg)
    for fmt in ("flags", "shell", "json", "systemd"):
        out = review.scrub(render(ex, fmt))
        assert KEY not in out
        assert "AUTOTUNE_TEST_KEY" in out
    assert '--api-key "${AUTOTUNE_TEST_KEY}"' in render(ex, "shell")


def test_export_a_trial_as_it_ran(cfg: StudyConfig) -> None:
    ex = build_export(_review(cfg), cfg, trial=3)
    assert ex.params["mem_fraction_static"] == 0.87 and ex.confirmed is None
    assert ex.notes == () and not ex.forced and ex.flags == ex.argv[len(ex.program) :]
    assert ex.margin == {"steps": 0, "headroom_gib": None}
    assert ex.headline.startswith("no baseline in the study → export trial 3 (0.87): ")


def test_export_without_a_feasible_trial(cfg: StudyConfig) -> None:
    review = build_review("t", "x", [trial(0, 0.94, outcome="startup_oom")], cfg=cfg,
                          study_attrs={})  # fmt: skip
    with pytest.raises(UsageError, match="no feasible trial"):
        build_export(review, cfg)


def test_a_soak_measures_a_predicted_export(cfg: StudyConfig) -> None:
    params = {"mem_fraction_static": 0.89, "max_running_requests": 48}
    soak = {"params": params, "passed": True, "outcome": "ok", "capacity_tokens": 173_683,
            "throughput_tok_s": 140.5, "headroom_gib": 1.9}  # fmt: skip
    review = build_review("t", "x", [trial(0, 0.90)], cfg=cfg, study_attrs={"confirmation": soak})
    ex = build_export(review, cfg)
    assert not ex.predicted and ex.capacity_tokens == 173_683 and ex.throughput_tok_s == 140.5
    assert "figures measured by the confirmation soak" in ex.notes
    assert not any(n.startswith("no trial ran") for n in ex.notes)
    # every surface shows what the soak measured: status, report and explain lead with the
    # export's own headline (they showed the prediction, marked CONFIRMED)
    assert review.winner is not None and review.winner.capacity_tokens == 173_683
    text = explain(review, review.trial(0))
    assert text.splitlines()[0] == ex.headline and "predicted" not in ex.headline
    assert "run by its confirmation soak alone" in text


def test_a_passed_confirmation_labels_the_winner_confirmed(cfg: StudyConfig) -> None:
    params = {"mem_fraction_static": 0.89, "max_running_requests": 48}
    ok = {"params": params, "passed": True, "outcome": "ok", "at": "today"}
    review = _review(cfg, confirmation=ok)
    assert review.confirmed is True
    ex = build_export(review, cfg)
    assert ex.confirmed is True and "CONFIRMED" in render(ex, "shell")
    other = {**ok, "params": {**params, "mem_fraction_static": 0.88}}
    assert _review(cfg, confirmation=other).confirmed is None
    failed = {**ok, "passed": False, "reason": "runtime_oom"}
    assert _review(cfg, confirmation=failed).confirmed is False
    assert "FAILED" in _review(cfg, confirmation=failed).confirmed_label()


def test_explain_names_a_folded_draft_s_share_of_the_pool() -> None:
    """GLM-4.5-Air with its MTP layer as an EAGLE draft on 0.5.23 (a box no rule was tuned on):
    the pool is sized with the draft's KV inside each token's cell, so the log's KV line (the
    target's layers) is short of the budget by the draft's share; it was put down to rounding,
    and the reserve listed the draft's weights and KV as 0.00."""
    bench = bench_for(load_profile(str(UNSEEN / "glm-4.5-air-fp8-tp2-h100-mtp.toml")))
    study = optuna.create_study(directions=["maximize", "maximize"])
    study.enqueue_trial(
        {"mem_fraction_static": 0.88, "max_running_requests": 48, "hicache_size": 0}
    )
    asked = study.ask()
    settings_for(asked, bench.search)
    run_trial(study, bench, asked, 1)
    review = build_review("t", "sqlite:///x.db", study.trials, cfg=None, study_attrs={})
    text = explain(review, review.trial(0))
    assert "the draft's KV, which 0.5.18+ sizes inside each token's cell" in text
    assert "padding page" not in text
    assert "draft graphs 0.09 (its weights are in A, its KV in the pool)" in text
