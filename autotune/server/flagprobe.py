"""SGLang's launch_server parser, read in the Python that runs SGLang: every flag it declares
(`describe`), and what it makes of some flags (`examine`: which it knows, under which canonical
name, what it rejects).

This module runs in two places, so what the script needs imports nothing of autotune: inside
autotune (on the simulator's parser, or a test's), and as a script in the study's own Python,
where the installed SGLang is. `run_in` is the one runner: it starts `python -c <this source>`,
sends one request on stdin (`{"describe": true}` or `{"examine": [flags, …]}`) and reads one
JSON object back from after `MARK`, so whatever SGLang prints to stdout on import is skipped.
Names are resolved by argparse itself (`_parse_optional`), so abbreviations (`--tp` for
`--tp-size`) are accepted exactly when SGLang's parser accepts them. `server.flagcheck` checks
commands with it; `bootstrap.flagtable` reads the flag table (`init` needs the defaults to tell
the flags an operator gave from the values SGLang printed for all the others).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

MARK = "autotune-flagprobe:"
"""Printed before the answer, so whatever SGLang prints to stdout on import is skipped."""

PROBE_TIMEOUT_S = 180.0
"""Importing SGLang loads torch: seconds on a warm box, a minute on a cold disk."""


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


def _plain(value: Any) -> Any:
    """`value` if JSON holds it as it is, else its repr (an enum, a callable): never equal to a
    logged literal, so such a flag is never dropped as "the default"."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple) and all(
        v is None or isinstance(v, bool | int | float | str) for v in value
    ):
        return list(value)
    return {"repr": repr(value)}


def describe(parser: argparse.ArgumentParser) -> list[dict[str, Any]]:
    """One entry per optional argument: `{dest, options, default, nargs, const, negatable}`;
    `nargs` is 0 for a flag without a value, "+"/"*"/"?"/N as argparse has it, 1 for one
    value."""
    out: list[dict[str, Any]] = []
    for action in parser._actions:
        longs = [s for s in action.option_strings if s.startswith("--")]
        if not longs or isinstance(action, argparse._HelpAction):
            continue
        nargs: Any = action.nargs
        if nargs is None:
            nargs = 1
        out.append(
            {
                "dest": action.dest,
                "options": longs,
                "default": _plain(action.default),
                "nargs": nargs,
                "const": _plain(action.const),
                "negatable": isinstance(action, argparse.BooleanOptionalAction),
            }
        )
    return out


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


def answer(request: Mapping[str, Any]) -> dict[str, Any]:
    """The answer to one request, read with the installed SGLang's parser: `{"version",
    "flags"}` (describe), `{"version", "reports"}` (examine), or `{"missing": why}` when SGLang
    does not import."""
    try:
        parser, installed = sglang_parser()
    except Exception as exc:  # any import failure means: not readable with this Python
        return {"missing": f"{type(exc).__name__}: {exc}"}
    out: dict[str, Any] = {"version": installed}
    if request.get("describe"):
        out["flags"] = describe(parser)
    argvs = request.get("examine")
    if isinstance(argvs, list):
        out["reports"] = [examine(parser, flags) for flags in argvs]
    return out


def run_in(python: str, request: Mapping[str, Any]) -> dict[str, Any] | None:
    """`answer(request)` computed by `python` (this module's source run there); None when it
    cannot run there (no such Python, a timeout, no answer after `MARK`)."""
    script = Path(__file__).read_text(encoding="utf-8")
    try:
        done = subprocess.run(
            [python, "-c", script],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    at = done.stdout.rfind(MARK)
    if at < 0:
        return None
    try:
        raw, _ = json.JSONDecoder().raw_decode(done.stdout, at + len(MARK))
    except ValueError:
        return None
    return raw if isinstance(raw, dict) else None


def main() -> int:
    """The script: one request on stdin, `MARK` and the answer on stdout."""
    request = json.load(sys.stdin)
    sys.stdout.write(MARK + json.dumps(answer(request if isinstance(request, dict) else {})))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
