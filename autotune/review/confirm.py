"""`autotune confirm`: soak the exported setting once more, longer, and record pass or fail.

The confirmation is a trial outside the search: the same launch command `export` prints, the
same server lifecycle and workload driver (`autotune.trial.run.run_trial` over `live_launcher`), the
study's workload with its steady phases `--soak-factor` times longer and its stress phase
repeated as often, judged by the study's constraints. Its log and record go to
`results/NAME/confirm/NNNN/`; the verdict is stored on the study as the user attribute
`confirmation`, which `report`, `explain` and `export` read: a winner whose parameters have not
passed a soak is labelled UNCONFIRMED everywhere.

A trial is too short to see a slow leak: `growth_per_trial` reads what the allocator kept after
each trial's workload, `soak_factor` makes the soak long enough that a steady leak at that rate
would eat the setting's spare headroom, and `soak_margin_gib` is the headroom a setting needs
beyond the required one to pass a soak that long.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

import optuna

from autotune.config.space import Settings, tuned_flags
from autotune.config.studyfile import StudyConfig
from autotune.config.workload import Poisson, Steady, Stress
from autotune.errors import HarnessError
from autotune.record import keys
from autotune.review.source import CONFIRMATION, CONFIRMATIONS
from autotune.study.loop import patiently
from autotune.study.objectives import constraint_values
from autotune.study.storage import STORAGE_ERRORS, storage_failure
from autotune.trial.run import Launcher, live_launcher, plan_trial, run_trial, write_record

DEFAULT_SOAK_FACTOR = 3.0
MAX_HISTORY = 20


def soak(cfg: StudyConfig, factor: float) -> StudyConfig:
    """The study with its workload lengthened: steady and Poisson phases `factor`× longer,
    stress rounds `ceil(factor)`× as many, the workload time limit scaled to match."""

    w = cfg.workload
    phases = []
    for ph in w.phases:
        if isinstance(ph, Steady | Poisson):
            ph = dataclasses.replace(ph, duration_s=ph.duration_s * factor)
        elif isinstance(ph, Stress):
            ph = dataclasses.replace(ph, rounds=ph.rounds * math.ceil(factor))
        phases.append(ph)
    limits = dataclasses.replace(
        cfg.server.limits, workload_s=cfg.server.limits.workload_s * factor
    )
    return dataclasses.replace(
        cfg,
        workload=dataclasses.replace(w, phases=tuple(phases)),
        server=dataclasses.replace(cfg.server, limits=limits),
    )


def run_confirmation(
    cfg: StudyConfig,
    folder: Path,
    params: Mapping[str, object],
    *,
    trial: int,
    launcher_factory: Callable[[StudyConfig, Path], object] | None = None,
    clock: Callable[[], float] = time.monotonic,
    phase: Callable[[str], None] = lambda p: None,
) -> dict[str, object]:
    """Launch, soak, tear down; the verdict as a JSON-safe dict."""

    launcher: Launcher = (launcher_factory or live_launcher)(cfg, folder)  # type: ignore[assignment]
    for note in launcher.stop_orphans():
        sys.stdout.write(f"stopped an orphaned server: {note}\n")
    typed = {k: v for k, v in params.items() if isinstance(v, bool | int | float | str)}
    settings = Settings(params=typed, flags=tuned_flags(typed, cfg.search))
    number = _next_number(folder / "confirm")
    plan = plan_trial(
        cfg,
        settings,
        number=number,
        trial_dir=folder / "confirm" / f"{number:04d}",
        extra=launcher.extra_args(),
    )
    record = run_trial(plan, launcher, clock=clock, phase=phase)
    write_record(record, plan.trial_dir)
    measured = record.measured()
    broken: list[str] = []
    if measured is not None:
        broken = [k for k, v in constraint_values(measured, cfg.constraints).items() if v > 0]
    passed = record.state == "complete" and record.outcome == "ok" and not broken
    reason = record.reason or (f"broke {', '.join(broken)}" if broken else "")
    return {
        "params": dict(typed),
        "trial": trial,
        "passed": passed,
        "outcome": record.outcome,
        "reason": reason,
        "violated": broken,
        "capacity_tokens": record.capacity_tokens,
        "throughput_tok_s": record.throughput_tok_s,
        "headroom_gib": record.headroom_gib,
        "stress_peak_gib": record.stress_peak_gib,
        "error_rate": record.error_rate,
        "seconds": record.phases.get("total"),
        "log_path": record.log_path,
        "folder": str(plan.trial_dir),
        "sglang_version": record.sglang_version,
        "at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


VERDICT_FILE = "verdict.json"


def keep_verdict(
    study: object,
    verdict: dict[str, object],
    *,
    url: str,
    note: Callable[[str], None] = lambda line: None,
    patience_s: float | None = None,
) -> Path:
    """Write the verdict beside the soak's log, then store it on the study, trying again while
    the storage fails (a PostgreSQL restart, a SQLite lock) for the run's patience; a storage
    that never answers is one line naming the file that still holds the verdict."""
    path = Path(str(verdict["folder"])) / VERDICT_FILE
    path.write_text(json.dumps(verdict, indent=1, sort_keys=True) + "\n")
    path.chmod(0o600)
    try:
        patiently(lambda: record_verdict(study, verdict), note=note, patience_s=patience_s)
    except STORAGE_ERRORS as exc:
        failure = storage_failure(exc, url, "failed")
        kept = f"the verdict is not on the study, it is kept in {path}"
        raise HarnessError(f"{failure}; {kept}") from exc
    return path


def record_verdict(study: object, verdict: dict[str, object]) -> None:
    """Store the verdict on the study (the latest, and a short history)."""

    assert isinstance(study, optuna.Study)
    study.set_user_attr(CONFIRMATION, verdict)
    history = study.user_attrs.get(CONFIRMATIONS)
    past = list(history) if isinstance(history, list) else []
    study.set_user_attr(CONFIRMATIONS, [*past, verdict][-MAX_HISTORY:])


def describe(v: Mapping[str, object]) -> str:
    """The verdict in a few lines (pure)."""
    head = "PASSED" if v.get("passed") else "FAILED"
    figures = []
    cap = v.get("capacity_tokens")
    if isinstance(cap, int) and cap:
        figures.append(f"{cap:,} tokens")
    tp = v.get("throughput_tok_s")
    if isinstance(tp, int | float) and v.get("outcome") == "ok":
        figures.append(f"{tp:,.1f} tok/s")
    h = v.get("headroom_gib")
    if isinstance(h, int | float) and v.get("outcome") == "ok":
        figures.append(f"{h:.2f} GiB free at the worst moment")
    lines = [
        f"confirmation {head}: {v.get('outcome')}" + (f", {', '.join(figures)}" if figures else "")
    ]
    if v.get("reason"):
        lines.append(f"  {v['reason']}")
    lines.append(f"  log: {v.get('log_path')}")
    return "\n".join(lines) + "\n"


def _next_number(folder: Path) -> int:
    taken = [int(p.name) for p in folder.glob("[0-9][0-9][0-9][0-9]") if p.name.isdigit()]
    return max(taken, default=-1) + 1


# ---- how long to soak, and the margin a soak needs (pure) ---------------------------------

LEAK_FACTOR = 1.5
"""A soak lasts long enough that a steady leak would eat this many times the spare headroom."""
MAX_SOAK_FACTOR = 100.0
GROWTH_NOISE_GIB = 0.02
"""Below this much per trial, growth is the probe's noise, not a leak."""


def growth_per_trial(records: Iterable[Mapping[str, object]]) -> float | None:
    """The allocator's growth over one trial's workload, the median over the trials that
    recorded it (None when none did)."""
    rows = sorted(
        float(v)
        for r in records
        if isinstance(v := r.get(keys.GROWTH), int | float) and not isinstance(v, bool)
    )
    if not rows:
        return None
    mid = len(rows) // 2
    return rows[mid] if len(rows) % 2 else (rows[mid - 1] + rows[mid]) / 2


def soak_factor(growth_gib: float | None, spare_gib: float | None, default: float) -> float:
    """How many trials long the soak is: `default`, or, where the trials measured growth, long
    enough that a steady leak at that rate eats `LEAK_FACTOR` times the headroom the setting
    kept beyond the required (`spare_gib`), so a slow leak that passes a trial's workload fails
    the soak instead of the night after."""
    if growth_gib is None or growth_gib < GROWTH_NOISE_GIB or spare_gib is None:
        return default
    need = 1.0 + LEAK_FACTOR * max(spare_gib, 0.0) / growth_gib
    return min(max(default, math.ceil(need)), MAX_SOAK_FACTOR)


def soak_margin_gib(growth_gib: float | None, factor: float) -> float:
    """Headroom a setting needs beyond the required one to pass a soak `factor` trials long:
    what the allocator grows by over the part of the soak a trial did not see."""
    if growth_gib is None or growth_gib < GROWTH_NOISE_GIB:
        return 0.0
    return growth_gib * max(factor - 1.0, 0.0)


PEAK_NOISE = 0.05
"""The least run-to-run spread (sd, a share of it) a stress peak is given where the trials at
one setting's demand did not measure it three times."""
MAX_TAIL = 2.0
"""The most a model's misses widen the peak's tail for the soak's margin."""
SOAK_RISK = 0.001
"""The chance a soak may meet a peak above the margin: the margin covers the worst stress peak
of a soak with this risk (the 99.9th percentile of `factor` trials' worst peaks)."""


def soak_peak_rise_gib(
    peaks: Sequence[float],
    peak_gib: float,
    factor: float,
    kappa: float = 1.0,
    groups: Sequence[Sequence[float]] = (),
) -> float:
    """How far above the stress peak of the trial it was judged by the worst peak of a soak
    `factor` trials long may rise: a soak meets about the worst of that many trials. The spread
    is the run-to-run sd of the trials' peaks, pooled over `peaks` and `groups` (the peaks at
    each other demand the trials ran) as a share of each group's median, `PEAK_NOISE` at
    least; a normal tail puts the worst of `factor` draws `z` spreads up (`SOAK_RISK`), one
    more for the judged trial having been a lucky one, and where the memory model missed its
    forecasts (`kappa` > 1, the search's calibration) the world differs from it, so the tail is
    taken wider by kappa squared (kappa at most `MAX_TAIL`). Never less than the worst rise the
    trials at this setting's demand (`peaks`) saw."""
    rows = sorted(peaks)
    share = _pooled_share([*groups, rows])
    sd = max(share, PEAK_NOISE) * peak_gib
    z = statistics.NormalDist().inv_cdf(1.0 - SOAK_RISK / max(factor, 1.0)) + 1.0
    tail = min(max(kappa, 1.0), MAX_TAIL) ** 2
    worst = rows[-1] - statistics.median(rows) if len(rows) >= 2 else 0.0
    return max(worst, z * sd * tail)


def _pooled_share(groups: Sequence[Sequence[float]]) -> float:
    """The run-to-run sd of a stress peak as a share of its median, pooled over the groups of
    peaks measured at one demand (groups of one say nothing)."""
    squares: list[float] = []
    for g in groups:
        if len(g) < 2:
            continue
        med = statistics.median(g)
        if med > 0:
            squares += [((x - med) / med) ** 2 for x in g]
    n = len(squares) - sum(1 for g in groups if len(g) >= 2)
    return math.sqrt(sum(squares) / n) if n > 0 else 0.0


def soak_steps(
    headroom_gib: float,
    required_gib: float,
    growth_gib: float | None,
    factor: float,
    step_gib: float,
    rise_gib: float = 0.0,
) -> int:
    """Fraction steps to back a setting off so that it passes a soak `factor` trials long: at
    least one, more while the headroom it kept (`headroom_gib`, its worst trial) does not cover
    the required one plus the growth over the soak plus how far the soak's worst peak may rise
    (`soak_peak_rise_gib`); each step hands `step_gib` (P × the step) back from the KV pool."""
    need = required_gib + soak_margin_gib(growth_gib, factor) + max(rise_gib, 0.0)
    if step_gib <= 0:
        return 1
    return max(1, math.ceil((need - headroom_gib) / step_gib - 1e-9))
