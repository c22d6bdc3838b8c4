"""`autotune status`: the trial table of a study, read from its storage (works while it runs)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import optuna
from sqlalchemy.exc import SQLAlchemyError

from autotune.cli.common import add_study_args, resolve_config, storage_url, study_dir
from autotune.config.studyfile import StudyConfig
from autotune.errors import HarnessError, UsageError
from autotune.masking import redact
from autotune.review.headline import headline
from autotune.review.source import build_review
from autotune.review.status import render
from autotune.study.storage import STUDY_DB, default_storage_url, load_existing


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "status",
        help="print a study's trials",
        description="Print a study's trial table, read from its storage (also while it runs).",
    )
    add_study_args(p)
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    name, url = _locate(args)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = load_existing(name, url)
        trials = study.get_trials(deepcopy=False)
        attrs = study.user_attrs
    except SQLAlchemyError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise HarnessError(f"cannot read the study storage {redact(url)}: {first}") from exc
    review = build_review(name, redact(url), trials, cfg=_config(args), study_attrs=attrs)
    text = render(name, redact(url), trials, headline=headline(review))
    sys.stdout.write(review.scrub(text))
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
            f"study {cfg.name} has no results in {folder}; run `autotune run --study {cfg.name}`"
        )
    return cfg.name, url
