"""Workers on one PostgreSQL study, in-process: Optuna's RDB heartbeats, failing a dead
worker's trial, a worker whose trial was failed while it ran, and samplers proposing while
other trials run. Each worker is its own `optuna.Study` over its own connection pool."""

from __future__ import annotations

import itertools
from pathlib import Path

import optuna
import pytest
import sqlalchemy
from optuna.samplers import BaseSampler, RandomSampler, TPESampler
from optuna.trial import TrialState

from autotune.config.schema import Heartbeat, Limits, StudyConfig
from autotune.config.studyfile import load_study
from autotune.search import CapacityAwareSampler
from autotune.study.loop import prepare, run_loop
from autotune.study.storage import Worker, open_study
from autotune.study.workers import SKIPPED_SURPLUS, Coordinator, same_point
from autotune.trial.record import Measured, Result
from tests.simstudy import small_steady

pytestmark = pytest.mark.postgres

HB = Heartbeat(interval_s=1, grace_s=2)
STUDY = (
    """
[server]
backend = "sim"
sim_profile = "llama-3.1-70b-tp8-h100"

[server.flags]
tp-size = 2

[search]
mem_fraction_static = { low = 0.80, high = 0.95, step = 0.01 }
max_running_requests = { choices = [8, 16, 32] }

[baseline]
mem_fraction_static = 0.88
max_running_requests = 16

"""
    + small_steady(input_len=64, output_len=8, concurrency=2)
    + """[budget]
n_trials = 4
"""
)


@pytest.fixture
def cfg(tmp_path: Path) -> StudyConfig:
    path = tmp_path / "w.toml"
    path.write_text(STUDY)
    return load_study(path)


def _worker(study: optuna.Study, cfg: StudyConfig, host: str) -> Coordinator:
    return Coordinator(
        me=Worker(host, 1, 1, "0,1", f"m-{host}"), search=cfg.search, heartbeat=HB, limits=Limits()
    )


def _open(cfg: StudyConfig, url: str, sampler: BaseSampler | None = None) -> optuna.Study:
    return open_study(cfg, url, sampler or RandomSampler(seed=0), heartbeat=HB)


def _age_heartbeats(study: optuna.Study) -> None:
    """As if every heartbeat were an hour old (no waiting for the grace period)."""
    engine = study._storage._backend.engine  # type: ignore[attr-defined]
    with engine.begin() as conn:
        conn.execute(
            sqlalchemy.text("UPDATE trial_heartbeats SET heartbeat = heartbeat - interval '1 hour'")
        )


def _ok(capacity: int) -> Result:
    m = Measured(capacity, 100.0, False, False, 0.0, 5.0, None, None)
    return Result("complete", "ok", "", m, {"capacity_tokens": capacity})


def test_dead_workers_trial_is_failed_after_its_heartbeat_stops(
    cfg: StudyConfig, pg_url: str
) -> None:
    a_study, b_study, c_study = (_open(cfg, pg_url) for _ in range(3))
    a, b, c = (_worker(s, cfg, h) for s, h in ((a_study, "a"), (b_study, "b"), (c_study, "c")))
    trial = b.ask(b_study)
    trial.set_user_attr("worker", b.me.to_dict())
    assert a.reap(a_study) == []  # its heartbeat is fresh
    b.release(trial)  # worker b dies: no more heartbeats
    assert a.reap(a_study) == []  # within the grace period
    _age_heartbeats(a_study)
    assert a.reap(a_study) == [trial.number]
    assert c.reap(c_study) == []  # already failed: its point is queued once
    t = a_study.get_trials()[trial.number]
    assert t.state == TrialState.FAIL and t.user_attrs["outcome"] == "stale"
    assert "no heartbeat from its worker (b pid 1, GPUs 0,1) for over 2 s" in t.user_attrs["reason"]
    assert "failed by a pid 1" in t.user_attrs["reason"]
    queued = a_study.get_trials(states=(TrialState.WAITING,))
    assert len(queued) == 1 and same_point(queued[0].system_attrs["fixed_params"], t.params)


def test_a_worker_whose_trial_was_failed_while_it_ran_goes_on(
    cfg: StudyConfig, pg_url: str
) -> None:
    mine, theirs = _open(cfg, pg_url), _open(cfg, pg_url)
    me, other = _worker(mine, cfg, "slow"), _worker(theirs, cfg, "other")
    calls: list[int] = []

    def run_one(trial: optuna.trial.Trial) -> Result:
        calls.append(trial.number)
        if len(calls) == 1:  # this worker stalls past the grace period; the other one judges
            _age_heartbeats(theirs)
            assert other.reap(theirs) == [trial.number]
        return _ok(1000 + trial.number)

    end = run_loop(
        mine,
        cfg,
        run_one=run_one,
        n_trials=1,
        timeout_s=None,
        clock=lambda: 0.0,
        worker=me.me,
        coordinator=me,
    )
    assert end.why == "budget" and calls == [0, 1]
    t0, t1 = mine.get_trials()
    assert t0.state == TrialState.FAIL and t0.user_attrs["outcome"] == "stale"
    assert t1.state == TrialState.COMPLETE and same_point(t1.params, t0.params)


def test_a_trial_past_the_budget_is_skipped_and_its_queued_point_kept(
    cfg: StudyConfig, pg_url: str
) -> None:
    studies = [_open(cfg, pg_url) for _ in range(3)]
    workers = [_worker(s, cfg, f"w{i}") for i, s in enumerate(studies)]
    prepare(studies[0], cfg)  # the baseline is queued
    trials = [w.ask(s) for w, s in zip(workers, studies, strict=True)]
    assert trials[0].number == 0  # the baseline, popped first
    verdicts = [w.claim(s, t, 2) for w, s, t in zip(workers, studies, trials, strict=True)]
    assert verdicts == ["", "", SKIPPED_SURPLUS]
    for w, t in zip(workers, trials, strict=True):
        w.release(t)


@pytest.mark.parametrize(
    "make",
    [
        lambda seed: CapacityAwareSampler(seed=seed),
        lambda seed: TPESampler(seed=seed, n_startup_trials=2),
    ],
    ids=["capacity", "tpe"],
)
def test_samplers_do_not_repeat_running_trials(cfg: StudyConfig, pg_url: str, make: object) -> None:
    assert callable(make)
    studies = [_open(cfg, pg_url, make(i)) for i in range(3)]
    workers = [_worker(s, cfg, f"w{i}") for i, s in enumerate(studies)]
    prepare(studies[0], cfg)
    ran = []
    for round_ in range(3):  # three rounds of three trials running side by side
        batch = []
        for w, s in zip(workers, studies, strict=True):
            while True:
                t = w.ask(s)
                t.set_user_attr("worker", w.me.to_dict())
                skip = w.claim(s, t, 100)
                if not skip:
                    break
                w.release(t)
                s.tell(t, state=TrialState.FAIL)
            batch.append((w, s, t))
        points = [studies[0]._storage.get_trial(t._trial_id).params for _, _, t in batch]
        for p, q in itertools.combinations(points, 2):
            assert not same_point(p, q), points
        for i, (w, s, t) in enumerate(batch):
            w.release(t)
            s.tell(t, [float(30_000 + 1_000 * round_ + i), 100.0])
        ran += points
    assert len(ran) == 9


def test_capacity_sampler_spreads_three_workers_by_itself(pg_url: str) -> None:
    """Launches on the simulator's model (`search.oracle`), told as real trials are: the
    capacity-aware sampler never proposes what another worker is running."""
    from autotune.sim.profiles import load_profile
    from autotune.testing.oracle import bench_for, run_trial

    bench = bench_for(load_profile("kimi-k2.5-tp8-96g"))
    cfg = bench.study_config
    studies = [_open(cfg, pg_url, CapacityAwareSampler(seed=i)) for i in range(3)]
    workers = [
        Coordinator(me=Worker(f"w{i}", 1, 1), search=bench.search, heartbeat=HB, limits=Limits())
        for i in range(3)
    ]
    studies[0].enqueue_trial(dict(bench.search.baseline))
    for round_ in range(3):
        batch = [(w, s, w.ask(s)) for w, s in zip(workers, studies, strict=True)]
        assert [w.claim(s, t, 100) for w, s, t in batch] == ["", "", ""]
        points = [s._storage.get_trial(t._trial_id).params for _, s, t in batch]
        for p, q in itertools.combinations(points, 2):
            assert not same_point(p, q), points
        for i, (w, s, t) in enumerate(batch):
            w.release(t)
            run_trial(s, bench, t, seed=10 * round_ + i)
