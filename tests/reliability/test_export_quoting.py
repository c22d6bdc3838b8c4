"""Exported commands run exactly what they say: every value quoted in the shell, flags and
systemd forms, so a model path with spaces, quotes, `$(…)`, backticks, `;`, `&`, globs, `%`
and `$VAR` reaches the program as one argument, unchanged, and nothing in it is executed.

The study runs once on the simulator; then its file names a stub program (`server.command`)
that records its argv and environment, and the export of that trial (`--backend sglang`) is
run: the shell form with `sh`, the flags line after the stub in `sh -c`, the systemd drop-in's
`ExecStart=` split by systemd's rules (and checked by `systemd-analyze verify` where it is
installed).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.reliability.helpers import NAME, World

pytestmark = pytest.mark.e2e

MODEL = '/models/my model\'s "best" $(touch PWNED1) `touch PWNED2` a\\b; c & d * %h $HOME ${HOME}'
TOKENIZER = "/models/it's"
ENV = "a b $(touch PWNED3) 'q' \"d\" `touch PWNED4` %n $HOME"
STUB = """#!{python}
import json, os, sys
with open(os.environ["ARGV_STUB_OUT"], "a") as out:
    out.write(json.dumps({{"argv": sys.argv[1:], "env": os.environ.get("REL_WEIRD")}}) + "\\n")
"""


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[World, Path, dict[str, str]]:
    """A finished trial, the study file rewritten around the stub, and its four exports."""
    world = World(tmp_path_factory.mktemp("export"))
    try:
        world.study(duration=0.5)
        done = world.run()
        assert done.rc == 0, done.out + done.err
        stub = world.folder / "stub"
        stub.write_text(STUB.format(python=sys.executable))
        stub.chmod(0o755)
        text = (world.folder / f"{NAME}.toml").read_text()
        text = text.replace(
            'model-path = "moonshotai/Kimi-K2.5"',
            f"model-path = {json.dumps(MODEL)}\ntokenizer-path = {json.dumps(TOKENIZER)}",
        )
        text = text.replace('backend = "sim"', f'backend = "sim"\ncommand = ["{stub}"]')
        text += f"\n[server.env]\nREL_WEIRD = {json.dumps(ENV)}\n"
        (world.folder / f"{NAME}.toml").write_text(text)
        args = ["--config", str(world.folder / f"{NAME}.toml"), "--results-dir", str(world.results)]
        forms = {}
        for fmt in ("shell", "flags", "systemd", "json"):
            out = world.autotune(
                "export", *args, "--trial", "0", "--backend", "sglang", "--no-flag-check",
                "--format", fmt,
            )  # fmt: skip
            assert out.rc == 0, out.out + out.err
            forms[fmt] = out.out
        yield world, stub, forms
    finally:
        world.finish()


def _recorded(path: Path) -> dict[str, object]:
    [line] = path.read_text().splitlines()
    data = json.loads(line)
    assert isinstance(data, dict)
    return data


def _check(argv: list[str], where: Path) -> None:
    assert argv[argv.index("--model-path") + 1] == MODEL, argv
    assert argv[argv.index("--tokenizer-path") + 1] == TOKENIZER, argv
    assert not list(where.rglob("PWNED*")), "a value was executed"


def _expected(forms: dict[str, str]) -> list[str]:
    argv = json.loads(forms["json"])["argv"]
    assert isinstance(argv, list)
    return [str(a) for a in argv[1:]]


def test_exported_shell_form_runs_exactly_that_path(
    exported: tuple[World, Path, dict[str, str]], tmp_path: Path
) -> None:
    _, _, forms = exported
    script = tmp_path / "launch.sh"
    script.write_text(forms["shell"])
    out = tmp_path / "argv.json"
    done = subprocess.run(
        ["sh", str(script)], cwd=tmp_path, env={**os.environ, "ARGV_STUB_OUT": str(out)},
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    got = _recorded(out)
    _check(list(got["argv"]), tmp_path)  # type: ignore[call-overload]
    assert got["argv"] == _expected(forms)
    assert got["env"] == ENV


def test_exported_flags_line_after_the_program_runs_exactly_that_path(
    exported: tuple[World, Path, dict[str, str]], tmp_path: Path
) -> None:
    _, stub, forms = exported
    out = tmp_path / "argv.json"
    [line] = forms["flags"].splitlines()
    done = subprocess.run(
        ["sh", "-c", f"exec {shlex.quote(str(stub))} {line}"], cwd=tmp_path,
        env={**os.environ, "ARGV_STUB_OUT": str(out)}, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    got = _recorded(out)
    _check(list(got["argv"]), tmp_path)  # type: ignore[call-overload]
    assert got["argv"] == _expected(forms)


def systemd_words(line: str, env: dict[str, str], *, dollars: bool = True) -> list[str]:
    """A systemd line split as systemd 252 does (`extract_first_word` with UNQUOTE|CUNESCAPE,
    then `%%` and, with `dollars` (ExecStart=; not Environment=, where `$` is no special
    character), `$$` and `${VAR}`): a quote opens quoting wherever it appears in a word, and an
    unbalanced one makes the whole line invalid."""
    escapes = {"\\": "\\", '"': '"', "'": "'", "n": "\n", "t": "\t", " ": " ", "s": " "}
    words: list[str] = []
    i, n = 0, len(line)
    while i < n:
        while i < n and line[i] in " \t":
            i += 1
        if i >= n:
            break
        word, quote = "", ""
        while i < n and (quote or line[i] not in " \t"):
            c = line[i]
            if c == "\\":
                if i + 1 >= n or line[i + 1] not in escapes:
                    raise ValueError(f"bad escape at {i}: {line[i : i + 2]!r}")
                word += escapes[line[i + 1]]
                i += 2
                continue
            if quote and c == quote:
                quote = ""
            elif not quote and c in "'\"":
                quote = c
            else:
                word += c
            i += 1
        if quote:
            raise ValueError(f"Unbalanced quoting in {line!r}")
        words.append(word)
    out = []
    for w in words:
        if dollars:
            for name, value in env.items():
                w = w.replace(f"${{{name}}}", value)
            w = w.replace("$$", "$")
        out.append(w.replace("%%", "%"))
    return out


def _systemd_lines(forms: dict[str, str]) -> tuple[str, list[str]]:
    lines = forms["systemd"].splitlines()
    exec_line = [ln for ln in lines if ln.startswith("ExecStart=") and ln != "ExecStart="][-1]
    envs = [ln[len("Environment=") :] for ln in lines if ln.startswith("Environment=")]
    return exec_line[len("ExecStart=") :], envs


def test_exported_systemd_form_runs_exactly_that_path(
    exported: tuple[World, Path, dict[str, str]], tmp_path: Path
) -> None:
    _, stub, forms = exported
    exec_line, _ = _systemd_lines(forms)
    analyze = shutil.which("systemd-analyze")
    if analyze is not None:
        unit = tmp_path / "autotune-export-check.service"
        unit.write_text("[Unit]\nDescription=export check\n" + forms["systemd"])
        verify = subprocess.run(
            [analyze, "verify", "--man=no", str(unit)], capture_output=True, text=True
        )
        assert "quoting" not in verify.stderr.lower(), verify.stderr
        assert "bad unit file setting" not in verify.stderr.lower(), verify.stderr
    argv = systemd_words(exec_line, {})
    assert argv[0] == str(stub)
    _check(argv[1:], tmp_path)
    assert argv[1:] == _expected(forms)


def test_exported_systemd_environment_is_exactly_the_study_s(
    exported: tuple[World, Path, dict[str, str]],
) -> None:
    _, envs = _systemd_lines(exported[2])
    assignments = [w for e in envs for w in systemd_words(e, {}, dollars=False)]
    assert dict(a.split("=", 1) for a in assignments).get("REL_WEIRD") == ENV, envs
