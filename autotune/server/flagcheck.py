"""Checking a launch command's flags with the server's own argument parser, before launching.

For SGLang the parser is SGLang's (`ServerArgs.add_cli_args`), used only when SGLang is
importable here; for the simulator it is the simulator's copy of SGLang's flag table. Each
problem is one line: an unknown flag (with its new name when SGLang renamed it) or a value the
parser rejects. Without a parser nothing is checked and the list is empty.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

from autotune.sim.flags import build_parser

RENAMED = {
    "--cuda-graph-max-bs": "--cuda-graph-max-bs-decode (SGLang 0.5.14+; the old flag is gone "
    "in 0.5.23)",
    "--cuda-graph-bs": "--cuda-graph-bs-decode (SGLang 0.5.14+)",
}
"""Flags SGLang renamed or removed, with what to use instead."""

ParserFactory = Callable[[], argparse.ArgumentParser | None]


class _Rejected(Exception):
    pass


def sglang_parser() -> argparse.ArgumentParser | None:
    """SGLang's own launch_server parser, or None when SGLang is not importable."""
    try:
        from sglang.srt.server_args import ServerArgs
    except Exception:  # any import failure means: not checkable here
        return None
    parser = argparse.ArgumentParser(prog="sglang.launch_server", add_help=False)
    ServerArgs.add_cli_args(parser)
    return parser


def sim_parser() -> argparse.ArgumentParser | None:

    return build_parser()


def check_argv(
    argv: Sequence[str], *, backend: str, parser_factory: ParserFactory | None = None
) -> list[str]:
    """Problems with the flags in `argv` (everything from the first `--` token on)."""
    factory = parser_factory or (sim_parser if backend == "sim" else sglang_parser)
    parser = factory()
    if parser is None:
        return []
    start = next((i for i, a in enumerate(argv) if a.startswith("--")), len(argv))
    flags = list(argv[start:])

    def reject(message: str) -> None:
        raise _Rejected(message)

    parser.error = reject  # type: ignore[method-assign,assignment]
    # an old flag that is a prefix of its new name must not pass as an abbreviation
    parser.allow_abbrev = False
    problems = []
    try:
        _, unknown = parser.parse_known_args(flags)
    except _Rejected as exc:
        return [f"the server's parser rejects the command: {exc}"]
    except SystemExit:
        return ["the server's parser rejects the command"]
    for token in unknown:
        if not token.startswith("--"):
            continue
        name = token.split("=", 1)[0]
        if name in RENAMED:
            problems.append(f"{name} is not a flag of this SGLang; use {RENAMED[name]}")
        else:
            problems.append(f"{name} is not a flag of this SGLang's launch_server")
    return problems
