"""Failure direction: which way a failed launch pushes, and the searches that follow it.

The trap of issue 14: Mixtral-8x7B on 2 × 48 GB, weights 43.5 of the 47.5 GiB free per GPU.
Every fraction below ~0.916 stops with `Not enough memory. Please try to increase
--mem-fraction-static`; a search that reads that as an OOM walks down into nothing.
"""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.distributions import BaseDistribution, FloatDistribution
from optuna.trial import TrialState, create_trial

from autotune.logparse.ledger import Ledger
from autotune.memory.model import Observation, Setting
from autotune.record.direction import Push, direction, floor_fraction, push_of
from autotune.record.view import view
from autotune.search import CapacityAwareSampler, WalkDownSampler, search_done
from autotune.search.capacity import DONE_ATTR, RULE_ATTR
from autotune.search.planner import Goal, plan
from autotune.search.points import Point
from autotune.search.walkdown import walk
from autotune.sim.profiles import load_profile
from autotune.testing.oracle import bench_for, best_stable
from tests.search.helpers import AXES, point, study_with

PROFILES = Path(__file__).resolve().parents[2] / "scripts" / "bench_profiles"
MIXTRAL = bench_for(load_profile(PROFILES / "mixtral-8x7b-tp2-48g.toml"))
NO_ROOM = (
    "startup_oom (no_kv_room): Not enough memory. Please try to increase --mem-fraction-static. "
    "Current value: self.server_args.mem_fraction_static=0.85"
)


@pytest.fixture(autouse=True)
def quiet() -> None:
    optuna.logging.set_verbosity(optuna.logging.ERROR)


# ---- push_of: every ending ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("outcome", "reason", "violated", "want"),
    [
        ("startup_oom", NO_ROOM, (), Push.RAISE),
        (
            "startup_oom",
            "startup_oom: Not enough memory. Please try to increase --mem-f",
            (),
            Push.RAISE,
        ),
        (
            "startup_oom",
            "startup_oom (no_kv_room): Loaded weights leave no GPU memory for the KV cache under "
            "--mem-fraction-static=0.85. Raise --mem-fraction-static above 0.916",
            (),
            Push.RAISE,
        ),
        (
            "startup_oom",
            "startup_oom (pool_too_small): Memory pool size is too small",
            (),
            Push.RAISE,
        ),
        (
            "startup_oom",
            "startup_oom (graph_capture_failed): Capture cuda graph failed",
            (),
            Push.LOWER,
        ),
        ("startup_oom", "startup_oom (torch_oom): CUDA out of memory", (), Push.LOWER),
        (
            "runtime_oom",
            "runtime_oom (torch_oom): CUDA out of memory. Tried to allocate",
            (),
            Push.LOWER,
        ),
        # the KV pool's own slots ran out (SGLang's allocator, not CUDA): the pool grows with f
        ("runtime_oom", "runtime_oom (decode_oom): Decode out of memory. Try to", (), Push.RAISE),
        ("runtime_oom", "runtime_oom (retract_oom): ValueError: Out of memory", (), Push.RAISE),
        ("ok", "", ("headroom_gib",), Push.LOWER),
        ("ok", "", ("p99_ttft_ms",), Push.NONE),
        ("ok", "", (), Push.NONE),
        (
            "startup_oom",
            "startup_oom (host_memory): Not enough host memory available.",
            (),
            Push.SHRINK_HOST,
        ),
        (
            "startup_oom",
            "startup_oom (host_oom_killer): Rank 3 scheduler is dead.",
            (),
            Push.SHRINK_HOST,
        ),
        (
            "startup_error",
            "startup_error (hicache_too_small): The host memory should be larger than the device "
            "memory with the current protocol",
            (),
            Push.GROW_HOST,
        ),
        ("startup_error", "startup_error (error): unrecognized arguments: --foo", (), Push.NONE),
        ("crash", "crash (process_lost): the scheduler vanished", (), Push.NONE),
        ("hang", "hang (watchdog_timeout): ...", (), Push.NONE),
    ],
)
def test_every_ending_pushes_its_own_way(
    outcome: str, reason: str, violated: tuple[str, ...], want: Push
) -> None:
    assert push_of(outcome, reason, violated) is want


def test_weights_that_do_not_fit_push_nowhere() -> None:
    """A CUDA OOM while the weights load (P logged, nothing after it): no fraction helps."""
    led = Ledger(p_gib=47.5, weights_gib=None, avail_after_weights_gib=None)
    assert (
        push_of("startup_oom", "startup_oom (torch_oom): CUDA out of memory", (), led) is Push.NONE
    )
    after = Ledger(p_gib=47.5, avail_after_weights_gib=4.0)
    assert (
        push_of("startup_oom", "startup_oom (torch_oom): CUDA out of memory", (), after)
        is Push.LOWER
    )


def test_the_ledger_gives_the_lowest_fraction_that_holds_a_pool() -> None:
    led = Ledger(p_gib=47.5, avail_after_weights_gib=4.0)
    assert floor_fraction(led) == pytest.approx(1 - 4.0 / 47.5)
    assert floor_fraction(Ledger(p_gib=47.5)) is None
    said = "Raise --mem-fraction-static above 0.917 (minimum viable = 1 - available/pre = 0.9158)."
    assert floor_fraction(led, said) == pytest.approx(0.917)


def test_a_stored_trial_reads_its_direction() -> None:
    dist: dict[str, BaseDistribution] = {
        "mem_fraction_static": FloatDistribution(0.75, 0.98, step=0.01)
    }
    rec = {
        "params": {"mem_fraction_static": 0.85},
        "ledger": {"p_gib": 47.5},
        "outcome": "startup_oom",
    }
    failed = create_trial(
        state=TrialState.FAIL,
        params={"mem_fraction_static": 0.85},
        distributions=dist,
        user_attrs={"outcome": "startup_oom", "reason": NO_ROOM, "record": rec},
    )
    assert direction(view(failed)) is Push.RAISE
    held = create_trial(
        values=[1.0, 1.0],
        params={"mem_fraction_static": 0.9},
        distributions=dist,
        user_attrs={"outcome": "ok", "reason": ""},
    )
    assert direction(view(held)) is Push.NONE


# ---- the trap ---------------------------------------------------------------------------------


def test_the_trap_every_fraction_below_the_floor_fails_with_increase() -> None:
    for f in (0.75, 0.8, 0.85, 0.91):
        p = point(MIXTRAL, {**MIXTRAL.search.baseline, "mem_fraction_static": f}, 0)
        assert p.push is Push.RAISE and p.too_low and not p.memory_failure
        assert p.floor == pytest.approx(1 - 4.0 / 47.5, abs=0.002)


def test_one_no_room_failure_is_enough_to_jump_above_the_floor() -> None:
    base = dict(MIXTRAL.search.baseline)
    failed = point(MIXTRAL, base, 0)
    prop = plan(AXES, [failed], [], Goal(min_headroom_gib=0.5))
    assert prop.rule == "up" and prop.done is None
    f = prop.params["mem_fraction_static"]
    assert isinstance(f, float) and 0.916 < f <= 0.93
    assert "too low" in prop.why


@pytest.mark.parametrize("seed", range(5))
def test_capacity_reaches_the_narrow_window_in_three_launches(seed: int) -> None:
    best = best_stable(MIXTRAL)
    study, launches = study_with(MIXTRAL, CapacityAwareSampler(seed=seed), 3, seed=seed)
    assert max(x.tokens for x in launches if x.feasible and x.stable) >= 0.99 * best
    assert sum(x.outcome.startswith("startup") for x in launches) <= 1
    for t in study.trials:
        assert "even the lowest" not in str(t.user_attrs.get(DONE_ATTR, ""))


def test_walkdown_never_walks_below_a_pool_that_found_no_room() -> None:
    best = best_stable(MIXTRAL)
    _, launches = study_with(MIXTRAL, WalkDownSampler(seed=0), 6)
    lows = [x for x in launches[1:] if x.outcome.startswith("startup")]
    assert not lows
    assert max(x.tokens for x in launches if x.feasible and x.stable) >= 0.99 * best


def test_no_fraction_in_range_holds_a_pool_says_so() -> None:
    """A range whose top is below the floor: the search closes with the reason, in the
    failures' own direction (never "even the lowest fails")."""
    axes = {**AXES, "mem_fraction_static": (0.85, 0.88, 0.9)}
    pts = [point(MIXTRAL, {**MIXTRAL.search.baseline, "mem_fraction_static": 0.85}, 0)]
    prop = plan(axes, pts, [], Goal())  # the ledger already says 0.9 < 0.916 cannot hold one
    assert prop.done is not None
    assert "holds a KV pool" in prop.done and "even the lowest" not in prop.done
    assert "0.9158" in prop.done
    _, rule, why = walk(axes, pts)
    assert rule == "confirm" and "holds a KV pool" in why


def test_out_of_memory_everywhere_still_says_even_the_lowest() -> None:
    setting = Setting(0.75, 48, None, 0.0)
    led = Ledger(p_gib=47.5, avail_after_weights_gib=4.0)
    obs = Observation(
        setting, led, "startup_oom", reason="startup_oom (torch_oom): CUDA out of memory"
    )
    p = Point(0, {"mem_fraction_static": 0.75, "max_running_requests": 48, "hicache_size": 0}, obs)
    prop = plan(AXES, [p], [], Goal())
    assert prop.done is not None and "even the lowest" in prop.done


# ---- failures that are not about memory -------------------------------------------------------


def _crash(number: int, f: float) -> Point:
    setting = Setting(f, 48, None, 0.0)
    led = Ledger(p_gib=94.0, avail_after_weights_gib=21.7)
    obs = Observation(setting, led, "startup_error", reason="startup_error (error): ValueError: x")
    return Point(
        number, {"mem_fraction_static": f, "max_running_requests": 48, "hicache_size": 0}, obs
    )


def test_a_crash_not_about_memory_is_run_once_more_then_reported() -> None:
    first = plan(AXES, [_crash(0, 0.8)], [], Goal())
    assert first.rule == "retry" and first.params["mem_fraction_static"] == 0.8
    again = plan(AXES, [_crash(0, 0.8), _crash(1, 0.8)], [], Goal())
    assert again.rule != "retry" and again.done is None
    stop = plan(AXES, [_crash(0, 0.8), _crash(1, 0.8), _crash(2, 0.78)], [], Goal())
    assert stop.done is not None and "not a memory setting" in stop.done


def test_walkdown_runs_a_crash_not_about_memory_once_more() -> None:
    params, _, why = walk(AXES, [_crash(0, 0.98)])
    assert params["mem_fraction_static"] == 0.98 and "once more" in why
    params, _, _ = walk(AXES, [_crash(0, 0.98), _crash(1, 0.98)])
    assert params["mem_fraction_static"] == 0.97


def test_the_closing_reason_of_a_study_follows_the_direction() -> None:
    study, _ = study_with(MIXTRAL, CapacityAwareSampler(seed=0), 12)
    done = search_done(study.trials)
    assert done is not None and "smaller than one step" in done
    assert study.trials[1].user_attrs[RULE_ATTR] == "up"
