"""Which throughput launches can change the capacity/throughput front (`search.front`), and the
planner's `explore` and `secure` rules that use it, on launches of the simulator's pure model."""

from __future__ import annotations

import dataclasses

import pytest

from autotune.search.front import (
    FRONT_GAIN,
    dominated,
    fit_throughput,
    gain,
    no_effect,
)
from autotune.search.planner import Goal, plan
from autotune.search.points import FRACTION, REQUESTS, Point
from tests.search.helpers import AXES, KIMI, QWEN, point
from tests.search.test_planner import EDGE_FOUND, kimi

GOAL = Goal(min_headroom_gib=0.5)


def test_the_saturating_law_is_recovered_from_two_request_counts() -> None:
    law = fit_throughput([(32, 32 / (0.02 + 0.001 * 32)), (48, 48 / (0.02 + 0.001 * 48))])
    assert law is not None
    assert law.at(128) == pytest.approx(128 / (0.02 + 0.001 * 128))
    assert law.at(64) < law.at(96) < law.at(128) < 1 / 0.001


def test_no_law_from_one_request_count_or_from_throughput_that_falls() -> None:
    assert fit_throughput([(48, 1000.0), (48, 1010.0)]) is None
    assert fit_throughput([(32, 1200.0), (64, 900.0)]) is None
    assert fit_throughput([]) is None


def test_gain_is_over_the_fastest_launch_of_at_least_that_capacity() -> None:
    held = [(200_000, 1000.0), (150_000, 1500.0)]
    assert gain(190_000, 1100.0, held) == pytest.approx(0.1)
    assert gain(140_000, 1530.0, held) == pytest.approx(0.02)
    assert gain(300_000, 500.0, held) == 1.0  # nothing held that much: all new


def test_more_requests_at_the_same_capacity_dominate() -> None:
    assert dominated(64, 100_000, [(64, 100_000), (128, 99_500)])
    assert not dominated(64, 100_000, [(128, 97_000)])
    assert not dominated(128, 100_000, [(64, 110_000)])


def test_an_axis_without_effect_is_one_probe_within_the_noise_at_no_more_capacity() -> None:
    origin = (100_000, 1000.0)
    assert no_effect(origin, [(100_200, 1000.0 * (1 + FRONT_GAIN / 2))])
    assert not no_effect(origin, [])
    assert not no_effect(origin, [(100_000, 1000.0 * (1 + 2 * FRONT_GAIN))])
    assert not no_effect(origin, [(110_000, 1000.0)])  # more capacity: the axis matters


def _run(done: list[Point], axes: dict[str, tuple[float | int, ...]], n: int) -> list[Point]:
    for i in range(n):
        p = plan(axes, done, [], GOAL)
        if p.done:
            break
        done.append(point(QWEN, p.params, len(done) + i))
    return done


def test_explore_skips_requests_that_more_requests_hold_as_much_capacity_as() -> None:
    """On Qwen3-32B every request count keeps the edge's fraction: once the edge is known the
    first throughput launch is the most requests the model calls safe there, not 64 (which 96
    at the same capacity dominates: more requests serve no slower)."""
    base = dict(QWEN.search.baseline)
    done = [point(QWEN, base, 0)]
    done.append(point(QWEN, plan(AXES, done, [], GOAL).params, 1))
    p = plan(AXES, done, [], GOAL)
    assert p.rule == "explore", p.why
    assert int(p.params[REQUESTS]) >= 96, p.why
    assert p.params[FRACTION] == done[1].params[FRACTION]
    ran = _run([*done, point(QWEN, p.params, 2)], AXES, 6)
    assert 64 not in {q.params[REQUESTS] for q in ran}


def _measured(p: Point, throughput: float) -> Point:
    return dataclasses.replace(p, throughput=throughput)


def test_explore_leaves_more_requests_the_law_puts_within_the_noise_of_what_held() -> None:
    """32 and 48 requests served 1,000 and 1,005 tok/s: the fitted law has saturated, 64 or more
    requests are predicted less than FRONT_GAIN faster than the 48 that held at the edge, so the
    throughput launch goes to the host cache instead."""
    seen = [*EDGE_FOUND, point(KIMI, kimi(0.9, 32), 5)]
    done = [
        _measured(q, 1005.0 if q.params[REQUESTS] == 48 else 1000.0) if q.feasible else q
        for q in seen
    ]
    p = plan(AXES, done, [], GOAL)
    assert p.rule == "explore", p.why
    assert p.params[REQUESTS] == 48 and p.params["hicache_size"] != 48, p.params
    # with the throughput the simulator serves (1,053 at 48, 946 at 32) 64 requests are
    # predicted 6% faster: worth the launch
    p = plan(AXES, seen, [], GOAL)
    assert p.rule == "explore" and int(p.params[REQUESTS]) > 48, p.why
    assert "predicted 1,1" in p.why and "over every launch held" in p.why


def test_one_host_cache_probe_that_moves_nothing_ends_the_axis() -> None:
    """Only the host cache is left to explore (a single request count); the probe farthest from
    the edge's 48 GB served as fast at the same capacity, so the search ends there instead of
    trying every other size."""
    axes = {**AXES, REQUESTS: (48,)}
    done = list(EDGE_FOUND[:4])
    p = plan(axes, done, [], GOAL)
    assert p.rule == "explore" and p.params["hicache_size"] in (0, 96), p.why
    probe = point(KIMI, p.params, 4)
    assert probe.feasible and probe.throughput == pytest.approx(done[2].throughput)
    p = plan(axes, [*done, probe], [], GOAL)
    assert p.rule == "confirm" and p.done is not None, p.why


def test_secure_is_not_needed_where_more_demand_held_at_its_fraction() -> None:
    """0.90 with 32 requests held with a thin margin for 1.1 GiB: `secure` would hold 0.89 with
    32 requests first; where 0.89 with 48 requests (more demand) held and counts as stable, the
    fallback is already in hand."""
    goal = Goal(min_headroom_gib=1.1)
    base = point(KIMI, kimi(0.86, 32), 0)
    best = point(KIMI, kimi(0.9, 32), 1, seed=1)
    assert plan(AXES, [base, best], [], goal).rule == "secure"
    more = point(KIMI, kimi(0.89, 48), 2)
    assert more.feasible
    p = plan(AXES, [base, more, best], [], goal)
    assert p.rule != "secure", p.why
    assert p.params != kimi(0.89, 32)
