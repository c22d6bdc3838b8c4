"""Objectives and constraints (pure): what a trial measured as Optuna's objective values and
constraint values (≤ 0 satisfied), the objectives' metric names, and which stored trials are
feasible."""

from __future__ import annotations

from collections.abc import Sequence

from optuna.trial import FrozenTrial

from autotune.config.schema import Constraint, Constraints
from autotune.record import keys
from autotune.record.view import view
from autotune.trial.record import Measured


def objective_values(m: Measured, objectives: Sequence[str]) -> list[float]:
    """What a trial measured as Optuna's objective values, in the study's objectives' order."""
    table = {"capacity": float(m.capacity_tokens), "throughput": float(m.throughput_tok_s)}
    return [table[name] for name in objectives]


def metric_names(objectives: Sequence[str]) -> list[str]:
    """The study's metric names, in the order of its objectives (`capacity` → `capacity_tokens`,
    `throughput` → `throughput_tok_s`): what Optuna's plots and Optuna Dashboard label each
    objective with instead of "Objective 0"."""
    return [keys.METRIC_NAMES[name] for name in objectives]


def constraint_values(m: Measured, c: Constraints) -> dict[str, float]:
    """One value per constraint, Optuna's convention: ≤ 0 satisfied, > 0 violated by that much.

    A trial that crashed before it could measure something violates that constraint too, so
    samplers learn the edge from crashes.
    """
    broken = m.oom or m.crashed
    out: dict[str, float] = {}
    if c.no_oom:
        out[Constraint.OOM] = 1.0 if m.oom else 0.0
    out[Constraint.CRASH] = 1.0 if m.crashed and not m.oom else 0.0
    rate = m.error_rate if m.error_rate is not None else (1.0 if broken else 0.0)
    out[Constraint.ERROR_RATE] = rate - c.max_error_rate
    if c.min_headroom_gib > 0:
        headroom = m.headroom_gib if m.headroom_gib is not None else (0.0 if broken else None)
        out[Constraint.HEADROOM] = c.min_headroom_gib - headroom if headroom is not None else 0.0
    if c.max_p99_ttft_ms is not None:
        out[Constraint.P99_TTFT] = _over(m.p99_ttft_ms, c.max_p99_ttft_ms, broken)
    if c.max_p99_itl_ms is not None:
        out[Constraint.P99_ITL] = _over(m.p99_itl_ms, c.max_p99_itl_ms, broken)
    return out


def broken_constraints(m: Measured, c: Constraints) -> list[str]:
    """The constraints `m` broke (`constraint_values` above 0), in their order."""
    return [k for k, v in constraint_values(m, c).items() if v > 0]


def _over(value: float | None, limit: float, broken: bool) -> float:
    if value is None:
        return 1.0 if broken else 0.0
    return (value - limit) / limit


def feasible(t: FrozenTrial) -> bool:
    """Whether a stored trial finished and met every constraint (its view's `feasible`)."""
    return view(t).feasible


def best_feasible_capacity(trials: Sequence[FrozenTrial]) -> int | None:
    """The largest KV pool among the feasible trials, None while there is none: the figure the
    progress line and `status` headline."""
    caps = [v.capacity_tokens or 0 for v in map(view, trials) if v.feasible]
    return max(caps) if caps else None
