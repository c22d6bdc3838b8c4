"""The study: constraints in Optuna's convention, baseline first, resume, stale and interrupted
trials, and the ask/tell loop over a fake trial runner."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.config.schema import Constraints, StudyConfig
from autotune.config.studyfile import load_study
from autotune.errors import HarnessError, UsageError
from autotune.masking import redact
from autotune.record import internals
from autotune.study.loop import Interrupted, prepare, run_loop
from autotune.study.objectives import constraint_values, feasible
from autotune.study.samplers import make_sampler
from autotune.study.storage import (
    Worker,
    counted,
    default_storage_url,
    open_study,
    recover,
    stale_trials,
)
from autotune.trial.record import Measured, Result
from tests.study.conftest import VALID

OK = Measured(159277, 980.0, False, False, 0.0, 5.4, 900.0, 25.0)


def test_constraints_feasible_when_all_within_limits() -> None:
    c = Constraints(max_error_rate=0.01, min_headroom_gib=1.0, max_p99_ttft_ms=1000.0)
    values = constraint_values(OK, c)
    assert set(values) == {"oom", "crash", "error_rate", "headroom_gib", "p99_ttft_ms"}
    assert all(v <= 0 for v in values.values())


def test_oom_violates_oom_and_unmeasured_constraints() -> None:
    c = Constraints(min_headroom_gib=1.0, max_p99_itl_ms=50.0)
    oom = Measured(0, 0.0, True, False, None, None, None, None)
    values = constraint_values(oom, c)
    assert values["oom"] > 0 and values["error_rate"] > 0 and values["headroom_gib"] > 0
    assert values["p99_itl_ms"] > 0 and values["crash"] == 0


def test_each_limit_is_violated_by_its_own_measure() -> None:
    c = Constraints(max_error_rate=0.01, min_headroom_gib=6.0, max_p99_ttft_ms=500.0)
    values = constraint_values(OK, c)
    assert values["headroom_gib"] == pytest.approx(0.6)
    assert values["p99_ttft_ms"] == pytest.approx(0.8)
    assert values["error_rate"] < 0 and values["oom"] == 0


def test_redact_hides_passwords() -> None:
    assert redact("postgresql://tuner:s3cret@db:5432/x") == "postgresql://tuner:***@db:5432/x"
    assert redact("sqlite:////tmp/a.db") == "sqlite:////tmp/a.db"


def _cfg(study_file: Callable[[str], Path], sampler: str = "tpe") -> StudyConfig:
    cfg = load_study(study_file(VALID))
    return dataclasses.replace(cfg, sampler=dataclasses.replace(cfg.sampler, name=sampler))


def _open(cfg: StudyConfig, tmp_path: Path) -> optuna.Study:
    return open_study(cfg, default_storage_url(tmp_path), make_sampler(cfg.sampler))


@pytest.fixture
def cfg(study_file: Callable[[str], Path]) -> StudyConfig:
    """`VALID` with the TPE sampler."""
    return _cfg(study_file)


@pytest.fixture
def study(cfg: StudyConfig, tmp_path: Path) -> optuna.Study:
    """`cfg`'s study, opened on the SQLite file in `tmp_path` (open it again there to resume)."""
    return _open(cfg, tmp_path)


def _runner(
    cfg: StudyConfig, outcomes: dict[int, str] | None = None
) -> Callable[[optuna.trial.Trial], Result]:
    from autotune.config.space import settings_for

    def run_one(trial: optuna.trial.Trial) -> Result:
        outcome = (outcomes or {}).get(trial.number, "ok")
        settings = settings_for(trial, cfg.search)
        if outcome == "interrupt":
            raise KeyboardInterrupt
        if outcome == "harness_error":
            return Result("fail", outcome, "launch failed", None, {})
        f = float(settings.params["mem_fraction_static"])
        oom = outcome == "startup_oom"
        m = dataclasses.replace(OK, capacity_tokens=int(f * 1000), oom=oom)
        return Result("complete", outcome, "", m, {"capacity_tokens": int(f * 1000)})

    return run_one


def _loop(study: optuna.Study, cfg: StudyConfig, n: int, runner: Callable[..., Result]) -> object:
    return run_loop(
        study,
        cfg,
        run_one=runner,
        n_trials=n,
        timeout_s=None,
        clock=lambda: 0.0,
        worker=Worker.current(),
    )


def test_baseline_runs_first_and_constraints_are_stored(
    cfg: StudyConfig, study: optuna.Study
) -> None:
    assert prepare(study, cfg) == 1
    _loop(study, cfg, 3, _runner(cfg, {1: "startup_oom"}))
    trials = study.get_trials()
    assert len(trials) == 3
    assert trials[0].params == {
        "mem_fraction_static": 0.88,
        "max_running_requests": 48,
        "hicache_size": 48,
    }
    named = internals.constraints(trials[0])
    assert set(named) == {"oom", "crash", "error_rate", "headroom_gib"}
    listed = [named[k] for k in sorted(named)]  # the form Optuna Dashboard reads
    assert trials[0].system_attrs["constraints"] == listed
    assert feasible(trials[0]) and not feasible(trials[1])
    assert internals.constraints(trials[1])["oom"] == 1.0
    assert trials[0].user_attrs["worker"]["pid"] == os.getpid()


def test_prepare_is_done_once(cfg: StudyConfig, study: optuna.Study, tmp_path: Path) -> None:
    prepare(study, cfg)
    assert prepare(_open(cfg, tmp_path), cfg) == 0


def test_grid_walks_every_point_and_stops(
    study_file: Callable[[str], Path], tmp_path: Path
) -> None:
    text = VALID.replace(
        "max_running_requests = { choices = [32, 48, 64] }", "max_running_requests = 48"
    )
    text = text.replace("hicache_size = { choices = [0, 48] }", "hicache_size = 48")
    cfg = dataclasses.replace(
        load_study(study_file(text)),
        sampler=dataclasses.replace(_cfg(study_file).sampler, name="grid"),
    )
    study = _open(cfg, tmp_path)
    assert prepare(study, cfg) == 8
    end = _loop(study, cfg, 100, _runner(cfg))
    values = [t.params["mem_fraction_static"] for t in study.get_trials()]
    assert values[0] == 0.88
    assert sorted(values) == [0.8, 0.82, 0.84, 0.86, 0.88, 0.9, 0.92, 0.94]
    assert end.why == "grid done"  # type: ignore[attr-defined]


@pytest.mark.parametrize(("known", "ran"), [(True, 2), (False, 3)])
def test_no_trial_starts_that_would_end_after_the_timeout(
    cfg: StudyConfig, study: optuna.Study, known: bool, ran: int
) -> None:
    """Trials of 40 s under a 100 s timeout: the third would start at 80 s and end at 120 s, so
    where the loop knows how long a trial takes it stops after two, saying why; where it does
    not, it stops only once the time is up (the third starts at 80 s)."""
    prepare(study, cfg)
    now = [0.0]
    runner = _runner(cfg)

    def timed(trial: optuna.trial.Trial) -> Result:
        now[0] += 40.0
        return runner(trial)

    end = run_loop(
        study,
        cfg,
        run_one=timed,
        n_trials=10,
        timeout_s=100.0,
        clock=lambda: now[0],
        worker=Worker.current(),
        trial_s=(lambda: 40.0) if known else (lambda: None),
    )
    assert (end.ran, len(study.get_trials())) == (ran, ran)
    if known:
        assert (
            end.why
            == "timeout: the next trial would end after it (a trial takes about 40s, 20s left)"
        )
    else:
        assert end.why == "timeout"


def test_resume_counts_finished_trials(
    cfg: StudyConfig, study: optuna.Study, tmp_path: Path
) -> None:
    prepare(study, cfg)
    _loop(study, cfg, 2, _runner(cfg))
    again = _open(cfg, tmp_path)
    end = _loop(again, cfg, 5, _runner(cfg))
    assert len(again.get_trials()) == 5 and end.ran == 3  # type: ignore[attr-defined]


def test_interrupt_records_trial_and_requeues_point(
    cfg: StudyConfig, study: optuna.Study, tmp_path: Path
) -> None:
    prepare(study, cfg)
    with pytest.raises(Interrupted):
        _loop(study, cfg, 4, _runner(cfg, {0: "interrupt"}))
    t0 = study.get_trials()[0]
    assert t0.state == TrialState.FAIL and t0.user_attrs["outcome"] == "interrupted"
    assert counted(study.get_trials()) == 0
    _loop(_open(cfg, tmp_path), cfg, 4, _runner(cfg))
    trials = study.get_trials()
    assert len(trials) == 5 and counted(trials) == 4
    assert trials[1].params == t0.params  # the interrupted point ran again


def test_repeated_harness_failures_stop_the_run(cfg: StudyConfig, study: optuna.Study) -> None:
    with pytest.raises(HarnessError, match="3 trials in a row"):
        _loop(
            study,
            cfg,
            10,
            _runner(cfg, {0: "harness_error", 1: "harness_error", 2: "harness_error"}),
        )
    *failed, queued = study.get_trials()
    assert [t.state for t in failed] == [TrialState.FAIL] * 3
    assert queued.state == TrialState.WAITING  # the point is queued again for the next run


def _dead_worker() -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return {"host": Worker.current().host, "pid": int(proc.stdout), "start_ticks": 12345}


def test_stale_running_trial_is_failed_and_requeued(cfg: StudyConfig, study: optuna.Study) -> None:
    prepare(study, cfg)
    trial = study.ask()
    from autotune.config.space import settings_for

    settings_for(trial, cfg.search)
    trial.set_user_attr("worker", _dead_worker())
    live = study.ask()
    live.set_user_attr("worker", Worker.current().to_dict())
    other = study.ask()
    other.set_user_attr("worker", {"host": "another-box", "pid": 1, "start_ticks": 1})
    assert [t.number for t in stale_trials(study.get_trials(), Worker.current().host)] == [0]
    stopped: list[int] = []
    recovered = recover(
        study,
        host=Worker.current().host,
        stop_orphans=lambda t: stopped.append(t.number) or "stopped pid 7",
    )
    assert recovered == [0] and stopped == [0]
    t0 = study.get_trials()[0]
    assert t0.state == TrialState.FAIL and t0.user_attrs["outcome"] == "stale"
    assert "stopped pid 7" in t0.user_attrs["reason"]
    assert study.get_trials()[1].state == TrialState.RUNNING  # a live worker's trial is left alone
    assert study.get_trials()[2].state == TrialState.RUNNING  # another host's trial too
    waiting = study.get_trials(states=(TrialState.WAITING,))
    assert [w.system_attrs["fixed_params"] for w in waiting] == [t0.params]


def test_worker_alive() -> None:
    assert Worker.current().alive()
    assert not Worker.from_dict(_dead_worker()).alive()  # type: ignore[union-attr]


def test_objectives_must_match_on_resume(study_file: Callable[[str], Path], tmp_path: Path) -> None:
    from autotune.errors import UsageError

    cfg = _cfg(study_file)
    _open(cfg, tmp_path)
    with pytest.raises(UsageError, match="objectives"):
        _open(dataclasses.replace(cfg, objectives=("capacity",)), tmp_path)


def test_gp_sampler_without_torch_is_a_usage_error() -> None:
    from autotune.config.schema import SamplerConfig
    from autotune.errors import UsageError

    try:
        import torch  # noqa: F401
    except ImportError:
        with pytest.raises(UsageError, match="torch"):
            make_sampler(SamplerConfig("gp"))


@pytest.mark.parametrize(
    ("fatal", "error", "match"),
    [
        ("interrupted", Interrupted, None),
        ("teardown: GPU 0: 3.00 GiB more in use", HarnessError, "GPU 0"),
    ],
    ids=["stop-asked-during-teardown", "unclean-teardown"],
)
def test_a_fatal_teardown_records_the_trial_then_stops_the_study(
    cfg: StudyConfig, study: optuna.Study, fatal: str, error: type[Exception], match: str | None
) -> None:
    def run_one(trial: optuna.trial.Trial) -> Result:
        ok = _runner(cfg)(trial)
        return dataclasses.replace(ok, fatal=fatal)

    with pytest.raises(error, match=match):
        _loop(study, cfg, 5, run_one)
    trials = study.get_trials()
    assert len(trials) == 1 and trials[0].state == TrialState.COMPLETE


def test_a_study_never_mixes_backends(
    cfg: StudyConfig, study: optuna.Study, tmp_path: Path
) -> None:
    """A rehearsal on the simulator cannot add trials to a real night's study, nor the reverse;
    a study from before backends were recorded is judged by its trials' records."""
    assert study.user_attrs["backend"] == cfg.server.backend == "sim"
    real = dataclasses.replace(cfg, server=dataclasses.replace(cfg.server, backend="sglang"))
    with pytest.raises(UsageError, match="holds trials of the simulator rehearsal") as err:
        _open(real, tmp_path)
    assert "--results-dir" in str(err.value) and "\n" not in str(err.value)
    assert _open(cfg, tmp_path).user_attrs["backend"] == "sim"

    old = tmp_path / "old"
    old.mkdir()
    older = optuna.create_study(
        study_name=cfg.name, storage=default_storage_url(old), directions=["maximize"] * 2
    )
    trial = older.ask()
    trial.set_user_attr("record", {"backend": "sglang"})
    older.tell(trial, [1.0, 1.0])
    with pytest.raises(UsageError, match="holds trials of the sglang backend"):
        open_study(cfg, default_storage_url(old), make_sampler(cfg.sampler))
