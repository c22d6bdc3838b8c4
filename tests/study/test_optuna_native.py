"""The study reads right in Optuna's own tools and in Optuna Dashboard: metric names on the
study, each ledger figure a flat attribute with its unit, constraints in the form both read, and
no trial for the search's decision not to launch.

The trials here are the simulator's pure model (`autotune.testing.oracle`) told through the
study loop's own `tell`, in real SQLite storages; Optuna Dashboard is its own WSGI app served over
real HTTP on 127.0.0.1.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import urllib.request
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any, get_type_hints
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import optuna
import optuna_dashboard
import pytest
from optuna.trial import TrialState
from optuna.visualization._pareto_front import _get_pareto_front_info

from autotune.config.schema import StudyConfig
from autotune.config.space import settings_for
from autotune.logparse.ledger import Ledger
from autotune.record import internals, keys
from autotune.record.view import search_end, view
from autotune.review.status import render
from autotune.search.capacity import DONE_ATTR, CapacityAwareSampler
from autotune.study.loop import run_loop, tell
from autotune.study.storage import Worker, default_storage_url, open_study
from autotune.testing.oracle import launch
from tests.search.helpers import KIMI
from tests.study.conftest import demo

NAMES = ["capacity_tokens", "throughput_tok_s"]


@pytest.fixture(autouse=True)
def quiet() -> None:
    optuna.logging.set_verbosity(optuna.logging.ERROR)


def _tell(study: optuna.Study, cfg: StudyConfig, params: Mapping[str, Any], seed: int) -> None:
    """Launch `params` on the pure model and tell the study as the run does."""
    study.enqueue_trial(dict(params))
    trial = study.ask()
    settings = settings_for(trial, cfg.search)
    _, result = launch(KIMI, settings.params, seed)
    tell(study, trial, result, cfg)


def _oom_and_two_feasible(tmp_path: Path) -> tuple[optuna.Study, StudyConfig]:
    """A demo-like study: the baseline runs out of memory under load (the highest capacity of
    all), two lower fractions hold."""
    cfg = dataclasses.replace(demo(), constraints=KIMI.study_config.constraints)
    study = open_study(cfg, default_storage_url(tmp_path), optuna.samplers.RandomSampler(0))
    for i, f in enumerate((0.93, 0.90, 0.88)):
        _tell(study, cfg, {"mem_fraction_static": f, "max_running_requests": 48}, i)
    return study, cfg


def test_metric_names_are_set_on_a_new_study_and_on_one_created_without_them(
    tmp_path: Path,
) -> None:
    cfg = demo()
    url = default_storage_url(tmp_path)
    optuna.create_study(study_name="demo", storage=url, directions=["maximize", "maximize"])
    assert optuna.load_study(study_name="demo", storage=url).metric_names is None  # as before
    open_study(cfg, url, optuna.samplers.RandomSampler(0))
    assert optuna.load_study(study_name="demo", storage=url).metric_names == NAMES
    other = tmp_path / "new"
    other.mkdir()
    study = open_study(cfg, default_storage_url(other), optuna.samplers.RandomSampler(0))
    assert study.metric_names == NAMES
    one = dataclasses.replace(cfg, objectives=("capacity",), name="one")
    assert open_study(one, url, optuna.samplers.RandomSampler(0)).metric_names == NAMES[:1]


def test_optunas_pareto_front_draws_the_oom_trial_as_infeasible(tmp_path: Path) -> None:
    study, _ = _oom_and_two_feasible(tmp_path)
    oom = study.trials[0]
    assert oom.user_attrs[keys.OUTCOME] == "runtime_oom" and oom.state == TrialState.COMPLETE
    assert oom.values[0] > max(t.values[0] for t in study.trials[1:])  # it would top the front
    info = _get_pareto_front_info(study)
    assert [t.number for t, _ in info.infeasible_trials_with_values] == [0]
    assert 0 not in [t.number for t, _ in info.best_trials_with_values]
    assert info.target_names == NAMES
    figure = optuna.visualization.plot_pareto_front(study)
    drawn = {str(tr.hovertemplate).split("<extra>")[-1]: list(tr.x) for tr in figure.data}
    assert drawn["Infeasible Trial</extra>"] == [oom.values[0]], drawn
    assert oom.values[0] not in drawn["Best Trial</extra>"]
    assert figure.layout.xaxis.title.text == "capacity_tokens"


def test_constraints_are_stored_by_name_and_as_the_list_the_dashboard_reads(
    tmp_path: Path,
) -> None:
    study, _ = _oom_and_two_feasible(tmp_path)
    oom, ok = study.trials[0], study.trials[1]
    named = internals.constraints(oom)
    assert named["oom"] == 1.0 and set(named) == {"oom", "crash", "error_rate", "headroom_gib"}
    assert oom.system_attrs["constraints"] == [named[k] for k in sorted(named)]
    assert view(oom).violated == ("error_rate", "headroom_gib", "oom")  # names, not "0", "1"
    assert view(oom).kind == "oom" and view(ok).feasible
    detail = optuna_dashboard._serializer.serialize_frozen_trial(study._study_id, oom, {})
    assert any(c > 0 for c in detail["constraints"])
    detail = optuna_dashboard._serializer.serialize_frozen_trial(study._study_id, ok, {})
    assert detail["constraints"] and all(c <= 0 for c in detail["constraints"])


@pytest.fixture
def dashboard(tmp_path: Path) -> Iterator[tuple[str, optuna.Study]]:
    """Optuna Dashboard's own WSGI app over the demo-like study, on a real port."""
    study, _ = _oom_and_two_feasible(tmp_path)

    class Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        app = optuna_dashboard.wsgi(default_storage_url(tmp_path))
    server: WSGIServer = make_server("127.0.0.1", 0, app, handler_class=Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", study
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def test_the_dashboard_reads_metric_names_constraints_and_flat_ledger_keys(
    dashboard: tuple[str, optuna.Study],
) -> None:
    base, study = dashboard
    listed = _get(f"{base}/api/studies")["study_summaries"]
    assert [s["study_name"] for s in listed] == ["demo"]
    detail = _get(f"{base}/api/studies/{listed[0]['study_id']}")
    assert detail["objective_names"] == NAMES
    by_number = {t["number"]: t for t in detail["trials"]}
    assert any(c > 0 for c in by_number[0]["constraints"])  # the OOM: drawn infeasible
    assert all(c <= 0 for c in by_number[1]["constraints"])
    attrs = {a["key"]: a["value"] for a in by_number[1]["user_attrs"]}
    led = view(study.trials[1]).ledger
    assert attrs["ledger.kv_tokens"] == str(led.max_total_num_tokens)
    assert attrs["ledger.weights_gib"] == str(led.weights_gib)
    columns = {a["key"] for a in detail["union_user_attrs"]}
    assert {"ledger.kv_tokens", "ledger.kv_gib", "capacity_tokens"} <= columns


def _numeric(cls: type) -> list[str]:
    hints = get_type_hints(cls)
    return [f.name for f in fields(cls) if hints[f.name] in (int | None, float | None)]


def test_every_numeric_ledger_field_has_a_flat_key_with_its_unit() -> None:
    numeric = _numeric(Ledger)
    assert "max_total_num_tokens" in numeric and "weights_gib" in numeric
    bad = [
        f
        for f in numeric
        if not keys.ledger_key(f).endswith(keys.UNITS) and "_fraction" not in keys.ledger_key(f)
    ]
    assert bad == [], f"ledger fields whose flat key names no unit: {bad}"
    filled = {f: 1 for f in numeric} | {"graph_phases": {"decode": 2.5}, "kv_dtype": "fp8"}
    flat = keys.ledger_attrs(filled)
    assert flat["ledger.kv_tokens"] == 1 and flat["ledger.graph.decode_gib"] == 2.5
    assert flat["ledger.kv_dtype"] == "fp8"
    assert len(flat) == len(numeric) + 2
    assert all(len(k) < 512 for k in flat)  # Optuna's RDB key column
    assert keys.ledger_attrs({"kv_gib": None, "weights_gib": float("nan"), "p_gib": True}) == {}


def test_the_trial_stores_each_figure_flat_and_every_reader_still_reads_the_record(
    tmp_path: Path,
) -> None:
    study, _ = _oom_and_two_feasible(tmp_path)
    t = study.trials[1]
    v = view(t)
    a = t.user_attrs
    assert a["ledger.kv_tokens"] == v.ledger.max_total_num_tokens == v.capacity_tokens
    assert a["ledger.weights_gib"] == v.ledger.weights_gib
    assert a["ledger.p_gib"] == v.ledger.p_gib
    assert a[keys.STRESS_PEAK] == a[keys.RECORD]["stress_peak_gib"]
    flat = [k for k in a if k.startswith(keys.LEDGER_PREFIX)]
    assert len(flat) >= 15
    assert all(isinstance(a[k], int | float | str) for k in flat)
    assert max(len(json.dumps(a[k])) for k in flat) < 1024  # whole in the dashboard's table


def _bench_cfg() -> StudyConfig:
    return KIMI.study_config


def test_the_stop_is_asked_before_the_ask_and_agrees_with_the_proposal(tmp_path: Path) -> None:
    """Before each ask, `nothing_left` gives the verdict the ask's own proposal then records."""
    sampler = CapacityAwareSampler(seed=3)
    study = optuna.create_study(directions=["maximize", "maximize"], sampler=sampler)
    study.set_user_attr("objectives", ["capacity", "throughput"])
    study.enqueue_trial(dict(KIMI.search.baseline))
    said = []
    for _ in range(12):
        before = sampler.nothing_left(study)
        trial = study.ask()
        settings = settings_for(trial, KIMI.search)  # Optuna samples at the first suggest
        inside = internals.fresh(study, trial).user_attrs.get(DONE_ATTR)
        assert before == inside, trial.number
        said.append(before)
        tell(study, trial, launch(KIMI, settings.params, trial.number)[1], _bench_cfg())
    assert said[0] is None and any(said), said  # the baseline runs; the search ends


def test_the_search_ends_as_a_study_attribute_and_leaves_no_trial(tmp_path: Path) -> None:
    cfg = dataclasses.replace(_bench_cfg(), name="kimi")
    sampler = CapacityAwareSampler(seed=3)
    study = open_study(cfg, default_storage_url(tmp_path), sampler)
    study.enqueue_trial(dict(KIMI.search.baseline))

    def run_one(trial: optuna.trial.Trial) -> Any:
        return launch(KIMI, settings_for(trial, cfg.search).params, trial.number)[1]

    def loop() -> Any:
        return run_loop(
            study,
            cfg,
            run_one=run_one,
            n_trials=40,
            timeout_s=None,
            clock=lambda: 0.0,
            worker=Worker.current(),
        )

    end = loop()
    trials = study.get_trials()
    assert end.why.startswith("search done: ") and end.counted == len(trials) < 40
    assert all(t.state == TrialState.COMPLETE for t in trials)  # no FAIL trial for the stop
    done = study.user_attrs[keys.SEARCH_DONE]
    assert done == {
        "reason": end.why.removeprefix("search done: "),
        "trials": len(trials),
        "last_trial": trials[-1].number,
    }
    ended = search_end(study.user_attrs, trials)
    assert ended is not None
    assert ended.line() == f"search done after {len(trials)} trials: {done['reason']}"
    text = render("kimi", "sqlite:///x", trials, ended=ended.line())
    assert text.splitlines()[-1] == ended.line()
    again = loop()  # a second run decides the same before asking: still no trial
    assert again.why == end.why and again.ran == 0 and len(study.get_trials()) == len(trials)


def test_a_trial_after_the_stop_makes_it_stale_and_old_studies_still_read(
    tmp_path: Path,
) -> None:
    study, _ = _oom_and_two_feasible(tmp_path)
    study.set_user_attr(keys.SEARCH_DONE, {"reason": "why", "trials": 2, "last_trial": 1})
    assert search_end(study.user_attrs, study.get_trials()) is None  # trial 2 ran after it
    study.set_user_attr(keys.SEARCH_DONE, {"reason": "why", "trials": 3, "last_trial": 2})
    ended = search_end(study.user_attrs, study.get_trials())
    assert ended is not None and ended.line() == "search done after 3 trials: why"
    old = optuna.create_study(directions=["maximize", "maximize"])
    for t in study.get_trials():
        old.add_trial(t)
    old.add_trial(
        optuna.trial.create_trial(
            state=TrialState.FAIL,
            user_attrs={keys.OUTCOME: "skipped", keys.REASON: "not launched: search done: old"},
        )
    )
    ended = search_end(old.user_attrs, old.get_trials())
    assert ended is not None and ended.line() == "search done after 3 trials: old"
