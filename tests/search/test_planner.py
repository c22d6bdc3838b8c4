"""One test per rule of the capacity-aware planner, on launches of the simulator's pure model."""

from __future__ import annotations

import dataclasses

from autotune.memory.model import Setting
from autotune.search.holding import RECHECKS
from autotune.search.planner import Goal, plan
from autotune.search.points import FRACTION, Point
from tests.search.helpers import AXES, DEEPSEEK, KIMI, QWEN, point

GOAL = Goal(min_headroom_gib=0.5)


def kimi(f: float, r: int = 48, h: int = 48) -> dict[str, float | int]:
    return {"mem_fraction_static": f, "max_running_requests": r, "hicache_size": h}


EDGE_FOUND = [
    point(KIMI, kimi(f, r), i)
    for i, (f, r) in enumerate([(0.88, 48), (0.89, 48), (0.90, 48), (0.91, 48), (0.91, 32)])
]


def test_start_is_conservative_without_any_launch() -> None:
    p = plan(AXES, [], [], GOAL)
    assert p.rule == "start"
    assert float(p.params[FRACTION]) <= 0.82
    assert p.params["hicache_size"] == 0


def test_start_does_not_duplicate_what_another_worker_runs() -> None:
    first = plan(AXES, [], [], GOAL)
    second = plan(AXES, [], [first.params], GOAL)
    assert second.params != first.params
    assert second.rule == "start"


def test_jumps_close_to_the_edge_with_a_margin() -> None:
    base = dict(QWEN.search.baseline)
    p = plan(AXES, [point(QWEN, base, 0)], [], GOAL)
    assert p.rule == "jump"
    assert float(p.params[FRACTION]) >= float(base[FRACTION]) + 0.04
    assert p.forecast is not None
    head = p.forecast.headroom
    assert head is not None and head.mean - 2 * head.sd >= GOAL.min_headroom_gib


def test_a_jump_takes_the_demand_most_likely_to_hold_at_its_fraction() -> None:
    """The tokens of a fraction are the same at any requests: once 0.85 ran with 48 and with
    32 requests, the jump above takes, of the settings at its fraction with no more demand than
    the best launch's, the one the model gives the best odds (32: a smaller peak), not the best
    launch's own 48."""
    done = [point(KIMI, kimi(0.85, 48), 0), point(KIMI, kimi(0.85, 32), 1)]
    p = plan(AXES, done, [], GOAL)
    assert p.rule in ("jump", "edge") and p.forecast is not None and p.model is not None
    f = p.forecast.setting.mem_fraction
    odds = {
        r: p.model.forecast(
            Setting(f, r, None, 48.0), default_slots=r, default_chunk=None
        ).p_stable(GOAL.min_headroom_gib)
        for r in (32, 48)
    }
    assert odds[32] > odds[48], odds
    assert p.params == kimi(f, 32), (p.params, odds)


def test_steps_when_the_edge_is_one_step_away() -> None:
    p = plan(AXES, [point(KIMI, kimi(0.88), 0), point(KIMI, kimi(0.89), 1)], [], GOAL)
    assert p.rule == "step"
    assert p.params == kimi(0.9)


def test_launches_the_step_above_the_highest_safe_when_it_would_count_as_stable() -> None:
    """From the operator's 0.88, 0.89 is the highest fraction the model calls safe and 0.90
    (p(stable) 0.96) would count as stable if it held: 0.90 first saves the launch at 0.89."""
    p = plan(AXES, [point(KIMI, kimi(0.88), 0)], [], GOAL)
    assert p.rule == "edge", p.why
    assert p.params == kimi(0.9)
    assert p.forecast is not None and p.model is not None
    head = p.forecast.headroom
    assert head is not None and head.mean - 2 * head.sd < GOAL.min_headroom_gib  # not "safe"
    assert p.forecast.p_stable(GOAL.min_headroom_gib) >= GOAL.accept_p
    assert "0.89" in p.why and "count as stable" in p.why
    assert point(KIMI, p.params, 1).feasible


def test_why_names_capacity_headroom_and_the_stress_peak() -> None:
    p = plan(AXES, [point(KIMI, kimi(0.88), 0)], [], GOAL)
    for words in ("predicted 188,", "tokens", "headroom", "stress peak", "±", "best stable so far"):
        assert words in p.why


def unmeasured(p: Point) -> Point:
    """The same launch with no stress peak and no headroom recorded."""
    assert p.observation is not None
    obs = dataclasses.replace(p.observation, stress_peak_gib=None, headroom_gib=None)
    return dataclasses.replace(p, observation=obs)


def test_after_an_oom_above_a_launch_that_measured_no_peak_goes_between_with_room() -> None:
    """0.86 held (no peak measured), 0.93 ran out under load with 0.80 GiB free: the peak is
    only known to exceed 0.80 GiB, so the next launch lies between the two, with room for a
    peak well past that floor, and holds."""
    done = [unmeasured(point(KIMI, kimi(0.86), 0)), point(KIMI, kimi(0.93), 1)]
    assert done[1].observation is not None and done[1].observation.outcome == "runtime_oom"
    p = plan(AXES, done, [], GOAL)
    assert 0.86 < float(p.params[FRACTION]) < 0.93, p
    fc = p.forecast
    assert fc is not None and fc.peak_floor is not None and fc.static_free is not None
    assert fc.static_free.mean - GOAL.min_headroom_gib >= 2 * fc.peak_floor, p.why
    assert point(KIMI, p.params, 2).feasible, p


def test_goes_down_after_an_oom_with_nothing_measured_to_a_setting_that_holds() -> None:
    first = point(KIMI, kimi(0.93), 0)
    p = plan(AXES, [first], [], GOAL)
    assert p.rule == "down"
    assert float(p.params[FRACTION]) < 0.93
    assert point(KIMI, p.params, 1).feasible, p


def test_an_oom_bounds_fewer_requests_at_a_higher_fraction() -> None:
    """An OOM at 0.93 with 48 requests (0.80 GiB free) says little less of 16 requests, whose
    decode weighs at most a few chunk tokens each: 0.94 with 16 (0.82 GiB free, its smaller
    CUDA graphs free 0.9 GiB more) is less than a coin toss, and the search does not go there."""
    first = point(KIMI, kimi(0.93), 0)
    p = plan(AXES, [first], [], GOAL)
    assert not float(p.params[FRACTION]) > 0.93
    model = p.model
    assert model is not None
    fc = model.forecast(Setting(0.94, 16, None, 48.0), default_slots=48, default_chunk=8192)
    assert fc.peak_floor is not None and fc.peak_floor > 0.75
    assert fc.p_stable(0.0) < 0.5


def test_never_proposes_more_than_what_failed() -> None:
    done = [point(KIMI, kimi(0.88), 0), point(KIMI, kimi(0.91), 1)]
    assert done[1].memory_failure
    bold = Goal(min_headroom_gib=0.0, safe_p=0.5, probe_p=0.01)
    p = plan(AXES, done, [], bold)
    s = p.params
    assert not (float(s[FRACTION]) >= 0.91 and int(s["max_running_requests"]) >= 48)


def test_goes_down_to_a_safe_setting_when_the_first_one_lacked_headroom() -> None:
    done = [point(KIMI, kimi(0.91, 32), 0)]
    assert done[0].observation is not None and done[0].observation.outcome == "ok"
    assert not done[0].feasible
    p = plan(AXES, done, [], GOAL)
    assert p.rule == "down"
    assert p.params == kimi(0.9, 32)
    assert p.forecast is not None and p.forecast.p_stable(0.5) > GOAL.safe_p


def test_never_proposes_a_host_cache_that_cannot_start() -> None:
    base = dict(DEEPSEEK.search.baseline)
    done = [point(DEEPSEEK, base, 0)]
    for n in range(1, 12):
        p = plan(AXES, done, [], GOAL)
        launched = point(DEEPSEEK, p.params, n)
        assert launched.observation is not None
        assert "hicache_too_small" not in launched.observation.reason, p.why
        if float(p.params[FRACTION]) >= 0.95:  # a pool too big for 24 or 48 GB of host cache
            assert p.params["hicache_size"] in (0, 96), p.why
        done.append(launched)


def test_explores_requests_and_host_cache_once_the_edge_is_known() -> None:
    done = EDGE_FOUND
    p = plan(AXES, done, [], GOAL)
    assert p.rule == "explore"
    assert p.params[FRACTION] in (0.89, 0.9)  # at most one step of capacity for throughput
    changed = [k for k in ("max_running_requests", "hicache_size") if p.params[k] != kimi(0.9)[k]]
    assert len(changed) == 1
    if changed == ["max_running_requests"]:
        assert int(p.params["max_running_requests"]) > 48
    assert p.forecast is not None and p.forecast.p_stable(0.5) >= GOAL.safe_p


def test_signals_done_when_what_is_left_is_below_one_step() -> None:
    p = plan(AXES, EDGE_FOUND, [], Goal(min_headroom_gib=0.5, explore=False))
    assert p.rule == "confirm"
    assert p.done is not None and "smaller than one step" in p.done
    assert p.params == kimi(0.9)
    assert "mem_fraction_static=0.91 ran out of GPU memory under load" in p.done


def test_a_running_probe_is_neither_repeated_nor_overtaken() -> None:
    done = [point(KIMI, kimi(0.88), 0)]
    first = plan(AXES, done, [], GOAL)
    second = plan(AXES, done, [first.params], GOAL)
    assert second.params != first.params
    f1, f2 = float(first.params[FRACTION]), float(second.params[FRACTION])
    assert f2 < f1 or int(second.params["max_running_requests"]) < 48


def test_a_bigger_prefill_chunk_is_predicted_to_need_more_headroom() -> None:
    axes = {**AXES, "chunked_prefill_size": (4096, 8192, 16384)}
    base = {**kimi(0.88), "chunked_prefill_size": 8192}
    done = [point(KIMI, base, 0), point(KIMI, {**base, FRACTION: 0.89}, 1)]
    p = plan(axes, done, [], GOAL)
    assert p.model is not None
    model = p.model
    at = {
        c: model.forecast(Setting(0.9, 48, c, 48.0), default_slots=48, default_chunk=8192)
        for c in (4096, 8192, 16384)
    }
    peaks = [at[c].stress_peak for c in (4096, 8192, 16384)]
    small, mid, big = (p for p in peaks if p is not None)
    assert small.mean < mid.mean < big.mean
    assert big.sd > mid.sd
    assert at[16384].p_stable(0.5) < 0.5 < at[4096].p_stable(0.5)


def test_rechecks_a_best_setting_that_held_with_a_thin_margin() -> None:
    done = list(EDGE_FOUND)
    edge = done[2].observation
    assert edge is not None and edge.static_free_gib is not None
    thin = dataclasses.replace(edge, stress_peak_gib=edge.static_free_gib - 0.58, headroom_gib=0.58)
    done[2] = dataclasses.replace(done[2], observation=thin)
    goal = Goal(min_headroom_gib=0.5, explore=False)
    # first the same fraction with the least demand: no capacity lost, more headroom
    p = plan(AXES, done, [], goal)
    assert p.rule == "margin"
    assert p.params == kimi(0.9, 32)
    done.append(point(KIMI, kimi(0.9, 32), 5))
    p = plan(AXES, done, [], goal)
    # less demand held the same capacity with room: the edge is known
    assert p.rule == "confirm" and p.params == kimi(0.9, 32), p.why
    # where the space offers no less demand, a best that held with a thin margin (0.7 GiB for
    # 0.5 required) runs again until it held RECHECKS times
    only48 = {**AXES, "max_running_requests": (48,)}
    held = dataclasses.replace(edge, stress_peak_gib=edge.static_free_gib - 0.7, headroom_gib=0.7)
    done = [*EDGE_FOUND[:2], dataclasses.replace(EDGE_FOUND[2], observation=held), EDGE_FOUND[3]]
    p = plan(only48, done, [], goal)
    assert p.rule == "recheck"
    assert p.params == kimi(0.9)
    again = [*done, dataclasses.replace(done[2], number=6), dataclasses.replace(done[2], number=7)]
    assert plan(only48, again, [], goal).rule == "confirm"
    # the holds still wanting run as stress passes of one launch, not as launches: held once,
    # the recheck asks for RECHECKS − 1 passes, and that launch holding is RECHECKS holds
    assert p.repeats == RECHECKS - 1 and f"run {RECHECKS - 1} times on the launch" in p.why
    passes = dataclasses.replace(done[2], number=6, repeats=p.repeats)
    assert plan(only48, [*done, passes], [], goal).rule == "confirm"
    assert plan(only48, [*done, dataclasses.replace(passes, repeats=1)], [], goal).rule == "recheck"


def test_secures_a_safe_fraction_of_the_same_demand_before_rechecking_a_thin_best() -> None:
    # 1.1 GiB required: 0.90 with 32 requests kept 1.2 GiB once, which the model calls stable
    # but not safe
    goal = Goal(min_headroom_gib=1.1)
    base = point(KIMI, kimi(0.86, 32), 0)
    held = [point(KIMI, kimi(0.9, 32), 1, seed=1)]
    p = plan(AXES, [base, *held], [], goal)
    # before the thin best runs again, the most capacity the model calls safe at its own
    # demand, so the study holds a setting it can trust if the thin one was luck
    assert p.rule == "secure", p.why
    assert p.params == kimi(0.89, 32)
    assert "thin margin" in p.why
    done = [base, *held, point(KIMI, p.params, 2)]
    p = plan(AXES, done, [], goal)
    assert p.rule == "recheck" and p.params == kimi(0.9, 32), p.why
    done += [point(KIMI, kimi(0.9, 32), n, seed=n) for n in (3, 4)]
    assert plan(AXES, done, [], goal).rule == "explore"


def test_an_uncertain_probe_for_capacity_takes_the_least_demand_at_its_fraction() -> None:
    # 0.94 with 48 requests held; 0.95 is uncertain: its tokens are the same at any requests,
    # and with the fewest it is the most likely to hold
    def ds(f: float, r: int = 48) -> dict[str, float | int]:
        return {"mem_fraction_static": f, "max_running_requests": r, "hicache_size": 0}

    done = [point(DEEPSEEK, ds(0.85), 0), point(DEEPSEEK, ds(0.94), 1)]
    p = plan(AXES, done, [], Goal(min_headroom_gib=0.5))
    assert p.rule == "bisect", p.why
    assert p.params == ds(0.95, 32)
