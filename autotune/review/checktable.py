"""`autotune check`'s output: one table, go or no-go per line, of every reading the night depends on
(`study.readings.CheckReport`), then the night's plan from those readings, then the verdict.

The plan (`night_plan`): the trial's phases as the check timed them (launch, startup,
teardown), the study's workload phases (steady and Poisson phases by their durations, each
stress phase by the check's own round times its rounds; a warm-up is not timed by the check and
counts nothing, so the hours are a lower bound by it; with `[workload] end_early` a phase that
settles ends sooner, so its duration is at most what it takes, and drains nothing; one that
runs its whole duration then drains its requests in flight, up to `drain_timeout_s`, which the
plan names and does not count: how long it takes is the answers' length, which the check, with
its short answers, cannot time), the search's expected and worst
launches (`search.estimate.launch_estimate`; the check's launch is the first), and the confirm
soak the winner will need (`review.soak`: its length in trials from what the check measured, the
default `DEFAULT_SOAK_FACTOR` when it measured no growth) → the expected and the worst hours.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from autotune.config.schema import StudyConfig
from autotune.config.space import fraction_step
from autotune.config.workload import Poisson, Steady, Stress, WorkloadSpec
from autotune.review.soak import DEFAULT_SOAK_FACTOR, soak_plan
from autotune.search.estimate import launch_estimate
from autotune.study.progress import duration, workload_plan
from autotune.study.readings import CheckReport, Row


@dataclass(frozen=True)
class NightPlan:
    """How long the night is expected to take and at worst, and what that rests on."""

    per_trial_s: float
    workload_s: float
    expected_launches: int
    worst_launches: int
    basis: str
    soak_factor: float
    soak_s: float
    expected_s: float
    worst_s: float
    phases: tuple[tuple[str, float | None], ...]


def night_plan(cfg: StudyConfig, report: CheckReport) -> NightPlan | None:
    """The night's plan from the check's timings; None when the check timed no launch."""
    t = report.timings
    if t is None:
        return None
    phases = _phases(cfg.workload, report.workload_phases)
    workload = sum(s or 0.0 for _, s in phases)
    per_trial = t.launch_s + t.startup_s + workload + t.teardown_s
    est = launch_estimate(cfg.search, cfg.sampler.name, cfg.budget.n_trials)
    factor = DEFAULT_SOAK_FACTOR
    if report.trial is not None:
        plan = soak_plan(
            report.trials,
            report.trial.params,
            required_gib=cfg.constraints.min_headroom_gib,
            step=fraction_step(cfg.search),
            space=cfg.search,
        )
        factor = plan.factor if plan is not None else factor
    soaked = sum(
        (s or 0.0) * (math.ceil(factor) if kind == "stress" else factor)
        for (_, s), kind in zip(phases, _kinds(cfg.workload), strict=True)
    )
    soak = t.launch_s + t.startup_s + soaked + t.teardown_s
    left = max(est.expected - 1, 0), max(est.worst - 1, 0)  # the check's launch is the first
    return NightPlan(
        per_trial_s=per_trial,
        workload_s=workload,
        expected_launches=est.expected,
        worst_launches=est.worst,
        basis=est.basis,
        soak_factor=factor,
        soak_s=soak,
        expected_s=left[0] * per_trial + soak,
        worst_s=left[1] * per_trial + soak,
        phases=phases,
    )


def _kinds(spec: WorkloadSpec) -> list[str]:
    return ["stress" if isinstance(p, Stress) else "other" for p in spec.phases]


def _phases(
    spec: WorkloadSpec, checked: Mapping[str, float]
) -> tuple[tuple[str, float | None], ...]:
    """Each workload phase with its expected seconds (`study.progress.workload_plan`): a steady
    or Poisson phase its duration, a stress phase the check's round times its rounds, a warm-up
    None (not timed)."""
    return tuple((p.name, p.seconds) for p in workload_plan(spec, checked))


def plan_rows(cfg: StudyConfig, report: CheckReport) -> list[Row]:
    """The night's plan as rows of the table (go: the plan informs, it does not refuse)."""
    plan = night_plan(cfg, report)
    t = report.timings
    if plan is None or t is None:
        return [Row("night plan", "not made: the check timed no launch", False, "see above")]
    early = cfg.workload.end_early.enabled
    drains = {p.name for p in cfg.workload.phases if isinstance(p, Steady | Poisson)}
    drain = duration(cfg.workload.drain_timeout_s)
    steps = ", ".join(
        f"{name} {('≤ ' if early else '') + duration(s) if s is not None else '? (not timed)'}"
        + (f" + drain ≤ {drain}" if name in drains else "")
        for name, s in plan.phases
    )
    timeout = cfg.budget.timeout_s
    capped = ""
    if timeout is not None and plan.worst_s > timeout:
        capped = f"; the study's timeout stops new trials after {duration(timeout)}"
    bound = "≥ " if any(s is None for _, s in plan.phases) else ""
    return [
        Row("startup (measured)", f"{t.startup_s:.1f} s (launch {t.launch_s:.1f} s)"),
        Row("teardown (measured)", f"{t.teardown_s:.1f} s"),
        Row("workload phases", f"{steps} = {bound}{duration(plan.workload_s)} per trial"),
        Row("one trial", f"{bound}{duration(plan.per_trial_s)}"),
        Row(
            "launches",
            f"expected {plan.expected_launches}, worst {plan.worst_launches} ({plan.basis})",
        ),
        Row("confirm soak", f"{plan.soak_factor:g}× the workload = {bound}{duration(plan.soak_s)}"),
        Row(
            "night",
            f"expected {bound}{plan.expected_s / 3600:.1f} h, worst {bound}"
            f"{plan.worst_s / 3600:.1f} h{capped}"
            + (
                f"; each steady or Poisson phase that runs its whole duration then drains the "
                f"requests still in flight (up to {drain}), which this does not count"
                if drains
                else ""
            )
            + (
                "; a phase that settles ends sooner and drains nothing ([workload] end_early)"
                if early and drains
                else ""
            ),
        ),
    ]


def check_text(cfg: StudyConfig, report: CheckReport) -> str:
    """The table (reading, value, go/no-go), the plan under it, and the verdict: `GO` or, for
    each no-go, one line with the reason and the fix."""
    rows = [*report.rows, *(plan_rows(cfg, report) if report.go else [])]
    width = max((len(r.reading) for r in rows), default=10)
    lines = [f"autotune check: study {cfg.name}, {cfg.server.backend} backend"]
    lines.append(f"{'reading':<{width}}  {'go':<5}  value")
    lines += [f"{r.reading:<{width}}  {'go' if r.go else 'NO-GO':<5}  {r.value}" for r in rows]
    bad = [r for r in rows if not r.go]
    took = f"(the check took {report.wall_s:.1f} s)"
    if not bad:
        lines.append(f"GO: every reading the night depends on is in place {took}")
    else:
        lines += [f"no-go: {r.reading}: {r.value}; fix: {r.fix or 'see above'}" for r in bad]
        lines.append(f"NO-GO: {len(bad)} reading(s) stop the night {took}")
    return "\n".join(lines) + "\n"


def verdict(report: CheckReport) -> int:
    """The exit code: 0 when every reading is go, 1 otherwise."""
    return 0 if report.go else 1
