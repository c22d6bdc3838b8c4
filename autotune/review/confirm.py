"""`autotune confirm`: soak the exported setting once more, longer, and record pass or fail.

The confirmation is a trial outside the search: the same launch command `export` prints, the
same server lifecycle and workload driver (`autotune.trial.run.run_trial` over
`live_launcher`), the study's workload with its steady phases `factor` times longer and its
stress phase repeated as often (how long: `autotune.review.soak`), judged by the study's
constraints. Its log and record go to `results/NAME/confirm/NNNN/`; the verdict is stored on
the study as the user attribute `confirmation`, which `report`, `explain` and `export` read: a
winner whose parameters have not passed a soak is labelled UNCONFIRMED everywhere.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path

import optuna

from autotune.config.space import settings_of
from autotune.config.studyfile import StudyConfig
from autotune.config.workload import Poisson, Steady, Stress
from autotune.errors import HarnessError
from autotune.record import keys
from autotune.record.stored import study_record
from autotune.review.soak import DEFAULT_SOAK_FACTOR
from autotune.review.verdict import Verdict
from autotune.study.loop import patiently
from autotune.study.objectives import constraint_values
from autotune.study.storage import STORAGE_ERRORS, storage_failure
from autotune.trial.live import live_launcher
from autotune.trial.plan import plan_trial
from autotune.trial.run import run_trial
from autotune.trial.seam import Launcher
from autotune.trial.trialfile import write_record

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


def soak_factor_for(given: float | None, margin: Mapping[str, object]) -> tuple[float, str]:
    """How many times longer the soak runs, and why when the operator did not say: `given`,
    else the soak the export's `margin` was sized for, else `DEFAULT_SOAK_FACTOR`."""
    sized = margin.get("soak_factor")
    if given is not None:
        return given, ""
    if isinstance(sized, int | float) and not isinstance(sized, bool):
        return float(sized), " (the soak the export's margin is sized for)"
    return DEFAULT_SOAK_FACTOR, ""


def run_confirmation(
    cfg: StudyConfig,
    folder: Path,
    params: Mapping[str, object],
    *,
    trial: int,
    launcher_factory: Callable[[StudyConfig, Path], Launcher] | None = None,
    clock: Callable[[], float] = time.monotonic,
    phase: Callable[[str], None] = lambda p: None,
) -> Verdict:
    """Launch, soak, tear down; the verdict."""

    launcher = (launcher_factory or live_launcher)(cfg, folder)
    for note in launcher.stop_orphans():
        sys.stdout.write(f"stopped an orphaned server: {note}\n")
    typed = {k: v for k, v in params.items() if isinstance(v, bool | int | float | str)}
    settings = settings_of(typed, cfg.search)
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
    return Verdict(
        params=dict(typed),
        trial=trial,
        passed=passed,
        outcome=record.outcome,
        reason=reason,
        violated=tuple(broken),
        capacity_tokens=record.capacity_tokens,
        throughput_tok_s=record.throughput_tok_s,
        headroom_gib=record.headroom_gib,
        stress_peak_gib=record.stress_peak_gib,
        error_rate=record.error_rate,
        seconds=record.phases.get("total"),
        log_path=record.log_path,
        folder=str(plan.trial_dir),
        sglang_version=record.sglang_version,
        at=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    )


VERDICT_FILE = "verdict.json"


def keep_verdict(
    study: object,
    verdict: Verdict,
    *,
    url: str,
    note: Callable[[str], None] = lambda line: None,
    patience_s: float | None = None,
) -> Path:
    """Write the verdict beside the soak's log, then store it on the study, trying again while
    the storage fails (a PostgreSQL restart, a SQLite lock) for the run's patience; a storage
    that never answers is one line naming the file that still holds the verdict."""
    path = Path(str(verdict.folder)) / VERDICT_FILE
    path.write_text(json.dumps(verdict.to_attr(), indent=1, sort_keys=True) + "\n")
    path.chmod(0o600)
    try:
        patiently(lambda: record_verdict(study, verdict), note=note, patience_s=patience_s)
    except STORAGE_ERRORS as exc:
        failure = storage_failure(exc, url, "failed")
        kept = f"the verdict is not on the study, it is kept in {path}"
        raise HarnessError(f"{failure}; {kept}") from exc
    return path


def record_verdict(study: object, verdict: Verdict) -> None:
    """Store the verdict on the study (the latest, and a short history)."""

    assert isinstance(study, optuna.Study)
    attr = verdict.to_attr()
    study.set_user_attr(keys.CONFIRMATION, attr)
    past = list(study_record(study).confirmations)
    study.set_user_attr(keys.CONFIRMATIONS, [*past, attr][-MAX_HISTORY:])


def _next_number(folder: Path) -> int:
    taken = [int(p.name) for p in folder.glob("[0-9][0-9][0-9][0-9]") if p.name.isdigit()]
    return max(taken, default=-1) + 1
