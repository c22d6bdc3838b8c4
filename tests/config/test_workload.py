"""The [workload] table: defaults, every shape, and one-line errors naming the dotted key."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.config import workload
from autotune.config.workload import LengthDist, workload_from_dict
from autotune.errors import ConfigError

FULL = {
    "api": "chat",
    "stream": False,
    "seed": 42,
    "api_key_env": "MY_KEY",
    "input_len": {"dist": "lognormal", "mean": 2000, "std": 1500, "min": 16, "max": 32000},
    "output_len": {"dist": "uniform", "min": 64, "max": 512},
    "sessions": {"turns": 4, "system_prompt_len": 2048, "system_prompts": 8},
    "phases": [
        {"kind": "warmup", "requests": 8, "concurrency": 4},
        {"kind": "steady", "concurrency": 32, "duration_s": 120, "name": "main"},
        {"kind": "poisson", "rate": 8.5, "duration_s": 60, "output_len": 32},
        {"kind": "stress", "rounds": 3},
    ],
}


def test_full_table_parses() -> None:
    spec = workload_from_dict(FULL)
    assert spec.api == "chat" and not spec.stream and spec.seed == 42
    assert spec.input_len == LengthDist("lognormal", 16, 32000, 2000.0, 1500.0)
    assert spec.output_len == LengthDist("uniform", 64, 512, 288.0, 0.0)
    assert spec.sessions == workload.Sessions(4, 2048, 8)
    w, s, p, x = spec.phases
    assert w == workload.Warmup("warmup-0", 8, 4)
    assert s == workload.Steady("main", 32, 120.0)
    assert isinstance(p, workload.Poisson)
    assert p.rate == 8.5 and p.output_len == LengthDist.fixed(32)
    assert x == workload.Stress("stress-3", rounds=3)
    assert spec.max_wall_s() == 300 + 120 + 60 + 60 + 60 + 600


def test_defaults() -> None:
    spec = workload_from_dict({"phases": [{"kind": "steady", "concurrency": 1, "duration_s": 1}]})
    assert spec.api == "generate" and spec.stream and spec.ignore_eos
    assert spec.input_len == LengthDist.fixed(1024)
    assert spec.api_key() is None


@pytest.mark.parametrize(
    ("change", "key", "words"),
    [
        ({"phases": []}, "workload.phases", "non-empty"),
        ({"bogus": 1}, "workload.bogus", "unknown key"),
        ({"seed": "x"}, "workload.seed", "whole number"),
        ({"stream": 1}, "workload.stream", "true or false"),
        ({"input_len": 0}, "workload.input_len", "[1,"),
        ({"input_len": {"dist": "zipf"}}, "workload.input_len.dist", "one of"),
        (
            {"input_len": {"dist": "uniform", "min": 9, "max": 3}},
            "workload.input_len.max",
            ">= min",
        ),
        ({"output_len": {"dist": "normal", "mean": 10}}, "workload.output_len.std", "missing"),
        ({"sessions": {"turns": 0}}, "workload.sessions.turns", "≥ 1"),
        ({"api_key_env": "not a name"}, "workload.api_key_env", "environment variable"),
    ],
)
def test_bad_values_name_the_key(change: dict[str, object], key: str, words: str) -> None:
    with pytest.raises(ConfigError) as exc:
        workload_from_dict({**FULL, **change})
    assert exc.value.key == key
    assert words in str(exc.value)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize(
    ("phase", "key"),
    [
        ({"kind": "poisson", "duration_s": 5}, "workload.phases[2].rate"),
        ({"kind": "poisson", "rate": -1, "duration_s": 5}, "workload.phases[2].rate"),
        ({"kind": "steady", "concurrency": 2}, "workload.phases[2].duration_s"),
        ({"kind": "stress", "rounds": True}, "workload.phases[2].rounds"),
        ({"kind": "burst"}, "workload.phases[2].kind"),
        ({"kind": "warmup", "extra": 1}, "workload.phases[2].extra"),
        (
            {"kind": "steady", "concurrency": 1, "duration_s": 1, "name": "main"},
            "workload.phases[2].name",
        ),
    ],
)
def test_bad_phase_names_its_index(phase: dict[str, object], key: str) -> None:
    phases = [*FULL["phases"][:2], phase]  # type: ignore[index]
    with pytest.raises(ConfigError) as exc:
        workload_from_dict({**FULL, "phases": phases})
    assert exc.value.key == key


def test_api_key_from_named_environment_variable() -> None:
    spec = workload_from_dict(FULL)
    assert spec.api_key({"MY_KEY": "s3cret"}) == "s3cret"
    with pytest.raises(ConfigError, match="MY_KEY is not set"):
        spec.api_key({})


def test_dataset_rows_and_errors(tmp_path: Path) -> None:
    data = tmp_path / "lens.jsonl"
    data.write_text(
        '{"input_len": 5, "output_len": 7}\n\n{"prompt": "hi there", "output_len": 3}\n'
    )
    spec = workload_from_dict(
        {"dataset": "lens.jsonl", "phases": FULL["phases"]}, base_dir=tmp_path
    )
    assert [(r.input_len, r.output_len, r.prompt) for r in spec.dataset_rows] == [
        (5, 7, None),
        (None, 3, "hi there"),
    ]
    with pytest.raises(ConfigError, match="remove input_len"):
        workload_from_dict({**FULL, "dataset": str(data)})
    data.write_text('{"input_len": 5}\n')
    with pytest.raises(ConfigError, match=r"lens.jsonl:1"):
        workload_from_dict({"dataset": str(data), "phases": FULL["phases"]})
    with pytest.raises(ConfigError, match="cannot read"):
        workload_from_dict({"dataset": str(tmp_path / "no.jsonl"), "phases": FULL["phases"]})
