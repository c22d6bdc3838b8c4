"""`autotune report`: results/NAME/report.html, PNGs in results/NAME/report/, and a summary.

Reads the study's storage only, so it works while `autotune run` is still adding trials.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path

from autotune.report.review import add_review_args


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "report",
        help="write results/NAME/report.html and PNGs, and print a summary",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    add_review_args(p)
    p.add_argument(
        "--out", type=Path, metavar="DIR", help="folder for the report (default results/NAME)"
    )
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from autotune.explain import explain
    from autotune.report.page import summary, write_report
    from autotune.report.review import open_source, review_of

    source = open_source(args)
    review = review_of(source, args)
    w = review.winner
    text = explain(review, review.trial(w.trial)) if w is not None else ""
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    written = write_report(review, args.out or source.folder, explanation=text, generated_at=now)
    sys.stdout.write(review.scrub(summary(review, written)))
    return 0
