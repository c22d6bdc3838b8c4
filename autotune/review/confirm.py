"""`autotune confirm`: soak the exported setting once more, longer, and record pass or fail.

The confirmation is a trial outside the search: the same launch command `export` prints, the
same server lifecycle and workload driver (`autotune.trial.run.run_trial` over `live_launcher`), the
study's workload with its steady phases `--soak-factor` times longer and its stress phase
repeated as often, judged by the study's constraints. Its log and record go to
`results/NAME/confirm/NNNN/`; the verdict is stored on the study as the user attribute
`confirmation`, which `report`, `explain` and `export` read: a winner whose parameters have not
passed a soak is labelled UNCONFIRMED everywhere.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import signal
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from autotune.config.studyfile import StudyConfig
from autotune.errors import HarnessError, UsageError
from autotune.review.source import (
    CONFIRMATION,
    CONFIRMATIONS,
    add_review_args,
    open_source,
    review_of,
)
from autotune.study.storage import constraint_values

DEFAULT_SOAK_FACTOR = 3.0
MAX_HISTORY = 20


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "confirm",
        help="relaunch the exported command for a longer soak with the stress phase; "
        "record pass or fail on the study",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    add_review_args(p)
    p.add_argument("--trial", type=int, metavar="N", help="confirm trial N's setting instead")
    p.add_argument(
        "--soak-factor",
        type=float,
        default=DEFAULT_SOAK_FACTOR,
        metavar="X",
        help="steady phases X times longer, stress repeated as often "
        f"(default {DEFAULT_SOAK_FACTOR:g})",
    )
    p.add_argument("--backend", choices=("sim", "sglang"), help="override server.backend")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    if not 1.0 <= args.soak_factor <= 100.0:
        raise UsageError(f"--soak-factor {args.soak_factor:g}: must be between 1 and 100")
    source = open_source(args, need_config=True)
    cfg = source.cfg
    assert cfg is not None
    review = review_of(source, args)
    from autotune.review.export import build_export
    from autotune.server.flagcheck import check_argv

    ex = build_export(review, cfg, trial=args.trial)
    problems = check_argv(ex.argv, backend=ex.backend)
    if problems:
        raise UsageError("; ".join(problems))
    soak_cfg = soak(cfg, args.soak_factor)
    out = sys.stdout
    out.write(
        f"confirming {' '.join(f'{k}={v}' for k, v in ex.params.items())} "
        f"(trial {ex.trial}) with a {args.soak_factor:g}× soak\n"
    )
    out.flush()
    with _sigterm_as_interrupt():
        verdict = run_confirmation(
            soak_cfg, source.folder, dict(ex.params), trial=ex.trial, phase=_phase_printer(out)
        )
    if verdict["outcome"] == "interrupted":
        out.write("confirmation interrupted: the server was stopped; nothing was recorded\n")
        return 130
    verdict["soak_factor"] = args.soak_factor
    record_verdict(source.study, verdict)
    out.write(describe(verdict))
    return 0 if verdict["passed"] else 1


def soak(cfg: StudyConfig, factor: float) -> StudyConfig:
    """The study with its workload lengthened: steady and Poisson phases `factor`× longer,
    stress rounds `ceil(factor)`× as many, the workload time limit scaled to match."""
    from autotune.config.workload import Poisson, Steady, Stress, WorkloadSpec

    w = cfg.workload
    if not isinstance(w, WorkloadSpec):
        raise HarnessError("the workload driver is not available in this build")
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
    from autotune.cli.run import free_port
    from autotune.config.space import Settings, server_argv, tuned_flags
    from autotune.trial.run import Launcher, TrialPlan, live_launcher, run_trial, write_record

    launcher: Launcher = (launcher_factory or live_launcher)(cfg, folder)  # type: ignore[assignment]
    for note in launcher.stop_orphans():
        sys.stdout.write(f"stopped an orphaned server: {note}\n")
    typed = {k: v for k, v in params.items() if isinstance(v, bool | int | float | str)}
    settings = Settings(params=typed, flags=tuned_flags(typed, cfg.search))
    argv = server_argv(cfg.server, settings, backend=cfg.server.backend,
                       extra=launcher.extra_args())  # fmt: skip
    number = _next_number(folder / "confirm")
    plan = TrialPlan(
        number=number,
        params=typed,
        argv=tuple(argv),
        env=dict(cfg.server.env),
        host=cfg.server.host,
        port=cfg.server.port or free_port(cfg.server.host),
        trial_dir=folder / "confirm" / f"{number:04d}",
        limits=cfg.server.limits,
        backend=cfg.server.backend,
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
        "sglang_version": record.sglang_version,
        "at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def record_verdict(study: object, verdict: dict[str, object]) -> None:
    """Store the verdict on the study (the latest, and a short history)."""
    import optuna

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


def _phase_printer(out: TextIO) -> Callable[[str], None]:
    start = time.monotonic()

    def phase(name: str) -> None:
        out.write(f"  {name} (at {time.monotonic() - start:.0f} s)\n")
        out.flush()

    return phase


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM stops the soak like Ctrl-C: the server is torn down before autotune exits."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _next_number(folder: Path) -> int:
    taken = [int(p.name) for p in folder.glob("[0-9][0-9][0-9][0-9]") if p.name.isdigit()]
    return max(taken, default=-1) + 1
