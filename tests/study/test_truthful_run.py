"""What the run and `status` say is true: an interrupted trial keeps the ledger it measured, the
baseline keeps its place in the queue on resume, queued points are listed with their parameters,
the closing line names the failure and the knob, and the warnings before the first launch."""

from __future__ import annotations

import dataclasses
import io
import tomllib
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.config.schema import StudyConfig
from autotune.config.studyfile import SHIPPED_STUDIES, load_study, parse_study
from autotune.record.remedy import remedy
from autotune.record.view import TrialView, view, views
from autotune.review.status import rows
from autotune.sim.profiles import load_profile
from autotune.study.loop import baseline_first, prepare, tell
from autotune.study.progress import warnings_before_launch
from autotune.study.runner import closing_reason, run
from autotune.study.storage import default_storage_url
from autotune.trial.plan import TrialPlan
from autotune.trial.record import Result
from autotune.trial.run import run_trial
from autotune.trial.seam import Startup
from tests.review.fakes import trial
from tests.study.conftest import VALID
from tests.study.fakes import FakeLauncher, FakeRun, Script, capacity, kimi_like

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
GRID = (
    VALID.replace('name = "tpe"', 'name = "grid"')
    .replace("hicache_size = { choices = [0, 48] }", "hicache_size = 48")
    .replace("max_running_requests = { choices = [32, 48, 64] }", "max_running_requests = 48")
)


def _cfg(text: str, tmp_path: Path) -> StudyConfig:
    return parse_study(tomllib.loads(text), name="t", path=tmp_path / "t.toml")


def _failed_baseline(outcome: str, reason: str) -> TrialView:
    """The baseline (trial 0, at the study's 0.88) as the record reads it after it failed."""
    return view(trial(0, 0.88, outcome=outcome, reason=reason))


def _plan(tmp_path: Path) -> TrialPlan:
    from autotune.config.schema import Limits

    return TrialPlan(
        number=0, params={"mem_fraction_static": 0.88}, argv=("python", "-m", "autotune.sim"),
        env={}, host="127.0.0.1", port=31000, trial_dir=tmp_path / "trials" / "0000",
        limits=Limits(), backend="sim",
    )  # fmt: skip


def test_an_interrupted_trial_keeps_the_ledger_it_measured(tmp_path: Path) -> None:
    launcher = FakeLauncher(lambda p: dataclasses.replace(kimi_like(p), interrupt_in="workload"))
    ticks = iter(range(100))
    record = run_trial(_plan(tmp_path), launcher, clock=lambda: float(next(ticks)),
                       phase=lambda p: None)  # fmt: skip
    assert record.state == "interrupted"
    assert record.capacity_tokens == capacity(0.88)  # was 0 ("capacity 0 tok")
    assert record.ledger["max_total_num_tokens"] == capacity(0.88)


def test_a_start_cut_short_keeps_what_its_log_showed(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    plan.trial_dir.mkdir(parents=True)
    lines = (LOGS / "v0_5_9_kimi_tp8_eagle3.log").read_text().splitlines()
    kv = next(i for i, line in enumerate(lines) if "KV Cache is allocated" in line)
    cut = "\n".join(lines[: kv + 9]) + "\n"  # killed during graph capture

    class CutLog(FakeLauncher):
        def launch(self, plan: TrialPlan) -> FakeRun:
            run = super().launch(plan)
            plan.log_path.write_text(cut)
            return run

    launcher = CutLog(lambda p: dataclasses.replace(kimi_like(p), interrupt_in="startup"))
    record = run_trial(plan, launcher, clock=lambda: 0.0, phase=lambda p: None)
    assert record.state == "interrupted" and record.capacity_tokens == 159_277
    # and the study's view (for an older record with capacity 0 too) shows the ledger's pool
    study = optuna.create_study()
    t = study.ask()
    tell(study, t, dataclasses.replace(record.result(), attrs={
        **record.result().attrs, "capacity_tokens": 0}), _cfg(GRID, tmp_path))  # fmt: skip
    assert view(study.trials[0]).capacity_tokens == 159_277


def _ask_params(study: optuna.Study) -> dict[str, object]:
    t = study.ask()
    return {k: t.suggest_float(k, 0.80, 0.94, step=0.02) for k in ("mem_fraction_static",)}


def test_the_baseline_keeps_its_place_on_resume(tmp_path: Path) -> None:
    cfg = _cfg(GRID, tmp_path)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}", study_name="t",
                                directions=["maximize", "maximize"])  # fmt: skip
    assert prepare(study, cfg) == 8  # the baseline 0.88, then the grid 0.80 … 0.94
    first = study.ask()
    assert first.suggest_float("mem_fraction_static", 0.80, 0.94, step=0.02) == 0.88
    stopped = Result("interrupted", "interrupted", "stopped by the operator", None, {})
    tell(study, first, stopped, cfg)  # Ctrl-C: the point is queued again, behind the grid
    waiting = [t for t in study.get_trials() if t.state == TrialState.WAITING]
    grid = [t.system_attrs["fixed_params"]["mem_fraction_static"] for t in waiting]
    assert grid[-1] == 0.88 and sorted(grid[:-1]) == [0.8, 0.82, 0.84, 0.86, 0.9, 0.92, 0.94]
    # the status table lists the queued points with their parameters
    head, body = rows(study.get_trials())
    queued = [r for r in body if r[1] == "queued"]
    col = head.index("mem_fraction_static")
    assert [r[col] for r in queued] == [f"{f:g}" for f in grid]
    assert baseline_first(study, cfg)  # what a resumed run does first
    assert _ask_params(study) == {"mem_fraction_static": 0.88}
    assert not baseline_first(study, cfg)  # the others keep their order, nothing is lost
    rest = [t.system_attrs["fixed_params"]["mem_fraction_static"]
            for t in study.get_trials() if t.state == TrialState.WAITING]  # fmt: skip
    assert rest == grid[:-1]


def test_a_measured_baseline_is_not_moved(tmp_path: Path) -> None:
    cfg = _cfg(GRID, tmp_path)
    study = optuna.create_study(directions=["maximize", "maximize"])
    prepare(study, cfg)
    t = study.ask()
    t.suggest_float("mem_fraction_static", 0.80, 0.94, step=0.02)
    study.tell(t, [1.0, 1.0])
    study.enqueue_trial({"mem_fraction_static": 0.88})
    assert not baseline_first(study, cfg)


def test_a_baseline_that_failed_with_a_small_host_cache_points_at_the_host_cache(
    tmp_path: Path,
) -> None:
    cfg = _cfg(GRID, tmp_path)
    base = _failed_baseline(
        "startup_error",
        "startup_error (hicache_too_small): AssertionError: The host memory should be larger",
    )
    assert base.cause == "hicache_too_small" and "hicache_size" in remedy(base)
    text = closing_reason(cfg, [base])
    assert text.startswith(" What ended it: the baseline (trial 0) failed with startup_error")
    assert "host cache is smaller than the device KV pool" in text and "hicache_size" in text
    # a capture that failed without running out of memory (sgl-project/sglang#11218:
    # `Capture cuda graph failed: ` under torch.compile) is not the fraction's
    failed = "startup_error (graph_capture_failed): Exception: Capture cuda graph failed: "
    capture = view(trial(6, 0.88, outcome="startup_error", reason=failed))
    assert remedy(capture).startswith("not a memory setting: CUDA-graph capture failed")
    oom = "startup_oom (graph_capture_failed): CUDA out of memory"
    ran_out = view(trial(7, 0.88, outcome="startup_oom", reason=oom))
    assert remedy(ran_out).startswith("CUDA-graph capture ran out of memory")
    # an OOM at startup points at the fraction, down; no room for KV at the fraction, up
    oom = view(trial(1, 0.94, outcome="startup_oom", reason="startup_oom (torch_oom): CUDA"))
    assert remedy(oom).startswith("lower mem_fraction_static")
    room = view(trial(2, 0.80, outcome="startup_oom", reason="startup_oom (no_kv_room): no"))
    assert remedy(room).startswith("the weights leave no room") and "raise" in remedy(room)
    # the allocator out of token slots is not a CUDA peak: the fraction down makes it worse
    slots = view(trial(3, 0.9, outcome="runtime_oom", reason="runtime_oom (decode_oom): Decode"))
    assert "max_running_requests" in remedy(slots) and "not CUDA memory" in remedy(slots)
    generic = view(trial(5, 0.9, outcome="runtime_oom", reason="runtime_oom (alloc_oom): Out"))
    assert remedy(generic) == remedy(slots)  # the allocator's generic line is the same fault
    last = view(trial(4, 0.9, outcome="runtime_oom", reason="runtime_oom (retract_oom): Out"))
    assert remedy(last).startswith("the KV pool could not hold the last decoding request")
    # a study that found a feasible setting and a good baseline needs no closing reason
    assert closing_reason(cfg, views([trial(0, 0.88), trial(1, 0.94, outcome="startup_oom")])) == ""


def test_with_nothing_feasible_the_failure_most_trials_share_ends_the_study(
    tmp_path: Path,
) -> None:
    """A 12 GB box: the baseline's graph capture ran out of memory, and every trial that then
    started had a KV pool smaller than the workload's 2,048-token prompts, which SGLang refused
    (error rate broken). The closing line names what most trials share, with its knob: the
    pool capped the prompt (before: the baseline's graph capture, the one trial unlike the
    rest)."""
    cfg = _cfg(GRID, tmp_path)
    base = _failed_baseline("startup_oom", "startup_oom (graph_capture_failed): capture")
    refused = (
        '2 of 132 requests failed: HTTP 400: {"error": {"message": "Input length (2048 tokens) '
        'exceeds the maximum allowed length (1184 tokens). Use a shorter input."}}'
    )
    served = []
    for n, f in ((1, 0.82), (2, 0.83), (3, 0.81)):
        v = view(trial(n, f))
        pool = v.ledger.max_total_num_tokens
        assert pool is not None and pool >= 1184
        served.append(
            dataclasses.replace(v, kind="infeasible", violated=("error_rate",), evidence=(refused,))
        )
    text = closing_reason(cfg, [base, *served])
    assert text.startswith(" What ended it: trial 3 served the load but broke error_rate"), text
    assert "the KV pool capped the prompt at 1,184 tokens" in text, text
    assert "raise mem_fraction_static until the pool holds them" in text, text
    # the baseline's own failure still ends a study where it is what the trials share
    assert closing_reason(cfg, [base]).startswith(" What ended it: the baseline (trial 0)")


def test_warnings_before_the_first_launch(tmp_path: Path) -> None:
    cfg = _cfg(VALID, tmp_path)  # 4 clients, max_running_requests up to 64
    [w] = warnings_before_launch(cfg, (), load_profile("kimi-k2.5-tp8-96g"))
    assert w.startswith("workload: at most 4 requests run at once (phase steady-0: concurrency 4)")
    assert "max_running_requests up to 64" in w
    # the demo copied to a profile without a draft, with one GPU and a bigger pool
    demo = (SHIPPED_STUDIES / "demo.toml").read_text()
    other = demo.replace('sim_profile = "kimi-k2.5-tp8-96g"', 'sim_profile = "qwen3-32b-h200"')
    lines = warnings_before_launch(_cfg(other, tmp_path), (), load_profile("qwen3-32b-h200"))
    draft = "server.flags.speculative_algorithm = EAGLE3, but the simulator profile qwen3-32b-h200"
    assert any(x.startswith(f"{draft} has no draft model") for x in lines)
    assert any("has 1 GPU(s)" in x for x in lines)
    assert any(x.startswith("search.hicache_size: 48 GB per rank holds about") for x in lines)
    # the shipped studies warn about nothing
    for name in ("demo", "kimi"):
        path = SHIPPED_STUDIES / f"{name}.toml"
        shipped = _cfg(path.read_text(), tmp_path)
        assert warnings_before_launch(shipped, (), load_profile(shipped.server.sim_profile)) == []


def test_the_host_cache_warning_uses_a_resumed_studys_ledgers(tmp_path: Path) -> None:
    small = VALID.replace("hicache_size = { choices = [0, 48] }", "hicache_size = 8")
    cfg = _cfg(small.replace("hicache_size = 48", "hicache_size = 8"), tmp_path)
    t = trial(0, 0.88)
    t.user_attrs["record"]["ledger"].update(host_cache_gb=8.0, host_cache_tokens=113_843)
    lines = warnings_before_launch(cfg, views([t]), None)
    assert any("8 GB per rank holds about 113,843 tokens" in x for x in lines)


def _night(tmp_path: Path, text: str, launcher: FakeLauncher) -> tuple[int, str]:
    path = tmp_path / "configs" / "t.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    cfg = load_study(path, name="t")
    folder = tmp_path / "results" / "t"
    folder.mkdir(parents=True, exist_ok=True)
    out = io.StringIO()
    code = run(cfg, folder, default_storage_url(folder), launcher, out)
    return code, out.getvalue()


def test_a_run_stopped_during_the_baseline_measures_it_first_on_resume(tmp_path: Path) -> None:
    def stop_at_baseline(plan: TrialPlan) -> Script:
        return dataclasses.replace(kimi_like(plan), interrupt_in="workload")

    code, out = _night(tmp_path, GRID, FakeLauncher(stop_at_baseline))
    assert code == 130 and "trial 1/5 (#0) interrupted [failed]: capacity " in out
    resumed = FakeLauncher()
    code, out = _night(tmp_path, GRID.replace("n_trials = 5", "n_trials = 2"), resumed)
    assert code == 0 and "the baseline goes first again" in out
    assert [p.params["mem_fraction_static"] for p in resumed.plans][:1] == [0.88]


def test_a_failed_baseline_the_search_got_past_is_said_but_did_not_end_the_study(
    tmp_path: Path,
) -> None:
    cfg = _cfg(GRID, tmp_path)
    base = _failed_baseline(
        "runtime_oom", "runtime_oom (torch_oom): torch.OutOfMemoryError: CUDA out of memory."
    )
    ok = view(trial(1, 0.86))
    assert ok.feasible and not base.feasible
    text = closing_reason(cfg, [base, ok])
    assert text.startswith(" The baseline (trial 0) failed with runtime_oom (torch_oom)"), text
    assert "lower mem_fraction_static" in text and "What ended it" not in text
    slow = view(trial(2, 0.86, min_headroom=50.0))
    text = closing_reason(cfg, [slow])
    assert "trial 2 served the load but broke headroom_gib" in text and "with ok" not in text


def test_the_run_warns_before_the_first_launch_and_names_what_ended_it(tmp_path: Path) -> None:
    def small_host_cache(plan: TrialPlan) -> Script:
        why = ("AssertionError: The host memory should be larger than the device memory",)
        return Script(Startup("startup_error", "hicache_too_small", why, {}, 1.0))

    text = VALID.replace("n_trials = 5", "n_trials = 2")
    _, out = _night(tmp_path, text, FakeLauncher(small_host_cache))
    lines = out.splitlines()
    warn = next(i for i, x in enumerate(lines) if x.startswith("warning: workload: at most 4"))
    first = next(i for i, x in enumerate(lines) if x.startswith("trial 1/2 (#0)"))
    assert warn < first
    assert "What ended it: the baseline (trial 0) failed with startup_error (hicache_too_small)" \
        in lines[-1] and "raise hicache_size" in lines[-1]  # fmt: skip


def test_three_failed_starts_in_a_row_name_the_knob(tmp_path: Path) -> None:
    """The demo copied to a profile with a bigger GPU: the host cache is too small at every
    fraction, the grid stops after three failed starts, and the error says what to change."""
    from autotune.errors import HarnessError

    def small_host_cache(plan: TrialPlan) -> Script:
        why = ("AssertionError: The host memory should be larger than the device memory",)
        return Script(Startup("startup_error", "hicache_too_small", why, {}, 1.0))

    with pytest.raises(HarnessError) as err:
        _night(tmp_path, GRID, FakeLauncher(small_host_cache))
    text = str(err.value)
    assert text.startswith("3 trials in a row failed") and "(hicache_too_small)" in text
    assert "what would fix it: the host cache is smaller than the device KV pool" in text
    assert "raise hicache_size" in text
