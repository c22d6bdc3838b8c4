"""End to end on the simulator: a short capacity search run with `autotune run`, whose baseline
runs out of memory under load, reads right in Optuna's own plots and in Optuna Dashboard: metric
names on the study, the OOM trial infeasible in Optuna's Pareto data, each ledger figure a flat
attribute, and the search's stop a study attribute that `status` and `report` say, with no FAIL
trial that never ran."""

from __future__ import annotations

import json
import threading
import urllib.request
import warnings
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

import optuna
import optuna_dashboard
import pytest
from optuna.trial import TrialState
from optuna.visualization._pareto_front import _get_pareto_front_info

from autotune.record import keys
from autotune.record.view import view
from tests import simstudy

pytestmark = pytest.mark.e2e

SEARCH = """[search]
mem_fraction_static = { low = 0.86, high = 0.94, step = 0.01 }
max_running_requests = 48
hicache_size = 48

[baseline]
mem_fraction_static = 0.93
max_running_requests = 48
hicache_size = 48"""
"""The demo's baseline (out of memory under the stress burst), one searched parameter."""


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def _dashboard_detail(url: str) -> dict[str, Any]:
    """The study as Optuna Dashboard's own app serves it over HTTP (`/api/studies/<id>`)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        app = optuna_dashboard.wsgi(url)
    server = make_server("127.0.0.1", 0, app, handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_port}"
        with urllib.request.urlopen(f"{base}/api/studies", timeout=30) as r:
            (summary,) = json.loads(r.read())["study_summaries"]
        with urllib.request.urlopen(f"{base}/api/studies/{summary['study_id']}", timeout=30) as r:
            detail: dict[str, Any] = json.loads(r.read())
        return detail
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_a_run_reads_right_in_optuna_and_its_dashboard(tmp_path: Path) -> None:
    config = tmp_path / "native.toml"
    config.write_text(
        simstudy.sim_study(
            time_scale=3000, sampler="capacity", headroom_gib=None, search=SEARCH, n_trials=8
        )
    )
    try:
        done = simstudy.run(config, "run", timeout=240)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr
        assert "finished (search done: " in done.stdout
        status = simstudy.run(config, "status", timeout=60)
        report = simstudy.run(config, "report", timeout=120)
    finally:
        simstudy.assert_none_left(tmp_path)
    url = f"sqlite:///{tmp_path / 'results/native/study.db'}"
    study = optuna.load_study(study_name="native", storage=url)
    trials = study.get_trials()
    assert study.metric_names == ["capacity_tokens", "throughput_tok_s"]

    # the search's stop: a study attribute and a line, no trial that never ran
    assert 2 <= len(trials) < 8
    assert all(t.state == TrialState.COMPLETE for t in trials), [t.state for t in trials]
    stop = study.user_attrs[keys.SEARCH_DONE]
    assert stop["trials"] == len(trials) and stop["last_trial"] == trials[-1].number
    assert f"finished (search done: {stop['reason']})" in done.stdout
    line = f"search done after {len(trials)} trials: {stop['reason']}"
    assert status.returncode == 0 and status.stdout.splitlines()[-1] == line, status.stdout
    assert report.returncode == 0 and line in report.stdout, report.stdout + report.stderr

    # the OOM baseline is infeasible in Optuna's own Pareto data, though its capacity tops all
    oom = trials[0]
    assert view(oom).kind == "oom" and oom.values[0] == max(t.values[0] for t in trials)
    info = _get_pareto_front_info(study)
    assert [t.number for t, _ in info.infeasible_trials_with_values] == [0]
    assert 0 not in [t.number for t, _ in info.best_trials_with_values]
    assert info.target_names == ["capacity_tokens", "throughput_tok_s"]

    # each ledger figure flat, with its unit, beside the record every reader takes
    for t in trials:
        v = view(t)
        assert t.user_attrs["ledger.kv_tokens"] == v.ledger.max_total_num_tokens
        assert t.user_attrs["ledger.kv_tokens"] == t.user_attrs[keys.CAPACITY]
        assert t.user_attrs["ledger.weights_gib"] == v.ledger.weights_gib
        assert t.user_attrs["ledger.p_gib"] == v.ledger.p_gib

    # Optuna Dashboard, through its own HTTP API, reads the names and the constraints
    detail = _dashboard_detail(url)
    assert detail["objective_names"] == ["capacity_tokens", "throughput_tok_s"]
    feasible = {t["number"]: all(c <= 0 for c in t["constraints"]) for t in detail["trials"]}
    assert feasible == {t.number: view(t).feasible for t in trials}
    assert feasible[0] is False
