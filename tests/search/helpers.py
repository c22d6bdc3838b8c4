"""Launches on the simulator's pure model as planner points, and whole in-memory studies."""

from __future__ import annotations

from collections.abc import Mapping

import optuna

from autotune.config.schema import Scalar
from autotune.logparse.ledger import Ledger
from autotune.memory.model import Observation
from autotune.search.points import Point, setting_of
from autotune.sim.profiles import load_profile
from autotune.testing.oracle import Bench, Launch, bench_for, launch, run_trial

KIMI = bench_for(load_profile("kimi-k2.5-tp8-96g"))
QWEN = bench_for(load_profile("qwen3-32b-h200"))
DEEPSEEK = bench_for(load_profile("deepseek-v3-tp8-h200"))
AXES: dict[str, tuple[Scalar, ...]] = {
    "mem_fraction_static": tuple(round(0.75 + i / 100, 2) for i in range(24)),
    "max_running_requests": (32, 48, 64, 96, 128),
    "hicache_size": (0, 24, 48, 96),
}


def point(bench: Bench, params: Mapping[str, Scalar], number: int, seed: int = 0) -> Point:
    """One launch of `params`, recorded as the planner reads a finished trial."""
    lau, result = launch(bench, params, seed * 1000 + number)
    rec = result.attrs["record"]
    assert isinstance(rec, dict)
    setting = setting_of(params)
    assert setting is not None
    headroom = result.measured.headroom_gib if result.measured else None
    peak = rec.get("stress_peak_gib")
    obs = Observation(
        setting=setting,
        ledger=Ledger.from_dict(rec["ledger"]),
        outcome=result.outcome,
        stress_peak_gib=float(peak) if isinstance(peak, float | int) else None,
        headroom_gib=headroom,
        feasible=lau.feasible,
        reason=result.reason,
    )
    broke = "oom" if lau.crashed else "headroom_gib"
    violated: frozenset[str] = frozenset() if lau.feasible else frozenset({broke})
    tput = result.measured.throughput_tok_s if result.measured else 0.0
    return Point(number, dict(params), obs, tput, violated)


def study_with(
    bench: Bench,
    sampler: optuna.samplers.BaseSampler,
    n: int,
    seed: int = 0,
    storage: str | None = None,
) -> tuple[optuna.Study, list[Launch]]:
    """An in-memory two-objective study that starts from the baseline and runs n launches."""
    study = optuna.create_study(
        directions=["maximize", "maximize"], sampler=sampler, storage=storage
    )
    study.set_user_attr("objectives", ["capacity", "throughput"])
    study.enqueue_trial(dict(bench.search.baseline))
    out = []
    for _ in range(n):
        trial = study.ask()
        out.append(run_trial(study, bench, trial, seed * 1000 + trial.number))
    return study, out
