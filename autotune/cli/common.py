"""What the subcommands share: the study arguments, locating a study, where a worker works and
what it holds while it does (`worker_place`, `worker_held`), and stop signals.

Only argparse lives here: every subcommand turns its arguments into values once, with
these helpers, and hands the values to the subsystem that does the work.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from autotune.config.schema import BACKENDS, SAMPLERS, StudyConfig
from autotune.config.studyfile import SHIPPED_STUDIES, find_study_file, load_study
from autotune.errors import UsageError
from autotune.masking import redact
from autotune.review.source import Review, Source, open_source, review_of
from autotune.review.winner import DEFAULT_TOLERANCE, Margin, parse_margin, parse_tolerance
from autotune.study.runner import study_lock
from autotune.study.storage import default_storage_url, probe_storage
from autotune.study.workers import gpu_claim, gpu_group, worker_folder, worker_gpus
from autotune.trial.signals import STOP_SIGNALS, first_received, forget, received

PACKAGE_CONFIGS = SHIPPED_STUDIES


def add_study_args(p: argparse.ArgumentParser) -> None:
    """The arguments that name a study and where it lives (`--study`, `--config`, `--storage`,
    `--results-dir`), the same for every subcommand that opens one."""
    p.add_argument("--study", metavar="NAME", help="configs/NAME.toml; also the results folder")
    p.add_argument(
        "--config", type=Path, metavar="PATH", help="study file (default configs/NAME.toml)"
    )
    p.add_argument(
        "--storage", metavar="URL", help="Optuna storage URL (default results/NAME/study.db)"
    )
    p.add_argument(
        "--results-dir",
        type=Path,
        metavar="DIR",
        default=Path("results"),
        help="where the study's folder NAME/ goes (default results)",
    )


def add_study_command(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    help: str,
    description: str | None,
    *,
    backend: bool = False,
) -> argparse.ArgumentParser:
    """The subcommand `name` of those that open a study by its arguments (`add_study_args`; with
    `backend`, `--backend` too): the parser, for the subcommand to add its own arguments."""
    p = sub.add_parser(name, help=help, description=description)
    add_study_args(p)
    if backend:
        add_backend_arg(p)
    return p


def add_documented_command(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str, help: str, doc: str | None
) -> argparse.ArgumentParser:
    """The subcommand `name` whose `--help` is its module's whole `doc`, laid out as written."""
    return sub.add_parser(
        name, help=help, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def add_backend_arg(p: argparse.ArgumentParser) -> None:
    """`--backend`: the subcommands that launch a server may override `server.backend`
    (`resolve_config` applies it)."""
    p.add_argument("--backend", choices=BACKENDS, help="override server.backend")


def add_fraction_arg(p: argparse.ArgumentParser, help: str) -> None:
    """`--fraction F`, repeatable: further mem_fraction_static values to say what they would give
    (read back with `fractions`)."""
    p.add_argument("--fraction", type=float, action="append", metavar="F", help=help)


def fractions(args: argparse.Namespace) -> list[float]:
    """The `--fraction` values, each checked to lie strictly between 0 and 1."""
    values: list[float] = args.fraction or []
    for f in values:
        if not 0.0 < f < 1.0:
            raise UsageError(f"--fraction {f:g}: must be between 0 and 1")
    return values


def resolve_config(args: argparse.Namespace) -> StudyConfig:
    """The study file named by --config or --study, with the command line's overrides applied."""
    if args.config is None and not args.study:
        raise UsageError("name a study: --study NAME (configs/NAME.toml) or --config PATH")
    path = args.config or find_study_file(args.study, [Path("configs"), PACKAGE_CONFIGS])
    cfg = load_study(path, name=args.study or None)
    backend = getattr(args, "backend", None)
    if backend:
        cfg = dataclasses.replace(cfg, server=dataclasses.replace(cfg.server, backend=backend))
    sampler = getattr(args, "sampler", None)
    if sampler:
        if sampler not in SAMPLERS:
            raise UsageError(f"--sampler {sampler}: unknown; use one of {', '.join(SAMPLERS)}")
        cfg = dataclasses.replace(cfg, sampler=dataclasses.replace(cfg.sampler, name=sampler))
    n_trials = getattr(args, "n_trials", None)
    if n_trials is not None:
        if n_trials < 1:
            raise UsageError(f"--n-trials {n_trials}: must be ≥ 1")
        cfg = dataclasses.replace(cfg, budget=dataclasses.replace(cfg.budget, n_trials=n_trials))
    timeout = getattr(args, "timeout", None)
    if timeout is not None:
        if not timeout > 0:
            raise UsageError(f"--timeout {timeout:g}: must be > 0 seconds")
        cfg = dataclasses.replace(cfg, budget=dataclasses.replace(cfg.budget, timeout_s=timeout))
    return cfg


def study_dir(cfg: StudyConfig, results_dir: Path) -> Path:
    """The study's results folder, `results/NAME/` under `--results-dir`: its storage, lock and
    trials."""
    return results_dir / cfg.name


def storage_url(args: argparse.Namespace, cfg: StudyConfig, folder: Path) -> str:
    """The storage to open: `--storage`, else the study file's `storage`, else the SQLite file in
    the study's folder."""
    return str(args.storage or cfg.storage or default_storage_url(folder))


def probed_storage_url(args: argparse.Namespace, cfg: StudyConfig, folder: Path) -> str:
    """`storage_url`, probed first when it is not the study folder's own SQLite file: a bad
    `--storage` fails before anything is written."""
    url = storage_url(args, cfg, folder)
    if url != default_storage_url(folder):
        probe_storage(url)
    return url


@dataclasses.dataclass(frozen=True)
class WorkerPlace:
    """Where a worker of a study (`run`, `check`) works: the study's folder, its storage and this
    worker's own folder in it (`study.workers.worker_folder`, by its GPU group)."""

    study_folder: Path
    url: str
    folder: Path


def worker_place(args: argparse.Namespace, cfg: StudyConfig) -> WorkerPlace:
    """The study's folder under `--results-dir`, its storage probed (`probed_storage_url`: a bad
    `--storage` fails before anything is written) and the worker's folder; nothing is made."""
    study_folder = study_dir(cfg, args.results_dir)
    url = probed_storage_url(args, cfg, study_folder)
    return WorkerPlace(study_folder, url, worker_folder(study_folder, gpu_group(cfg.server.env)))


def make_worker_folder(args: argparse.Namespace, folder: Path) -> None:
    """Create the worker's `folder` with its parents; one that cannot be made is a `UsageError`
    naming `--results-dir`."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"--results-dir {args.results_dir}: cannot create {folder}: {exc}"
        ) from exc


INTERRUPTED = 130
"""The exit code of a run stopped by Ctrl-C (SIGINT) or SIGTERM, the trial recorded first."""
HUNG_UP = 129
"""The exit code of a run stopped by SIGHUP (128 + 1, the shell's own for a hang-up): the
terminal or SSH session it ran in went away; the trial is recorded first, as for Ctrl-C."""


class HungUp(KeyboardInterrupt):
    """Raised by SIGHUP's handler: a stop like Ctrl-C's, which `cli.main` ends with `HUNG_UP`."""


class Stopped:
    """Which stop signal came first while `stop_signals` held (`trial.signals.first_received`:
    the teardown holds one until the server is stopped, and notes it there)."""

    @property
    def signum(self) -> int | None:
        """The first stop signal received while `stop_signals` held, None when there was none."""
        return first_received()

    def exit_code(self, code: int) -> int:
        """`code`, except that a run ended by SIGHUP (130, interrupted) exits with 129."""
        if code == INTERRUPTED and self.signum == signal.SIGHUP:
            return HUNG_UP
        return code


@contextmanager
def stop_signals() -> Iterator[Stopped]:
    """Ctrl-C (SIGINT), `systemctl stop` (SIGTERM) and a hang-up (SIGHUP: the SSH session or
    terminal went away) stop the run cleanly: the server is stopped and the trial recorded
    first (`trial.signals.STOP_SIGNALS`). SIGINT is handled even when the shell started us with it
    ignored (a background job), so `kill -INT` always works; SIGHUP ignored at the start
    (`nohup autotune run …`) stays ignored."""
    forget()

    def interrupt(signum: int, frame: object) -> None:
        received(signum)
        raise HungUp if signum == signal.SIGHUP else KeyboardInterrupt

    previous = {signal.SIGINT: signal.signal(signal.SIGINT, interrupt)}
    for signum in STOP_SIGNALS:
        if signum not in previous and signal.getsignal(signum) is not signal.SIG_IGN:
            previous[signum] = signal.signal(signum, interrupt)
    try:
        yield Stopped()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextmanager
def worker_held(cfg: StudyConfig, place: WorkerPlace) -> Iterator[Stopped]:
    """What a worker that launches servers holds while it works: the lock on its folder
    (`study.runner.study_lock`), the claim on its GPUs (`study.workers.gpu_claim`) and the stop
    signals (`stop_signals`, which it yields)."""
    with (
        study_lock(place.folder),
        gpu_claim(place.study_folder, worker_gpus(cfg), cfg.name),
        stop_signals() as stopped,
    ):
        yield stopped


def add_review_command(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str, help: str, doc: str | None
) -> argparse.ArgumentParser:
    """The subcommand `name` of those that read a finished study (report, explain, export,
    confirm): described by the first line of its module's `doc`, with the study arguments plus
    the winner's `--tolerance` and `--margin`."""
    p = add_study_command(sub, name, help, doc.splitlines()[0] if doc else None)
    p.add_argument(
        "--tolerance",
        default=str(DEFAULT_TOLERANCE),
        metavar="FRACTION",
        help="winner: throughput within this fraction of the best feasible (default 0.05)",
    )
    p.add_argument(
        "--margin",
        default="soak",
        metavar="MARGIN",
        help="winner: back off mem_fraction_static until the setting passes a confirm soak "
        "as long as the trials' growth asks for (soak, the default), by N steps (1step) or "
        "until N GiB stay free at the stress peak (2GiB)",
    )
    return p


def locate(args: argparse.Namespace, *, need_config: bool = False) -> Source:
    """The study named on the command line, opened for review, with its study file when found."""
    if not args.study and args.config is None:
        raise UsageError("name a study: --study NAME (configs/NAME.toml) or --config PATH")
    cfg: StudyConfig | None = None
    try:
        cfg = resolve_config(args)
    except UsageError:
        if need_config or args.config is not None:
            raise
    name = cfg.name if cfg is not None else str(args.study)
    folder = Path(args.results_dir) / name
    if cfg is not None:
        folder = study_dir(cfg, args.results_dir)
        url = storage_url(args, cfg, folder)
    else:
        url = str(args.storage or default_storage_url(folder))
    return open_source(name, url, folder, cfg, addressed(args, name))


def addressed(args: argparse.Namespace, name: str) -> str:
    """The arguments that name the study as the operator named it (`--config PATH`, a
    `--results-dir` other than the default, `--storage` with its password masked), for the
    commands autotune tells them to run next; `--study NAME` alone where that is all it took."""
    parts = ["--config", str(args.config)] if args.config is not None else ["--study", name]
    if Path(args.results_dir) != Path("results"):
        parts += ["--results-dir", str(args.results_dir)]
    if args.storage:
        parts += ["--storage", redact(str(args.storage))]
    return shlex.join(parts)


def winner_rule(args: argparse.Namespace) -> tuple[float, Margin]:
    """--tolerance and --margin as values."""
    return (
        parse_tolerance(str(getattr(args, "tolerance", DEFAULT_TOLERANCE))),
        parse_margin(str(getattr(args, "margin", "soak"))),
    )


def review(args: argparse.Namespace, *, need_config: bool = False) -> tuple[Source, Review]:
    """The study named on the command line, read, with the command line's winner rule."""
    source = locate(args, need_config=need_config)
    tolerance, margin = winner_rule(args)
    return source, review_of(source, tolerance=tolerance, margin=margin)
