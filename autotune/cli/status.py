"""`autotune status`: the trial table of a study, read from its storage (works while it runs)."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from pathlib import Path

import optuna

from autotune.cli.common import (
    add_study_command,
    addressed,
    resolve_config,
    storage_url,
    study_dir,
)
from autotune.config.schema import StudyConfig
from autotune.errors import UsageError
from autotune.masking import redact
from autotune.record.stored import study_record
from autotune.review.status import status_text
from autotune.study.storage import (
    STORAGE_ERRORS,
    STUDY_DB,
    default_storage_url,
    load_existing,
    storage_failure,
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `autotune status` and its arguments to the subcommands."""
    p = add_study_command(
        sub,
        "status",
        "print a study's trials",
        "Print a study's trial table, read from its storage (also while it runs).",
    )
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    """Print the study's trial table from its storage, trials whose worker is gone marked, with the
    headline and how the search ended."""
    name, url = _locate(args)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = load_existing(name, url)
        trials = study.get_trials(deepcopy=False)
        attrs = study_record(study)
    except STORAGE_ERRORS as exc:
        raise storage_failure(exc, url, "cannot be read") from exc
    text = status_text(name, redact(url), trials, attrs, _config(args), now=datetime.now())
    sys.stdout.write(text)
    return 0


def _config(args: argparse.Namespace) -> StudyConfig | None:
    """The study file when there is one (its baseline and step); status works without it."""
    try:
        return resolve_config(args)
    except UsageError:
        return None


def _locate(args: argparse.Namespace) -> tuple[str, str]:
    """Study name and storage URL without requiring the study file when the default is used."""
    if args.storage and args.study:
        return args.study, args.storage
    if args.study and args.config is None:
        db = Path(args.results_dir) / args.study / STUDY_DB
        if db.is_file():
            return args.study, default_storage_url(db.parent)
    cfg = resolve_config(args)
    folder = study_dir(cfg, args.results_dir)
    url = storage_url(args, cfg, folder)
    if url == default_storage_url(folder) and not (folder / STUDY_DB).is_file():
        raise UsageError(
            f"study {cfg.name} has no results in {folder}; run "
            f"`autotune run {addressed(args, cfg.name)}`"
        )
    return cfg.name, url
