"""The export formats: how an `Export` (`autotune.review.export`) is written, one `Format` each.

* `flags`: the flags alone, one shell-quoted line (fixed, then tuned);
* `shell`: the full command with a comment header, one flag per line;
* `json`: headline, study, trial, params, argv, capacity_tokens, throughput_tok_s, headroom_gib
  (free at the worst moment), margin, confirmed, sglang_version, how the winner was chosen and
  its share of the box's ceiling (`ceiling`);
* `systemd`: a drop-in that replaces `ExecStart=` (and sets the study's environment).

Every format starts with the headline (for `flags` it goes to stderr, so the line on stdout
stays pasteable).

Each format is a `Format` in one registry (`FORMATS` are their names). Every value is written so
that the format's own reader reads back exactly the argv and the environment the trial ran with
(`shlex.quote` for `flags` and `shell`; JSON; systemd's quoting, escapes, `%%` and `$$` for
`systemd`), or refused in one line naming the value's study-file key and the fix (a NUL in any
format; in `systemd`, a control character other than newline and tab in an `Environment=`
value, and a program systemd would run another way). Comment lines escape control characters,
so no text in a header can start a command or a directive.

What is exported is decided before any of this (`autotune.review.export.build_export`); a format
only writes it, so every format carries the same command.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from autotune.config.studyfile import is_env_name
from autotune.errors import UsageError
from autotune.review import figures as fig
from autotune.review.export import Export


@dataclass(frozen=True)
class Format:
    """One export format: its name and how it writes an `Export`.

    `write` writes every value so that the format's own reader reads back exactly the argv and
    the environment that the trial ran with (`shlex.split` and `sh` for `flags` and `shell`,
    `json.loads` for `json`, systemd's unit parser for `systemd`), or raises a one-line
    `UsageError` naming the value's study-file key and the fix where the format cannot carry it."""

    name: str
    write: Callable[[Export], str]


def render(ex: Export, fmt: str) -> str:
    """The export in `fmt`; `flags` is the flags line alone (its headline goes to stderr)."""
    f = _REGISTRY.get(fmt)
    if f is None:
        raise UsageError(f"--format {fmt}: unknown; use one of {', '.join(FORMATS)}")
    return f.write(ex)


def to_json(ex: Export) -> dict[str, object]:
    """The export as the `json` format's object: the headline, the forced marker, the command and
    its figures, the margin and confirmation, and how the winner was chosen."""
    return {
        "headline": ex.headline,
        "forced": {"reason": ex.forced, "marker": ex.forced_flag} if ex.forced else None,
        "study": ex.study,
        "trial": ex.trial,
        "params": dict(ex.params),
        "argv": list(ex.command),
        "api_key_env": ex.api_key_env,
        "env": dict(ex.env),
        "capacity_tokens": ex.capacity_tokens,
        "throughput_tok_s": ex.throughput_tok_s,
        "headroom_gib": ex.headroom_gib,
        "predicted": ex.predicted,
        "margin": dict(ex.margin),
        "tolerance": ex.tolerance,
        "chosen_trial": ex.chosen_trial,
        "confirmed": ex.confirmed,
        "confirmation": ex.confirmed_label,
        "sglang_version": ex.sglang_version,
        "backend": ex.backend,
        "notes": list(ex.notes),
        "ceiling": dict(ex.ceiling) or None,
        "asked": dict(ex.asked) or None,
        "ran_other": list(ex.ran_other),
    }


def _header(ex: Export) -> list[str]:
    figures = []
    if ex.capacity_tokens is not None:
        figures.append(f"{ex.capacity_tokens:,} KV tokens")
    if ex.throughput_tok_s is not None:
        figures.append(f"{ex.throughput_tok_s:,.1f} tok/s")
    if ex.headroom_gib is not None:
        figures.append(f"{fig.gib(ex.headroom_gib)} GiB {fig.FREE_AT_WORST}")
    how = " (predicted)" if ex.predicted else ""
    margin = ex.margin
    if isinstance(margin.get("soak_plan"), str):
        m = str(margin["soak_plan"])
    elif margin.get("headroom_gib") is not None:
        m = f"{margin['headroom_gib']:g} GiB {fig.FREE_AT_WORST}"
    else:
        m = f"{margin.get('steps', 0)} step(s) of mem_fraction_static"
    lines = [ex.headline] if ex.headline else []
    if ex.ceiling.get("line"):
        lines.append(str(ex.ceiling["line"]))
    if ex.forced:
        lines.append(
            f"FORCED EXPORT: {ex.forced}; the command carries {ex.forced_flag}, which SGLang "
            "rejects: remove it only if you mean to launch this"
        )
    lines += [
        f"autotune study {ex.study}, trial {ex.trial}: {', '.join(figures) or 'no figures'}{how}",
        f"margin: {m}; {ex.confirmed_label}",
        f"sglang {ex.sglang_version or 'version unknown'}, backend {ex.backend}",
    ]
    lines += [f"note: {n}" for n in ex.notes]
    return [comment(line) for line in lines]


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
"""C0 and C1 control characters, DEL included."""


def comment(text: str) -> str:
    """`# text` on one line whatever `text` holds: control characters written as escapes
    (`\n`, `\x1b`), so that a newline in a value (a headline naming a string choice, say)
    cannot end a comment and start a shell command or a systemd directive."""
    return "# " + _CONTROL.sub(lambda m: ascii(m.group())[1:-1], text)


def _shown(value: str) -> str:
    """A value as an error line names it: quoted, control characters escaped, at most 60
    characters."""
    return repr(value if len(value) <= 60 else value[:57] + "...")


def _labelled(ex: Export) -> list[tuple[str, str]]:
    """Each word of the exported command with the study-file key it comes from (the key of the
    flag a value follows; `server.command` for the program)."""
    out = [(w, "server.command") for w in ex.program]
    flag = ""
    for w in ex.flags:
        if w.startswith("--"):
            flag = w.split("=", 1)[0]
        out.append((w, ex.origins.get(flag, flag or "server.command")))
    return out


def _refuse_nul(ex: Export) -> None:
    """No format carries a NUL byte: argv and environ are C strings (the study file refuses one
    at load; a setting read back from storage is checked again here)."""
    for word, key in _labelled(ex):
        if "\0" in word:
            raise UsageError(f"{key}: {_shown(word)} holds a NUL byte, which no command line "
                             "can carry; remove it")  # fmt: skip
    for name, value in ex.env.items():
        if "\0" in value:
            raise UsageError(f"server.env.{name}: the value holds a NUL byte, which no "
                             "environment can carry; remove it")  # fmt: skip


def _key_name(ex: Export) -> None:
    """The API key is referred to as `${NAME}`: NAME must be a variable name, or the reference
    would be a shell or systemd expression of its own."""
    if ex.api_key_env and not is_env_name(ex.api_key_env):
        raise UsageError(
            f"workload.api_key_env: {_shown(ex.api_key_env)} is not an environment variable "
            "name; use ASCII letters, digits and _, not starting with a digit"
        )


def _shell_program(ex: Export) -> None:
    """`exec -x` is an option of bash's `exec`, not a program."""
    if ex.program and ex.program[0].startswith("-"):
        raise UsageError(
            f"server.command: the program {_shown(ex.program[0])} starts with '-', which exec "
            "reads as an option; name it by a path (./-…)"
        )


def flags_line(ex: Export) -> str:
    """The flags alone, shell-quoted (`shlex.quote`): one command line, where a value with a
    newline keeps it inside its quotes."""
    _refuse_nul(ex)
    _key_name(ex)
    return _join([*ex.flags]) + (" " + _key_shell(ex) if ex.api_key_env else "") + "\n"


def shell(ex: Export) -> str:
    """A POSIX `sh` script: the header as comments, `export` of the study's environment, then
    `exec` of the command, one flag per line; every word `shlex.quote`d."""
    _refuse_nul(ex)
    _key_name(ex)
    _shell_program(ex)
    out = ["#!/bin/sh", *_header(ex)]
    env = [f"{k}={shlex.quote(v)}" for k, v in ex.env.items()]
    if env:
        out.append("export " + " ".join(env))
    program = list(ex.program)
    body = [_join(program)]
    flags = list(ex.flags)
    i = 0
    while i < len(flags):
        tok = [flags[i]]
        i += 1
        while i < len(flags) and not flags[i].startswith("--"):
            tok.append(flags[i])
            i += 1
        body.append("  " + _join(tok))
    if ex.api_key_env:
        body.append("  " + _key_shell(ex))
    out.append("exec " + " \\\n".join(body))
    return "\n".join(out) + "\n"


def _json(ex: Export) -> str:
    _refuse_nul(ex)
    return json.dumps(to_json(ex), indent=2, ensure_ascii=False) + "\n"


def _key_shell(ex: Export) -> str:
    return f'--api-key "${{{ex.api_key_env}}}"'


def systemd(ex: Export) -> str:
    """A drop-in: `ExecStart=` emptied and set again, and `Environment=` for the study's
    environment, every word written by systemd's own rules (`_sd_word`, `_sd_env`)."""
    _refuse_nul(ex)
    _key_name(ex)
    _sd_program(ex)
    head = _header(ex)
    out = [
        *head[:1],
        "# drop-in for the SGLang service, e.g. /etc/systemd/system/sglang.service.d/autotune.conf",
        *head[1:],
        "[Service]",
    ]
    if ex.program and not ex.program[0].startswith("/"):
        out.insert(
            len(out) - 1,
            comment(
                f"note: {ex.program[0]} is not an absolute path: systemd looks it up in its own "
                "search path, not the shell's or a venv's; set server.command to the full path "
                "of the Python that has SGLang"
            ),
        )
    out += [f"Environment={_sd_env(k, v)}" for k, v in ex.env.items()]
    words = [_sd_word(a) for a in ex.command]
    if ex.api_key_env:
        words += ["--api-key", f"${{{ex.api_key_env}}}"]
    out += ["ExecStart=", "ExecStart=" + " ".join(words)]
    return "\n".join(out) + "\n"


# systemd's rules, from systemd.syntax(7) "Quoting", systemd.service(5) "Command lines" and
# systemd.exec(5) "Environment=" (checked against systemd 252's own parser, whose unit dump
# `SYSTEMD_LOG_LEVEL=debug systemd-analyze verify` prints, by tests/review/test_export_hostile.py):
# * a word is unquoted as a whole: a quote opens quoting only at its start, so a word holding
#   anything but plain characters is written inside double quotes;
# * C-style escapes are read everywhere: `\` and `"` are escaped, and control characters
#   written as `\n`, `\t`, `\xHH` (a raw newline would end the line: `ExecStartPre=` on the next
#   line would be a directive of its own);
# * `%` starts a specifier in `ExecStart=` and `Environment=` alike: written `%%`;
# * `$` expands a variable in `ExecStart=` (`${X}`, `$X`): written `$$`; in `Environment=` it
#   has no meaning and is kept as it is;
# * a lone `;` separates commands: quoted (`";"`) it is an argument.

_SD_PLAIN = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_@%+=:,./-$")
_SD_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r", "\a": "\\a",
               "\b": "\\b", "\f": "\\f", "\v": "\\v"}  # fmt: skip
_SD_PREFIXES = "-@:+!"
"""Characters that, first in `ExecStart=`'s program, systemd reads as prefixes
(systemd.service(5), "Special executable prefixes"), quoted or not."""


def _sd_escaped(text: str) -> str:
    """`text` for inside a double-quoted systemd word: C-style escapes for `\\`, `"` and every
    control character (C1 ones as `\\uHHHH`)."""
    out = []
    for c in text:
        if c in _SD_ESCAPES:
            out.append(_SD_ESCAPES[c])
        elif _CONTROL.fullmatch(c):
            out.append(f"\\x{ord(c):02x}" if ord(c) < 0x80 else f"\\u{ord(c):04x}")
        else:
            out.append(c)
    return "".join(out)


def _sd_quoted(text: str) -> str:
    if text and all(c in _SD_PLAIN for c in text):
        return text
    return '"' + _sd_escaped(text) + '"'


def _sd_word(word: str) -> str:
    """A word for `ExecStart=`: `%` and `$` doubled, then plain, or double-quoted and escaped
    (the empty word is `""`)."""
    return _sd_quoted(word.replace("%", "%%").replace("$", "$$"))


def _sd_program(ex: Export) -> None:
    """What systemd cannot take as `ExecStart=`'s program: a prefix character first; a quote,
    a backslash or a control character (systemd.service(5): control characters are not allowed
    in the command; systemd 252 also refuses quotes and backslashes in it, "Executable name
    contains special characters", and will not start the unit); or `$` (systemd expands
    variables in the arguments, argv[0] among them, but not in the path it executes, so `$$`
    would name another file)."""
    if not ex.program:
        return
    program = ex.program[0]
    why = ""
    if program[:1] in _SD_PREFIXES:
        why = f"starts with {program[0]!r}, which systemd reads as a prefix"
    elif _CONTROL.search(program) or any(c in program for c in "'\"\\"):
        why = "holds a quote, a backslash or a control character, which systemd refuses there"
    elif "$" in program:
        why = "holds '$', which systemd would expand in argv[0] but not in the path it runs"
    if why:
        raise UsageError(
            f"server.command: the program {_shown(program)} {why}; use a path without it, or "
            "--format shell"
        )


def _sd_env(name: str, value: str) -> str:
    """An `Environment=` assignment: `%` doubled, `$` kept; plain, or double-quoted and escaped.
    A newline or a tab is escaped (`\\n`, `\\t`); any other control character is refused:
    systemd.exec(5) says non-printable characters are rejected in values, and a systemd that
    rejects one drops the whole assignment (the server would start without the variable)."""
    bad = _CONTROL.search(value.replace("\n", "").replace("\t", ""))
    if bad:
        raise UsageError(
            f"server.env.{name}: the value holds the control character "
            f"{bad.group()!a}, which systemd's Environment= does not carry; remove it, "
            "or export --format shell or json"
        )
    return _sd_quoted(f"{name}={value}".replace("%", "%%"))


def _join(words: Sequence[str]) -> str:
    return " ".join(shlex.quote(w) for w in words)


_REGISTRY = {
    f.name: f
    for f in (
        Format("flags", flags_line),
        Format("shell", shell),
        Format("json", _json),
        Format("systemd", systemd),
    )
}
FORMATS = tuple(_REGISTRY)
