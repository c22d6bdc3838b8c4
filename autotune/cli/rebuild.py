"""`autotune rebuild`: give a lost study storage its trials back from the trial folders."""

from __future__ import annotations

import argparse
import sys

from autotune.cli.common import add_study_command, resolve_config, storage_url, study_dir
from autotune.study.rebuild import rebuild


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `autotune rebuild` and its arguments to the subcommands."""
    p = add_study_command(
        sub,
        "rebuild",
        "rebuild a lost study storage from the trial folders (trials/NNNN/trial.json)",
        "Create the study again in an empty storage (default results/NAME/study.db) "
        "from its trial folders, each trial under its own number; the folders are only read.",
    )
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    """Create the study again in its (empty) storage from `trials/NNNN/trial.json` and say what was
    put back."""
    cfg = resolve_config(args)
    folder = study_dir(cfg, args.results_dir)
    url = storage_url(args, cfg, folder)
    done = rebuild(cfg, folder, url)
    sys.stdout.write(done.line(cfg.name, url) + "\n")
    return 0
