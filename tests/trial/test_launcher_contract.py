"""The `Launcher` contract, run against both implementations the study loop is driven with:
`LiveLauncher` (`live_launcher` over a simulator study: real `python -m autotune.sim` servers on
127.0.0.1, startup sped up 30000×) and the test fake `FakeLauncher` (tests/study/fakes.py).

Each case builds its plan the way the study runner does (`settings_for` over a fixed trial,
`plan_trial` with the launcher's `extra_args()`, `trial_dir` under the study folder) and runs it
with `run_trial`. The simulator's servers carry the test's folder in their command line
(`--sim-gpu-dir`), so `no_leftovers` (tests/conftest.py) kills and fails on any survivor; each
case also checks for itself that nothing is left: no process, a free port, no pidfile, no GPU
memory held in the simulator's state.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import optuna
import pytest

from autotune.config.schema import StudyConfig
from autotune.config.space import settings_for
from autotune.config.studyfile import load_study
from autotune.config.workload import Stress
from autotune.server import pidfile
from autotune.server.gpu import SimProbe
from autotune.server.teardown import port_is_free
from autotune.study.runner import trial_dir
from autotune.trial.live import live_launcher
from autotune.trial.plan import TrialPlan, plan_trial
from autotune.trial.run import FollowUp, run_shared, run_trial
from autotune.trial.seam import Launcher
from autotune.trial.trialfile import TrialRecord, write_record
from tests import simstudy
from tests.study.fakes import FakeLauncher

# Startup of the simulated Kimi-K2.5 in under a second; a 0.2 s steady phase and one stress round.
STUDY = simstudy.sim_study(time_scale=30000, duration=0.2)


@dataclass
class Rig:
    """A launcher, its study, and how to tell that the servers it started are all gone."""

    name: str
    folder: Path
    cfg: StudyConfig
    study_dir: Path
    launcher: Launcher
    extra_expected: tuple[str, ...]
    check_gone: Callable[[TrialPlan], None] = field(repr=False)

    def plan(self, mem_fraction_static: float, number: int = 0) -> TrialPlan:
        fixed = optuna.trial.FixedTrial({"mem_fraction_static": mem_fraction_static})
        return plan_trial(
            self.cfg,
            settings_for(fixed, self.cfg.search),
            number=number,
            trial_dir=trial_dir(self.study_dir, number),
            extra=self.launcher.extra_args(),
        )


def _study(folder: Path) -> tuple[StudyConfig, Path]:
    path = folder / "configs" / "contract.toml"
    path.parent.mkdir(parents=True)
    path.write_text(STUDY)
    cfg = load_study(path)
    return cfg, folder / "results" / cfg.name


def _live(folder: Path) -> Rig:
    cfg, study_dir = _study(folder)
    gpu_dir = study_dir / "sim-gpu"

    def gone(plan: TrialPlan) -> None:
        assert simstudy.leftovers(folder) == [], "a simulator process outlived its trial"
        assert port_is_free(plan.host, plan.port), f"port {plan.port} is still bound"
        assert pidfile.records(study_dir / "run") == []
        held = {g.index: dict(g.pids) for g in SimProbe(gpu_dir).snapshot() if g.pids or g.used}
        assert held == {}, f"simulated GPU memory still held: {held}"

    return Rig(
        "live",
        folder,
        cfg,
        study_dir,
        live_launcher(cfg, study_dir),
        ("--sim-gpu-dir", str(gpu_dir)),
        gone,
    )


def _fake(folder: Path) -> Rig:
    cfg, study_dir = _study(folder)
    launcher = FakeLauncher()

    def gone(plan: TrialPlan) -> None:
        assert launcher.log.count("launch") == launcher.log.count("stop") >= 1
        assert launcher.log[-1] == "stop"

    return Rig("fake", folder, cfg, study_dir, launcher, (), gone)


@pytest.fixture(params=[pytest.param("live", marks=pytest.mark.e2e), "fake"])
def rig(request: pytest.FixtureRequest, no_leftovers: Path) -> Rig:
    make = _live if request.param == "live" else _fake
    return make(no_leftovers)


def _run(rig: Rig, plan: TrialPlan) -> tuple[TrialRecord, list[str]]:
    phases: list[str] = []
    record = run_trial(plan, rig.launcher, clock=time.monotonic, phase=phases.append)
    return record, phases


# mem_fraction_static -> (state, outcome, phases): the simulated Kimi-K2.5 serves at 0.88 and runs
# out of memory during startup at 0.94 (a parameter result: complete); `kimi_like` scripts the same.
CASES = {
    "ok": (0.88, "complete", "ok", ["launch", "startup", "workload", "teardown"]),
    "startup_oom": (0.94, "complete", "startup_oom", ["launch", "startup", "teardown"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_trial_ends_in_a_known_record_and_leaves_nothing_running(rig: Rig, case: str) -> None:
    f, state, outcome, expected_phases = CASES[case]
    plan = rig.plan(f, number=3)
    record, phases = _run(rig, plan)

    assert (record.state, record.outcome) == (state, outcome), record.reason
    assert phases == expected_phases
    assert record.fatal == "", "the teardown was not clean"
    assert record.number == 3 and dict(record.params) == dict(plan.params)
    assert record.params["mem_fraction_static"] == f
    assert record.argv == (*plan.argv, "--host", plan.host, "--port", str(plan.port))
    assert record.backend == "sim" and record.autotune_version
    assert record.log_path == str(plan.log_path)
    assert plan.log_path.is_file() and plan.log_path.stat().st_size > 0
    assert set(record.phases) >= {*expected_phases, "total"}
    measured = record.measured()
    assert measured is not None and measured.oom == (outcome == "startup_oom")
    if outcome == "ok":
        assert record.reason == ""
        assert record.capacity_tokens > 150_000
        assert record.throughput_tok_s > 0 and record.error_rate == 0.0
        assert record.headroom_gib is not None and record.headroom_gib > 0
        assert record.workload and record.sglang_version
    else:
        assert "out of memory" in record.reason.lower()
        assert record.workload == {} and record.throughput_tok_s == 0.0

    written = json.loads(write_record(record, plan.trial_dir).read_text())
    assert (written["state"], written["outcome"]) == (state, outcome)
    rig.check_gone(plan)


def test_stop_orphans_on_a_clean_folder_reports_nothing_and_is_idempotent(rig: Rig) -> None:
    assert rig.launcher.stop_orphans() == []  # a study folder nothing ever ran in
    assert rig.launcher.stop_orphans() == []
    plan = rig.plan(0.94)  # the shortest trial: a startup OOM, its server stopped by run_trial
    record, _ = _run(rig, plan)
    assert record.outcome == "startup_oom", record.reason
    assert rig.launcher.stop_orphans() == []  # that server was stopped, not orphaned
    assert rig.launcher.stop_orphans() == []
    rig.check_gone(plan)


def test_extra_args_are_strings_that_every_plan_carries(rig: Rig) -> None:
    extra = rig.launcher.extra_args()
    assert isinstance(extra, tuple) and all(isinstance(a, str) for a in extra)
    assert extra == rig.extra_expected
    assert rig.launcher.extra_args() == extra  # the same for every launch
    for number, f in enumerate((0.88, 0.91)):
        argv = rig.plan(f, number).argv
        starts = [i for i in range(len(argv) - len(extra) + 1) if argv[i : i + len(extra)] == extra]
        assert starts, f"{extra} not in {argv}"


def test_follow_ups_share_a_live_launch_and_a_launcher_that_cannot_share_says_so(
    rig: Rig,
) -> None:
    plan = rig.plan(0.88, number=4)
    burst = Stress("burst", rounds=1, requests=2, input_len=64, output_len=4)
    workload = dataclasses.replace(rig.cfg.workload, phases=(burst,))
    follows = [
        FollowUp(name, dataclasses.replace(plan, trial_dir=plan.trial_dir / name), workload, 60.0)
        for name in ("one", "two")
    ]
    phases: list[str] = []
    shared = run_shared(plan, rig.launcher, lambda ledger: follows, clock=time.monotonic,
                        phase=phases.append)  # fmt: skip
    assert shared.first.outcome == "ok", shared.first.reason
    if rig.name == "live":  # one server served all three workloads, at rest before each
        assert phases == ["launch", "startup", "workload", "case one", "case two", "teardown"]
        assert [r.outcome for r in shared.then] == ["ok", "ok"] and shared.why == ""
        assert all(r.stress_peak_gib is not None and r.headroom_gib for r in shared.then)
        assert all(r.log_path == str(plan.log_path) for r in shared.then)
        assert shared.then[-1].fatal == "" and "teardown" in shared.then[-1].phases
    else:  # the fake's servers serve their own workload only
        assert shared.then == () and shared.unrun == 2 and "one workload each" in shared.why
    rig.check_gone(plan)
