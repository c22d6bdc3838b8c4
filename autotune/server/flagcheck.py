"""Checking a launch command's flags with the server's own argument parser, before launching.

For SGLang the parser is SGLang's (`ServerArgs.add_cli_args`) in the study's own Python (the
one `server.command` runs), reached by running `flagprobe`'s source there once for every command to
check; for the simulator it is the simulator's flag table. Each problem is one line: an unknown
flag (with its new name when SGLang renamed it) or a value the parser rejects. A flag SGLang
accepts under another spelling (an abbreviation such as `--tp`, or an alias) is fine, and the
report names its canonical spelling, which exports use. Without a parser nothing is checked.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from autotune.config.command import console_script, in_container, interpreter, program_end
from autotune.server import flagprobe
from autotune.sim.flags import build_parser
from autotune.sim.profiles import ProfileError, load_profile

RENAMED = {
    "--cuda-graph-max-bs": "--cuda-graph-max-bs-decode (SGLang 0.5.14+; the old flag is gone "
    "in 0.5.23)",
    "--cuda-graph-bs": "--cuda-graph-bs-decode (SGLang 0.5.14+)",
}
"""Flags SGLang renamed or removed, with what to use instead."""

ParserFactory = Callable[[], argparse.ArgumentParser | None]


@dataclass(frozen=True)
class FlagReport:
    """What the server's parser said about one command line."""

    problems: tuple[str, ...] = ()
    canonical: Mapping[str, str] = field(default_factory=dict)
    """Given spelling → the parser's canonical one, where they differ (`--tp` → `--tp-size`)."""
    checked_by: str = ""
    """Whose parser checked it (`SGLang 0.5.23 (/usr/bin/python3)`), "" when none could."""


def sim_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser | None:
    """The simulator's parser for the release the command asks for (`--sim-version`, else its
    profile's `sglang_version`)."""
    return build_parser(_sim_release(list(argv)))


def _sim_release(argv: list[str]) -> str | None:
    def value(flag: str) -> str | None:
        for i, token in enumerate(argv):
            if token == flag and i + 1 < len(argv):
                return argv[i + 1]
            if token.startswith(flag + "="):
                return token.split("=", 1)[1]
        return None

    version = value("--sim-version")
    if version:
        return version
    profile = value("--sim-profile")
    try:
        return load_profile(profile).sglang_version if profile else None
    except (ProfileError, OSError):
        return None


def sglang_python(argv: Sequence[str]) -> str | None:
    """The Python that runs SGLang for this command: the one it names (`PY -m
    sglang.launch_server`, behind any wrapper), or the one SGLang's console script starts
    (`sglang serve`: its `#!` line); None where it names neither or runs in a container, whose
    Python this host cannot ask."""
    program = argv[: program_end(argv)]
    if in_container(program):
        return None
    named = interpreter(program)
    if named is not None:
        return named
    script = console_script(program)
    return _script_python(script) if script is not None else None


_PIP_SH_LAUNCHER = re.compile(r"""^'''exec' "?([^" ]+)"? """)
"""pip's launcher for a script whose interpreter path is too long for `#!`: `#!/bin/sh`, then
`'''exec' "/long/path/python" "$0" "$@"`."""


def _script_python(script: str) -> str | None:
    """The interpreter a console script's first line starts (`#!/opt/venv/bin/python`,
    `#!/usr/bin/env python3`, or pip's `#!/bin/sh` launcher)."""
    path = shutil.which(script)
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            head = [f.readline(1024), f.readline(1024)]
    except OSError:
        return None
    words = head[0][2:].split() if head[0].startswith("#!") else []
    if not words:
        return None
    if os.path.basename(words[0]) == "env":
        rest = [w for w in words[1:] if not w.startswith("-")]
        return rest[0] if rest else None
    if os.path.basename(words[0]) == "sh":
        m = _PIP_SH_LAUNCHER.match(head[1])
        return m.group(1) if m else None
    return words[0]


def study_python(argv: Sequence[str]) -> str | None:
    """The Python whose SGLang checks this command's flags (`sglang_python`, else this one);
    None where the server runs in a container."""
    if in_container(argv[: program_end(argv)]):
        return None
    return sglang_python(argv) or sys.executable


def flags_of(argv: Sequence[str]) -> list[str]:
    """The server's flags: what follows the program (`autotune.config.command.program_end`), so
    a wrapper's own flags are not taken for SGLang's."""
    return list(argv[program_end(argv) :])


def inspect_argvs(
    argvs: Sequence[Sequence[str]],
    *,
    backend: str,
    parser_factory: ParserFactory | None = None,
) -> list[FlagReport]:
    """One report per command line, all checked by one parser (one SGLang import)."""
    if not argvs:
        return []
    if parser_factory is not None:
        parser = parser_factory()
        if parser is None:
            return [FlagReport() for _ in argvs]
        return [_report(flagprobe.examine(parser, flags_of(a)), "the given parser") for a in argvs]
    if backend == "sim":
        return [_sim_report(a) for a in argvs]
    python = study_python(argvs[0])
    if python is None:
        return [FlagReport() for _ in argvs]
    raw = _probe(python, [flags_of(a) for a in argvs])
    if raw is None or "reports" not in raw:
        return [FlagReport() for _ in argvs]
    who = f"SGLang {raw.get('version', '?')} ({python})"
    reports = raw["reports"]
    return [_report(r, who) for r in (reports if isinstance(reports, list) else [])]


def _sim_report(argv: Sequence[str]) -> FlagReport:
    parser = sim_parser(argv)
    if parser is None:
        return FlagReport()
    return _report(flagprobe.examine(parser, flags_of(argv)), "the simulator's flag table")


def inspect_argv(
    argv: Sequence[str], *, backend: str, parser_factory: ParserFactory | None = None
) -> FlagReport:
    """The report on one command line (`inspect_argvs` with one): its problems and canonical
    spellings."""
    return inspect_argvs([argv], backend=backend, parser_factory=parser_factory)[0]


def check_argv(
    argv: Sequence[str], *, backend: str, parser_factory: ParserFactory | None = None
) -> list[str]:
    """Problems with the flags in `argv` (everything from the first `--` token on)."""
    return list(inspect_argv(argv, backend=backend, parser_factory=parser_factory).problems)


def canonical_argv(argv: Sequence[str], canonical: Mapping[str, str]) -> tuple[str, ...]:
    """`argv` with each of the server's flags spelled the way the parser names it (the program
    and its wrapper's flags as they are)."""
    start = program_end(argv)
    out = list(argv[:start])
    for token in argv[start:]:
        name, eq, value = token.partition("=")
        if token.startswith("--") and name in canonical:
            token = canonical[name] + eq + value
        out.append(token)
    return tuple(out)


def _report(raw: Mapping[str, object], who: str) -> FlagReport:
    problems: list[str] = []
    error = raw.get("error")
    if error:
        problems.append(f"the server's parser rejects the command: {error}")
    unknown = raw.get("unknown")
    ambiguous = raw.get("ambiguous")
    for name in unknown if isinstance(unknown, list) else []:
        if name in RENAMED:
            problems.append(f"{name} is not a flag of this SGLang; use {RENAMED[name]}")
        elif isinstance(ambiguous, dict) and name in ambiguous:
            problems.append(f"{name} is not a flag of this SGLang's launch_server "
                            f"({ambiguous[name]})")  # fmt: skip
        else:
            problems.append(f"{name} is not a flag of this SGLang's launch_server")
    canonical = raw.get("canonical")
    return FlagReport(
        problems=tuple(problems),
        canonical=dict(canonical) if isinstance(canonical, dict) else {},
        checked_by=who,
    )


def _probe(python: str, flag_lists: list[list[str]]) -> dict[str, object] | None:
    """`flagprobe` run by `python` on `flag_lists`; None when it cannot run there."""
    return flagprobe.run_in(python, {"examine": flag_lists})
