"""`autotune explain`: one trial's memory arithmetic in words and numbers."""

from __future__ import annotations

import argparse
import sys

from autotune.cli import common
from autotune.errors import UsageError
from autotune.review.explain import explain


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `autotune explain` and its arguments to the subcommands."""
    p = common.add_review_command(
        sub,
        "explain",
        "the memory arithmetic of one trial (default: the exported winner), in words",
        __doc__,
    )
    p.add_argument("--trial", type=int, metavar="N", help="trial number (default: the winner)")
    common.add_fraction_arg(p, "also say what this mem_fraction_static would give (repeatable)")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    """Print the memory arithmetic of `--trial N` (default: the winner), with each `--fraction`'s
    too."""
    _, review = common.review(args)
    number = args.trial
    if number is None:
        if review.winner is None:
            raise UsageError(
                f"study {review.name} has no feasible trial to explain yet; pass --trial N"
            )
        number = review.winner.trial
    extra = common.fractions(args)
    text = explain(review, review.trial(number), extra=extra)
    sys.stdout.write(review.scrub(text))
    return 0
