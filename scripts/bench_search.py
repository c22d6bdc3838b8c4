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
throughput): throughput is the second objective. "export" is what the exported setting kept of
the capacity its confirm soak allows (`export_share`: over the most any fraction holds through a
soak as long at the export's other parameters), median and 10th percentile over the studies
whose export passed its soak: a margin wider than the soak needs shows there. "final min" is the
least any study held in a launch that is stable in its world; "kept" what the exported setting
keeps of the best stable capacity where that setting is stable, 0 where it is not (`kept`, median
and least): the held launches count only settings a launch ran, the export is what the operator
takes away, backed off by the margin a confirm soak needs (longer than a trial: the growth and
the worst peak of several workloads).

    .venv/bin/python scripts/bench_search.py --mismatch      # a world that differs from the model
    .venv/bin/python scripts/bench_search.py --mismatch peak_tail_dof,spike_probability
    .venv/bin/python scripts/bench_search.py --chunks 2048,4096,8192   # search the prefill chunk
    .venv/bin/python scripts/bench_search.py --mismatch random --more --study kimi

`--mismatch random` runs every study in a world drawn at random (`autotune.testing.worlds`:
the ranges, the seed from `--world-seed`, the box and the study's seed, the departure score and
its buckets), prints each study's world on a line of its own, and the figures by bucket. `--more`
adds scripts/bench_profiles/more/; `--study NAME` adds a study file on its simulator profile.
Every run ends with the night in hours (`autotune.testing.night`): each study's simulated wall
time from its first launch to the end of its export's confirm soak, median and worst per box
(`--per-study`: every study's).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections import deque
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import optuna

from autotune.config.schema import CHUNK, FRACTION, Choices, SamplerConfig, Scalar, StudyConfig
from autotune.config.space import fraction_step, grid, settings_for, snap
from autotune.config.studyfile import read_study
from autotune.config.workload import EarlyEnd
from autotune.errors import UsageError
from autotune.record import internals
from autotune.record.stored import stored
from autotune.review.confirm import record_verdict
from autotune.review.soak import DEFAULT_SOAK_FACTOR
from autotune.review.source import build_review
from autotune.review.verdict import Verdict
from autotune.sim.profiles import Mismatch, ProfileError, list_profiles, load_profile
from autotune.study.objectives import broken_constraints
from autotune.study.samplers import SAMPLER_KINDS, make_sampler
from autotune.testing.night import BENCH_WORKLOAD, Hours, launch_hours, soak_hours
from autotune.testing.oracle import (
    MISMATCH,
    STABLE_P,
    Bench,
    Launch,
    bench_for,
    best_stable,
    covered,
    front,
    launch,
    over,
    p_stable,
    plan_for,
    run_trial,
)
from autotune.testing.worlds import BUCKETS, bucket, departure, describe, draw_world, world_seed
from autotune.trial.record import Result

DEFAULT_SAMPLERS = ("capacity", "tpe", "random", "gp", "walkdown")
BENCH_PROFILES = Path(__file__).resolve().parent / "bench_profiles"
"""Boxes of the benchmark's own besides the shipped simulator profiles (loaded by path)."""
MORE_PROFILES = BENCH_PROFILES / "more"
"""Boxes outside the default set (`--more` adds them)."""
STUDIES = Path(__file__).resolve().parent.parent / "autotune" / "studies"
"""The shipped study files `--study NAME` finds."""
RANDOM = "random"
"""`--mismatch random`: every study in a world of its own (`autotune.testing.worlds`)."""


MISMATCH_KEYS = tuple(f.name for f in fields(Mismatch))


def mismatch_of(keys: str) -> Mismatch:
    """The world of `--mismatch KEYS`: every key of `MISMATCH` ("all"), the named ones, or none
    (and none for "random", whose worlds are drawn per study)."""
    if not keys or keys == RANDOM:
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


def default_profiles(more: bool = False) -> list[str]:
    """Every shipped simulator profile, then every profile directly in scripts/bench_profiles/
    (and, with `more`, every one in scripts/bench_profiles/more/)."""
    extra = sorted(MORE_PROFILES.glob("*.toml")) if more else []
    return list_profiles() + [str(p) for p in [*sorted(BENCH_PROFILES.glob("*.toml")), *extra]]


def study_file(name: str) -> StudyConfig:
    """A study file by path or by the name of a shipped one (`autotune/studies/NAME.toml`)."""
    path = Path(name)
    if not path.is_file():
        path = STUDIES / f"{name}.toml"
    if not path.is_file():
        raise SystemExit(f"--study: no study file {name}; a path or one of {_shipped()}")
    return read_study(path.read_text(encoding="utf-8"), name=path.stem, path=path)


def _shipped() -> str:
    return ", ".join(p.stem for p in sorted(STUDIES.glob("*.toml")))


@dataclass(frozen=True)
class Box:
    """One study's box: its label, profile, the study's search (a study file's or the
    benchmark's), the study file it times its night by, and its launch budget."""

    label: str
    bench: Bench
    cfg: StudyConfig
    budget: int


@dataclass(frozen=True)
class World:
    """The world one study runs in: the bench (its profile's `[mismatch]` with the world's
    keys on top), the best stable capacity and the true front there, and how it was drawn."""

    bench: Bench
    best: int
    pareto: list[tuple[int, float]]
    seed: int | None = None  # the world's seed (`--mismatch random`), None otherwise
    departure: float = 0.0  # `autotune.testing.worlds.departure`, GiB


def world_for(box: Box, mismatch: str, base: int, seed: int) -> World:
    """The study's world: the box's own with `--mismatch`'s keys on top, or, for
    `--mismatch random`, one drawn from the box's name, the study seed and `base`."""
    bench = box.bench
    drawn: int | None = None
    if mismatch == RANDOM:
        drawn = world_seed(base, box.label, seed)
        bench = replace(
            bench,
            profile=replace(
                bench.profile, mismatch=over(bench.profile.mismatch, draw_world(drawn))
            ),
        )
    return World(bench, best_stable(bench), front(bench), drawn, departure(bench).total)


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
    soaks: int = 0  # the confirm soaks run (a failed one backs the export off; `MAX_SOAKS`)
    world: str = ""  # the world the study ran in (`describe`)
    world_seed: int | None = None  # its seed under `--mismatch random`
    departure: float = 0.0  # its departure score, GiB
    # the simulated night, first launch to the confirm soak's end
    night: Hours = field(default_factory=Hours)
    to_target: Hours | None = None  # the same had the study stopped at the target's launch
    night_off: Hours = field(default_factory=Hours)  # the night with no phase ending early
    to_target_off: Hours | None = None
    best: int = 0  # the best stable capacity of the study's world (0: nothing in it is stable)
    soak_factor: float | None = None  # the confirm soak's length in trials (None: no export)
    # the exported capacity over the most a setting of its demand holds through that soak
    export_share: float | None = None
    # the exported capacity over the best stable one where the export is stable, else 0
    kept: float = 0.0
    # where the export failed its soak: the most any setting of the space holds through a soak
    # as long (`soak_best`); None where the soak passed or nothing was exported
    soak_best: int | None = None


def study_run(
    name: str,
    bench: Bench,
    best: int,
    seed: int,
    budget: int,
    workers: int,
    pareto: list[tuple[int, float]] | None = None,
    cfg: StudyConfig | None = None,
) -> Run:
    """One study of sampler `name` on the bench, seeded by `seed`, up to `budget` launches; its
    night timed by the study file `cfg` (the benchmark's workload when None)."""
    timed = cfg if cfg is not None else replace(bench.study_config, workload=BENCH_WORKLOAD)
    # the same launches timed with every phase run to its end (`[workload] end_early = false`)
    off = replace(timed, workload=replace(timed.workload, end_early=EarlyEnd(enabled=False)))
    night = night_off = Hours()
    at_target: Hours | None = None
    at_target_off: Hours | None = None
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
        plan = plan_for(bench, launch.params, seed * 1000 + trial.number)
        repeats = launch.stress_repeats
        night += launch_hours(bench.profile, plan, timed, launch.outcome, repeats)
        night_off += launch_hours(bench.profile, plan, off, launch.outcome, repeats)
        held_best = launch.truth_tokens >= 0.99 * best
        if reached is None and launch.feasible and launch.stable and held_best:
            reached = len(launches)
            clock = now
            at_target, at_target_off = night, night_off
    upto = launches[:reached] if reached else launches
    held = [x.truth_tokens for x in launches if x.feasible and x.stable]
    soaked = exported_soak(bench, study, seed)
    for k, (factor, params) in enumerate(soaked.soaks if soaked is not None else ()):
        plan = plan_for(bench, params, seed * 1000 + 999 - k)
        soak_h = soak_hours(bench.profile, plan, timed, factor)
        night += soak_h
        night_off += soak_h  # the soak never ends early
        at_target = at_target + soak_h if at_target is not None else None
        at_target_off = at_target_off + soak_h if at_target_off is not None else None
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
        soak_ok=soaked.passed if soaked is not None else None,
        soaks=len(soaked.soaks) if soaked is not None else 0,
        world=describe(bench.mismatch),
        night=night,
        to_target=at_target,
        night_off=night_off,
        to_target_off=at_target_off,
        best=best,
        soak_factor=soaked.factor if soaked is not None else None,
        export_share=export_share(bench, soaked.params, soaked.factor)
        if soaked is not None
        else None,
        kept=kept(bench, soaked.params, best) if soaked is not None else 0.0,
        soak_best=soak_best(bench, soaked.params, soaked.factor)
        if soaked is not None and not soaked.passed
        else None,
    )


def kept(bench: Bench, params: dict[str, Scalar], best: int) -> float:
    """What the study ends with: the exported setting's capacity over the best stable
    capacity of the world where the export is itself stable (`p_stable` ≥ `STABLE_P`), 0 where
    it is not; the held launches (`Run.final`) count only settings a launch ran, the export is
    what the operator takes away. Where the export traded the prefill chunk for its margin, the
    best counts the space's settings at that chunk too (a chunk the space does not search can
    hold more than its best)."""
    p, tokens = p_stable(bench, params)
    if CHUNK in params:
        best = max(best, soak_best(bench, params, 1.0))
    return tokens / best if best and p >= STABLE_P else 0.0


def soak_best(bench: Bench, params: dict[str, Scalar], factor: float) -> int:
    """The most capacity any setting of the space holds through a soak `factor` trials long
    (`p_stable` ≥ `STABLE_P`), each also at the prefill chunk the export traded to where it did;
    0 where none does: a world where no export can pass its soak."""
    traded = {CHUNK: params[CHUNK]} if CHUNK in params else None
    best = 0
    for pt in grid(bench.search) or []:
        for q in (pt, {**pt, **traded}) if traded else (pt,):
            p, tokens = p_stable(bench, q, soak=factor)
            if p >= STABLE_P:
                best = max(best, tokens)
    return best


def export_share(bench: Bench, params: dict[str, Scalar], factor: float) -> float | None:
    """How much of the capacity a soak `factor` trials long allows the export kept: its
    capacity over the most any fraction of the space, or between the export's and the space's
    low end, holds through that soak at the export's other parameters (exhaustive, `p_stable`
    ≥ `STABLE_P`); None where no fraction does. A margin wider than the soak needs shows here,
    one too narrow in the soak's verdict."""
    own = float(params[FRACTION])
    values = {float(pt[FRACTION]) for pt in grid(bench.search) or [] if FRACTION in pt}
    # a margin may back the export off below the space's low end: every step between counts
    step = fraction_step(bench.search)
    low, f = min(values, default=own), own
    while f < low - 1e-9:
        values.add(snap(f, step))
        f += step
    best = exported = 0
    for f in values | {own}:
        p, tokens = p_stable(bench, {**params, FRACTION: f}, soak=factor)
        if f == own:
            exported = tokens
        if p >= STABLE_P:
            best = max(best, tokens)
    return exported / best if best else None


MAX_SOAKS = 3
"""The confirm soaks a night runs at most: where one fails, the export backs off beyond the point
it refuted (`review.source.confirmed_choice`) and its note tells the operator to confirm again."""


@dataclass(frozen=True)
class Soaked:
    """The night's confirm soaks of what `autotune export` printed, the last one's verdict."""

    passed: bool
    soaks: tuple[tuple[float, dict[str, Scalar]], ...]
    """Each soak run, in order: its length in trials and the parameters soaked."""

    @property
    def factor(self) -> float:
        """The last soak's length in trials."""
        return self.soaks[-1][0]

    @property
    def params(self) -> dict[str, Scalar]:
        """The last soaked (exported) parameters."""
        return self.soaks[-1][1]


def exported_soak(bench: Bench, study: optuna.Study, seed: int) -> Soaked | None:
    """The confirm soaks of the setting `autotune export` would print, on the simulated machine
    (None: the study held nothing to export). Each is one soak launch, as `autotune confirm` runs
    it: the export's default margin (`review.soak.soak_plan`: backed off for a soak as long as the
    trials' growth asks for, never below a fraction that can start, trading demand where the
    window is too narrow), soaked as long as that margin was sized for, exactly as exported (a
    margin may back the fraction off below the search space's own low end). A soak that fails
    is stored on the study as `autotune confirm` stores it, and the export read again, up to
    `MAX_SOAKS`."""
    runs: list[tuple[float, dict[str, Scalar]]] = []
    for k in range(MAX_SOAKS):
        review = build_review(
            "bench", "", study.trials, cfg=bench.study_config, study_attrs=study.user_attrs
        )
        w = review.winner
        if w is None:
            return None
        factor = w.soak.factor if w.soak is not None else DEFAULT_SOAK_FACTOR
        params = dict(w.params)
        if runs and runs[-1] == (factor, params):
            # the margin could not move past the point its soak refuted: the export says so,
            # and the operator would not soak the same setting again
            return Soaked(False, tuple(runs))
        soaked, result = launch(bench, params, seed * 1000 + 999 - k, soak=factor)
        runs.append((factor, params))
        if soaked.feasible or k == MAX_SOAKS - 1:
            return Soaked(soaked.feasible, tuple(runs))
        record_verdict(study, soak_verdict(bench, params, factor, result))
    raise AssertionError("unreachable: the last soak returns")


def soak_verdict(bench: Bench, params: dict[str, Scalar], factor: float, result: Result) -> Verdict:
    """The verdict `autotune confirm` stores for a soak launch that failed (no worst cases: the
    soak's own failure is what backs the export off)."""
    m = result.measured
    assert m is not None  # a simulated launch measures what it got to
    broken = broken_constraints(m, bench.constraints)
    return Verdict(
        params=params,
        passed=False,
        outcome=result.outcome,
        reason=result.reason or f"broke {', '.join(broken)}",
        violated=tuple(broken),
        capacity_tokens=m.capacity_tokens,
        headroom_gib=m.headroom_gib,
        soak_factor=factor,
    )


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


def _steps(r: Run, budget: int) -> int:
    return r.launches if r.launches is not None else budget + 1


def _pct(part: int, whole: int) -> str:
    return f"{part / whole:.0%}" if whole else "-"


def outcomes(runs: list[Run], budget: int) -> list[str]:
    """Per sampler: the share of studies whose export passes its soak and the share that held
    99% of the best stable capacity, the lowest share of the best any study held in a launch and
    the median and lowest its export keeps (0 where the export is not stable, `kept`), median
    and worst launches to the target, median crashes on the way, TPE's median launches over
    this sampler's (on the same studies), the share of the front held at the median."""
    by: dict[str, list[Run]] = {}
    for r in runs:
        if r.best > 0:
            by.setdefault(r.sampler, []).append(r)
    head = (
        f"{'sampler':<10} {'studies':>7} {'soak ok':>7} {'reached':>7} {'final min':>9} "
        f"{'kept med/min':>12} {'launches med':>12} {'worst':>6} {'crashes med':>11} {'vs tpe':>7} "
        f"{'front med':>9} {'export med':>10} {'p10':>5}"
    )
    lines = [head]
    tpe = by.get("tpe")
    tpe_med = statistics.median(_steps(r, budget) for r in tpe) if tpe else None
    for name, rs in by.items():
        steps = [_steps(r, budget) for r in rs]
        med = statistics.median(steps)
        ratio = "-"
        if tpe_med is not None:
            ratio = f"{'>=' if tpe_med > budget else ''}{tpe_med / med:.1f}x"
        soaked = sum(r.soak_ok is True for r in rs)
        lines.append(
            f"{name:<10} {len(rs):>7} {_pct(soaked, len(rs)):>7} "
            f"{_pct(sum(r.launches is not None for r in rs), len(rs)):>7} "
            f"{min(r.final for r in rs):>9.1%} {_kept(rs):>12} "
            f"{_launches(med, budget):>12} "
            f"{_launches(max(steps), budget):>6} "
            f"{statistics.median(r.crashes for r in rs):>11g} {ratio:>7} "
            f"{statistics.median(r.front for r in rs):>9.0%} {_export(rs)}"
        )
    for name, rs in by.items():
        failed = [r for r in rs if r.soak_ok is False]
        if not failed:
            continue
        closed = [r for r in failed if not r.soak_best]
        slim = [r for r in failed if r.soak_best and r.soak_best < 0.5 * r.best]
        lines.append(
            f"({name}: {len(failed)} exports failed their soak; in {len(closed)} of those worlds "
            "no setting of the space passes a soak that long"
            + (f" ({', '.join(f'{r.profile} seed {r.seed}' for r in closed)})" if closed else "")
            + (
                f", in {len(slim)} one does with less than half the best stable capacity "
                f"({', '.join(f'{r.profile} seed {r.seed}: {r.soak_best:,} tokens' for r in slim)})"
                if slim
                else ""
            )
            + ")"
        )
    none = [r for r in runs if r.best == 0]
    if none:
        studies = sorted({(r.profile, r.seed) for r in none})
        exported = sum(r.soak_ok is not None for r in none)
        lines.append(
            f"({len(studies)} studies left out: no setting of the space is stable in their world "
            f"({', '.join(f'{p} seed {s}' for p, s in studies)}); "
            f"{exported} of their {len(none)} runs exported a setting, "
            f"{sum(r.soak_ok is True for r in none)} passed its soak)"
        )
    return lines


def _kept(rs: list[Run]) -> str:
    """`kept` over the studies, median/least."""
    values = [r.kept for r in rs]
    return f"{statistics.median(values):.0%}/{min(values):.0%}"


def _export(rs: list[Run]) -> str:
    """The export's share of what its soak allows (`export_share`), median and 10th
    percentile over the studies whose export passed its soak."""
    shares = sorted(r.export_share for r in rs if r.soak_ok and r.export_share is not None)
    if not shares:
        return f"{'-':>10} {'-':>5}"
    return f"{statistics.median(shares):>10.0%} {shares[len(shares) // 10]:>5.0%}"


def worst_studies(runs: list[Run], budget: int) -> list[str]:
    """Per sampler, the study that ended with the least of the best stable capacity (ties: the
    most launches to the target), with its seed and world."""
    lines = []
    for name in dict.fromkeys(r.sampler for r in runs):
        rs = [r for r in runs if r.sampler == name and r.best > 0]
        if not rs:
            continue
        w = min(rs, key=lambda r: (r.final, -_steps(r, budget), r.soak_ok is True))
        seed = f", world seed {w.world_seed}" if w.world_seed is not None else ""
        world = f", departure {w.departure:.2f} GiB: {w.world}" if w.departure else ""
        lines.append(
            f"worst {name}: {w.final:.1%} of the best, {_launches(_steps(w, budget), budget)} "
            f"launches, soak {'ok' if w.soak_ok else 'FAILED' if w.soak_ok is False else '-'}; "
            f"{w.profile} seed {w.seed}{seed}{world}"
        )
    return lines


def by_departure(runs: list[Run], budget: int) -> list[str]:
    """The outcome figures per departure bucket (`autotune.testing.worlds.BUCKETS`)."""
    lines = []
    low = 0.0
    for name, upper in BUCKETS:
        rs = [r for r in runs if bucket(r.departure) == name]
        span = f"{low:g}-{upper:g} GiB" if math.isfinite(upper) else f">= {low:g} GiB"
        low = upper
        studies = len({(r.profile, r.seed) for r in rs})
        lines += ["", f"departure {name} ({span}): {studies} studies"]
        if rs:
            lines += outcomes(rs, budget)
    return lines


def _hours(values: list[float]) -> str:
    return f"{statistics.median(values):.1f}/{max(values):.1f}" if values else "-"


def night_table(runs: list[Run]) -> list[str]:
    """The night in hours (first launch to the confirm soak's end), median/worst per profile and
    sampler, and where the hours went."""
    samplers = list(dict.fromkeys(r.sampler for r in runs))
    profiles = list(dict.fromkeys(r.profile for r in runs))
    width = max([32, *(len(p) for p in profiles)])
    lines = [
        "",
        "night in hours, first launch to the confirm soak's end (median/worst)",
        f"{'profile':<{width}} " + " ".join(f"{s:>11}" for s in samplers),
    ]
    for prof in [*profiles, "all"]:
        cells = [
            _hours([r.night.total_h for r in runs if r.sampler == s and prof in ("all", r.profile)])
            for s in samplers
        ]
        lines.append(f"{prof:<{width}} " + " ".join(f"{c:>11}" for c in cells))
    lines += [
        "",
        "hours if the study stopped at the launch that reached the target, then soaked "
        "(median/worst; - : never reached)",
        f"{'profile':<{width}} " + " ".join(f"{s:>11}" for s in samplers),
    ]
    for prof in [*profiles, "all"]:
        cells = []
        for s in samplers:
            rs = [r for r in runs if r.sampler == s and prof in ("all", r.profile)]
            hit = [r.to_target.total_h for r in rs if r.to_target is not None]
            cells.append(_hours(hit) if len(hit) == len(rs) else f"{_hours(hit)}*")
        lines.append(f"{prof:<{width}} " + " ".join(f"{c:>11}" for c in cells))
    lines.append("(*: some studies never reached it; the figures are over those that did)")
    lines += early_end_table(runs, samplers, profiles, width)
    lines.append("")
    for s in samplers:
        rs = [r for r in runs if r.sampler == s]
        total = sum((r.night for r in rs), Hours())
        secs = total.total_h * 3600 or 1.0
        unconfirmed = sum(r.soak_ok is not True for r in rs)
        factors = [r.soak_factor for r in rs if r.soak_factor is not None]
        soaks = f"{statistics.median(factors):g}x/{max(factors):g}x" if factors else "-"
        lines.append(
            f"{s}: startup {total.startup_s / secs:.0%}, workload {total.workload_s / secs:.0%}, "
            f"teardown {total.teardown_s / secs:.0%}, confirm soak {total.soak_s / secs:.0%} "
            f"of the hours; {statistics.median(r.used for r in rs):g} launches at the median; "
            f"soak factor median/max {soaks}; "
            f"{unconfirmed} of {len(rs)} without a confirmed export"
        )
    for s in samplers:
        long = max((r for r in runs if r.sampler == s), key=lambda r: r.night.total_h)
        lines.append(f"longest night {s}: {study_line(long)}")
    return lines


def early_end_table(
    runs: list[Run], samplers: list[str], profiles: list[str], width: int
) -> list[str]:
    """The night with every phase run to its end beside the night with the early end
    (`[workload] end_early`), median/worst per profile and sampler; then the same had the study
    stopped at the launch that reached the target."""

    def whole(r: Run) -> tuple[Hours | None, Hours | None]:
        return r.night_off, r.night

    def stopped(r: Run) -> tuple[Hours | None, Hours | None]:
        return r.to_target_off, r.to_target

    lines = []
    for title, of in (("night", whole), ("stopped at the target", stopped)):
        lines += [
            "",
            f"{title}, hours without the early end -> with it (median/worst)",
            f"{'profile':<{width}} " + " ".join(f"{s:>21}" for s in samplers),
        ]
        for prof in [*profiles, "all"]:
            cells = []
            for s in samplers:
                pairs = [of(r) for r in runs if r.sampler == s and prof in ("all", r.profile)]
                kept = [(a, b) for a, b in pairs if a is not None and b is not None]
                before = _hours([a.total_h for a, _ in kept])
                cells.append(f"{before} -> {_hours([b.total_h for _, b in kept])}")
            lines.append(f"{prof:<{width}} " + " ".join(f"{c:>21}" for c in cells))
    return lines


def study_line(r: Run) -> str:
    """One study's night: its box, seed and world, the hours by part, the soak's factor; and
    what it ended with (the most stable capacity a launch held, the export's share)."""
    n = r.night
    soak = f"{r.soak_factor:g}x soak {n.soak_s / 3600:.1f} h" if r.soak_factor else "no export"
    if r.soaks > 1:
        soak += f" ({r.soaks} soaks: the export backed off after each that failed)"
    world = f", world seed {r.world_seed}" if r.world_seed is not None else ""
    return (
        f"{n.total_h:.1f} h, {r.profile} seed {r.seed}{world}: {n.launches} launches (startup "
        f"{n.startup_s / 3600:.1f} h, workload {n.workload_s / 3600:.1f} h, teardown "
        f"{n.teardown_s / 3600:.1f} h), {soak}"
        + (
            f", to the target {r.to_target.total_h:.1f} h (launch {r.launches})"
            if r.to_target is not None
            else ""
        )
        + f"; held {r.final:.0%} of the best stable, export keeps {r.kept:.0%}"
        + ("" if r.soak_ok is not False else "; its soak fails")
    )


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
        "profile's own [mismatch] table (which is always kept); 'random': every study in a "
        "world drawn from the ranges of autotune/testing/worlds.py (--world-seed)",
    )
    ap.add_argument(
        "--chunks",
        default="",
        metavar="SIZES",
        help="also search chunked_prefill_size over these comma-separated sizes",
    )
    ap.add_argument(
        "--world-seed",
        type=int,
        default=0,
        help="with --mismatch random: the seed every study's world is drawn from (with the "
        "profile's name and the study's seed)",
    )
    ap.add_argument(
        "--more", action="store_true", help="also run every profile in scripts/bench_profiles/more/"
    )
    ap.add_argument(
        "--study",
        action="append",
        default=[],
        metavar="NAME",
        help="also run this study file (a path or a shipped study's name, e.g. kimi) on its "
        "simulator profile: its search, constraints, n_trials and workload",
    )
    ap.add_argument(
        "--per-study", action="store_true", help="print every study's night on a line of its own"
    )
    args = ap.parse_args(argv)
    world = mismatch_of(args.mismatch)
    drawn = args.mismatch == RANDOM
    chunks = tuple(int(c) for c in args.chunks.split(",") if c.strip())
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    profiles = [p for p in args.profiles.split(",") if p] or default_profiles(args.more)
    samplers = []
    for name in args.samplers.split(","):
        if name not in SAMPLER_KINDS:
            print(f"skipping sampler {name}: not registered", file=sys.stderr)
            continue
        try:
            make_sampler(SamplerConfig(name=name))
        except UsageError as exc:
            print(f"skipping sampler {name}: {exc}", file=sys.stderr)
            continue
        samplers.append(name)
    boxes: list[Box] = []
    for prof_name in profiles:
        try:
            profile = load_profile(prof_name)
        except ProfileError as exc:
            print(f"--profiles: {exc}", file=sys.stderr)
            return 2
        bench = bench_for(profile, min_headroom_gib=args.min_headroom, mismatch=world)
        if chunks:
            space = (*bench.search.params, Choices("chunked_prefill_size", chunks))
            bench = replace(bench, search=replace(bench.search, params=space))
        if args.baseline_fraction is not None:
            baseline = {**bench.search.baseline, "mem_fraction_static": args.baseline_fraction}
            bench = replace(bench, search=replace(bench.search, baseline=baseline))
        timed = replace(bench.study_config, workload=BENCH_WORKLOAD)
        boxes.append(Box(profile.name, bench, timed, args.budget))
    for name in args.study:
        cfg = study_file(name)
        profile = load_profile(cfg.server.sim_profile)
        base = bench_for(profile, mismatch=world)
        bench = replace(base, search=cfg.search, constraints=cfg.constraints)
        boxes.append(Box(f"{cfg.name} (study)", bench, cfg, cfg.budget.n_trials))
    runs: list[Run] = []
    t0 = time.perf_counter()
    for box in boxes:
        fixed = None if drawn else world_for(box, args.mismatch, args.world_seed, 0)
        if fixed is not None:
            print(
                f"{box.label}: best stable capacity {fixed.best:,} tokens; "
                f"{len(fixed.pareto)} settings on the capacity/throughput front",
                file=sys.stderr,
            )
        for seed in range(args.seeds):
            w = fixed or world_for(box, args.mismatch, args.world_seed, seed)
            if drawn:
                print(
                    f"world: seed {seed}, profile {box.label}, world seed {w.seed}, departure "
                    f"{w.departure:.2f} GiB ({bucket(w.departure)}): {describe(w.bench.mismatch)}"
                    f"; best stable {w.best:,} tokens"
                )
            for name in samplers:
                run = study_run(
                    name, w.bench, w.best, seed, box.budget, args.workers, w.pareto, box.cfg
                )
                runs.append(
                    replace(run, profile=box.label, world_seed=w.seed, departure=w.departure)
                )
    mode = f", mismatch: {world}" if world.on else ""
    if drawn:
        mode = f", mismatch: random (world seed {args.world_seed}, on top of each profile's own)"
    print(
        f"{len(boxes)} profiles × {args.seeds} seeds, budget {args.budget} launches, "
        f"{args.workers} worker(s), headroom ≥ {args.min_headroom:g} GiB" + mode + "; "
        f"{time.perf_counter() - t0:.0f} s"
    )
    for line in summarize(runs, args.budget, args.workers) + per_profile(runs, args.budget):
        print(line)
    print()
    for line in outcomes(runs, args.budget) + worst_studies(runs, args.budget):
        print(line)
    if drawn:
        for line in by_departure(runs, args.budget):
            print(line)
    for line in night_table(runs):
        print(line)
    if args.per_study:
        print()
        for r in runs:
            print(f"night {r.sampler}: {study_line(r)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
