"""The commands autotune tells the operator to run name the study as they named it
(`cli.common.addressed`): a study opened with `--config` and `--results-dir` is not found again
by `--study NAME` alone."""

from __future__ import annotations

import argparse
from pathlib import Path

from autotune.cli.common import addressed
from autotune.review.source import build_review
from tests.review.fakes import walk


def _args(**given: object) -> argparse.Namespace:
    base: dict[str, object] = {
        "study": None,
        "config": None,
        "storage": None,
        "results_dir": Path("results"),
    }
    return argparse.Namespace(**{**base, **given})


def test_the_study_is_named_as_the_operator_named_it() -> None:
    assert addressed(_args(study="kimi"), "kimi") == "--study kimi"
    flow = _args(config=Path("/tmp/flow/glm.toml"), results_dir=Path("/tmp/flow/results"))
    assert addressed(flow, "glm") == "--config /tmp/flow/glm.toml --results-dir /tmp/flow/results"
    pg = _args(study="kimi", storage="postgresql://tuner:s3cret@db:5432/studies")
    said = addressed(pg, "kimi")
    assert said == "--study kimi --storage 'postgresql://tuner:***@db:5432/studies'"
    assert addressed(_args(config=Path("my study.toml")), "x") == "--config 'my study.toml'"


def test_the_review_s_confirm_hint_carries_those_arguments() -> None:
    review = build_review(
        "glm",
        "sqlite:///x.db",
        walk(),
        cfg=None,
        study_attrs={},
        addressed="--config /tmp/flow/glm.toml --results-dir /tmp/flow/results",
    )
    assert review.confirmed_label() == (
        "UNCONFIRMED (run `autotune confirm --config /tmp/flow/glm.toml --results-dir "
        "/tmp/flow/results`)"
    )
    plain = build_review("glm", "sqlite:///x.db", walk(), cfg=None, study_attrs={})
    assert plain.confirmed_label() == "UNCONFIRMED (run `autotune confirm --study glm`)"
