"""The export `Format` contract, run against every format in
`autotune.review.exportformats.FORMATS`.

Each registered format has its own reader here (`READERS`: `shlex` for `flags` and `shell`,
`json.loads` for `json`, the documented systemd rules for `systemd`), and a format without one
fails the first test, so a format added to the registry is held to the contract at once:

* what the reader reads back is exactly the command the trial ran (the program too, where the
  format carries it) with the API key taken from its variable, and the study's environment,
  where the format carries it;
* a value no format can carry (a NUL) is refused in one line naming its study-file key;
* every format but `flags` (whose line stays pasteable: its headline goes to stderr) carries
  the headline.

The hostile values each format must carry are in test_export_hostile.py.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest

from autotune.config.studyfile import parse_study
from autotune.errors import UsageError
from autotune.review.export import Export, build_export
from autotune.review.exportformats import FORMATS, render
from autotune.review.source import build_review
from tests.review.conftest import STUDY
from tests.review.fakes import walk
from tests.review.systemd_reader import expand, read_unit

KEY_ENV = "AUTOTUNE_TEST_KEY"  # the conftest study's workload.api_key_env
KEY = "k-contract"
ENV = {KEY_ENV: KEY}


@dataclasses.dataclass(frozen=True)
class Read:
    """What a format's reader makes of an export: the argv that would run with `ENV` set (the
    program first when the format carries it), and the environment (None: not carried)."""

    argv: list[str]
    program: bool
    env: dict[str, str] | None


def _shell_words(text: str) -> list[str]:
    """`sh`'s words of a script whose only backslashes outside quotes continue lines, with the
    API key's variable expanded."""
    lex = shlex.shlex(text, posix=True)
    lex.whitespace_split, lex.commenters, lex.escape = True, "#", ""
    return [w.replace(f"${{{KEY_ENV}}}", KEY) for w in lex if w != "\\"]


def _flags(text: str) -> Read:
    return Read([w.replace(f"${{{KEY_ENV}}}", KEY) for w in shlex.split(text)], False, None)


def _shell(text: str) -> Read:
    words = _shell_words(text)
    at = words.index("exec")
    env = dict(w.split("=", 1) for w in words[1:at]) if words[0] == "export" else {}
    return Read(words[at + 1 :], True, env)


def _json(text: str) -> Read:
    data = json.loads(text)
    key = ["--api-key", ENV[data["api_key_env"]]] if data["api_key_env"] else []
    return Read([*data["argv"], *key], True, data["env"])


def _systemd(text: str) -> Read:
    unit = read_unit(text)
    assert list(unit.execs) == ["ExecStart"], text
    [argv] = unit.execs["ExecStart"]
    return Read(expand(argv, {**unit.env, **ENV}), True, unit.env)


READERS: dict[str, Callable[[str], Read]] = {
    "flags": _flags,
    "shell": _shell,
    "json": _json,
    "systemd": _systemd,
}
"""Each format's own reader, by the format's name."""


@pytest.fixture
def export(tmp_path: Path) -> Export:
    cfg = parse_study(tomllib.loads(STUDY), name="t", path=tmp_path / "t.toml")
    return build_export(build_review("t", "x", walk(), cfg=cfg, study_attrs={}), cfg)


def test_every_format_has_a_reader() -> None:
    assert set(READERS) == set(FORMATS)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_format_reads_back_the_command_and_environment_exactly(fmt: str, export: Export) -> None:
    got = READERS[fmt](render(export, fmt))
    want = [*export.command, "--api-key", KEY]
    assert got.argv == (want if got.program else want[len(export.program) :])
    assert got.env is None or got.env == dict(export.env)
    assert export.env and export.program  # the study has both, so both are checked


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_format_refuses_a_nul_in_one_line_by_its_key(fmt: str, export: Export) -> None:
    argv = list(export.argv)
    argv[argv.index("--model-path") + 1] = "a\0b"
    with pytest.raises(UsageError) as err:
        render(dataclasses.replace(export, argv=tuple(argv)), fmt)
    text = str(err.value)
    assert text.startswith("server.flags.model-path: ") and "\n" not in text


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f != "flags"])
def test_a_format_carries_the_headline(fmt: str, export: Export) -> None:
    assert export.headline and export.headline in render(export, fmt)
