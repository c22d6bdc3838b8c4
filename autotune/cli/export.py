"""`autotune export`: the winning launch command, ready to paste."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from autotune.cli import common
from autotune.errors import UsageError
from autotune.review.export import build_export
from autotune.review.exportformats import FORMATS, comment, render
from autotune.server.flagcheck import canonical_argv, inspect_argv


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `autotune export` and its arguments to the subcommands."""
    p = common.add_review_command(
        sub,
        "export",
        "print the winning launch command (flags, shell, json or a systemd drop-in)",
        __doc__,
    )
    p.add_argument("--format", default="shell", metavar="FORMAT", help=", ".join(FORMATS))
    p.add_argument("--trial", type=int, metavar="N", help="export trial N as it ran (no margin)")
    common.add_backend_arg(p)
    p.add_argument(
        "--force",
        action="store_true",
        help="export a setting that failed (OOM, crash, infeasible) anyway, marked as such: "
        "its command carries a flag SGLang rejects until it is removed",
    )
    p.add_argument(
        "--no-flag-check",
        action="store_true",
        help="skip checking the flags against the installed SGLang's parser",
    )
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    """Print the winner's (or `--trial N`'s) launch command in `--format`, its flags checked against
    the installed SGLang's parser and spelled as it names them (unless `--no-flag-check`)."""
    if args.format not in FORMATS:
        raise UsageError(f"--format {args.format}: unknown; use one of {', '.join(FORMATS)}")
    source, review = common.review(args, need_config=True)
    assert source.cfg is not None
    ex = build_export(review, source.cfg, trial=args.trial, force=args.force)
    if not args.no_flag_check:
        report = inspect_argv(ex.argv, backend=ex.backend)
        for problem in report.problems:
            sys.stderr.write(f"autotune: warning: {problem}\n")
        ex = dataclasses.replace(ex, argv=canonical_argv(ex.argv, report.canonical))
    text = render(ex, args.format)  # a value the format cannot carry stops here: nothing written
    if args.format == "flags":  # stdout stays one pasteable line; the answer goes to stderr
        sys.stderr.write(review.scrub(comment(ex.headline) + "\n"))
        if ex.ceiling.get("line"):
            sys.stderr.write(review.scrub(comment(str(ex.ceiling["line"])) + "\n"))
        if ex.forced:
            line = f"FORCED EXPORT: {ex.forced}; remove {ex.forced_flag} to launch"
            sys.stderr.write(comment(line) + "\n")
        for line in ex.ran_other:  # SGLang ran another value than the trial asked
            sys.stderr.write(review.scrub(comment(line)) + "\n")
    sys.stdout.write(review.scrub(text))
    return 0
