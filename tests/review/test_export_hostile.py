"""Every export format carries hostile values exactly, or refuses them in one line.

A corpus of values (a newline, a NUL, `%` specifiers, `$HOME`, `${X}`, backslashes, both quotes,
unicode, spaces, `;`, `&&`, a multi-line JSON, the empty string, a leading `-`, control
characters, a newline followed by a systemd directive) is put in a fixed flag's value
(`server.flags.model-path`) and in an environment value (`server.env.HOSTILE`) of the study
file, and each format is read back with its own reader:

* `flags`: `shlex.split`, and the line run by `sh` after the program;
* `shell`: `shlex` (POSIX rules; its unquoted backslashes are the line continuations), and the
  script run by `sh`;
* `json`: `json.loads`;
* `systemd`: the drop-in read by the documented rules (`tests.review.systemd_reader.read_unit`)
  and, where `systemd-analyze` is installed, by systemd's own parser (`analyze_unit`, the dump
  of `systemd-analyze verify`), which must agree with it and accept the unit without a word.

The argv and the environment read back must equal the trial's exactly (systemd's variable
expansion at start applied). A NUL is refused when the study file loads (tests/config); a value
a format cannot carry is refused by that format in one line naming its key.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from autotune.config.schema import StudyConfig
from autotune.config.studyfile import parse_study
from autotune.errors import ConfigError, UsageError
from autotune.review.export import Export, build_export
from autotune.review.exportformats import FORMATS, render
from autotune.review.source import build_review
from tests.review.conftest import STUDY
from tests.review.fakes import walk
from tests.review.systemd_reader import ANALYZE, INSTALL, analyze_unit, expand, read_unit
from tests.simstudy import run as simrun
from tests.simstudy import sim_study

KEY_ENV = "AUTOTUNE_TEST_KEY"
KEY = "k-not-secret-1"

CORPUS: dict[str, str] = {
    "newline": "a\nb",
    "newline-directive": "x\nExecStartPre=/bin/touch PWNED",
    "nul": "a\0b",
    "percent": "50% %h %n %% %i",
    "dollar": "$HOME",
    "dollar-brace": "${X}",
    "dollar-dollar": "$$ $ ${ $",
    "backslash": "a\\b\\\\c\\",
    "double-quote": 'say "hi"',
    "single-quote": "it's",
    "both-quotes": "'\"' \"'\"",
    "unicode": "模型 ü 😀 \u00a0 \u200b \u2028",
    "spaces": "  lead and trail  ",
    "semicolon": ";",
    "and-and": "&& touch PWNED && $(touch PWNED) `touch PWNED`",
    "json-multiline": '{\n  "rope_scaling": {"type": "yarn", "factor": 4.0},\n  "x": "a\\"b"\n}',
    "empty": "",
    "leading-dash": "-x --y",
    "hash": "#not-a-comment",
    "tab": "a\tb",
    "control": "cr\r esc\x1b bell\x07 del\x7f c1\x85",
    "escapes-spelled": "\\n \\x41 \\u0041 \\; \\s",
}
"""The hostile values, by name."""

REFUSED: dict[tuple[str, str], str] = {
    ("systemd", "control"): "server.env.HOSTILE: the value holds the control character '\\r'",
}
"""(format, value) pairs a format refuses, and how its one line starts. Every other pair must
read back exactly; `nul` never gets this far (the study file refuses it)."""


def toml_str(value: str) -> str:
    """`value` as a TOML basic string (TOML escapes every control character but tab)."""
    body = "".join(
        c if c not in '"\\' and (ord(c) >= 0x20 or c == "\t") and c != "\x7f"
        else f"\\u{ord(c):04x}"
        for c in value
    )  # fmt: skip
    return f'"{body}"'


def _study(value: str, program: str = "python3") -> str:
    """The export tests' study file with `value` as `model-path` and as `$HOSTILE`, and
    `program` as the server's program."""
    v = toml_str(value)
    text = STUDY.replace('model-path = "/models/Kimi K2.5"', f"model-path = {v}")
    env = f'env = {{ SGLANG_ENABLE_SPEC_V2 = "1", HOSTILE = {v} }}'
    text = text.replace('env = { SGLANG_ENABLE_SPEC_V2 = "1" }', env)
    return text.replace('command = ["python3"', f"command = [{toml_str(program)}")


def _cfg(text: str, tmp_path: Path) -> StudyConfig:
    return parse_study(tomllib.loads(text), name="t", path=tmp_path / "t.toml")


def _export(value: str, tmp_path: Path, program: str = "python3") -> Export:
    cfg = _cfg(_study(value, program), tmp_path)
    review = build_review("t", "x", walk(), cfg=cfg, study_attrs={})
    ex = build_export(review, cfg)
    assert ex.argv[ex.argv.index("--model-path") + 1] == value
    assert ex.env["HOSTILE"] == value
    return ex


def _want_argv(ex: Export) -> list[str]:
    return [*ex.command, "--api-key", KEY]


STUB = """#!{python}
import json, os, sys
with open(os.environ["ARGV_STUB_OUT"], "w") as out:
    json.dump({{"argv": sys.argv[1:], "env": os.environ.get("HOSTILE")}}, out)
"""


def _stub(folder: Path) -> Path:
    """A program that records its argv and `$HOSTILE`, in a folder whose name is hostile too
    (as far as systemd takes a program: no quotes, backslashes or control characters)."""
    where = folder / "bin dir %h 50% ; é"
    where.mkdir(parents=True, exist_ok=True)
    stub = where / "stub"
    stub.write_text(STUB.format(python=sys.executable))
    stub.chmod(0o755)
    return stub


def _run_sh(script: str, tmp_path: Path) -> dict[str, object]:
    out = tmp_path / "argv.json"
    done = subprocess.run(
        ["sh", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=30,
        env={**os.environ, "ARGV_STUB_OUT": str(out), KEY_ENV: KEY, "HOSTILE": "unset"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert not list(tmp_path.rglob("PWNED*")), "a value was executed"
    data = json.loads(out.read_text())
    assert isinstance(data, dict)
    return data


def _shlex_words(text: str) -> list[str]:
    """POSIX shell words of `text`, `#` comments dropped. shlex.quote never writes a backslash
    outside quotes, so read with no escape character; the unquoted backslashes are then exactly
    the line continuations, which sh removes."""
    lex = shlex.shlex(text, posix=True)
    lex.whitespace_split = True
    lex.commenters = "#"
    lex.escape = ""
    words = list(lex)
    continuations = text.count(" \\\n")
    assert words.count("\\") == continuations, (words, continuations)
    return [w for w in words if w != "\\"]


def _refusal(fmt: str, name: str) -> str | None:
    return REFUSED.get((fmt, name))


# ------------------------------------------------------------------------------------------------
# Every format, every value
# ------------------------------------------------------------------------------------------------

CARRIED = [n for n in CORPUS if n != "nul"]


@pytest.mark.parametrize("name", CARRIED)
def test_flags_line_reads_back_exactly(name: str, tmp_path: Path) -> None:
    ex = _export(CORPUS[name], tmp_path)
    line = render(ex, "flags")
    assert shlex.split(line) == [*ex.flags, "--api-key", f"${{{KEY_ENV}}}"]
    stub = _stub(tmp_path)
    got = _run_sh(f"exec {shlex.quote(str(stub))} {line}", tmp_path)
    assert got["argv"] == _want_argv(ex)[len(ex.program) :]


@pytest.mark.parametrize("name", CARRIED)
def test_shell_script_reads_back_exactly(name: str, tmp_path: Path) -> None:
    value = CORPUS[name]
    stub = _stub(tmp_path)
    ex = _export(value, tmp_path, program=str(stub))
    script = render(ex, "shell")
    words = _shlex_words(script)
    assert words[0] == "export" and "exec" in words
    at = words.index("exec")
    env = dict(w.split("=", 1) for w in words[1:at])
    assert env == dict(ex.env)
    assert words[at + 1 :] == [*ex.command, "--api-key", f"${{{KEY_ENV}}}"]
    got = _run_sh(script, tmp_path)
    assert got == {"argv": _want_argv(ex)[1:], "env": value}


@pytest.mark.parametrize("name", CARRIED)
def test_json_reads_back_exactly(name: str, tmp_path: Path) -> None:
    ex = _export(CORPUS[name], tmp_path)
    data = json.loads(render(ex, "json"))
    assert data["argv"] == list(ex.command)
    assert data["env"] == dict(ex.env) and data["env"]["HOSTILE"] == CORPUS[name]
    assert data["api_key_env"] == KEY_ENV


def _unit(ex: Export, tmp_path: Path) -> tuple[str, Path]:
    text = render(ex, "systemd")
    unit = tmp_path / "autotune-hostile.service"
    unit.write_text("[Unit]\nDescription=autotune export check\n" + text)
    return text, unit


@pytest.mark.parametrize("name", CARRIED)
def test_systemd_drop_in_reads_back_exactly(name: str, tmp_path: Path) -> None:
    value = CORPUS[name]
    stub = _stub(tmp_path)
    ex = _export(value, tmp_path, program=str(stub))
    refused = _refusal("systemd", name)
    if refused:
        with pytest.raises(UsageError) as err:
            render(ex, "systemd")
        assert str(err.value).startswith(refused) and "\n" not in str(err.value)
        return
    text, unit = _unit(ex, tmp_path)
    documented = read_unit(text)
    assert list(documented.execs) == ["ExecStart"], text  # one directive, nothing else runs
    [argv] = documented.execs["ExecStart"]
    assert documented.env == dict(ex.env)
    assert expand(argv, {**documented.env, KEY_ENV: KEY}) == _want_argv(ex)
    if ANALYZE is None:
        pytest.skip(f"systemd-analyze is not installed ({INSTALL}); read by the documented rules")
    parsed = analyze_unit(unit)
    assert parsed.returncode == 0 and parsed.complaints == [], parsed.complaints
    assert parsed.execs == {"ExecStart": [argv]}, "systemd reads the line another way"
    assert parsed.env == documented.env


def test_systemd_reader_agrees_with_systemd_on_what_it_reads(tmp_path: Path) -> None:
    """The documented-rules reader is checked on a hand-written unit that leans on every rule
    the exports use (escapes, both quotes, specifiers, `$$`, `;` as an argument)."""
    if ANALYZE is None:
        pytest.skip(f"systemd-analyze is not installed ({INSTALL})")
    unit = tmp_path / "autotune-reader.service"
    unit.write_text(
        "[Unit]\nDescription=x\n[Service]\n"
        'Environment="A=x\\ny" \'B=%%h $HOME\' C=plain "D= lead\\ttab "\n'
        'ExecStart=/bin/echo "a b" \'c "d"\' $$HOME "%%%%" ";" "" '
        '"\\x41\\101\\u00fc\\n" "\\\\" \'it\\\'s\'\n'
    )
    documented = read_unit(unit.read_text())
    parsed = analyze_unit(unit)
    assert parsed.complaints == [] and parsed.returncode == 0
    assert parsed.execs == documented.execs
    assert documented.execs["ExecStart"] == [
        ["/bin/echo", "a b", 'c "d"', "$$HOME", "%%", ";", "", "AAü\n", "\\", "it's"]
    ]
    assert parsed.env == documented.env == {"A": "x\ny", "B": "%h $HOME", "C": "plain",
                                            "D": " lead\ttab "}  # fmt: skip


def test_the_old_systemd_form_would_fail_here(tmp_path: Path) -> None:
    """The readers catch the faults the drop-in had when it wrote a newline raw: in
    `Environment=` it let the next line be a live `ExecStartPre=`, and in `ExecStart=` (a
    multi-line JSON value) systemd stopped at unbalanced quoting and would not start the unit."""
    env_case = (
        "[Service]\n"
        'Environment="HOSTILE=x\nExecStartPre=/bin/touch PWNED\nY=z"\n'
        "ExecStart=\nExecStart=/bin/echo ok\n"
    )
    json_case = "[Service]\nExecStart=\nExecStart=/bin/echo --json '{\n  \"a\": 1\n}'\n"
    with pytest.raises(ValueError, match=r"Unbalanced quoting|unexpected directive"):
        read_unit(env_case)
    with pytest.raises(ValueError, match=r"Unbalanced quoting|unexpected directive"):
        read_unit(json_case)
    if ANALYZE is None:
        pytest.skip(f"systemd-analyze is not installed ({INSTALL})")
    unit = tmp_path / "autotune-old.service"
    unit.write_text("[Unit]\nDescription=x\n" + env_case)
    assert analyze_unit(unit).execs["ExecStartPre"] == [["/bin/touch", "PWNED"]]
    unit.write_text("[Unit]\nDescription=x\n" + json_case)
    parsed = analyze_unit(unit)
    assert parsed.returncode != 0 and parsed.execs == {}
    assert any("quoting" in c.lower() for c in parsed.complaints), parsed.complaints


# ------------------------------------------------------------------------------------------------
# What is refused, and how
# ------------------------------------------------------------------------------------------------


def test_a_nul_never_reaches_an_export(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^server\.env\.HOSTILE: holds a NUL byte"):
        _cfg(_study(CORPUS["nul"]), tmp_path)
    # a setting built some other way (read back from storage) is refused by every format
    ex = _export("plain", tmp_path)
    argv = list(ex.argv)
    argv[argv.index("--model-path") + 1] = "a\0b"
    bad = dataclasses.replace(ex, argv=tuple(argv))
    for fmt in FORMATS:
        with pytest.raises(UsageError, match=r"^server\.flags\.model-path: 'a\\x00b' holds a NUL"):
            render(bad, fmt)


@pytest.mark.parametrize(
    ("program", "says"),
    [
        ("-prog", "starts with '-', which systemd reads as a prefix"),
        ("@prog", "starts with '@', which systemd reads as a prefix"),
        ("/opt/$x/python", "holds '$', which systemd would expand in argv[0]"),
        ("/opt/a\nb/python", "holds a quote, a backslash or a control character"),
        ("/opt/it's/python", "holds a quote, a backslash or a control character"),
        ("/opt/a\\b/python", "holds a quote, a backslash or a control character"),
    ],
)
def test_systemd_refuses_a_program_it_would_run_another_way(
    program: str, says: str, tmp_path: Path
) -> None:
    ex = _export("plain", tmp_path, program=program)
    with pytest.raises(UsageError) as err:
        render(ex, "systemd")
    text = str(err.value)
    assert text.startswith("server.command: the program ") and says in text, text
    assert "\n" not in text and "--format shell" in text


def test_systemd_says_a_program_without_a_path_is_looked_up_in_its_own_path(
    tmp_path: Path,
) -> None:
    """`init` writes `python -m sglang.launch_server` where the log does not name the program:
    under systemd a bare `python` is another Python, or none."""
    note = "is not an absolute path: systemd looks it up in its own search path"
    assert note in render(_export("plain", tmp_path, program="python"), "systemd")
    assert note not in render(_export("plain", tmp_path, program="/opt/v/bin/python"), "systemd")


def test_shell_refuses_a_program_exec_reads_as_an_option(tmp_path: Path) -> None:
    ex = _export("plain", tmp_path, program="-prog")
    with pytest.raises(UsageError, match=r"^server\.command: the program '-prog' starts with '-'"):
        render(ex, "shell")
    assert render(ex, "json")  # json carries it


def test_an_api_key_variable_that_is_no_name_is_refused(tmp_path: Path) -> None:
    ex = dataclasses.replace(_export("plain", tmp_path), api_key_env="X:-$(touch PWNED)")
    for fmt in ("flags", "shell", "systemd"):
        with pytest.raises(UsageError, match=r"^workload\.api_key_env: .* is not an environment"):
            render(ex, fmt)


def test_a_headline_with_a_newline_stays_a_comment(tmp_path: Path) -> None:
    line = "best\nExecStartPre=/bin/touch PWNED\ntouch PWNED"
    ex = dataclasses.replace(_export("plain", tmp_path), headline=line)
    unit = render(ex, "systemd")
    assert "\nExecStartPre" not in unit and "\ntouch" not in unit
    assert read_unit(unit).execs.keys() == {"ExecStart"}
    assert unit.splitlines()[0] == "# best\\nExecStartPre=/bin/touch PWNED\\ntouch PWNED"
    script = render(ex, "shell")
    assert "\ntouch" not in script and script.splitlines()[1].startswith("# best\\n")


# ------------------------------------------------------------------------------------------------
# End to end: a trial the simulator ran, exported by the command
# ------------------------------------------------------------------------------------------------


@pytest.mark.e2e
def test_the_command_exports_a_run_trial_that_reads_back_exactly(tmp_path: Path) -> None:
    """`autotune run` on the simulator, then the study file names a stub program, a multi-line
    JSON flag value and an environment value with a newline and a directive after it;
    `autotune export --trial 0 --backend sglang` in each format reads back exactly, and a
    value systemd cannot carry stops the systemd export with one line, exit 2, nothing on
    stdout."""
    study = tmp_path / "hostile.toml"
    study.write_text(sim_study(n_trials=1, duration=0.3))
    done = simrun(study, "run", timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    stub = _stub(tmp_path)
    flag, env = CORPUS["json-multiline"], CORPUS["newline-directive"]
    text = study.read_text().replace(
        'backend = "sim"', f'backend = "sim"\ncommand = [{toml_str(str(stub))}]'
    )
    tables = (
        f"[server.env]\nHOSTILE = {toml_str(env)}\n\n"
        f"[server.flags]\njson-model-override-args = {toml_str(flag)}\n"
    )
    text = text.replace("[server.flags]\n", tables)
    study.write_text(text)
    args = ("export", "--trial", "0", "--backend", "sglang", "--no-flag-check", "--format")
    forms = {}
    for fmt in FORMATS:
        out = simrun(study, *args, fmt, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        forms[fmt] = out.stdout
    argv = json.loads(forms["json"])["argv"]
    assert argv[0] == str(stub) and argv[argv.index("--json-model-override-args") + 1] == flag
    assert json.loads(forms["json"])["env"]["HOSTILE"] == env
    assert _run_sh(forms["shell"], tmp_path) == {"argv": argv[1:], "env": env}
    assert shlex.split(forms["flags"]) == argv[1:]
    unit = read_unit(forms["systemd"])
    assert list(unit.execs) == ["ExecStart"] and unit.env["HOSTILE"] == env
    assert expand(unit.execs["ExecStart"][0], unit.env) == argv
    if ANALYZE is not None:
        path = tmp_path / "autotune-e2e.service"
        path.write_text("[Unit]\nDescription=x\n" + forms["systemd"])
        parsed = analyze_unit(path)
        assert parsed.complaints == [] and parsed.execs == unit.execs and parsed.env == unit.env
    # a control character systemd's Environment= does not carry: refused, by its key
    study.write_text(text.replace(toml_str(env), toml_str("a\x1bb")))
    out = simrun(study, *args, "systemd", timeout=120)
    assert out.returncode == 2 and out.stdout == ""
    says = "autotune: error: server.env.HOSTILE: the value holds the control character '\\x1b'"
    assert out.stderr.startswith(says) and out.stderr.count("\n") == 1
    assert simrun(study, *args, "shell", timeout=120).returncode == 0
