"""Workers sharing a study, the pure parts: settings, identity, judging stale trials, the budget
and repeats, and the wait for other workers (with a fake clock)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import FrozenTrial, TrialState

from autotune.config.schema import Heartbeat, Limits, SearchConfig, StudyConfig
from autotune.config.studyfile import parse_study
from autotune.errors import ConfigError, UsageError
from autotune.study.storage import Worker, stale
from autotune.study.workers import (
    HOST_ENV,
    Coordinator,
    current_worker,
    duplicate_of,
    gpu_group,
    machine_id,
    max_wait_s,
    parse_gpus,
    same_point,
    surplus,
    with_worker_args,
    worker_folder,
    worker_seed,
)

T0 = datetime(2026, 1, 1, 12, 0, 0)
ME = Worker("box-a", 100, 5, "0,1", "m-a")


def _trial(
    number: int,
    state: TrialState = TrialState.RUNNING,
    *,
    worker: Worker | None = None,
    params: dict[str, float] | None = None,
    start: float = 0.0,
    outcome: str | None = None,
    fixed: dict[str, float] | None = None,
) -> FrozenTrial:
    attrs: dict[str, object] = {}
    if worker is not None:
        attrs["worker"] = worker.to_dict()
    if outcome is not None:
        attrs["outcome"] = outcome
    params = params or {}
    finished = state.is_finished()
    return FrozenTrial(
        number=number,
        state=state,
        value=None,
        values=[1.0, 1.0] if state == TrialState.COMPLETE else None,
        datetime_start=T0 + timedelta(seconds=start),
        datetime_complete=T0 + timedelta(seconds=start + 1) if finished else None,
        params=params,
        distributions={k: FloatDistribution(0.0, 1.0) for k in params},
        user_attrs=attrs,
        system_attrs={"fixed_params": fixed} if fixed else {},
        intermediate_values={},
        trial_id=number + 1000,
    )


def _dead_pid() -> int:
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(done.stdout)


# ------------------------------------------------------------------------------------------------
# Settings and identity
# ------------------------------------------------------------------------------------------------


def test_parse_gpus() -> None:
    assert parse_gpus("0,1, 2,3") == "0,1,2,3"
    assert parse_gpus("07") == "7"
    for bad in ("", "0,,1", "a", "0,0", "-1", "0;1"):
        with pytest.raises(UsageError, match="--gpus"):
            parse_gpus(bad)


def test_worker_folder_per_gpu_group() -> None:
    assert worker_folder(Path("results/s"), "") == Path("results/s")
    assert worker_folder(Path("results/s"), "4,5,6,7") == Path("results/s/gpus-4-5-6-7")
    assert gpu_group({"CUDA_VISIBLE_DEVICES": " 0,1 "}) == "0,1"
    assert gpu_group({}) == ""


def _cfg(storage: str = "") -> StudyConfig:
    text: dict[str, object] = {
        "server": {"backend": "sim", "flags": {"tp": 2}},
        "search": {"mem_fraction_static": {"low": 0.8, "high": 0.9}},
        "workload": {
            "input_len": 8,
            "output_len": 4,
            "phases": [{"kind": "steady", "concurrency": 1, "duration_s": 1.0}],
        },
    }
    if storage:
        text["storage"] = {"heartbeat_s": 2, "grace_s": 10}
    return parse_study(text, name="s", path=Path("s.toml"))


def test_study_file_heartbeat() -> None:
    cfg = _cfg(storage="yes")
    assert cfg.heartbeat == Heartbeat(interval_s=2, grace_s=10)
    assert _cfg().heartbeat == Heartbeat()
    base = {
        "server": {"backend": "sim"},
        "search": {"mem_fraction_static": {"low": 0.8, "high": 0.9}},
        "workload": {
            "input_len": 8,
            "output_len": 4,
            "phases": [{"kind": "steady", "concurrency": 1, "duration_s": 1.0}],
        },
    }
    with pytest.raises(ConfigError, match=r"storage\.grace_s"):
        parse_study(
            {**base, "storage": {"heartbeat_s": 10, "grace_s": 15}}, name="s", path=Path("s")
        )
    with pytest.raises(ConfigError, match=r"storage\.heartbeat_s"):
        parse_study({**base, "storage": {"heartbeat_s": 0}}, name="s", path=Path("s"))


def test_worker_args_override_the_study_file() -> None:
    cfg = _cfg()
    out = with_worker_args(cfg, gpus="2,3", port=30002, heartbeat_s=5, grace_s=None)
    assert out.server.port == 30002
    assert out.server.env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert out.heartbeat == Heartbeat(interval_s=5, grace_s=300)
    same = with_worker_args(cfg, gpus=None, port=None, heartbeat_s=None, grace_s=None)
    assert same == cfg
    with pytest.raises(UsageError, match="--port"):
        with_worker_args(cfg, gpus=None, port=70000, heartbeat_s=None, grace_s=None)
    with pytest.raises(UsageError, match="--grace-s"):
        with_worker_args(cfg, gpus=None, port=None, heartbeat_s=5, grace_s=6)


def test_current_worker_records_host_gpus_and_machine() -> None:
    w = current_worker("0,1", env={HOST_ENV: "box-z"})
    assert (w.host, w.gpus) == ("box-z", "0,1") and w.machine == machine_id() != ""
    assert w.alive()
    assert Worker.from_dict(w.to_dict()) == w
    plain = current_worker("", env={})
    assert plain.host == Worker.current().host and "gpus" not in plain.to_dict()


def test_worker_seeds_differ_between_workers_and_repeat_for_one() -> None:
    a, b = Worker("box-a", 1, 1, "0,1"), Worker("box-a", 2, 2, "2,3")
    assert worker_seed(7, a) != worker_seed(7, b)
    assert worker_seed(7, a) == worker_seed(7, dataclasses.replace(a, pid=99))
    assert 0 <= worker_seed(2**40, a) < 2**31


# ------------------------------------------------------------------------------------------------
# Stale trials
# ------------------------------------------------------------------------------------------------


def test_stale_judges_other_machines_by_heartbeat_and_this_one_by_process() -> None:
    other = Worker("box-b", 1, 1, "0,1", "m-b")
    dead_here = Worker("box-a", _dead_pid(), 12345, "2,3", "m-a")
    live_here = dataclasses.replace(Worker.current(), host="box-a", machine="m-a", gpus="4,5")
    trials = [
        _trial(0, worker=other),  # heartbeat late: stale
        _trial(1, worker=other),  # heartbeat fresh
        _trial(2, worker=dead_here),  # process gone on this machine: stale at once
        _trial(3, worker=live_here),  # alive here: never stale, even with a late heartbeat
        _trial(4, worker=ME),  # mine
        _trial(5, TrialState.COMPLETE, worker=other),
        _trial(6, start=0.0),  # no worker, old: stale
        _trial(7, start=200.0),  # no worker, young: another worker is recording itself
    ]
    now = T0 + timedelta(seconds=230)
    found = stale(trials, ME, {1000, 1003, 1004}, grace_s=9, now=now)
    assert [t.number for t, _ in found] == [0, 2, 6]
    why = dict((t.number, w) for t, w in found)
    assert "no heartbeat from its worker (box-b pid 1, GPUs 0,1) for over 9 s" in why[0]
    assert "is gone" in why[2]


def test_same_host_name_on_another_machine_is_judged_by_heartbeat() -> None:
    twin = Worker("box-a", _dead_pid(), 1, "", "m-other")  # a container with the same name
    assert stale([_trial(0, worker=twin)], ME, set(), grace_s=9, now=T0) == []
    assert len(stale([_trial(0, worker=twin)], ME, {1000}, grace_s=9, now=T0)) == 1


# ------------------------------------------------------------------------------------------------
# Budget and repeats
# ------------------------------------------------------------------------------------------------


def test_surplus_counts_finished_and_earlier_running_trials() -> None:
    done = [_trial(i, TrialState.COMPLETE, start=i) for i in range(3)]
    skipped = _trial(3, TrialState.FAIL, outcome="skipped", start=3)
    a = _trial(4, start=10)
    b = _trial(5, start=11)
    popped = _trial(1, start=12)  # an enqueued point: a low number, popped last
    trials = [*done, skipped, a, b]
    assert not surplus(trials, a, 5) and not surplus(trials, b, 5)
    assert surplus(trials, b, 4) and not surplus(trials, a, 4)
    assert surplus([*trials, popped], popped, 5)


def test_duplicate_of_an_earlier_running_trial() -> None:
    a = _trial(0, params={"x": 0.86}, start=0)
    b = _trial(1, params={"x": 0.8600000000000001}, start=1)
    c = _trial(2, params={"x": 0.87}, start=2)
    queued = _trial(3, fixed={"x": 0.87}, start=3)
    finished = _trial(4, TrialState.COMPLETE, params={"x": 0.88}, start=4)
    late = _trial(5, params={"x": 0.88}, start=5)
    trials = [a, b, c, queued, finished, late]
    assert duplicate_of(trials, b) is a
    assert duplicate_of(trials, a) is None  # the first one runs
    assert duplicate_of(trials, queued) is c
    assert duplicate_of(trials, late) is None  # the same point, but not side by side
    assert same_point({"x": 0.86, "n": 8}, {"n": 8, "x": 0.8600000000000001})
    assert not same_point({"x": 0.86}, {"x": 0.86, "n": 8})


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


def test_hold_waits_while_others_fill_the_budget_and_gives_up_after_a_trial() -> None:
    clock = _Clock()
    lines: list[str] = []
    limits = Limits(startup_s=10, stall_s=5, workload_s=10, stop_grace_s=2, release_s=3)
    hb = Heartbeat(interval_s=2, grace_s=4)
    co = Coordinator(
        me=ME,
        search=SearchConfig(params=(), baseline={}),
        heartbeat=hb,
        limits=limits,
        clock=clock,
        sleep=clock.sleep,
        notify=lines.append,
    )
    done = [_trial(i, TrialState.COMPLETE) for i in range(3)]
    running = [_trial(3), _trial(4)]
    assert co.hold(done, 6) is None  # room left
    assert co.hold([*done, *running], 6) is None  # one slot still free
    assert co.hold([*done, *running], 5) == ""  # full: waited one heartbeat
    assert clock.slept == [2] and lines == ["waiting for trials [3, 4] running on other workers"]
    assert max_wait_s(limits, hb) == 33
    why = None
    for _ in range(40):
        why = co.hold([*done, *running], 5)
        if why:
            break
    assert why and "still running on other workers after 33 s" in why
    assert co.hold(done, 5) is None  # the wait starts afresh
    # a grid with nothing queued waits for the running points (one may come back)
    assert co.hold([*done, _trial(3)], 10, grid=True) == ""
    queued = _trial(9, TrialState.WAITING)
    assert co.hold([*done, _trial(3), queued], 10, grid=True) is None


def test_status_names_the_worker_of_each_trial_when_several_share_the_study() -> None:
    from autotune.review.status import rows

    a, b = Worker("box-a", 1, 1, "0,1"), Worker("box-b", 2, 2)
    head, body = rows([_trial(0, worker=a), _trial(1, worker=b), _trial(2)])
    assert head[3] == "worker" and [r[3] for r in body] == ["box-a:0,1", "box-b", ""]
    head, _ = rows([_trial(0, worker=a), _trial(1, worker=a)])
    assert "worker" not in head


def test_points_queued_twice_by_workers_starting_together_run_once(tmp_path: Path) -> None:
    import optuna

    from autotune.study.workers import drop_twice_queued

    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}", study_name="s")
    for point in ({"x": 0.86}, {"x": 0.8600000000000001}, {"x": 0.9}, {"x": 0.9}):
        study.enqueue_trial(point)
    assert drop_twice_queued(study) == [1, 3]
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.WAITING, TrialState.FAIL] * 2
    assert trials[1].user_attrs["outcome"] == "skipped"
    assert drop_twice_queued(study) == []


def test_a_gpu_group_must_hold_the_server() -> None:
    """The GPUs a server needs are `config.space.gpus_needed`'s (tests/config/test_space.py)."""
    cfg = _cfg()  # tp = 2
    with pytest.raises(UsageError, match=r"--gpus 3: the server needs 2 GPUs"):
        with_worker_args(cfg, gpus="3", port=None, heartbeat_s=None, grace_s=None)


def test_driver_url_picks_the_installed_postgresql_driver() -> None:

    from autotune.study.storage import driver_url

    assert driver_url("postgres://u:p@db:5432/x") == "postgresql://u:p@db:5432/x"
    for kept in ("postgresql://db/x", "postgresql+psycopg2://db/x", "sqlite:///a.db"):
        assert driver_url(kept) == kept
