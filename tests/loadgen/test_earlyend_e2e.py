"""`autotune run` through the simulator with `[workload] end_early`: a steady phase whose
throughput settles ends early and the trial records when and why; one whose measurement stays
noisy runs its whole duration."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from autotune.record.stored import stored
from tests import simstudy
from tests.simstudy import sim_study

pytestmark = pytest.mark.e2e

RULE = "end_early = {{ window_s = 1, windows = 3, tolerance = {tol}, min_s = 3, min_requests = 5 }}"


def _run(folder: Path, text: str) -> list[dict[str, object]]:
    path = folder / "early.toml"
    path.write_text(text)
    done = simstudy.run(path, "run", timeout=200)
    assert done.returncode == 0, done.stdout + done.stderr
    record = json.loads((folder / "results/early/trials/0000/trial.json").read_text())
    phases: list[dict[str, object]] = record["workload"]["phases"]
    return phases


def _with_rule(text: str, tol: float) -> str:
    return text.replace("drain_timeout_s = 5\n", f"drain_timeout_s = 5\n{RULE.format(tol=tol)}\n")


def test_a_settled_steady_phase_ends_early_and_the_trial_says_why(no_leftovers: Path) -> None:
    phases = _run(no_leftovers, _with_rule(sim_study(duration=90, n_trials=1), 0.1))
    steady, stress = phases
    assert steady["ended_by"] == "ended_early"
    assert isinstance(steady["duration_s"], float) and steady["duration_s"] < 60
    why = str(steady["early_end"])
    assert why.startswith("ended at ") and "of 90: throughput within 10% over 3 windows" in why
    summary = steady["summary"]
    assert isinstance(summary, dict) and summary["completed"] >= 5
    assert not summary.get("errors")  # what the early end cancelled is not a failure
    assert stress["ended_by"] == "completed"  # one round: nothing to skip
    url = f"sqlite:///{no_leftovers / 'results' / 'early' / 'study.db'}"
    trial = optuna.load_study(study_name="early", storage=url).get_trials()[0]
    assert stored(trial).ended_early == {str(steady["name"]): why}  # what a surface reads
    explained = simstudy.run(no_leftovers / "early.toml", "explain", "--trial", "0", timeout=60)
    assert explained.returncode == 0, explained.stderr
    assert f"workload phase {steady['name']} {why}" in explained.stdout
    # the confirm soak counts its factor in trials as they ran: twice the seconds the trial's
    # steady phase ran before it ended early, not twice the 90 s it was planned for
    confirmed = simstudy.run(no_leftovers / "early.toml", "confirm", "--cases", "none",
                             "--soak-factor", "2", timeout=200)  # fmt: skip
    assert confirmed.returncode == 0, confirmed.stdout + confirmed.stderr
    ran = float(steady["duration_s"])
    assert f"phase {steady['name']}: {2 * ran:,.0f} s, 2× the {ran:,.0f} s trial 0 ran it" in (
        confirmed.stdout
    )
    record = next((no_leftovers / "results/early/confirm").glob("*/trial.json"))
    soaked = json.loads(record.read_text())
    soak_steady = soaked["workload"]["phases"][0]
    assert soak_steady["ended_by"] == "completed"  # a soak never ends early
    assert 2 * ran - 1 <= float(soak_steady["duration_s"]) < 90


def test_a_noisy_steady_phase_runs_its_whole_duration(no_leftovers: Path) -> None:
    noisy = sim_study(duration=8, n_trials=1).replace(
        'input_len = { dist = "uniform", min = 200, max = 600 }\noutput_len = 16',
        'input_len = { dist = "lognormal", mean = 3000, std = 4000, min = 50, max = 30000 }\n'
        'output_len = { dist = "uniform", min = 1, max = 64 }',
    )
    assert "lognormal" in noisy
    steady = _run(no_leftovers, _with_rule(noisy, 0.02))[0]
    assert steady["ended_by"] == "completed"
    assert steady["early_end"] is None
    assert isinstance(steady["duration_s"], float) and steady["duration_s"] >= 8
