"""`autotune report`: results/NAME/report.html, PNGs in results/NAME/report/, and a summary.

Reads the study's storage only, so it works while `autotune run` is still adding trials.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path

from autotune.cli import common
from autotune.config.schema import StudyConfig
from autotune.errors import UsageError
from autotune.review.export import launch_argv
from autotune.review.source import Review
from autotune.server.flagcheck import check_argv


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `autotune report` and its arguments to the subcommands."""
    p = common.add_review_command(
        sub,
        "report",
        "write results/NAME/report.html and PNGs, and print a summary",
        __doc__,
    )
    p.add_argument(
        "--out", type=Path, metavar="DIR", help="folder for the report (default results/NAME)"
    )
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    """Write the study's report (HTML and PNGs) to `--out` (default the study's folder) and print
    its summary; the flags' problems go to stderr as warnings."""
    # the renderers load matplotlib and plotly (about a second): only `report` pays for them
    from autotune.review.explain import explain
    from autotune.review.page import summary, write_report

    source, review = common.review(args)
    w = review.winner
    # without a winner, the arithmetic of the baseline (or the last launch) says what failed
    shown = review.trial(w.trial) if w is not None else review.baseline_trial
    if shown is None:
        shown = next((t for t in reversed(review.trials) if t.launched), None)
    text = explain(review, shown) if shown is not None else ""
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    warnings = _flag_problems(source.cfg, review)
    out_dir = args.out or source.folder
    try:
        written = write_report(
            review, out_dir, explanation=text, generated_at=now, warnings=warnings
        )
    except OSError as exc:
        raise UsageError(f"--out {out_dir}: cannot write the report there: {exc.strerror}") from exc
    sys.stdout.write(review.scrub(summary(review, written)))
    for problem in warnings:
        sys.stderr.write(f"autotune: warning: {problem}\n")
    return 0


def _flag_problems(cfg: StudyConfig | None, review: Review) -> list[str]:
    """The exported command checked with the server's own parser (when it is importable)."""
    if cfg is None or review.winner is None:
        return []

    backend = cfg.server.backend
    try:
        argv = launch_argv(cfg, review.winner.params, backend=backend)
    except KeyError:  # the study file's search space changed since the trials ran
        return []
    return check_argv(argv, backend=backend)
