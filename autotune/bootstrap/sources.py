"""The operator's launch command, read from a command line or a systemd unit.

A command is split the way a shell would (`shlex`), after joining backslash-continued lines. The
program is everything up to SGLang's entry point (`/opt/venv/bin/python -m sglang.launch_server`,
`sglang serve`, with any wrapper before it and the wrapper's own flags), or before the first `--`
token where no entry point is named; leading `NAME=value` words and an `env` prefix become the
server's environment; a `bash -c "exec …"` wrapper is unwrapped. Every flag is kept in order
with its value exactly as given: a number only becomes a TOML number when it prints back the same
(`0.88`, `8`, not `1e-5` or `007`), a flag without a value is a bare flag, several values a list,
and a flag given twice keeps its last value, as argparse does.

A unit (systemd.service(5), systemd.syntax(7)) gives its `[Service]` `ExecStart=` (the last one
after an empty reset; the one naming sglang when there are several), with line continuations,
comments inside them, the `-`, `@`, `:`, `+`, `!` prefixes (`@` names argv[0] apart from the
program), `$NAME` and `${NAME}` from its environment, `Environment=` (quoted assignments) and
`EnvironmentFile=` (a leading `-`: optional), whose settings override `Environment=` as systemd
has it. `WorkingDirectory=` and `User=` become notes: autotune runs the command where it is
started, as whoever starts it.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from autotune.config.command import own_network, program_end
from autotune.config.schema import FlagValue, Scalar
from autotune.config.space import render
from autotune.errors import UsageError

_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.DOTALL)
_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|API_?KEY|CREDENTIAL|PRIVATE", re.IGNORECASE)
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")
_SHELLS = ("sh", "bash", "dash", "zsh")


@dataclass(frozen=True)
class Launch:
    """One launch command, split into what a study file holds."""

    command: tuple[str, ...]
    """The program part: everything before the first flag."""
    flags: tuple[tuple[str, FlagValue], ...]
    """Every flag in order, named as given without the leading dashes."""
    env: tuple[tuple[str, str], ...] = ()
    secret_env: tuple[str, ...] = ()
    """Environment variables the source set that look like secrets: not copied."""
    origin: str = "the command line"
    notes: tuple[str, ...] = field(default_factory=tuple)
    """Comment lines about what could not be kept as it was."""


def is_secret_name(name: str) -> bool:
    """Whether an environment variable's name looks like it holds a secret (token, password, API key
    …): such values are never copied into a study."""
    return bool(_SECRET_NAME.search(name))


def scalar(text: str) -> Scalar:
    """`text` as an int or float when it prints back exactly the same, else the string."""
    if re.fullmatch(r"-?\d+", text):
        number: Scalar = int(text)
    elif re.fullmatch(r"-?\d+\.\d+", text):
        number = float(text)
    else:
        return text
    return number if render(number) == text else text


def split_flags(tokens: Sequence[str]) -> tuple[list[tuple[str, FlagValue]], list[str], list[str]]:
    """`--name value…` tokens as (name, value) pairs in order; also the stray tokens (not after a
    flag) and the names given more than once (the last value kept)."""
    pairs: dict[str, FlagValue] = {}
    order: list[str] = []
    stray: list[str] = []
    repeated: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if not token.startswith("--") or token == "--":
            stray.append(token)
            continue
        name, eq, inline = token[2:].partition("=")
        values: list[str] = [inline] if eq else []
        if not eq:
            while i < len(tokens) and not tokens[i].startswith("--"):
                values.append(tokens[i])
                i += 1
        value: FlagValue
        if not values:
            value = True
        elif len(values) == 1:
            value = scalar(values[0])
        else:
            value = tuple(scalar(v) for v in values)
        if name in pairs:
            repeated.append(name)
            order.remove(name)
        pairs[name] = value
        order.append(name)
    return [(n, pairs[n]) for n in order], stray, repeated


def _split(text: str, what: str) -> list[str]:
    try:
        return shlex.split(text.replace("\\\r\n", " ").replace("\\\n", " "), comments=False)
    except ValueError as exc:
        raise UsageError(f"{what}: cannot split it into words ({exc}); check its quotes") from None


def _unwrap(words: list[str], env: dict[str, str], what: str) -> list[str]:
    """Leading assignments and `env` into `env`; `bash -c "exec …"` into its own words."""
    for _ in range(4):
        while words and _ASSIGNMENT.match(words[0]):
            m = _ASSIGNMENT.match(words[0])
            assert m is not None
            env[m.group(1)] = m.group(2)
            words = words[1:]
        if words and os.path.basename(words[0]) == "env":
            words = words[1:]
            while words and words[0].startswith("-"):
                words = words[1:]
            continue
        if (
            len(words) >= 3
            and os.path.basename(words[0]) in _SHELLS
            and words[1] in ("-c", "-lc", "-ec")
        ):
            words = _split(words[2], what)
            continue
        if words and words[0] == "exec":
            words = words[1:]
            continue
        break
    return words


def launch_from_words(
    words: Sequence[str],
    *,
    origin: str,
    env: Mapping[str, str] | None = None,
    notes: Iterable[str] = (),
) -> Launch:
    """A `Launch` from a command already split into words."""
    environment = dict(env or {})
    rest = _unwrap(list(words), environment, origin)
    start = program_end(rest)
    program = tuple(rest[:start])
    if not program:
        raise UsageError(f"{origin}: no program before the flags; give the whole command")
    if start == len(rest):
        raise UsageError(
            f"{origin}: {' '.join(program)!r} has no --flags; give the server's launch command "
            "(python -m sglang.launch_server --model-path …)"
        )
    flags, stray, repeated = split_flags(rest[start:])
    out_notes = list(notes)
    if not any("sglang" in w for w in program):
        out_notes.append(
            f"the program ({' '.join(program)}) does not name sglang; autotune runs it as given"
        )
    if own_network(program):
        out_notes.append(
            f"the server runs in a container ({' '.join(program[:2])}) with a network of its own: "
            "autotune binds each trial's server to server.host and a free port, which the "
            "container does not publish; add --network host to the command by hand"
        )
    if stray:
        out_notes.append(f"words that follow no flag were left out: {' '.join(stray)}")
    for name in dict.fromkeys(repeated):
        out_notes.append(f"--{name} is given more than once; the last value is kept")
    secret = tuple(k for k in environment if is_secret_name(k))
    return Launch(
        command=program,
        flags=tuple(flags),
        env=tuple((k, v) for k, v in environment.items() if k not in secret),
        secret_env=secret,
        origin=origin,
        notes=tuple(out_notes),
    )


def launch_from_command(text: str) -> Launch:
    """`--from-cmd "python -m sglang.launch_server …"`."""
    words = _split(text, "--from-cmd")
    if not words:
        raise UsageError("--from-cmd: empty; give the server's launch command")
    return launch_from_words(words, origin="the command line")


# ------------------------------------------------------------------------------------------------
# systemd units
# ------------------------------------------------------------------------------------------------


def unit_lines(text: str) -> list[tuple[str, str, str]]:
    """(section, key, value) for every assignment, continuations joined, comments dropped."""
    out: list[tuple[str, str, str]] = []
    section = ""
    pending: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if pending and line[:1] in ("#", ";"):
            continue  # a comment inside a continuation is skipped
        if not pending and (not line or line[:1] in ("#", ";")):
            continue
        if line.endswith("\\"):
            pending.append(line[:-1])
            continue
        pending.append(line)
        joined = " ".join(p.strip() for p in pending).strip()
        pending = []
        if joined.startswith("[") and joined.endswith("]"):
            section = joined[1:-1].strip()
            continue
        key, eq, value = joined.partition("=")
        if eq:
            out.append((section, key.strip(), value.strip()))
    if pending:
        joined = " ".join(p.strip() for p in pending).strip()
        key, eq, value = joined.partition("=")
        if eq:
            out.append((section, key.strip(), value.strip()))
    return out


def read_env_file(path: Path) -> dict[str, str]:
    """`KEY=VALUE` lines (quotes stripped, `#`/`;` comments skipped), as systemd reads them."""
    out: dict[str, str] = {}
    for raw in path.read_text(encoding="utf-8", errors="replace").splitlines():
        line = raw.strip()
        if not line or line[:1] in ("#", ";"):
            continue
        if line.startswith("export "):
            line = line[len("export ") :].strip()
        key, eq, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            continue
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key] = value
    return out


def _expand(words: list[str], env: Mapping[str, str], missing: list[str]) -> list[str]:
    """systemd's `$NAME` (split into words) and `${NAME}` (one word) in ExecStart."""
    out: list[str] = []
    for word in words:
        whole = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if whole and whole.group(1) in env:
            out += env[whole.group(1)].split()
            continue

        def sub(m: re.Match[str]) -> str:
            name = m.group(1) or m.group(2)
            if name in env:
                return env[name]
            missing.append(name)
            return m.group(0)

        out.append(_VAR.sub(sub, word))
    return out


def _exec_words(value: str, origin: str) -> tuple[list[str], bool]:
    """ExecStart's words with its prefixes applied; whether `$` expansion is on."""
    prefix = re.match(r"^[-@:+!]*", value)
    marks = prefix.group(0) if prefix else ""
    words = _split(value[len(marks) :], origin)
    if "@" in marks and len(words) >= 2:
        words = [words[0], *words[2:]]  # the second word is argv[0] only
    return words, ":" not in marks


def launch_from_unit(path: Path) -> Launch:
    """`--from-unit sglang.service`."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise UsageError(f"--from-unit {path}: cannot read it ({exc.strerror})") from None
    origin = f"{path.name} (ExecStart)"
    execs: list[str] = []
    env: dict[str, str] = {}
    file_env: dict[str, str] = {}
    notes: list[str] = []
    for section, key, value in unit_lines(text):
        if section != "Service":
            continue
        if key == "ExecStart":
            execs = [] if not value else [*execs, value]
        elif key == "Environment":
            for word in _split(value, f"{path.name} Environment="):
                m = _ASSIGNMENT.match(word)
                if m:
                    env[m.group(1)] = m.group(2)
        elif key == "EnvironmentFile" and value:
            optional = value.startswith("-")
            name = value.lstrip("-").strip()
            where = Path(name) if os.path.isabs(name) else path.parent / name
            try:
                file_env.update(read_env_file(where))
            except OSError:
                if not optional:
                    notes.append(
                        f"EnvironmentFile={name} could not be read; its variables are missing"
                    )
        elif key in ("WorkingDirectory", "User", "Group") and value:
            notes.append(
                f"the unit sets {key}={value}; autotune runs the command from where it is "
                "started, as its user"
            )
    if not execs:
        raise UsageError(f"--from-unit {path}: no ExecStart= in its [Service] section")
    chosen = next((e for e in reversed(execs) if "sglang" in e), execs[-1])
    env.update(file_env)
    words, expand = _exec_words(chosen, origin)
    if expand:
        missing: list[str] = []
        words = _expand(words, env, missing)
        for name in dict.fromkeys(missing):
            notes.append(f"ExecStart uses ${name}, which the unit does not set; replace it by hand")
    if any(re.search(r"%[a-zA-Z]", w) for w in words):
        notes.append("ExecStart holds systemd specifiers (%i, %h, …); replace them by hand")
    words = [w.replace("%%", "%") for w in words]
    return launch_from_words(words, origin=origin, env=env, notes=notes)
