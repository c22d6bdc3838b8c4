"""The `autotune` command line: parses arguments, dispatches subcommands, maps errors to exit codes.

Each subcommand lives in the module that owns its noun and registers in `autotune.cli.commands`;
this module only wires them up, so errors become one-line messages with the right exit code.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import cast

import autotune
from autotune import __version__
from autotune.cli.common import HUNG_UP, INTERRUPTED, HungUp
from autotune.cli.streams import tolerant_streams
from autotune.errors import AutotuneError
from autotune.masking import scrub
from autotune.study.storage import STORAGE_ERRORS, first_line

Handler = Callable[[argparse.Namespace], int]
Registrar = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad usage in one line with exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"autotune: error: {message} (see `autotune --help`)\n")
        raise SystemExit(2)


def _registrars() -> list[Registrar]:
    """Subcommand registrars, imported lazily so one broken command cannot break the others."""
    from autotune.cli import commands

    return commands.REGISTRARS


def build_parser() -> argparse.ArgumentParser:
    """The `autotune` parser with every subcommand of `commands.MODULES` registered on it."""
    parser = _Parser(prog="autotune", description=autotune.__doc__)
    parser.add_argument("--version", action="version", version=f"autotune {__version__}")
    sub = cast(
        "argparse._SubParsersAction[argparse.ArgumentParser]",
        parser.add_subparsers(dest="command", required=True, parser_class=_Parser),
    )
    for register in _registrars():
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; standard output and error gone (a closed pipe, a hung-up terminal)
    never stop it (`cli.streams`)."""
    with tolerant_streams():
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except AutotuneError as exc:
        sys.stderr.write(f"autotune: error: {exc}\n")
        return exc.exit_code
    except STORAGE_ERRORS as exc:  # a command that reads the study met a storage gone away
        sys.stderr.write(f"autotune: error: the study storage failed: {scrub(first_line(exc))}\n")
        return 1
    except HungUp:
        sys.stderr.write("autotune: hung up (SIGHUP)\n")
        return HUNG_UP
    except KeyboardInterrupt:
        sys.stderr.write("autotune: interrupted\n")
        return INTERRUPTED


if __name__ == "__main__":
    raise SystemExit(main())
