"""What a launch_server parser makes of some flags: which it knows, under which canonical name,
and what it rejects.

This module runs in two places, so it imports nothing of autotune: inside autotune (on the
simulator's parser, or a test's), and as a script in the study's own Python, where the installed
SGLang is (`python -c <this source> < argvs.json`). Names are resolved by argparse itself
(`_parse_optional`), so abbreviations (`--tp` for `--tp-size`) are accepted exactly when
SGLang's parser accepts them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any


class Rejected(Exception):
    """The parser called `error()`: the message it would print."""


def examine(parser: argparse.ArgumentParser, flags: Sequence[str]) -> dict[str, Any]:
    """What `parser` makes of `flags`: `{"unknown": [names, in order], "ambiguous": {the
    unknown names that abbreviate several flags: message},
    "error": message or None, "canonical": {given: canonical}}`. An unknown or ambiguous flag
    is left out (with its value) before the rest is parsed, so every problem is found at once."""

    def reject(message: str) -> None:
        raise Rejected(message)

    parser.error = reject  # type: ignore[method-assign,assignment]
    unknown: list[str] = []
    ambiguous: dict[str, str] = {}
    canonical: dict[str, str] = {}
    kept: list[str] = []
    skip_value = False
    for token in flags:
        if skip_value and not token.startswith("-"):
            skip_value = False
            continue
        skip_value = False
        if not token.startswith("--"):
            kept.append(token)
            continue
        name = token.split("=", 1)[0]
        try:
            found: Any = parser._parse_optional(token)
        except Rejected as exc:
            unknown.append(name)
            ambiguous[name] = str(exc)
            skip_value = "=" not in token
            continue
        if isinstance(found, list):  # newer Pythons return every match
            found = found[0] if len(found) == 1 else None
        action = found[0] if isinstance(found, tuple) else None
        if action is None:
            unknown.append(name)
            skip_value = "=" not in token
            continue
        kept.append(token)
        primary = next((s for s in action.option_strings if s.startswith("--")), name)
        if primary != name:
            canonical[name] = primary
    error: str | None = None
    try:
        parser.parse_known_args(kept)
    except Rejected as exc:
        error = str(exc)
    except SystemExit:
        error = "the parser exited"
    return {"unknown": unknown, "ambiguous": ambiguous, "error": error, "canonical": canonical}


def sglang_parser() -> tuple[argparse.ArgumentParser, str]:
    """SGLang's launch_server parser and SGLang's version (raises when SGLang is missing)."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang.launch_server", add_help=False)
    ServerArgs.add_cli_args(parser)
    try:
        from importlib.metadata import version

        installed = version("sglang")
    except Exception:
        installed = "unknown"
    return parser, installed


def main() -> int:
    argvs = json.load(sys.stdin)
    try:
        parser, installed = sglang_parser()
    except Exception as exc:  # any import failure means: not checkable with this Python
        json.dump({"missing": f"{type(exc).__name__}: {exc}"}, sys.stdout)
        return 0
    reports = [examine(parser, flags) for flags in argvs]
    json.dump({"version": installed, "reports": reports}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
