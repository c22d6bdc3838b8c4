"""Every flag a launch_server parser declares: its option strings, destination, default and arity.

Like `server.flagprobe`, this module runs in two places, so it imports nothing of autotune:
inside autotune on the simulator's parser (`describe`), and as a script in the study's own Python,
where the installed SGLang is (`python -c <this source>`), printing one JSON object. `init` needs
the defaults to tell the flags an operator gave from the values SGLang printed for all the others.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

MARK = "autotune-argsprobe:"
"""Printed before the JSON object, so whatever SGLang prints to stdout on import is skipped."""


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
    """One entry per optional argument: `{dest, options, default, nargs, const}`; `nargs` is
    0 for a flag without a value, "+"/"*"/"?"/N as argparse has it, 1 for one value."""
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


def main() -> int:
    try:
        from sglang.srt.server_args import ServerArgs

        parser = argparse.ArgumentParser(prog="sglang.launch_server", add_help=False)
        ServerArgs.add_cli_args(parser)
    except Exception as exc:  # any import failure means: not readable with this Python
        sys.stdout.write(MARK + json.dumps({"missing": f"{type(exc).__name__}: {exc}"}))
        return 0
    try:
        from importlib.metadata import version

        installed = version("sglang")
    except Exception:
        installed = "unknown"
    sys.stdout.write(MARK + json.dumps({"version": installed, "flags": describe(parser)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
