"""How many launches each sampler needs to reach the memory edge, on the simulator's pure model.

Whole studies run in-process (no servers): every shipped simulator profile and every profile
directly in scripts/bench_profiles/ (boxes of the benchmark's own: small cards, weights that
nearly fill the GPU, very large CUDA graphs, noisy peaks, TP 1/2/4/8, with and without a draft)
× seeds × samplers; scripts/bench_profiles/more/ holds boxes outside that set, for `--profiles`.
Each launch is simulated by `autotune.testing.oracle` (startup sizes with the launch's jitter, a
stress phase of full-chunk forwards) and told to an in-memory Optuna study exactly as a real trial
would be. The target is the best stable capacity of the space, found by evaluating every grid
point on the model; a study reaches it at the first launch that is stable (by the model), was
recorded feasible, and holds at least 99% of it.

    .venv/bin/python scripts/bench_search.py                 # all profiles, 10 seeds, 30 launches
    .venv/bin/python scripts/bench_search.py --seeds 3 --samplers capacity,tpe
    .venv/bin/python scripts/bench_search.py --workers 3     # 3 concurrent workers, pending trials

Prints, per sampler: median and worst launches to the target (">N" when a study never got there
within its budget), how many studies got there, median and worst crashes on the way, and the
final capacity relative to the best. Crashes are launches that ended in an OOM or crash (at
startup or under load); "in study" counts them over all the study's launches, and "used" is
how many launches the study took before the sampler said nothing was left worth one (as
`autotune run` stops then) or the budget ran out. "front" is the share of the true
capacity/throughput Pareto front (stable settings no other stable setting beats on both, found
exhaustively) that the study's stable launches reached (99% of the capacity, 98% of the
throughput): throughput is the second objective.

    .venv/bin/python scripts/bench_search.py --mismatch      # a world that differs from the model
    .venv/bin/python scripts/bench_search.py --mismatch peak_tail_dof,spike_probability
    .venv/bin/python scripts/bench_search.py --chunks 2048,4096,8192   # search the prefill chunk
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import deque
from dataclasses import dataclass, fields, replace
from pathlib import Path

import optuna

from autotune.config.space import settings_for
from autotune.config.studyfile import Choices, SamplerConfig
from autotune.errors import UsageError
from autotune.record import internals
from autotune.record.stored import stored
from autotune.record.view import views
from autotune.review.soak import DEFAULT_SOAK_FACTOR
from autotune.review.winner import choose
from autotune.sim.profiles import Mismatch, list_profiles, load_profile
from autotune.study.samplers import SAMPLER_FACTORIES, make_sampler
from autotune.testing.oracle import (
    MISMATCH,
    Bench,
    Launch,
    bench_for,
    best_stable,
    covered,
    front,
    launch,
    run_trial,
)

DEFAULT_SAMPLERS = ("capacity", "tpe", "random", "gp", "walkdown")
BENCH_PROFILES = Path(__file__).resolve().parent / "bench_profiles"
"""Boxes of the benchmark's own besides the shipped simulator profiles (loaded by path)."""


MISMATCH_KEYS = tuple(f.name for f in fields(Mismatch))


def mismatch_of(keys: str) -> Mismatch:
    """The world of `--mismatch KEYS`: every key of `MISMATCH` ("all"), the named ones, or none."""
    if not keys:
        return Mismatch()
    if keys == "all":
        return MISMATCH
    names = [k.strip() for k in keys.split(",") if k.strip()]
    unknown = [k for k in names if k not in MISMATCH_KEYS]
    if unknown:
        raise SystemExit(f"--mismatch: unknown {', '.join(unknown)}; one of {MISMATCH_KEYS}")
    if "spike_probability" in names or "spike_factor" in names:  # one knob, two keys
        names += ["spike_probability", "spike_factor"]
    return replace(Mismatch(), **{k: getattr(MISMATCH, k) for k in names})


def default_profiles() -> list[str]:
    """Every shipped simulator profile, then every profile directly in scripts/bench_profiles/."""
    return list_profiles() + [str(p) for p in sorted(BENCH_PROFILES.glob("*.toml"))]


@dataclass(frozen=True)
class Run:
    sampler: str
    profile: str
    seed: int
    launches: int | None  # to the target; None if never within the budget
    crashes: int  # crashed launches up to the target (or the whole budget)
    crashes_all: int  # crashed launches over the whole study
    used: int  # launches until the sampler said nothing was left worth one (or the budget)
    final: float  # best stable and feasible capacity at the end / the best
    clock: float | None  # trial-durations of wall time to the target (workers mode)
    front: float = 0.0  # share of the true (capacity, throughput) front held by the end
    soak_ok: bool | None = None  # the exported setting passes a confirm soak (None: nothing held)


def study_run(
    name: str,
    bench: Bench,
    best: int,
    seed: int,
    budget: int,
    workers: int,
    pareto: list[tuple[int, float]] | None = None,
) -> Run:
    sampler = make_sampler(SamplerConfig(name=name, seed=seed))
    study = optuna.create_study(directions=["maximize", "maximize"], sampler=sampler)
    study.set_user_attr("objectives", ["capacity", "throughput"])
    study.enqueue_trial(dict(bench.search.baseline))
    launches: list[Launch] = []
    reached: int | None = None
    clock: float | None = None
    running: deque[tuple[optuna.trial.Trial, float]] = deque()
    now = 0.0
    ended = False
    while len(launches) < budget and (running or not ended):
        while not ended and len(running) < workers and len(launches) + len(running) < budget:
            trial = study.ask()
            settings_for(trial, bench.search)  # parameters are chosen when a worker starts
            if stored(internals.fresh(study, trial)).search_done is not None:
                # nothing left worth a launch: the run loop skips the trial and ends the study
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                ended = True
                break
            running.append((trial, now))
        if not running:
            break
        trial, started = running.popleft()
        now = max(now, started + 1.0)
        launch = run_trial(study, bench, trial, seed * 1000 + trial.number)
        launches.append(launch)
        if reached is None and launch.feasible and launch.stable and launch.tokens >= 0.99 * best:
            reached = len(launches)
            clock = now
    upto = launches[:reached] if reached else launches
    held = [x.tokens for x in launches if x.feasible and x.stable]
    return Run(
        sampler=name,
        profile=bench.profile.name,
        seed=seed,
        launches=reached,
        crashes=sum(x.crashed for x in upto),
        crashes_all=sum(x.crashed for x in launches),
        used=len(launches),
        final=max(held, default=0) / best if best else 0.0,
        clock=clock,
        front=covered(pareto, launches) if pareto else 0.0,
        soak_ok=exported_passes_soak(bench, study, seed),
    )


def exported_passes_soak(bench: Bench, study: optuna.Study, seed: int) -> bool | None:
    """Whether the setting `autotune export` would print passes `autotune confirm`'s soak on the
    simulated machine (one soak launch, as `autotune confirm` runs it): `review.winner.choose`
    with its default margin (`review.soak.soak_plan`: backed off for a soak as long as the
    trials' growth asks for, never below a fraction that can start, trading demand where the
    window is too narrow), soaked as long as that margin was sized for, exactly as exported
    (a margin may back the fraction off below the search space's own low end)."""
    seen = views(study.trials)
    w = choose(seen, space=bench.search, min_headroom_gib=bench.constraints.min_headroom_gib)
    if w is None:
        return None
    factor = w.soak.factor if w.soak is not None else DEFAULT_SOAK_FACTOR
    soaked, _ = launch(bench, dict(w.params), seed * 1000 + 999, soak=factor)
    return soaked.feasible


def summarize(runs: list[Run], budget: int, workers: int) -> list[str]:
    lines = []
    head = (
        f"{'sampler':<10} {'studies':>7} {'reached':>7} {'launches med':>12} {'worst':>6} "
        f"{'crashes med':>11} {'worst':>6} {'in study':>8} {'used med':>8} {'final med':>9} "
        f"{'final min':>9} {'front med':>9} {'soak ok':>7}"
    )
    if workers > 1:
        head += f" {'wall med':>8}"
    lines.append(head)
    by: dict[str, list[Run]] = {}
    for r in runs:
        by.setdefault(r.sampler, []).append(r)
    for name, rs in by.items():
        steps = [r.launches if r.launches is not None else budget + 1 for r in rs]
        med = statistics.median(steps)
        worst = max(steps)
        crashes = [r.crashes for r in rs]
        finals = [r.final for r in rs]
        line = (
            f"{name:<10} {len(rs):>7} {sum(r.launches is not None for r in rs):>7} "
            f"{_launches(med, budget):>12} {_launches(worst, budget):>6} "
            f"{statistics.median(crashes):>11g} {max(crashes):>6} "
            f"{statistics.median(r.crashes_all for r in rs):>8g} "
            f"{statistics.median(r.used for r in rs):>8g} "
            f"{statistics.median(finals):>9.1%} {min(finals):>9.1%} "
            f"{statistics.median(r.front for r in rs):>9.0%} "
            f"{_share([r.soak_ok for r in rs]):>7}"
        )
        if workers > 1:
            clocks = [r.clock if r.clock is not None else budget + 1.0 for r in rs]
            line += f" {statistics.median(clocks):>8g}"
        lines.append(line)
    return lines


def _share(flags: list[bool | None]) -> str:
    seen = [f for f in flags if f is not None]
    return f"{sum(seen)}/{len(seen)}" if seen else "-"


def _launches(value: float, budget: int) -> str:
    return f">{budget}" if value > budget else f"{value:g}"


def per_profile(runs: list[Run], budget: int) -> list[str]:
    lines = ["", "median launches to the target per profile (>N: not reached)"]
    profiles = sorted({r.profile for r in runs})
    samplers = list(dict.fromkeys(r.sampler for r in runs))
    width = max([32, *(len(p) for p in profiles)])
    lines.append(f"{'profile':<{width}} " + " ".join(f"{s:>9}" for s in samplers))
    for prof in profiles:
        cells = []
        for s in samplers:
            steps = [
                r.launches if r.launches is not None else budget + 1
                for r in runs
                if r.profile == prof and r.sampler == s
            ]
            cells.append(f"{_launches(statistics.median(steps), budget):>9}")
        lines.append(f"{prof:<{width}} " + " ".join(cells))
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--budget", type=int, default=30, help="launches per study")
    ap.add_argument("--samplers", default=",".join(DEFAULT_SAMPLERS))
    ap.add_argument("--profiles", default="", help="comma-separated (default: every profile)")
    ap.add_argument("--workers", type=int, default=1, help="concurrent workers per study")
    ap.add_argument("--min-headroom", type=float, default=0.5, help="GiB under the stress peak")
    ap.add_argument(
        "--baseline-fraction",
        type=float,
        default=None,
        help="start every study from this mem_fraction_static instead of the profile's baseline",
    )
    ap.add_argument(
        "--mismatch",
        nargs="?",
        const="all",
        default="",
        metavar="KEYS",
        help="run every profile in a world that differs from the model: all of "
        f"{', '.join(MISMATCH_KEYS)} (or the comma-separated ones named), set on top of the "
        "profile's own [mismatch] table (which is always kept)",
    )
    ap.add_argument(
        "--chunks",
        default="",
        metavar="SIZES",
        help="also search chunked_prefill_size over these comma-separated sizes",
    )
    args = ap.parse_args(argv)
    world = mismatch_of(args.mismatch)
    chunks = tuple(int(c) for c in args.chunks.split(",") if c.strip())
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    profiles = [p for p in args.profiles.split(",") if p] or default_profiles()
    samplers = []
    for name in args.samplers.split(","):
        if name not in SAMPLER_FACTORIES:
            print(f"skipping sampler {name}: not registered", file=sys.stderr)
            continue
        try:
            make_sampler(SamplerConfig(name=name))
        except UsageError as exc:
            print(f"skipping sampler {name}: {exc}", file=sys.stderr)
            continue
        samplers.append(name)
    runs: list[Run] = []
    t0 = time.perf_counter()
    for prof_name in profiles:
        profile = load_profile(prof_name)
        prof_name = profile.name
        bench = bench_for(profile, min_headroom_gib=args.min_headroom, mismatch=world)
        if chunks:
            space = (*bench.search.params, Choices("chunked_prefill_size", chunks))
            bench = replace(bench, search=replace(bench.search, params=space))
        if args.baseline_fraction is not None:
            baseline = {**bench.search.baseline, "mem_fraction_static": args.baseline_fraction}
            bench = replace(bench, search=replace(bench.search, baseline=baseline))
        best = best_stable(bench)
        pareto = front(bench)
        print(
            f"{prof_name}: best stable capacity {best:,} tokens; "
            f"{len(pareto)} settings on the capacity/throughput front",
            file=sys.stderr,
        )
        for name in samplers:
            for seed in range(args.seeds):
                runs.append(study_run(name, bench, best, seed, args.budget, args.workers, pareto))
    print(
        f"{len(profiles)} profiles × {args.seeds} seeds, budget {args.budget} launches, "
        f"{args.workers} worker(s), headroom ≥ {args.min_headroom:g} GiB"
        + (f", mismatch: {world}" if world.on else "")
        + "; "
        f"{time.perf_counter() - t0:.0f} s"
    )
    for line in summarize(runs, args.budget, args.workers) + per_profile(runs, args.budget):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
