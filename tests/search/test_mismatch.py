"""A world that differs from the model: the simulator's `[mismatch]` keys, and a search that
checks its predictions against every launch and widens its margins when they miss."""

from __future__ import annotations

import dataclasses
import math
import random
import re
from collections.abc import Callable
from types import ModuleType

import optuna
import pytest

from autotune.logparse.ledger import Ledger
from autotune.memory.fit import fit
from autotune.memory.model import Estimate, Forecast, Observation, Setting
from autotune.search import CapacityAwareSampler
from autotune.search.calibration import Calibration, Check, calibrate
from autotune.search.planner import Goal, plan
from autotune.search.points import Point
from autotune.search.state import PlanState
from autotune.sim.flags import ServerSettings
from autotune.sim.memplan import plan_startup
from autotune.sim.profiles import Mismatch, ProfileError, load_profile, profile_from_dict
from autotune.sim.runtime import (
    forward_cdf,
    forward_mean_gib,
    growth_gib,
    student_cdf,
    transient_peak_gib,
)
from autotune.testing.oracle import MISMATCH, bench_for, best_stable, p_stable
from tests.search.helpers import AXES, KIMI, point, study_with

GOAL = Goal(min_headroom_gib=0.5)


@pytest.fixture(autouse=True)
def quiet() -> None:
    optuna.logging.set_verbosity(optuna.logging.ERROR)


# ---- the simulator's keys -------------------------------------------------------------------


def _doc(**mismatch: object) -> dict[str, object]:
    import tomllib

    from autotune.sim.profiles import PROFILE_DIR

    doc = tomllib.loads((PROFILE_DIR / "qwen3-32b-h200.toml").read_text())
    if mismatch:
        doc["mismatch"] = dict(mismatch)
    return doc


def test_mismatch_is_off_by_default_and_read_strictly() -> None:
    assert not load_profile("qwen3-32b-h200").mismatch.on
    prof = profile_from_dict(_doc(growth_mib_per_request=0.2, peak_tail_dof=5))
    assert prof.mismatch == Mismatch(growth_mib_per_request=0.2, peak_tail_dof=5)
    with pytest.raises(ProfileError, match=r"mismatch\.growth"):
        profile_from_dict(_doc(growth="fast"))
    with pytest.raises(ProfileError, match="peak_tail_dof"):
        profile_from_dict(_doc(peak_tail_dof=2))
    with pytest.raises(ProfileError, match="spike_probability"):
        profile_from_dict(_doc(spike_probability=2.0))


def test_student_cdf_is_the_closed_form() -> None:
    for dof in (3, 4, 5, 8):
        assert student_cdf(0.0, dof) == pytest.approx(0.5)
        assert student_cdf(1.5, dof) + student_cdf(-1.5, dof) == pytest.approx(1.0)
    t = 1.3
    three = 0.5 + (math.atan(t / math.sqrt(3)) + (t / math.sqrt(3)) / (1 + t * t / 3)) / math.pi
    assert student_cdf(t, 3) == pytest.approx(three)
    assert student_cdf(2.0, 4) == pytest.approx(0.9419, abs=1e-4)  # tables
    normal = 0.5 * (1 + math.erf(2.0 / math.sqrt(2)))
    assert student_cdf(2.0, 200) == pytest.approx(normal, abs=2e-3)


def test_a_forward_peak_is_drawn_from_forward_cdf() -> None:
    prof = dataclasses.replace(
        load_profile("qwen3-32b-h200"),
        mismatch=Mismatch(peak_tail_dof=5, spike_probability=0.02, spike_factor=0.5),
    )
    rng = random.Random(7)
    draws = [transient_peak_gib(prof, 8192, 0, rng) for _ in range(20000)]
    mean = forward_mean_gib(prof, 8192, 0)
    for ratio in (1.05, 1.15, 1.3):
        limit = mean * ratio
        seen = sum(d <= limit for d in draws) / len(draws)
        assert seen == pytest.approx(forward_cdf(prof, 8192, 0, limit), abs=0.006)


def test_the_peak_grows_with_the_live_context_and_the_allocator_with_requests() -> None:
    prof = dataclasses.replace(
        load_profile("qwen3-32b-h200"),
        mismatch=Mismatch(context_mib_per_1k_tokens=4.0, growth_mib_per_request=0.2),
    )
    assert forward_mean_gib(prof, 0, 48, 200_000) - forward_mean_gib(prof, 0, 48) == pytest.approx(
        4.0 * 200 / 1024
    )
    assert growth_gib(prof, 1500) == pytest.approx(0.2 * 1500 / 1024)
    assert growth_gib(load_profile("qwen3-32b-h200"), 1500) == 0.0


def test_one_rank_short_sizes_the_pool_by_the_least() -> None:
    base = load_profile("kimi-k2.5-tp8-96g")
    short = dataclasses.replace(base, mismatch=Mismatch(rank_imbalance_gib=0.5))
    s = ServerSettings(tp_size=8, mem_fraction_static=0.88, max_running_requests=48)
    even, uneven = plan_startup(base, s), plan_startup(short, s)
    assert uneven.p_per_rank[-1] == pytest.approx(uneven.p_per_rank[0] - 0.5)
    assert uneven.p_gib == pytest.approx(even.p_gib - 0.5)
    assert (uneven.max_total_num_tokens or 0) < (even.max_total_num_tokens or 0)


def test_the_oracle_truth_matches_its_launches() -> None:
    bench = bench_for(load_profile("deepseek-v3-tp8-h200"), mismatch=MISMATCH)
    params = {"mem_fraction_static": 0.94, "max_running_requests": 48, "hicache_size": 0}
    p, _ = p_stable(bench, params)
    from autotune.testing.oracle import launch

    passed = 0
    for seed in range(150):
        _, result = launch(bench, params, seed * 13 + 5)
        m = result.measured
        passed += m is not None and m.headroom_gib is not None and m.headroom_gib >= 0.5
    assert passed / 150 == pytest.approx(p, abs=0.08)
    assert 0.6 < p < 0.95  # heavy tails: a setting that held three times can still be unstable


def test_a_soak_sees_more_growth_than_a_trial() -> None:
    bench = bench_for(load_profile("qwen3-32b-h200"), mismatch=MISMATCH)
    params = {"mem_fraction_static": 0.93, "max_running_requests": 48, "hicache_size": 0}
    trial, _ = p_stable(bench, params)
    soak, _ = p_stable(bench, params, soak=3.0)
    assert soak < trial


# ---- calibration ------------------------------------------------------------------------------


def test_a_model_that_hits_keeps_its_nerve_and_one_that_misses_widens() -> None:
    hits = Calibration(tuple(Check(i, 1.0, 0.2, 1.0 + 0.05 * (-1) ** i) for i in range(4)))
    assert hits.kappa < 1.0 and not hits.misses and hits.describe() == ""
    missed = Calibration((Check(1, 1.0, 0.2, 0.4), Check(2, 1.0, 0.2, 1.1)))
    assert missed.kappa > 1.5
    assert missed.bias_gib > 0
    assert "missed 1 of 2" in missed.describe() and "wider" in missed.describe()


def test_widened_margins_lower_p_stable() -> None:
    fc = Forecast(
        setting=Setting(0.9, 48),
        tokens=Estimate(1e5, 1.0),
        static_free=Estimate(2.0, 0.02),
        stress_peak=Estimate(1.0, 0.2),
    )
    plain = Calibration()
    missed = Calibration((Check(1, 1.0, 0.2, 0.2),))
    assert plain.p_stable(fc, 0.5) == pytest.approx(fc.p_stable(0.5))
    assert missed.p_stable(fc, 0.5) < 0.9 < plain.p_stable(fc, 0.5)


def test_every_launch_is_scored_against_the_model_of_the_launches_before_it() -> None:
    pts = [
        point(KIMI, {**KIMI.search.baseline, "mem_fraction_static": f}, i)
        for i, f in enumerate((0.88, 0.89, 0.9))
    ]
    cal = calibrate(pts)
    assert [c.number for c in cal.checks] == [1, 2]  # the first has nothing to be judged by
    assert all(abs(c.z) < 2 for c in cal.checks)  # the shipped profile is the model's world
    # a launch that kept far less than predicted is a miss
    o = pts[2].observation
    assert o is not None and o.headroom_gib is not None
    worse = dataclasses.replace(
        o, headroom_gib=o.headroom_gib - 1.5, stress_peak_gib=(o.stress_peak_gib or 0) + 1.5
    )
    cal = calibrate([pts[0], pts[1], dataclasses.replace(pts[2], observation=worse)])
    assert cal.misses and cal.kappa > 1.3


# ---- the planner in a world that differs ------------------------------------------------------


def _near_miss(p: Point, headroom: float) -> Point:
    o = p.observation
    assert o is not None and o.static_free_gib is not None
    obs = dataclasses.replace(
        o, headroom_gib=headroom, stress_peak_gib=o.static_free_gib - headroom, feasible=False
    )
    return dataclasses.replace(p, observation=obs, violated=frozenset({"headroom_gib"}))


def test_a_near_miss_tries_less_demand_then_once_more() -> None:
    def kimi(f: float, r: int = 48) -> dict[str, float | int]:
        return {"mem_fraction_static": f, "max_running_requests": r, "hicache_size": 48}

    done = [
        point(KIMI, kimi(0.88), 0),
        point(KIMI, kimi(0.89), 1),
        _near_miss(point(KIMI, kimi(0.9), 2), 0.42),
    ]
    p = plan(AXES, done, [], GOAL)
    assert p.rule == "margin" and p.params == kimi(0.9, 32)
    done.append(_near_miss(point(KIMI, kimi(0.9, 32), 3), 0.45))
    p = plan(AXES, done, [], GOAL)
    assert p.rule == "retry" and p.params in (kimi(0.9), kimi(0.9, 32))  # one of the near misses
    assert "near miss" in p.why


def test_a_safe_setting_far_below_a_near_miss_is_bisected_past_not_stepped_to() -> None:
    """Two near misses at 0.90 widened the margins so far that the highest setting the model
    calls safe lies four steps below: the next launch goes halfway, not one safe step at a time
    from there, and keeps the host cache the safe setting has."""

    def kimi(f: float, r: int = 48) -> dict[str, float | int]:
        return {"mem_fraction_static": f, "max_running_requests": r, "hicache_size": 48}

    done = [
        point(KIMI, kimi(0.8), 0),
        _near_miss(point(KIMI, kimi(0.9), 1), 0.05),
        _near_miss(point(KIMI, kimi(0.9, 32), 2), 0.05),
    ]
    p = plan(AXES, done, [], GOAL)
    assert p.rule == "bisect", p.why
    safe = re.search(r"the model calls safe is ([0-9.]+), (\d+) steps below 0.9", p.why)
    assert safe is not None and int(safe[2]) >= 4, p.why
    f = float(p.params["mem_fraction_static"])
    assert float(safe[1]) + 0.015 < f < 0.885
    assert p.params == kimi(f, 32)


def test_a_failure_contradicted_by_a_launch_needing_more_is_not_a_bound() -> None:
    def kimi(f: float, r: int = 48) -> dict[str, float | int]:
        return {"mem_fraction_static": f, "max_running_requests": r, "hicache_size": 48}

    held = point(KIMI, kimi(0.9, 48), 1)
    near = _near_miss(point(KIMI, kimi(0.9, 32), 2), 0.1)
    assert near.observation is not None
    oom = dataclasses.replace(
        near.observation, outcome="runtime_oom", headroom_gib=None, stress_peak_gib=None
    )
    failed = dataclasses.replace(near, observation=oom, violated=frozenset({"oom"}))
    p = plan(AXES, [point(KIMI, kimi(0.88), 0), point(KIMI, kimi(0.89), 3), held, failed], [], GOAL)
    assert p.rule == "retry" and p.params == kimi(0.9, 32)
    assert "noise" in p.why


def _ran_out(p: Point) -> Point:
    """`p` as a launch of its setting that ran out of memory under load."""
    assert p.observation is not None
    oom = dataclasses.replace(
        p.observation,
        outcome="runtime_oom",
        reason="runtime_oom (torch_oom): torch.OutOfMemoryError: CUDA out of memory",
        feasible=False,
        headroom_gib=None,
        stress_peak_gib=None,
    )
    return dataclasses.replace(p, observation=oom, violated=frozenset({"oom"}))


def test_failures_too_many_for_the_holds_beside_them_bound_the_search() -> None:
    """0.9/32 held once, and 0.9/48 (more memory) too; then 0.9/32 ran out of memory on a
    recheck. One failure beside the holds is a spike of the tail (a stable setting shows one in
    ten times); a second is the edge: 0.9/32 and everything needing as much is out, and the
    search neither rechecks it nor stands on the holds above it."""

    def kimi(f: float, r: int = 48) -> dict[str, float | int]:
        return {"mem_fraction_static": f, "max_running_requests": r, "hicache_size": 48}

    edge = point(KIMI, kimi(0.9, 32), 1)
    failed = dataclasses.replace(_ran_out(edge), number=3)
    done = [point(KIMI, kimi(0.88), 0), edge, point(KIMI, kimi(0.9, 48), 2), failed]
    goal = Goal(min_headroom_gib=0.5, explore=False)
    once = PlanState(AXES, list(AXES), done, [], goal)
    assert once.bounds == [] and once.best is not None  # noise: not a bound yet
    twice = [*done, dataclasses.replace(failed, number=4)]
    st = PlanState(AXES, list(AXES), twice, [], goal)
    assert [b.number for b in st.bounds] == [3, 4]
    assert st.best is not None and st.best.number == 0  # the holds at 0.9 no longer stand
    p = plan(AXES, twice, [], goal)
    assert float(p.params["mem_fraction_static"]) < 0.9, p


def test_held_once_at_the_edge_is_not_yet_stable() -> None:
    """A thin margin that held is proven by the model's expectation, not by one pass."""

    def kimi(f: float, r: int = 48) -> dict[str, float | int]:
        return {"mem_fraction_static": f, "max_running_requests": r, "hicache_size": 48}

    edge = point(KIMI, kimi(0.9), 1)
    o = edge.observation
    assert o is not None and o.static_free_gib is not None
    thin = dataclasses.replace(o, headroom_gib=0.52, stress_peak_gib=o.static_free_gib - 0.52)
    done = [
        point(KIMI, kimi(0.88), 0),
        point(KIMI, kimi(0.89), 2),
        dataclasses.replace(edge, observation=thin),
    ]
    p = plan(AXES, done, [], Goal(min_headroom_gib=0.5, explore=False))
    assert p.rule == "margin" and p.params == kimi(0.9, 32)
    assert "best stable so far 173," in p.why  # 0.89, not the thin 0.9


@pytest.mark.parametrize("name", ["kimi-k2.5-tp8-96g", "deepseek-v3-tp8-h200", "qwen3-32b-h200"])
def test_capacity_reaches_the_edge_of_a_world_that_differs(name: str) -> None:
    bench = bench_for(load_profile(name), mismatch=MISMATCH)
    best = best_stable(bench)
    for seed in range(2):
        _, launches = study_with(bench, CapacityAwareSampler(seed=seed), 8, seed=seed)
        held = [x.tokens for x in launches if x.feasible and x.stable]
        assert max(held) >= 0.99 * best
        assert sum(x.crashed for x in launches) <= 1


def test_the_ledger_shows_rank_zero() -> None:
    bench = bench_for(load_profile("kimi-k2.5-tp8-96g"), mismatch=Mismatch(rank_imbalance_gib=0.5))
    p = point(bench, {**bench.search.baseline}, 0)
    assert p.observation is not None
    led: Ledger = p.observation.ledger
    even = point(KIMI, {**KIMI.search.baseline}, 0).observation
    assert even is not None and led.p_gib is not None and even.ledger.p_gib is not None
    assert led.p_gib == pytest.approx(even.ledger.p_gib, abs=0.02)  # rank 0 has its full share
    assert (p.observation.tokens or 0) < (even.tokens or 0)  # the pool follows the least rank
    _ = Observation  # typed view used above


def test_a_runtime_oom_far_above_the_peaks_of_its_demand_is_a_spike_not_a_bound() -> None:
    """0.86/32 ran out of memory with more static free memory than 1.25 × any peak that 32
    requests measured (0.85/32 held): a spike of the peak's tail, not the edge."""

    def kimi(f: float, r: int = 48) -> dict[str, float | int]:
        return {"mem_fraction_static": f, "max_running_requests": r, "hicache_size": 48}

    below = point(KIMI, kimi(0.85, 32), 1)
    top = point(KIMI, kimi(0.86, 32), 2)
    assert below.observation is not None and top.observation is not None
    assert below.observation.measured_peak_gib is not None
    free = top.observation.static_free_gib
    assert free is not None and free > 1.25 * below.observation.measured_peak_gib
    spiked = _ran_out(top)
    done = [point(KIMI, kimi(0.84, 32), 0), below, spiked]
    p = plan(AXES, done, [], GOAL)
    assert float(p.params["mem_fraction_static"]) > 0.86, p  # not a bound: the search goes on up
    # the same OOM twice is the edge: nothing at or above it needing as much memory
    twice = [*done, dataclasses.replace(spiked, number=3)]
    p = plan(AXES, twice, [], GOAL)
    assert float(p.params["mem_fraction_static"]) < 0.86 or p.params["max_running_requests"] < 32


def test_the_peak_model_learns_a_transient_that_grows_with_the_pool() -> None:
    """A stress phase fills the KV pool: where launches of different pools measured peaks that
    grow with it, the model predicts a bigger pool's peak from that slope; flat peaks add
    nothing."""

    def obs(f: float, tokens: int, peak: float) -> Observation:
        led = Ledger(max_total_num_tokens=tokens, available_gpu_mem_gib=10.0)
        return Observation(Setting(f, 48), led, "ok", stress_peak_gib=peak, headroom_gib=10 - peak)

    growing = fit([obs(0.80, 100_000, 2.0), obs(0.84, 140_000, 2.4), obs(0.86, 160_000, 2.6)])
    assert growing.peak is not None
    at = growing.peak.at(48, None, 200_000)
    assert at.mean == pytest.approx(3.0, abs=0.01)
    assert growing.peak.at(48, None, 160_000).mean == pytest.approx(2.6, abs=0.01)
    flat = fit([obs(0.80, 100_000, 2.5), obs(0.84, 140_000, 2.4), obs(0.86, 160_000, 2.45)])
    assert flat.peak is not None and flat.peak.per_pool_token == 0.0
    two = fit([obs(0.80, 100_000, 2.0), obs(0.86, 160_000, 2.6)])  # no residual to judge by
    assert two.peak is not None and two.peak.per_pool_token == 0.0


def test_a_spiked_peak_does_not_widen_the_peak_models_spread() -> None:
    """One stress phase that peaked 40% above every other launch of its requests and chunk is
    a spike of the tail: the fit leaves it out, so the spread stays that of the others; a peak
    of other requests is no reference for it."""

    def obs(f: float, peak: float, requests: int = 48) -> Observation:
        led = Ledger(max_total_num_tokens=int(f * 200_000), available_gpu_mem_gib=10.0)
        return Observation(
            Setting(f, requests), led, "ok", stress_peak_gib=peak, headroom_gib=10 - peak
        )

    calm = [obs(0.80, 2.0), obs(0.82, 2.05), obs(0.84, 1.98)]
    spiked = fit([*calm, obs(0.86, 2.9)])
    assert spiked.peak is not None
    assert spiked.peak.sd == pytest.approx(fit(calm).peak.sd)  # type: ignore[union-attr]
    assert spiked.peak.at(48, None).mean < 2.1
    alone = fit([obs(0.80, 2.0, 32), obs(0.86, 2.9)])
    assert alone.peak is not None and alone.peak.at(48, None).mean > 2.5


def _own_table(tmp_path: object, **mismatch: object) -> str:
    """A copy of the Kimi box whose profile carries its own `[mismatch]` table."""
    import tomllib
    from pathlib import Path

    from autotune.sim.profiles import PROFILE_DIR

    text = (PROFILE_DIR / "kimi-k2.5-tp8-96g.toml").read_text()
    assert "[mismatch]" not in text and tomllib.loads(text)
    table = "\n".join(f"{k} = {v}" for k, v in mismatch.items())
    path = Path(str(tmp_path)) / "kimi-short-rank.toml"
    path.write_text(text + f"\n[mismatch]\n{table}\n")
    return str(path)


def test_the_benchmark_keeps_a_profiles_own_mismatch_and_adds_its_world_on_top(
    tmp_path: object,
) -> None:
    own = load_profile(_own_table(tmp_path, rank_imbalance_gib=1.5))
    assert own.mismatch == Mismatch(rank_imbalance_gib=1.5)
    # bench_search hands every profile its --mismatch world, an empty one without the flag
    assert bench_for(own, mismatch=Mismatch()).mismatch == own.mismatch
    layered = bench_for(own, mismatch=Mismatch(peak_tail_dof=5)).mismatch
    assert layered == Mismatch(rank_imbalance_gib=1.5, peak_tail_dof=5)
    plain = dataclasses.replace(own, mismatch=Mismatch())
    assert best_stable(bench_for(own, mismatch=Mismatch())) < best_stable(bench_for(plain))


def test_bench_search_runs_a_profile_in_its_own_world(
    tmp_path: object,
    capsys: pytest.CaptureFixture[str],
    load_script: Callable[[str], ModuleType],
) -> None:
    bench_search = load_script("bench_search")
    with_table = _own_table(tmp_path, rank_imbalance_gib=1.5)
    best = {}
    for name in ("kimi-k2.5-tp8-96g", with_table):
        argv = ["--seeds", "1", "--samplers", "capacity", "--profiles", name, "--budget", "6"]
        assert bench_search.main(argv) == 0
        found = re.search(r"best stable capacity ([\d,]+) tokens", capsys.readouterr().err)
        assert found is not None
        best[name] = int(found.group(1).replace(",", ""))
    assert best[with_table] < best["kimi-k2.5-tp8-96g"]
