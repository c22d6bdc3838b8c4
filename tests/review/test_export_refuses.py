"""`export` refuses a setting that failed, in every format, unless `--force`; a forced export is
marked in the format itself: the command carries a flag SGLang rejects, and json says so."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import optuna
import pytest

from autotune.cli.main import main
from autotune.config.schema import StudyConfig
from autotune.errors import UsageError
from autotune.review.export import FORCED_FLAG, build_export
from autotune.review.exportformats import FORMATS, render
from autotune.review.source import build_review
from tests.oracle import run_in_sglang
from tests.review.conftest import STUDY
from tests.review.fakes import trial, walk


def _crash() -> optuna.trial.FrozenTrial:
    return trial(8, 0.93, outcome="crash", reason="crash (scheduler_exception): boom")


def _review(cfg: StudyConfig):  # type: ignore[no-untyped-def]
    return build_review("t", "x", [*walk(), _crash()], cfg=cfg, study_attrs={})


@pytest.mark.parametrize(
    ("number", "says"),
    [
        (6, "trial 6 ran out of memory (runtime_oom)"),
        (7, "trial 7 ran out of memory (startup_oom)"),
        (5, "trial 5 was infeasible (broke headroom_gib)"),
        (8, "trial 8 crashed (crash: scheduler_exception)"),
    ],
)
def test_a_failed_trial_is_refused(cfg: StudyConfig, number: int, says: str) -> None:
    with pytest.raises(UsageError) as err:
        build_export(_review(cfg), cfg, trial=number)
    text = str(err.value)
    assert text.startswith(says) and "--force" in text and "\n" not in text


def test_a_winner_whose_setting_failed_when_it_ran_is_refused(cfg: StudyConfig) -> None:
    review = build_review("t", "x", [trial(0, 0.90), trial(1, 0.89, outcome="runtime_oom")],
                          cfg=cfg, study_attrs={})  # fmt: skip
    with pytest.raises(UsageError, match=r"^trial 1 ran out of memory .*--force"):
        build_export(review, cfg)
    assert build_export(review, cfg, force=True).forced.startswith("trial 1 ran out of memory")


def test_a_forced_export_is_marked_in_every_format(cfg: StudyConfig) -> None:
    ex = build_export(_review(cfg), cfg, trial=6, force=True)
    marker = f"{FORCED_FLAG}=trial-6-runtime_oom"
    assert ex.forced_flag == marker and ex.flags[0] == marker
    flags = render(ex, "flags")
    assert shlex.split(flags)[0] == marker  # a token of the command, not a comment
    data = json.loads(render(ex, "json"))
    assert data["forced"] == {"reason": ex.forced, "marker": marker}
    assert marker in data["argv"] and "FORCED" in data["headline"]
    shell = render(ex, "shell")
    assert f"  {marker} \\" in shell and "# FORCED EXPORT: trial 6 ran out of memory" in shell
    words = shlex.split(shell.split("exec ", 1)[1].replace("\\\n", " "))
    assert marker in words
    unit = render(ex, "systemd")
    start = next(x for x in unit.splitlines() if x.startswith("ExecStart=") and len(x) > 10)
    assert marker in start.split() and "# FORCED EXPORT" in unit
    # an unforced export carries no marker, and neither does a feasible trial forced
    plain = build_export(_review(cfg), cfg, trial=3, force=True)
    assert not plain.forced and FORCED_FLAG not in render(plain, "json")


def _study_on_disk(tmp_path: Path) -> list[str]:
    (tmp_path / "t.toml").write_text(STUDY)
    db = tmp_path / "results" / "t"
    db.mkdir(parents=True)
    study = optuna.create_study(study_name="t", storage=f"sqlite:///{db / 'study.db'}",
                                directions=["maximize", "maximize"])  # fmt: skip
    for t in [*walk(), _crash()]:
        study.add_trial(t)
    return ["--config", str(tmp_path / "t.toml"), "--results-dir", str(tmp_path / "results")]


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_command_refuses_in_every_format_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    args = _study_on_disk(tmp_path)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for number in ("6", "7", "5", "8"):
        code = main(["export", *args, "--trial", number, "--format", fmt, "--no-flag-check"])
        out, err = capsys.readouterr()
        assert code == 2 and out == ""
        assert err.count("\n") == 1 and f"trial {number} " in err and "--force" in err
    code = main(["export", *args, "--trial", "6", "--format", fmt, "--force", "--no-flag-check"])
    out, err = capsys.readouterr()
    assert code == 0 and f"{FORCED_FLAG}=trial-6-runtime_oom" in out
    if fmt == "flags":  # the line stays pasteable; what it is goes to stderr
        assert out.count("\n") == 1 and "FORCED EXPORT" in err and "→ export trial 6" in err


@pytest.mark.sglang
def test_sglang_refuses_to_start_a_forced_export(cfg: StudyConfig, sglang_python: Path) -> None:
    """The marker does what it is for: SGLang's own parser stops at it (exit 2)."""
    ex = build_export(_review(cfg), cfg, trial=6, force=True)
    probe = (
        "import sys\n"
        "from sglang.srt.server_args import prepare_server_args\n"
        "try:\n    prepare_server_args(sys.argv[1:])\n"
        "except SystemExit as e:\n    print('exit', e.code)\n"
    )
    out = run_in_sglang(sglang_python, probe, *ex.flags)
    assert out.strip().endswith("exit 2")
