"""Two readers of a systemd service unit, to check what an exported drop-in starts.

* `read_unit` follows the documented rules (systemd.syntax(7) "Quoting", systemd.service(5)
  "Command lines", systemd.exec(5) "Environment="), strictly: whatever the manuals leave open
  (a quote inside a word, an unknown escape, a lone `;`, a raw control character, a specifier
  other than `%%`, a continued line) is an error, so an export that leans on it fails here.
* `analyze_unit` asks systemd itself: `SYSTEMD_LOG_LEVEL=debug systemd-analyze verify` loads
  the unit with the service manager's own parser and, at debug level, dumps what it parsed
  (`unit_dump`: `Environment: NAME=value` and, under `-> ExecStart:`, `Command Line:` with each
  argument written by systemd's `shell_maybe_quote`), which `_dump_words` decodes.

Both give the argv as systemd holds it after loading, before it starts the service; `expand`
is what systemd does then (`replace_env_argv`: `$$` → `$`, `${NAME}` → its value, `$NAME` as a
whole word → its value split at whitespace), so the argv the program receives is
`expand(argv, env)`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
            "\\": "\\", '"': '"', "'": "'", "s": " "}  # fmt: skip


@dataclass(frozen=True)
class Unit:
    """What a unit's `[Service]` section sets: the commands of each `Exec…=` directive (after an
    empty assignment resets the list) and the environment, in systemd's order."""

    execs: dict[str, list[list[str]]]
    env: dict[str, str]


def _unescape(text: str, i: int) -> tuple[str, int]:
    """The C-style escape at `text[i]` (a backslash): its character and the index after it."""
    c = text[i + 1 : i + 2]
    if c in _ESCAPES:
        return _ESCAPES[c], i + 2
    for lead, width, base in (("x", 2, 16), ("u", 4, 16), ("U", 8, 16)):
        if c == lead:
            digits = text[i + 2 : i + 2 + width]
            if len(digits) != width or not re.fullmatch(r"[0-9a-fA-F]+", digits):
                raise ValueError(f"bad escape {text[i : i + 2 + width]!r}")
            return chr(int(digits, base)), i + 2 + width
    if re.fullmatch(r"[0-7]{3}", text[i + 1 : i + 4]):
        return chr(int(text[i + 1 : i + 4], 8)), i + 4
    raise ValueError(f"unknown escape {text[i : i + 2]!r} (systemd warns and guesses)")


def _char(text: str, i: int) -> tuple[str, int]:
    """The character at `text[i]`, an escape unescaped, and the index after it."""
    if text[i] == "\\":
        return _unescape(text, i)
    return text[i], i + 1


def split_words(value: str, *, exec_line: bool) -> list[str]:
    """A setting's value unquoted into words by systemd.syntax(7): a quote opens quoting only at
    the start of a word and must be followed by whitespace or the end; C-style escapes anywhere.
    In an `Exec…=` line a lone unquoted `;` would start a second command: an error here."""
    words: list[str] = []
    i, n = 0, len(value)
    while i < n:
        if value[i] in " \t":
            i += 1
            continue
        word: list[str] = []
        if value[i] in "'\"":
            quote = value[i]
            i += 1
            while True:
                if i >= n:
                    raise ValueError(f"Unbalanced quoting in {value!r}")
                if value[i] == quote:
                    i += 1
                    break
                ch, i = _char(value, i)
                word.append(ch)
            if i < n and value[i] not in " \t":
                raise ValueError(f"a closing quote not followed by whitespace in {value!r}")
        else:
            start = i
            while i < n and value[i] not in " \t":
                if value[i] in "'\"":
                    raise ValueError(f"a quote inside a word in {value!r}")
                ch, i = _char(value, i)
                word.append(ch)
            if exec_line and value[start:i] == ";":
                raise ValueError(f"a lone ';' (a second command) in {value!r}")
        words.append("".join(word))
    return words


def _specifiers(text: str) -> str:
    """`%%` → `%`; any other specifier is an error (an export uses none)."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == "%":
            if text[i + 1 : i + 2] != "%":
                raise ValueError(f"specifier {text[i : i + 2]!r} in {text!r}")
            out.append("%")
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def read_unit(text: str) -> Unit:
    """The `[Service]` section of `text` by the documented rules (module docstring)."""
    if "\r" in text or "\0" in text:
        raise ValueError("a raw CR or NUL, which systemd reads as the end of a line")
    execs: dict[str, list[list[str]]] = {}
    env: dict[str, str] = {}
    section = ""
    for raw in text.split("\n"):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.endswith("\\"):
            raise ValueError(f"a line continued onto the next: {raw!r}")
        if line.startswith("["):
            section = line
            continue
        key, _, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if section != "[Service]":
            continue
        if key.startswith("Exec"):
            if not value:
                execs[key] = []
                continue
            # ExecStart= expands specifiers in the line, then unquotes it (load-fragment.c)
            words = split_words(_specifiers(value), exec_line=True)
            execs.setdefault(key, []).append(words)
        elif key == "Environment":
            if not value:
                env.clear()
                continue
            # Environment= unquotes, then expands specifiers in each assignment
            for word in split_words(value, exec_line=False):
                name, eq, val = _specifiers(word).partition("=")
                if not eq or not re.fullmatch(_NAME, name):
                    raise ValueError(f"not an assignment: {word!r}")
                env[name] = val
        else:
            raise ValueError(f"an unexpected directive {key}= in [Service]")
    return Unit(execs=execs, env=env)


def expand(argv: list[str], env: dict[str, str]) -> list[str]:
    """systemd's variable expansion at start (`replace_env_argv`, env-util.c): a word that is
    `$NAME` whole becomes the value split at whitespace; elsewhere `${NAME}` becomes the value
    (unset: empty), `$$` becomes `$`, and a braceless `$NAME` inside a word stays."""
    out: list[str] = []
    for word in argv:
        whole = re.fullmatch(r"\$(" + _NAME + ")", word)
        if whole:
            out += split_words(env.get(whole.group(1), ""), exec_line=False)
            continue
        text: list[str] = []
        i = 0
        while i < len(word):
            if word.startswith("$$", i):
                text.append("$")
                i += 2
            elif word.startswith("${", i) and "}" in word[i:]:
                end = word.index("}", i)
                text.append(env.get(word[i + 2 : end], ""))
                i = end + 1
            else:
                text.append(word[i])
                i += 1
        out.append("".join(text))
    return out


ANALYZE = shutil.which("systemd-analyze")
INSTALL = "apt-get install -y systemd"
"""The Debian package that provides `systemd-analyze` (CI installs it with this line)."""


@dataclass(frozen=True)
class Analyzed:
    """What `systemd-analyze verify` made of a unit: its dump read back, and what it said."""

    execs: dict[str, list[list[str]]]
    env: dict[str, str]
    complaints: list[str]
    """What it printed when run as a user runs it: nothing for a unit it accepts whole (it
    prints a bad setting, an unknown escape, a missing program)."""
    returncode: int


def _dump_words(line: str) -> list[str]:
    """A `Command Line:` of systemd's dump back into words: `shell_maybe_quote` writes a word as
    it is, or in double quotes with `\\`, `"`, `$` and backquotes escaped by a backslash and
    control characters as C escapes (`\\n`, `\\t`, octal `\\033`); the empty word is `""`."""
    words: list[str] = []
    i, n = 0, len(line)
    extra = {"$": "$", "`": "`"}
    while i < n:
        if line[i] == " ":
            i += 1
            continue
        if line[i] != '"':
            j = line.find(" ", i)
            j = n if j < 0 else j
            words.append(line[i:j])
            i = j
            continue
        i += 1
        word: list[str] = []
        while line[i] != '"':
            if line[i] == "\\":
                if line[i + 1] in extra:
                    word.append(extra[line[i + 1]])
                    i += 2
                else:
                    ch, i = _unescape(line, i)
                    word.append(ch)
            else:
                word.append(line[i])
                i += 1
        words.append("".join(word))
        i += 1
    return words


def analyze_unit(unit: Path) -> Analyzed:
    """`unit` loaded by systemd's own parser (module docstring); needs `systemd-analyze`. Run
    twice: as a user runs it (its exit code and every line it prints are the verdict), and at
    debug level for the dump."""
    assert ANALYZE is not None, f"systemd-analyze is not installed ({INSTALL})"
    verdict = subprocess.run(
        [ANALYZE, "verify", "--man=no", str(unit)], capture_output=True, text=True, timeout=60
    )
    done = subprocess.run(
        [ANALYZE, "verify", "--man=no", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SYSTEMD_LOG_LEVEL": "debug", "SYSTEMD_LOG_COLOR": "0"},
    )
    complaints = [ln for ln in (verdict.stdout + verdict.stderr).splitlines() if ln.strip()]
    lines = done.stdout.split("\n")
    if f"\t-> Unit {unit.name}:" not in lines:  # it did not load (a fatal setting)
        return Analyzed(execs={}, env={}, complaints=complaints, returncode=verdict.returncode)
    start = lines.index(f"\t-> Unit {unit.name}:")
    block: list[str] = []
    for ln in lines[start + 1 :]:
        if ln.startswith("\t-> Unit "):
            break
        block.append(ln)
    env: dict[str, str] = {}
    execs: dict[str, list[list[str]]] = {}
    setting = re.compile(r"^\t\t(?:-> )?[A-Z][A-Za-z]*:")
    i = 0
    while i < len(block):
        ln = block[i]
        if ln.startswith("\t\tEnvironment: "):
            # the dump writes a value as it is: a newline in it continues on the next lines,
            # up to the next setting
            value = [ln[len("\t\tEnvironment: ") :]]
            while i + 1 < len(block) and not setting.match(block[i + 1]):
                i += 1
                value.append(block[i])
            name, _, val = "\n".join(value).partition("=")
            env[name] = val
        elif re.match(r"^\t\t-> (Exec[A-Za-z]+):$", ln):
            key = ln.strip()[3:-1]
            while i + 1 < len(block) and block[i + 1].startswith("\t\t\t"):
                i += 1
                sub = block[i].strip()
                if sub.startswith("Command Line: "):
                    execs.setdefault(key, []).append(_dump_words(sub[len("Command Line: ") :]))
        i += 1
    return Analyzed(execs=execs, env=env, complaints=complaints, returncode=verdict.returncode)
