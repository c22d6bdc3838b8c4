"""`autotune run`: the overnight study loop, from a study file to a finished Optuna study.

This is the composition root: it resolves the study file and overrides, opens the storage,
recovers what a killed run left behind, then asks, runs and tells until the budget is spent.
Everything it writes lives under `results/NAME/` (or --results-dir): `study.db`, and per trial
`trials/NNNN/server.log` and `trial.json`.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from autotune.cli import common
from autotune.config.schema import SAMPLERS
from autotune.errors import UsageError
from autotune.server.hostcheck import check_host
from autotune.study.runner import run
from autotune.study.workers import with_worker_args
from autotune.trial.live import live_launcher


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `autotune run` and its arguments, the per-worker overrides among them, to the
    subcommands."""
    p = common.add_study_command(
        sub,
        "run",
        "run (or resume) a study: launch, load and record servers until the budget is spent",
        "Run a study; re-running the same command resumes it.",
        backend=True,
    )
    p.add_argument("--n-trials", type=int, metavar="N", help="trials to finish (budget.n_trials)")
    p.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="no trial starts that would end after this long (by the trials timed so far)",
    )
    p.add_argument(
        "--sampler", metavar="NAME", help=f"override sampler.name ({', '.join(SAMPLERS)})"
    )
    w = p.add_argument_group("workers sharing one study (see docs/workers.md)")
    w.add_argument(
        "--gpus",
        metavar="LIST",
        help="this worker's GPU group, e.g. 0,1,2,3 (CUDA_VISIBLE_DEVICES)",
    )
    w.add_argument("--port", type=int, metavar="N", help="this worker's server port (server.port)")
    w.add_argument(
        "--heartbeat-s", type=int, metavar="S", help="heartbeat interval (storage.heartbeat_s)"
    )
    w.add_argument(
        "--grace-s",
        type=int,
        metavar="S",
        help="fail another worker's trial after this long without its heartbeat (storage.grace_s)",
    )
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    """Run the study: resolve its config and this worker's overrides, make its folder, hold its lock
    and GPU claim, and ask, run and tell trials until the budget is spent; a `UsageError` takes back
    the folders it made."""

    cfg = with_worker_args(
        common.resolve_config(args),
        gpus=args.gpus,
        port=args.port,
        heartbeat_s=args.heartbeat_s,
        grace_s=args.grace_s,
    )

    for note in check_host(cfg):
        sys.stdout.write(f"note: {note}\n")
    place = common.worker_place(args, cfg)
    folder = place.folder
    launcher = live_launcher(cfg, folder)  # refuses what it cannot launch before anything is made
    made = [p for p in (folder, *folder.parents) if not p.exists()]
    common.make_worker_folder(args, folder)
    try:
        with common.worker_held(cfg, place) as stopped:
            return stopped.exit_code(run(cfg, folder, place.url, launcher, sys.stdout))
    except UsageError:
        _undo(folder, made)
        raise


def _undo(folder: Path, made: list[Path]) -> None:
    """Bad input found once the folder existed (a study of another backend, other objectives):
    take back the lock and the folders this run made, so nothing is left written."""
    lock = folder / "run" / "autotune.lock"
    if made and lock.exists():
        lock.unlink(missing_ok=True)
    for path in [folder / "run", *made]:
        with contextlib.suppress(OSError):  # only empty folders go
            path.rmdir()
