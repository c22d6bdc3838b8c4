"""The search knows when its model is wrong: launches that contradict the memory model beyond
its own noise are named in the why, widen the margins to a heavy tail, repeat the edge, and
change the closing reason; a box that follows the model never raises the doubt."""

from __future__ import annotations

import dataclasses
import math

import optuna
import pytest

from autotune.search import CapacityAwareSampler
from autotune.search.calibration import calibrate
from autotune.search.capacity import DONE_ATTR, WHY_ATTR
from autotune.search.doubt import DOUBT_Z, REPEATS, Doubt, Evidence, doubt, student_cdf
from autotune.search.planner import Goal, plan
from autotune.search.points import FRACTION, Point
from tests.search.helpers import AXES, DEEPSEEK, KIMI, QWEN, point, study_with

GOAL = Goal(min_headroom_gib=0.5)
HELD_ONLY = Goal(min_headroom_gib=0.5, explore=False)


@pytest.fixture(autouse=True)
def quiet() -> None:
    optuna.logging.set_verbosity(optuna.logging.ERROR)


def kimi(f: float, r: int = 48, h: int = 48) -> dict[str, float | int]:
    return {"mem_fraction_static": f, "max_running_requests": r, "hicache_size": h}


def heavier(p: Point, by_gib: float) -> Point:
    """The same launch with a stress peak `by_gib` higher (and that much less headroom)."""
    o = p.observation
    assert o is not None and o.stress_peak_gib is not None and o.headroom_gib is not None
    obs = dataclasses.replace(
        o, stress_peak_gib=o.stress_peak_gib + by_gib, headroom_gib=o.headroom_gib - by_gib
    )
    return dataclasses.replace(p, observation=obs)


def grown(p: Point, growth_gib: float) -> Point:
    """The same launch with the allocator keeping `growth_gib` after its workload."""
    assert p.observation is not None
    return dataclasses.replace(
        p, observation=dataclasses.replace(p.observation, growth_gib=growth_gib)
    )


CLIMB = [point(KIMI, kimi(f), i) for i, f in enumerate((0.86, 0.87, 0.88, 0.89))]
EDGE_FOUND = [
    point(KIMI, kimi(f, r), i)
    for i, (f, r) in enumerate([(0.88, 48), (0.89, 48), (0.90, 48), (0.91, 48), (0.91, 32)])
]


def test_the_student_tail_is_heavier_than_the_normal() -> None:
    assert student_cdf(0.0) == pytest.approx(0.5)
    assert student_cdf(3.182) == pytest.approx(0.975, abs=1e-3)  # t(3) tables
    assert student_cdf(2.0) < 0.5 * (1 + math.erf(2.0 / math.sqrt(2.0)))
    normal = Doubt()
    assert not normal.wrong and normal.p_above(0.4, 0.2) == pytest.approx(0.977, abs=1e-3)
    heavy = Doubt((Evidence(1, "peak", 4.0, "trial 1's stress peak"),))
    assert heavy.tails and heavy.p_above(0.4, 0.2) == pytest.approx(student_cdf(2.0))
    assert heavy.p_above(0.4, 0.2) < 0.95  # two sd of margin no longer make a setting safe
    leak = Doubt((Evidence(1, "growth", 9.0, "trial 1's allocator kept"),))
    assert leak.wrong and not leak.tails and leak.p_above(0.4, 0.2) == normal.p_above(0.4, 0.2)


def test_launches_of_a_box_that_follows_the_model_raise_no_doubt() -> None:
    for pts in (CLIMB, EDGE_FOUND):
        d = doubt(pts, calibrate(pts))
        assert not d.wrong and d.describe() == ""
    p = plan(AXES, EDGE_FOUND, [], HELD_ONLY)
    assert p.done is not None and p.done.startswith("what is left to learn is smaller")


def test_a_peak_beyond_the_models_noise_is_named_and_widens_the_margin() -> None:
    """0.86 to 0.89 held; one of them peaked 0.9 GiB above what the others say its demand takes
    (the model's spread there is about 0.15 GiB): the why names that launch and its distance in
    the model's own sd, and the next step up is no longer safe under the heavier tail."""
    plain = plan(AXES, CLIMB, [], GOAL)
    assert plain.rule == "step" and "contradict" not in plain.why
    bad = [CLIMB[0], heavier(CLIMB[1], 0.9), CLIMB[2], CLIMB[3]]
    d = doubt(bad, calibrate(bad))
    assert d.wrong and d.tails
    peak = next(e for e in d.evidence if e.kind == "peak")
    assert peak.number == 1 and peak.z >= DOUBT_Z
    p = plan(AXES, bad, [], GOAL)
    assert "contradict the memory model beyond its noise" in p.why
    assert "trial 1's stress peak 3.73 GiB" in p.why and "Student-t" in p.why
    assert p.rule != "step"
    assert "p(stable) 0.98" in plain.why and "p(stable) 0.98" not in p.why


def test_doubt_repeats_the_edge_before_the_search_ends() -> None:
    """The edge known to one step (0.90 held, 0.91 failed): on a model the launches follow, the
    search ends; where every launch's allocator kept 0.3 GiB (the model takes free memory as
    static), it runs 0.90 again first, and its closing reason names the evidence instead of
    "what is left to learn is smaller than one step"."""
    plain = plan(AXES, EDGE_FOUND, [], HELD_ONLY)
    assert plain.rule == "confirm"
    leaky = [grown(p, 0.3) for p in EDGE_FOUND]
    d = doubt(leaky, calibrate(leaky))
    assert d.wrong and not d.tails and {e.kind for e in d.evidence} == {"growth"}
    again = plan(AXES, leaky, [], HELD_ONLY)
    assert again.rule == "recheck" and again.params == kimi(0.9), again.why
    assert "allocator kept 0.30 GiB" in again.why
    repeated = [*leaky, grown(point(KIMI, kimi(0.9), 5), 0.3)]
    end = plan(AXES, repeated, [], HELD_ONLY)
    assert end.rule == "confirm" and end.done is not None
    assert end.params == kimi(0.9)
    assert "smaller than one step" not in end.done
    assert end.done.startswith(f"the best setting held {REPEATS} times")
    assert "contradict the memory model" in end.done


def test_an_optimistic_miss_beyond_noise_is_evidence_and_never_becomes_the_best() -> None:
    """0.90 ran out of memory under load where the launches before it predicted a healthy
    headroom: a miss of many sd. The search says so, keeps 0.89 (stable) as the best and never
    proposes a setting at or above the failure's demand."""
    done = [point(KIMI, kimi(0.88), 0), point(KIMI, kimi(0.89), 1)]
    crash = point(KIMI, kimi(0.93), 2)
    assert crash.observation is not None and crash.observation.outcome == "runtime_oom"
    o = crash.observation
    crashed = dataclasses.replace(
        crash,
        params=kimi(0.9),
        observation=dataclasses.replace(
            o, setting=dataclasses.replace(o.setting, mem_fraction=0.9)
        ),
    )
    pts = [*done, crashed]
    d = doubt(pts, calibrate(pts))
    assert any(e.kind == "headroom" and e.number == 2 for e in d.evidence), d
    p = plan(AXES, pts, [], GOAL)
    assert "contradict" in p.why
    assert float(p.params[FRACTION]) < 0.9 or p.params["max_running_requests"] < 48
    assert "best stable so far" in p.why and "(trial 1)" in p.why


@pytest.mark.parametrize("bench", [KIMI, QWEN, DEEPSEEK], ids=["kimi", "qwen", "deepseek"])
def test_a_whole_study_on_a_box_that_follows_the_model_never_doubts(bench: object) -> None:
    study, _ = study_with(bench, CapacityAwareSampler(), 10)  # type: ignore[arg-type]
    for t in study.trials:
        assert "contradict" not in str(t.user_attrs.get(WHY_ATTR, ""))
        assert "contradict" not in str(t.user_attrs.get(DONE_ATTR, ""))


def thin(p: Point, headroom_gib: float) -> Point:
    """The same launch, held with only `headroom_gib` under its stress peak."""
    o = p.observation
    assert o is not None and o.headroom_gib is not None and o.stress_peak_gib is not None
    rise = o.headroom_gib - headroom_gib
    obs = dataclasses.replace(
        o, headroom_gib=headroom_gib, stress_peak_gib=o.stress_peak_gib + rise
    )
    return dataclasses.replace(p, observation=obs)


def test_a_study_never_ends_with_nothing_kept_while_a_setting_held() -> None:
    """One setting in the space, held with 0.52 GiB for 0.5 required: the model does not call
    it stable (p 0.54) and nothing else is left, so it runs again rather than ending with
    nothing kept; once it held twice it is the best, and the search keeps it."""
    one = {"mem_fraction_static": (0.9,), "max_running_requests": (48,), "hicache_size": (48,)}
    first = thin(point(KIMI, kimi(0.9), 0), 0.52)
    p = plan(one, [first], [], HELD_ONLY)
    assert p.rule == "recheck" and p.done is None and p.params == kimi(0.9), p.why
    assert "so that the study keeps a setting" in p.why
    second = thin(point(KIMI, kimi(0.9), 1), 0.53)
    p = plan(one, [first, second], [], HELD_ONLY)
    assert "best stable so far 188," in p.why, p.why
    third = thin(point(KIMI, kimi(0.9), 2), 0.55)
    end = plan(one, [first, second, third], [], HELD_ONLY)
    assert end.done is not None and "holds 188," in end.done, end


def test_where_the_launches_contradict_the_model_the_step_below_the_best_holds_first() -> None:
    """0.88 and 0.90 held, 0.91 failed (with 48 and with 32 requests), and every allocator kept
    0.3 GiB: a few holds near the edge cannot tell a setting that passes 99% of stress phases
    from one that passes 92%, so the step below the best (0.89, no more demand) holds before the
    search repeats the best or ends; once it held, the search goes on as before. On a model the
    launches follow it ends."""
    seen = [EDGE_FOUND[0], *EDGE_FOUND[2:]]
    assert plan(AXES, seen, [], HELD_ONLY).rule == "confirm"
    leaky = [grown(p, 0.3) for p in seen]
    p = plan(AXES, leaky, [], HELD_ONLY)
    assert p.rule == "secure", p.why
    assert p.params[FRACTION] == 0.89 and int(p.params["max_running_requests"]) <= 48
    assert "the step below trial 2" in p.why and "contradict the memory model" in p.why
    held = [*leaky, grown(point(KIMI, p.params, 5), 0.3)]
    assert held[-1].feasible
    nxt = plan(AXES, held, [], HELD_ONLY)
    assert nxt.params[FRACTION] != 0.89, nxt.why
