"""A study written by `autotune init` from a simulator log runs: three trials of `autotune run
--backend sim`, the workload cut short through the study's own phases, nothing left running."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from autotune.config.studyfile import load_study
from tests import simstudy

pytestmark = pytest.mark.e2e


def test_a_generated_study_runs_three_trials_on_the_simulator(
    kimi_log: Path, no_leftovers: Path
) -> None:
    folder = no_leftovers
    path = folder / "kimi.toml"
    done = subprocess.run(
        [sys.executable, "-m", "autotune", "init", "kimi", "--from-log", str(kimi_log),
         "--out", str(path)],
        capture_output=True, text=True, timeout=120, cwd=folder,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    text = path.read_text()
    start, end = text.index("[workload]"), text.index("[constraints]")
    path.write_text(text[:start] + simstudy.workload() + text[end:])
    cfg = load_study(path)
    baseline = dict(cfg.search.baseline)

    run = simstudy.run(path, "run", "--backend", "sim", "--n-trials", "3")
    assert run.returncode == 0, run.stdout + run.stderr
    url = f"sqlite:///{folder / 'results' / 'kimi' / 'study.db'}"
    trials = optuna.load_study(study_name="kimi", storage=url).get_trials()
    launched = [t for t in trials if t.user_attrs.get("outcome") != "skipped"]
    assert len(launched) == 3, [t.user_attrs.get("outcome") for t in trials]
    # the log ran the baseline and seeds the memory model (`seed_logs`), so the baseline is not
    # launched again: the first launch goes up toward the edge
    assert "seed_logs = [" in text and baseline["mem_fraction_static"] == 0.88
    first = launched[0]
    assert first.params != baseline
    assert first.params["mem_fraction_static"] > baseline["mem_fraction_static"]
    record = json.loads((folder / "results/kimi/trials/0000/trial.json").read_text())
    argv = " ".join(record["argv"])
    fraction = f"--mem-fraction-static {first.params['mem_fraction_static']:g}"
    for flag in ("--model-path moonshotai/Kimi-K2.5", "--tp-size 8", "--speculative-algorithm "
                 "EAGLE3", fraction, "--hicache-size 48"):  # fmt: skip
        assert flag in argv, argv
    assert record["workload"]["overall"]["completed"] > 0
    low, high = (float(x) for x in re.findall(r"low = ([0-9.]+), high = ([0-9.]+)", text)[0])
    assert all(low <= t.params["mem_fraction_static"] <= high for t in launched)
