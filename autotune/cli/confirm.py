"""`autotune confirm`: soak the exported setting once more, longer, then run it at its worst cases
(the largest prefill chunk, the longest context, the most running requests, several arrival
orders), and record pass or fail with every case's peak on the study."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable, Sequence
from typing import TextIO

from autotune.cli import common
from autotune.config.workload import Poisson, Steady
from autotune.errors import UsageError
from autotune.review.confirm import (
    ended_early,
    keep_verdict,
    run_confirm,
    soak,
    soak_factor_for,
    with_cases,
)
from autotune.review.export import build_export
from autotune.review.soak import DEFAULT_SOAK_FACTOR
from autotune.review.verdict import CaseResult
from autotune.review.worstcase import CASE_NAMES, Case, case_planner
from autotune.server.flagcheck import check_argv
from autotune.study.runner import study_lock


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `autotune confirm` and its arguments to the subcommands."""
    p = common.add_review_command(
        sub,
        "confirm",
        "relaunch the exported command for a longer soak with the stress phase; "
        "record pass or fail on the study",
        __doc__,
    )
    p.add_argument("--trial", type=int, metavar="N", help="confirm trial N's setting instead")
    p.add_argument(
        "--soak-factor",
        type=float,
        default=None,
        metavar="X",
        help="steady phases X times as long as the exported trial ran them, stress repeated "
        "as often (default: as long as "
        "the export's margin was sized for, long enough for the growth the trials measured "
        f"to eat the spare headroom; {DEFAULT_SOAK_FACTOR:g} where they measured none)",
    )
    p.add_argument(
        "--cases",
        default=None,
        metavar="NAMES",
        help="the worst cases to run after the soak, comma-separated, or `all` or `none` "
        f"(default: all for the exported setting, none with --trial): {', '.join(CASE_NAMES)}",
    )
    common.add_backend_arg(p)
    p.add_argument(
        "--wait",
        action="store_true",
        help="while `autotune run` holds the study's results folder, wait for it to finish "
        "instead of refusing",
    )
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    """Soak the export's setting (or `--trial N`'s) for `--soak-factor` times as long, record the
    verdict on the study and print it; exits 0 on pass, 1 on fail."""
    if args.soak_factor is not None and not 1.0 <= args.soak_factor <= 100.0:
        raise UsageError(f"--soak-factor {args.soak_factor:g}: must be between 1 and 100")
    names = _case_names(args.cases or ("none" if args.trial is not None else "all"))
    source, review = common.review(args, need_config=True)
    cfg = source.cfg
    assert cfg is not None
    # a soak may test again a setting that failed (export refuses it); it never carries the
    # forced export's marker, which is not part of `argv`
    ex = build_export(review, cfg, trial=args.trial, force=True)
    problems = check_argv(ex.argv, backend=ex.backend)
    if problems:
        raise UsageError("; ".join(problems))
    factor, why = soak_factor_for(args.soak_factor, ex.margin)
    exported = review.trial(ex.trial)
    ran = ended_early(exported)
    soak_cfg = soak(cfg, factor, ran)
    out = sys.stdout
    out.write(f"{ex.headline}\n")
    out.write(
        f"confirming {' '.join(f'{k}={v}' for k, v in ex.params.items())} "
        f"(trial {ex.trial}) with a {factor:g}× soak{why}\n"
    )
    for ph in soak_cfg.workload.phases:
        if isinstance(ph, Steady | Poisson) and ph.name in ran:
            one = f"{ran[ph.name]:,.0f} s trial {ex.trial} ran it before it ended early"
            out.write(f"  phase {ph.name}: {ph.duration_s:,.0f} s, {factor:g}× the {one}\n")

    out.flush()
    planner = None if names is None else case_planner(cfg, names, exported.ledger)

    def planned(cases: Sequence[Case]) -> None:
        out.write(f"worst cases: {len(cases)}, sharing a launch, from the least to the most "
                  f"likely to fail: {', '.join(c.name for c in cases)}\n")  # fmt: skip
        out.flush()

    def heard(case: Case, r: CaseResult) -> None:
        out.write(f"  {case.name}: {r.verdict} ({case.why})\n")
        out.flush()

    with study_lock(source.folder, wait=args.wait), common.stop_signals() as stopped:
        done = run_confirm(soak_cfg, cfg, source.folder, dict(ex.params), trial=ex.trial,
                           cases=planner, phase=_phase_printer(out), on_plan=planned,
                           on_case=heard)  # fmt: skip
    verdict = done.verdict
    if verdict.outcome == "interrupted":
        out.write("confirmation interrupted: the server was stopped; nothing was recorded\n")
        return stopped.exit_code(common.INTERRUPTED)
    verdict = dataclasses.replace(verdict, soak_factor=factor)
    cut = done.cut
    if names is not None:
        verdict = with_cases(verdict, done.cases)
        if done.launches > 1:
            fresh = done.launches - 1
            out.write(f"worst cases: {fresh} fresh launch{'es' if fresh > 1 else ''} of the "
                      "same setting, after the server ended or did not come to rest (the "
                      "launch column)\n")  # fmt: skip
        if cut:
            out.write(f"worst cases interrupted after {len(done.cases)}: the soak's verdict is "
                      "recorded with the cases that ran\n")  # fmt: skip

    def warn(line: str) -> None:
        out.write(f"warning: {line}\n")
        out.flush()

    keep_verdict(source.study, verdict, url=source.url, note=warn)
    out.write(verdict.describe())
    if names is not None and cut:
        return stopped.exit_code(common.INTERRUPTED)
    return 0 if verdict.passed else 1


def _case_names(text: str) -> tuple[str, ...] | None:
    """`--cases`: None for `none`, () for `all`, else the names, each one checked."""
    words = [w.strip() for w in text.split(",") if w.strip()]
    if words == ["none"]:
        return None
    if words in ([], ["all"]):
        return ()
    bad = [w for w in words if w not in CASE_NAMES]
    if bad:
        raise UsageError(
            f"--cases {','.join(bad)}: unknown; use all, none or some of {', '.join(CASE_NAMES)}"
        )
    return tuple(words)


def _phase_printer(out: TextIO) -> Callable[[str], None]:
    start = time.monotonic()

    def phase(name: str) -> None:
        out.write(f"  {name} (at {time.monotonic() - start:.0f} s)\n")
        out.flush()

    return phase
