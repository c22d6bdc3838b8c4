"""The benchmark's random worlds and its night in hours: `--mismatch random` draws the same
worlds for the same seeds, inside the documented ranges, and prints each study's world and the
night-in-hours table."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from types import ModuleType

import pytest

from autotune.config.workload import EarlyEnd, Steady, Stress
from autotune.loadgen.driver import ABORT_SETTLE_S
from autotune.review.confirm import soak
from autotune.sim.profiles import Mismatch, load_profile
from autotune.testing.night import (
    BENCH_WORKLOAD,
    SETTLE_WAVES,
    TEARDOWN_S,
    early_end_s,
    phase_s,
    request_s,
    soak_hours,
    startup_s,
    workload_s,
)
from autotune.testing.oracle import bench_for, plan_for
from autotune.testing.worlds import (
    RANGES,
    TAIL_DOFS,
    bucket,
    departure,
    describe,
    draw_world,
    inside,
    world_seed,
)


@pytest.fixture
def bench_search(load_script: Callable[[str], ModuleType]) -> ModuleType:
    return load_script("bench_search")


def test_a_world_seed_draws_the_same_world_inside_the_ranges() -> None:
    seeds = [world_seed(7, "qwen3-32b-h200", s) for s in range(300)]
    assert seeds == [world_seed(7, "qwen3-32b-h200", s) for s in range(300)]
    assert len(set(seeds)) == 300
    assert world_seed(8, "qwen3-32b-h200", 0) != seeds[0]
    assert world_seed(7, "kimi-k2.5-tp8-96g", 0) != seeds[0]
    worlds = [draw_world(s) for s in seeds]
    assert worlds == [draw_world(s) for s in seeds]
    assert all(inside(w) for w in worlds)
    assert {w.peak_tail_dof for w in worlds} == set(TAIL_DOFS)
    for name, r in RANGES.items():
        values = [getattr(w, name) for w in worlds]
        # the draws fill their range: near both ends, never outside
        assert min(values) < r.low + 0.05 * (r.high - r.low)
        assert max(values) > r.high - 0.05 * (r.high - r.low)
    assert not inside(replace(worlds[0], growth_mib_per_request=1.5))
    assert not inside(replace(worlds[0], peak_tail_dof=6))


def test_the_departure_score_is_zero_for_the_model_and_grows_with_each_key() -> None:
    kimi = load_profile("kimi-k2.5-tp8-96g")
    model = bench_for(kimi)
    assert departure(model).total == 0.0
    assert bucket(0.0) == "mild" and bucket(1.5) == "moderate" and bucket(4.0) == "severe"
    one = {
        "growth_mib_per_request": 0.5,
        "rank_imbalance_gib": 1.0,
        "peak_tail_dof": 3,
        "context_mib_per_1k_tokens": 5.0,
        "spike_probability": 1e-4,
    }
    for key, value in one.items():
        world = Mismatch(**{key: value, "spike_factor": 0.5})
        score = departure(bench_for(kimi, mismatch=world)).total
        assert score > departure(bench_for(kimi, mismatch=Mismatch(spike_factor=0.5))).total, key
    # growth over a trial's 1,500 requests; the rank's shortfall as it is
    parts = departure(bench_for(kimi, mismatch=Mismatch(growth_mib_per_request=1.0)))
    assert parts.growth == pytest.approx(1500 / 1024)
    short = departure(bench_for(kimi, mismatch=Mismatch(rank_imbalance_gib=1.25)))
    assert short.rank == 1.25
    one_gpu = load_profile("qwen3-32b-h200")  # TP1: no last rank to be short
    assert departure(bench_for(one_gpu, mismatch=Mismatch(rank_imbalance_gib=1.25))).rank == 0.0


def test_a_night_counts_the_profiles_startup_and_every_phase_to_its_end() -> None:
    kimi = load_profile("kimi-k2.5-tp8-96g")
    bench = bench_for(kimi)
    plan = plan_for(bench, bench.search.baseline)
    st = kimi.startup
    full = (
        st.init_distributed_s
        + st.weight_load_s
        + st.draft_load_s
        + 1.2 * st.kv_alloc_s
        + st.graph_capture_s
        + st.draft_graph_capture_s
        + st.hicache_s_per_gb * ((plan.host_cache_gb or 0) + (plan.host_draft_gb or 0))
        + st.server_start_s
        + st.warmup_s
    )
    assert startup_s(kimi, plan) == pytest.approx(full)
    too_much = plan_for(bench, {**bench.search.baseline, "mem_fraction_static": 0.75})
    assert not too_much.ok and startup_s(kimi, too_much) < full
    # with the early end off, the steady phase runs its duration, then drains
    off = replace(BENCH_WORKLOAD, end_early=EarlyEnd(enabled=False))
    steady = off.phases[1]
    assert phase_s(kimi, plan, off, steady) > 900
    total = workload_s(kimi, plan, off, 1e9)
    assert total == pytest.approx(sum(phase_s(kimi, plan, off, p) for p in off.phases))
    assert workload_s(kimi, plan, off, 1e9, ooms=True) < total
    assert workload_s(kimi, plan, off, 600.0) == 600.0
    assert workload_s(kimi, plan, BENCH_WORKLOAD, 1e9) < total  # on by default: shorter


def test_the_night_ends_a_phase_where_the_drivers_rule_would_fire() -> None:
    kimi = load_profile("kimi-k2.5-tp8-96g")
    plan = plan_for(bench_for(kimi), bench_for(kimi).search.baseline)
    steady, stress = BENCH_WORKLOAD.phases[1], BENCH_WORKLOAD.phases[2]
    assert isinstance(steady, Steady) and isinstance(stress, Stress)
    rule = BENCH_WORKLOAD.end_early
    b = min(128, plan.max_running_requests or 1)
    one = request_s(kimi, plan, BENCH_WORKLOAD.input_len.mean, BENCH_WORKLOAD.output_len.mean, b)
    at = early_end_s(kimi, plan, BENCH_WORKLOAD, steady)
    assert at is not None and at % rule.window_s == 0
    assert at >= max(rule.min_s, SETTLE_WAVES * one + rule.windows * rule.window_s, 128 * one / b)
    assert (
        at < max(rule.min_s, SETTLE_WAVES * one + rule.windows * rule.window_s, 128 * one / b) + 30
    )
    # no drain: what is in flight is cancelled, the server given ABORT_SETTLE_S to drop it
    assert phase_s(kimi, plan, BENCH_WORKLOAD, steady) == pytest.approx(at + ABORT_SETTLE_S)
    # the rule's earliest moment past the duration: the phase runs to its end
    short = replace(steady, duration_s=rule.min_s)
    assert early_end_s(kimi, plan, BENCH_WORKLOAD, short) is None
    # the stress peak repeats in the model: two rounds of three
    off = replace(BENCH_WORKLOAD, end_early=EarlyEnd(enabled=False))
    two = phase_s(kimi, plan, off, replace(stress, rounds=2))
    assert phase_s(kimi, plan, BENCH_WORKLOAD, stress) == pytest.approx(two)
    assert phase_s(kimi, plan, off, stress) == pytest.approx(1.5 * two)


def test_the_night_soaks_a_factor_of_trials_as_they_ran() -> None:
    """The confirm soak's steady phase is the factor times the trial's steady phase as it ran
    (ended early by the driver's rule), then drained: a soak never ends early."""
    kimi = load_profile("kimi-k2.5-tp8-96g")
    bench = bench_for(kimi)
    plan = plan_for(bench, bench.search.baseline)
    cfg = replace(bench.study_config, workload=BENCH_WORKLOAD)
    steady = BENCH_WORKLOAD.phases[1]
    at = early_end_s(kimi, plan, BENCH_WORKLOAD, steady)
    assert at is not None and at < 900
    soaked = soak(cfg, 3.0, {steady.name: at})
    expected = startup_s(kimi, plan) + workload_s(kimi, plan, soaked.workload, 1e9) + TEARDOWN_S
    assert soak_hours(kimi, plan, cfg, 3.0).soak_s == pytest.approx(expected)
    # against the whole planned duration three times over, it is shorter by 3 × (900 − at)
    whole = soak(cfg, 3.0)
    longer = startup_s(kimi, plan) + workload_s(kimi, plan, whole.workload, 1e9) + TEARDOWN_S
    assert longer - expected == pytest.approx(3 * (900 - at))


def _run(module: ModuleType, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    argv = ["--seeds", "2", "--samplers", "capacity", "--profiles", "qwen3-32b-h200"]
    assert module.main([*argv, "--budget", "4", *extra]) == 0
    return capsys.readouterr().out


def test_a_random_run_prints_each_studys_world_and_the_night(
    bench_search: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _run(bench_search, capsys, "--mismatch", "random", "--world-seed", "7")
    lines = re.findall(
        r"^world: seed (\d), profile qwen3-32b-h200, world seed (\d+), .*$", out, re.M
    )
    assert [s for s, _ in lines] == ["0", "1"]
    for seed, drawn in lines:
        assert int(drawn) == world_seed(7, "qwen3-32b-h200", int(seed))
        assert describe(draw_world(int(drawn))) in out
    assert out.count("world: seed") == 2
    assert re.search(r"^departure (mild|moderate|severe) ", out, re.M)
    assert re.search(r"^worst capacity: .* qwen3-32b-h200 seed \d, world seed \d+", out, re.M)
    assert "night in hours" in out
    night = re.search(
        r"^qwen3-32b-h200\s+(\d+\.\d)/(\d+\.\d)$", out.split("night in hours")[1], re.M
    )
    assert night is not None and 0 < float(night.group(1)) <= float(night.group(2))
    longest = re.search(r"^longest night capacity: (\d+\.\d) h, qwen3-32b-h200 seed \d", out, re.M)
    assert longest is not None and longest.group(1) == night.group(2)
    again = _run(bench_search, capsys, "--mismatch", "random", "--world-seed", "7")
    assert re.findall(r"^world: .*$", again, re.M) == re.findall(r"^world: .*$", out, re.M)
    other = _run(bench_search, capsys, "--mismatch", "random", "--world-seed", "8")
    assert re.findall(r"^world: .*$", other, re.M) != re.findall(r"^world: .*$", out, re.M)


def test_a_plain_run_draws_no_world(
    bench_search: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _run(bench_search, capsys)
    assert "world: seed" not in out and "departure" not in out
    assert "night in hours" in out


def test_the_export_share_is_the_capacity_kept_of_what_its_soak_allows(
    bench_search: ModuleType,
) -> None:
    """`export_share`: 1 at the highest fraction that passes the soak, the ratio of the pools
    below it, None where no fraction of that demand passes."""
    bench = bench_for(load_profile("qwen3-32b-h200"), min_headroom_gib=0.5)
    base = {"max_running_requests": 32, "hicache_size": 0}
    passing = [
        f
        for f in (round(0.80 + 0.01 * i, 2) for i in range(19))
        if bench_search.p_stable(bench, {**base, "mem_fraction_static": f}, soak=3.0)[0]
        >= bench_search.STABLE_P
    ]
    top = max(passing)
    at_top = {**base, "mem_fraction_static": top}
    assert bench_search.export_share(bench, at_top, 3.0) == pytest.approx(1.0)
    lower = {**base, "mem_fraction_static": round(top - 0.05, 2)}
    tokens = [bench_search.p_stable(bench, p, soak=3.0)[1] for p in (lower, at_top)]
    assert bench_search.export_share(bench, lower, 3.0) == pytest.approx(tokens[0] / tokens[1])
    assert tokens[0] < tokens[1]


def test_kept_is_the_exports_share_of_the_best_stable_where_the_export_is_stable(
    bench_search: ModuleType,
) -> None:
    """`kept`: the exported capacity over the best stable one where the export is stable in its
    world, 0 where it is not (a setting above the stable edge that held by luck keeps nothing)."""
    bench = bench_for(load_profile("qwen3-32b-h200"), min_headroom_gib=0.5)
    base = {"max_running_requests": 32, "hicache_size": 0}
    rows = [
        (f, *bench_search.p_stable(bench, {**base, "mem_fraction_static": f}))
        for f in (round(0.80 + 0.01 * i, 2) for i in range(19))
    ]
    stable = [(f, tokens) for f, p, tokens in rows if p >= bench_search.STABLE_P]
    unstable = [f for f, p, _ in rows if p < bench_search.STABLE_P]
    assert stable and unstable
    top, best = max(stable)
    lower, fewer = min(stable)
    assert bench_search.kept(bench, {**base, "mem_fraction_static": top}, best) == 1.0
    assert bench_search.kept(bench, {**base, "mem_fraction_static": lower}, best) == pytest.approx(
        fewer / best
    )
    assert bench_search.kept(bench, {**base, "mem_fraction_static": unstable[-1]}, best) == 0.0
