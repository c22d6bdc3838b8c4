"""The study file refuses a NUL byte in any value, and a control character in any key, when it
loads: one line naming the key, exit code 2 through the CLI, nothing written, no trial.

Before, a NUL (`"\\u0000"` in TOML) passed validation and the first launch died with
`ValueError: embedded null byte` (subprocess), a traceback, the trial left RUNNING: one more
stale trial per rerun."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from autotune.config.studyfile import load_study, parse_study
from autotune.errors import ConfigError
from tests.review.conftest import STUDY
from tests.simstudy import run, sim_study


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        ('SGLANG_ENABLE_SPEC_V2 = "1"', 'SGLANG_ENABLE_SPEC_V2 = "1\\u0000"',
         "server.env.SGLANG_ENABLE_SPEC_V2"),
        ('model-path = "/models/Kimi K2.5"', 'model-path = "/models/\\u0000"',
         "server.flags.model-path"),
        ('"-m", "sglang', '"-m\\u0000", "sglang', "server.command[1]"),
        ("max_running_requests = { choices = [32, 48, 64] }",
         'tool_call_parser = { choices = ["a", "b\\u0000"] }',
         "search.tool_call_parser.choices[1]"),
        ('description = "x"', 'description = "x\\u0000"', "description"),
    ],
)  # fmt: skip
def test_a_nul_byte_in_a_value_is_refused_naming_its_key(
    old: str, new: str, key: str, tmp_path: Path
) -> None:
    text = ('description = "x"\n' + STUDY).replace(old, new)
    assert new in text
    with pytest.raises(ConfigError) as err:
        parse_study(tomllib.loads(text), name="t", path=tmp_path / "t.toml")
    assert err.value.key == key
    assert str(err.value) == (
        f"{key}: holds a NUL byte (\\u0000), which no command line, environment or export can "
        "carry; remove it"
    )


def test_a_control_character_in_a_key_is_refused(tmp_path: Path) -> None:
    text = STUDY.replace('model-path = "/models/Kimi K2.5"', '"model-path\\n" = "/m"')
    with pytest.raises(ConfigError) as err:
        parse_study(tomllib.loads(text), name="t", path=tmp_path / "t.toml")
    assert (
        str(err.value) == "server.flags.model-path\\n: the key holds a control character; remove it"
    )
    env = STUDY.replace('SGLANG_ENABLE_SPEC_V2 = "1"', '"SGLANG\\n" = "1"')
    with pytest.raises(ConfigError, match=r"^server\.env\.SGLANG\\n: the key holds a control"):
        parse_study(tomllib.loads(env), name="t", path=tmp_path / "t.toml")


def test_other_control_characters_in_values_load(tmp_path: Path) -> None:
    """A newline, a tab or an escape in a value is carried to the launch as it is (each export
    format escapes or refuses it itself)."""
    text = STUDY.replace('model-path = "/models/Kimi K2.5"', 'model-path = "a\\nb\\tc\\u001bd"')
    cfg = parse_study(tomllib.loads(text), name="t", path=tmp_path / "t.toml")
    assert dict(cfg.server.flags)["model_path"] == "a\nb\tc\x1bd"


@pytest.mark.e2e
def test_run_refuses_a_nul_before_it_writes_anything(tmp_path: Path) -> None:
    study = tmp_path / "nul.toml"
    study.write_text(
        sim_study(n_trials=1, duration=0.3).replace(
            "[server.flags]", '[server.env]\nX = "a\\u0000b"\n\n[server.flags]'
        )
    )
    with pytest.raises(ConfigError):
        load_study(study)
    for command in (("run",), ("status",), ("export", "--format", "systemd")):
        done = run(study, *command, timeout=120)
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        assert done.stderr == (
            "autotune: error: server.env.X: holds a NUL byte (\\u0000), which no command line, "
            "environment or export can carry; remove it\n"
        ), command
        assert done.stdout == ""
    assert not (tmp_path / "results").exists()  # no study, no trial, no lock
