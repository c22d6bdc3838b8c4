"""`autotune check`: one launch of the study's baseline with a short load, before the night, and
a go/no-go table of every reading the night depends on.

Only arguments here: the check itself is `autotune.study.check.run_check`, its table
`autotune.review.checktable`. It takes the same study arguments as `run`, holds the same lock
and GPU claim, and stores its launch as the study's baseline trial.
"""

from __future__ import annotations

import argparse
import sys

from autotune.cli import common
from autotune.review.checktable import check_text, verdict
from autotune.study.check import preflight, run_check
from autotune.trial.live import LiveLauncher, live_launcher


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `autotune check` and its arguments (those of `run` that name the study)."""
    p = common.add_study_command(
        sub,
        "check",
        "before the night: launch the baseline once with a short load and say go or no-go",
        "Preflight, one launch of the baseline with a short load, teardown; a table "
        "of every reading the night depends on. Exit 0: go; 1: no-go; 2: bad input.",
        backend=True,
    )
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    """Run the check under the study's lock and GPU claim, print its table, exit 0 (go) or 1."""
    cfg = common.resolve_config(args)
    place = common.worker_place(args, cfg)
    checked = preflight(cfg)
    if not checked.go:  # nothing written: the night's folder stays as it was
        sys.stdout.write(check_text(cfg, checked))
        return verdict(checked)
    common.make_worker_folder(args, place.folder)
    with common.worker_held(cfg, place):
        report = run_check(
            cfg,
            place.folder,
            place.url,
            live_launcher,
            lambda launcher: launcher.probe if isinstance(launcher, LiveLauncher) else None,
            preflighted=checked,
        )
    sys.stdout.write(check_text(cfg, report))
    return verdict(report)
