"""`autotune init NAME`: a study file from what the operator already has.

Starts from the server's launch command (`--from-cmd "python -m sglang.launch_server …"`), its
systemd unit (`--from-unit sglang.service`: ExecStart, Environment, EnvironmentFile) or one of its
logs (`--from-log server.log`: SGLang prints every argument at startup), or a log with either of
the others (the command for the flags, the log for the memory and the traffic). The study holds
the exact command and every flag, the current memory settings as the baseline, a search space
sized from the log's memory ledger, a workload sketched from its serving lines, and a comment on
where each value came from. It is validated before it is written to `configs/NAME.toml`
(or --out PATH); an existing file is left alone unless --force. See docs/init.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from autotune.bootstrap.study import STEADY_S, Sources, compose, default_out, write_study
from autotune.cli.common import add_documented_command
from autotune.config.studyfile import check_study_name
from autotune.errors import UsageError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `autotune init` and its arguments to the subcommands."""
    p = add_documented_command(
        sub,
        "init",
        "write a study file from a launch command, a systemd unit or a server log",
        __doc__,
    )
    p.add_argument("name", metavar="NAME", help="the study: configs/NAME.toml")
    src = p.add_argument_group("what to start from (a log may come with a command or a unit)")
    src.add_argument("--from-log", type=Path, metavar="LOG", help="an SGLang server log")
    src.add_argument("--from-unit", type=Path, metavar="UNIT", help="a systemd service file")
    src.add_argument("--from-cmd", metavar="CMD", help="the launch command, quoted as one word")
    p.add_argument("--out", type=Path, metavar="PATH", help="where to write (configs/NAME.toml)")
    p.add_argument("--force", action="store_true", help="overwrite an existing file")
    p.add_argument(
        "--steady-s",
        type=float,
        default=STEADY_S,
        metavar="SECONDS",
        help=f"how long each trial's steady load runs (default {STEADY_S:g})",
    )
    p.add_argument(
        "--sim-profile", metavar="NAME", help="server.sim_profile for rehearsals (--backend sim)"
    )
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    """Compose the study from `--from-log`/`--from-unit`/`--from-cmd`, validate it and write it to
    `--out` (default `configs/NAME.toml`), an existing file kept unless `--force`."""
    name = check_study_name(args.name)
    out: Path = args.out or default_out(name)
    if out.exists() and not args.force:
        raise UsageError(f"{out} exists; pass --force to overwrite it, or --out PATH")
    if not args.steady_s > 0:
        raise UsageError(f"--steady-s must be > 0; got {args.steady_s:g}")
    draft = compose(
        Sources(
            name=name,
            from_log=args.from_log,
            from_unit=args.from_unit,
            from_cmd=args.from_cmd,
            steady_s=args.steady_s,
            sim_profile=args.sim_profile,
        )
    )
    write_study(draft, out, name=name, force=args.force)
    for warning in draft.warnings:
        sys.stderr.write(f"autotune: warning: {warning}\n")
    sys.stdout.write(f"wrote {out}: {draft.summary}\n")
    sys.stdout.write(f"check it (the workload above all), then: autotune run --config {out}\n")
    return 0
