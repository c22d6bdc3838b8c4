"""Every flag a shipped study, an export or the simulator's command emits parses with the real
SGLang's own `ServerArgs` parser (the `sglang_python` fixture's venv)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from autotune.config.schema import StudyConfig
from autotune.config.space import Settings, server_argv, tuned_flags
from autotune.config.studyfile import SHIPPED_STUDIES, load_study
from autotune.review.export import launch_argv
from autotune.server.flagcheck import FlagReport, inspect_argvs
from autotune.server.hostcheck import argvs_to_check
from autotune.sim.flags import sglang_argv

pytestmark = pytest.mark.sglang
CONFIGS = SHIPPED_STUDIES


def _studies() -> list[Path]:
    found = sorted(CONFIGS.glob("*.toml"))
    assert found, f"no shipped studies in {CONFIGS}"
    return found


def _as_sglang(cfg: StudyConfig, python: Path) -> StudyConfig:
    server = dataclasses.replace(
        cfg.server, backend="sglang", command=(str(python), "-m", "sglang.launch_server")
    )
    return dataclasses.replace(cfg, server=server)


def _without_sim_flags(argv: list[str]) -> list[str]:
    """The simulator's command with its own `--sim-*` options (and program) taken out."""
    return list(sglang_argv(argv[argv.index("autotune.sim") + 1 :]))


def _commands(cfg: StudyConfig, python: Path) -> dict[str, list[str]]:
    real = _as_sglang(cfg, python)
    out = {f"search point {i}": argv for i, argv in enumerate(argvs_to_check(real))}
    baseline = dict(cfg.search.baseline)
    out["export of the baseline"] = launch_argv(real, baseline, backend="sglang")
    settings = Settings(params=baseline, flags=tuned_flags(baseline, cfg.search))
    sim = server_argv(cfg.server, settings, backend="sim")
    out["the simulator's command"] = [str(python), "-m", "sglang.launch_server",
                                      *_without_sim_flags(sim)]  # fmt: skip
    return out


def _problems(commands: dict[str, list[str]]) -> dict[str, FlagReport]:
    names = list(commands)
    reports = inspect_argvs([commands[n] for n in names], backend="sglang")
    assert all(r.checked_by.startswith("SGLang 0.5.23") for r in reports), reports[0]
    return {n: r for n, r in zip(names, reports, strict=True) if r.problems}


@pytest.mark.parametrize("study", _studies(), ids=lambda p: p.stem)
def test_every_emitted_flag_parses_with_sglangs_parser(study: Path, sglang_python: Path) -> None:
    cfg = load_study(study)
    assert _problems(_commands(cfg, sglang_python)) == {}


def test_a_flag_sglang_does_not_take_is_caught(sglang_python: Path, tmp_path: Path) -> None:
    """The same check on a study that still passes the removed --cuda-graph-max-bs and a host
    cache write policy SGLang does not offer."""
    text = (CONFIGS / "kimi.toml").read_text()
    assert "[server.flags]\n" in text
    text = text.replace(
        "[server.flags]\n", '[server.flags]\ncuda-graph-max-bs = 64\nhicache-write-policy = "x"\n'
    )
    path = tmp_path / "kimi.toml"
    path.write_text(text)
    bad = _problems(_commands(load_study(path), sglang_python))
    assert bad, "a flag SGLang rejects passed"
    lines = [p for r in bad.values() for p in r.problems]
    assert any("--cuda-graph-max-bs is not a flag of this SGLang" in p for p in lines), lines
    assert any("--hicache-write-policy" in p and "invalid choice" in p for p in lines), lines
