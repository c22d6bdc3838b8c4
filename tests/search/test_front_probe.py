"""The point of the front with the most capacity at the most requests is measured even where the
launches contradict the model: a world whose peaks widen the model's margins until more
max_running_requests at the best fraction falls under the safe p(stable), though it holds."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import ModuleType

from autotune.config.schema import SamplerConfig
from autotune.search.capacity import WHY_ATTR
from autotune.sim.profiles import load_profile
from autotune.study.samplers import make_sampler
from autotune.testing.night import BENCH_WORKLOAD
from autotune.testing.oracle import MISMATCH, bench_for, covered, front, over
from autotune.testing.worlds import draw_world, world_seed
from tests.search.helpers import study_with

MORE = Path(__file__).resolve().parents[2] / "scripts" / "bench_profiles" / "more"


def test_more_requests_at_the_best_capacity_is_probed_below_the_safe_p(
    load_script: Callable[[str], ModuleType],
) -> None:
    bench_search = load_script("bench_search")
    profile = load_profile("qwen3-32b-h200")
    bench = bench_for(profile, min_headroom_gib=0.5)
    timed = replace(bench.study_config, workload=BENCH_WORKLOAD)
    box = bench_search.Box(profile.name, bench, timed, 30)
    # Student-t peaks (4 degrees of freedom), the allocator growing: the model doubts itself
    world = bench_search.world_for(box, "random", 0, 6)
    assert world.pareto == [(world.best, world.pareto[0][1])]  # one point: the best at 128
    run = bench_search.study_run("capacity", world.bench, world.best, 6, 30, 1, world.pareto)
    assert run.front == 1.0, run
    assert run.final > 0.99 and run.crashes_all == 0
    assert run.used <= 10, run.used  # before, 14 launches that never tried 0.96 at 128


def test_a_front_probe_that_held_thin_is_answered_by_the_step_below_its_demand() -> None:
    """In the world that differs from the model, more requests at the best fraction held once
    with a thin margin; the search then runs the highest fraction below it the model expects
    to hold at that demand, the point of the front that demand really holds (before: the thin
    hold stood for that point, and half the front was never measured)."""
    bench = bench_for(
        load_profile("llama-3.1-70b-tp8-h100"), min_headroom_gib=0.5, mismatch=MISMATCH
    )
    study, launches = study_with(bench, make_sampler(SamplerConfig(name="capacity", seed=7)), 11, 7)
    whys = [str(t.user_attrs.get(WHY_ATTR, "")) for t in study.trials]
    below = [w for w in whys if "held at its demand with a thin margin" in w]
    assert below and all("for that point of the front" in w for w in below), whys
    assert covered(front(bench), launches) == 1.0


def test_a_best_of_more_demand_that_ties_on_capacity_does_not_walk_the_demands_below_it() -> None:
    """Once the step below a thin front probe holds, it ties the best on capacity and, faster,
    becomes the best; less demand at its fraction held already, so the search does not launch
    each request count below it for margin (before: three `margin` launches, 48, 64 and 96
    requests, at a fraction 32 requests had held three times)."""
    profile = load_profile(str(MORE / "gemma-2-27b-tp1-h100.toml"))
    drawn = replace(draw_world(world_seed(0, profile.name, 3)), spike_probability=0.0)
    profile = replace(profile, mismatch=over(profile.mismatch, drawn))
    bench = bench_for(profile, min_headroom_gib=0.5)
    study, _ = study_with(bench, make_sampler(SamplerConfig(name="capacity", seed=3)), 13, 3)
    whys = [str(t.user_attrs.get(WHY_ATTR, "")) for t in study.trials]
    front_at = next(i for i, w in enumerate(whys) if "for that point of the front" in w)
    assert not [w for w in whys[front_at:] if w.startswith("margin to")], whys[front_at:]
