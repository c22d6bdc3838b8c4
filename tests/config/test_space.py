"""The one mapping from a trial to parameters and flags, for live and fixed trials alike."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import optuna
import pytest

from autotune.config.space import (
    Settings,
    gpus_needed,
    grid,
    params_from_flags,
    server_argv,
    settings_for,
    tuned_flags,
)
from autotune.config.studyfile import load_study
from tests.study.conftest import VALID


def _search(study_file: Callable[[str], Path], text: str = VALID):  # type: ignore[no-untyped-def]
    return load_study(study_file(text))


def test_fixed_trial_gives_the_flags(study_file: Callable[[str], Path]) -> None:
    cfg = _search(study_file)
    params = {"mem_fraction_static": 0.88, "max_running_requests": 48, "hicache_size": 48}
    s = settings_for(optuna.trial.FixedTrial(params), cfg.search)
    assert dict(s.params) == params
    assert s.flags == (
        "--mem-fraction-static", "0.88",
        "--max-running-requests", "48",
        "--enable-hierarchical-cache", "--hicache-size", "48",
    )  # fmt: skip


def test_hicache_zero_means_off(study_file: Callable[[str], Path]) -> None:
    cfg = _search(study_file)
    flags = tuned_flags(
        {"mem_fraction_static": 0.9, "max_running_requests": 32, "hicache_size": 0}, cfg.search
    )
    assert "--enable-hierarchical-cache" not in flags and "--hicache-size" not in flags


def test_live_trial_values_are_snapped_to_the_step(study_file: Callable[[str], Path]) -> None:
    cfg = _search(study_file)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(20):
        trial = study.ask()
        s = settings_for(trial, cfg.search)
        f = s.params["mem_fraction_static"]
        assert isinstance(f, float) and round(f, 2) == f and 0.8 <= f <= 0.94
        assert s.flags[1] == str(f)
        study.tell(trial, 0.0)


def test_flags_round_trip(study_file: Callable[[str], Path]) -> None:
    text = VALID.replace(
        "hicache_size = { choices = [0, 48] }",
        "hicache_size = { choices = [0, 48] }\n"
        "enable_mixed_chunk = { choices = [true, false] }\n"
        'schedule_policy = "lpm"',
    )
    cfg = _search(study_file, text)
    for params in (
        {"mem_fraction_static": 0.82, "max_running_requests": 64, "hicache_size": 0,
         "enable_mixed_chunk": True, "schedule_policy": "lpm"},
        {"mem_fraction_static": 0.94, "max_running_requests": 32, "hicache_size": 48,
         "enable_mixed_chunk": False, "schedule_policy": "lpm"},
    ):  # fmt: skip
        s = settings_for(optuna.trial.FixedTrial(params), cfg.search)
        argv = server_argv(cfg.server, s, backend="sglang")
        assert params_from_flags(argv, cfg.search) == params


def test_argv_has_base_command_fixed_then_tuned_flags(study_file: Callable[[str], Path]) -> None:
    cfg = _search(study_file)
    s = settings_for(
        optuna.trial.FixedTrial(
            {"mem_fraction_static": 0.88, "max_running_requests": 48, "hicache_size": 0}
        ),
        cfg.search,
    )
    real = server_argv(cfg.server, s, backend="sglang")
    assert real[:3] == ["python", "-m", "sglang.launch_server"]
    assert real[3:8] == ["--model-path", "/models/kimi", "--tp-size", "8", "--trust-remote-code"]
    assert real[-4:] == ["--mem-fraction-static", "0.88", "--max-running-requests", "48"]
    sim = server_argv(cfg.server, s, backend="sim", extra=("--sim-gpu-dir", "g"))
    assert sim[1:5] == ["-m", "autotune.sim", "--sim-profile", "kimi-k2.5-tp8-96g"]
    assert "--sim-time-scale" in sim and sim[-2:] == ["--sim-gpu-dir", "g"]
    assert real[3:] == sim[sim.index("--model-path") : -2]


def test_grid_enumerates_every_point(study_file: Callable[[str], Path]) -> None:
    cfg = _search(study_file)
    points = grid(cfg.search)
    assert points is not None and len(points) == 8 * 3 * 2
    assert {"mem_fraction_static": 0.94, "max_running_requests": 64, "hicache_size": 48} in points


def test_grid_needs_steps(study_file: Callable[[str], Path]) -> None:
    cfg = _search(study_file, VALID.replace(", step = 0.02", "").replace("0.88\n", "0.88\n", 1))
    assert grid(cfg.search) is None


@pytest.mark.parametrize(("value", "text"), [(0.9, "0.9"), (1.0, "1"), (48, "48"), ("x", "x")])
def test_render(value: float | int | str, text: str) -> None:
    from autotune.config.space import render

    assert render(value) == text


def test_a_value_beyond_the_space_replaces_the_fixed_flag_of_its_name(
    study_file: Callable[[str], Path],
) -> None:
    """An export may lower the prefill chunk the study fixed: one `--chunked-prefill-size`, its."""
    text = VALID.replace("tp-size = 8\n", "tp-size = 8\nchunked_prefill_size = 8192\n")
    cfg = _search(study_file, text)
    params = {"mem_fraction_static": 0.88, "max_running_requests": 48, "hicache_size": 0}
    plain = server_argv(cfg.server, settings_for(optuna.trial.FixedTrial(params), cfg.search),
                        backend="sglang")  # fmt: skip
    assert plain[plain.index("--chunked-prefill-size") + 1] == "8192"
    lowered = {**params, "chunked_prefill_size": 2048}
    flags = tuned_flags(lowered, cfg.search)
    assert flags[-2:] == ("--chunked-prefill-size", "2048")
    argv = server_argv(cfg.server, Settings(params=lowered, flags=flags), backend="sglang")
    assert argv.count("--chunked-prefill-size") == 1
    assert argv[argv.index("--chunked-prefill-size") + 1] == "2048"
    assert params_from_flags(argv, cfg.search) == params


def test_gpus_needed_multiplies_the_parallel_sizes() -> None:
    assert gpus_needed((("tp", 2),)) == 2
    assert gpus_needed((("tensor_parallel_size", 4), ("pp_size", 2))) == 8
    assert gpus_needed(()) == 1
    assert gpus_needed((("tp_size", 2), ("dp_size", 4))) == 8  # four replicas of TP2
    assert gpus_needed((("tp", 8), ("dp", 8), ("enable_dp_attention", True))) == 8
