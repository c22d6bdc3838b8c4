"""SGLang-compatible flag parsing and strict profile loading."""

from __future__ import annotations

import tomllib

import pytest

from autotune.sim.flags import Fault, flags_for, parse_command_line, parse_version
from autotune.sim.profiles import (
    PROFILE_DIR,
    ProfileError,
    list_profiles,
    load_profile,
    profile_from_dict,
)

OPERATOR = [
    "--model-path",
    "moonshotai/Kimi-K2.5",
    "--tp",
    "8",
    "--mem-fraction-static",
    "0.88",
    "--max-running-requests",
    "48",
    "--chunked-prefill-size",
    "8192",
    "--enable-hierarchical-cache",
    "--hicache-size",
    "48",
    "--host",
    "127.0.0.1",
    "--port",
    "30000",
    "--speculative-algorithm",
    "EAGLE3",
    "--speculative-draft-model-path",
    "d",
    "--trust-remote-code",
    "--tool-call-parser",
    "kimi_k2",
    "--reasoning-parser",
    "kimi_k2",
]


def test_operator_command_line_parses() -> None:
    cmd = parse_command_line(OPERATOR)
    s = cmd.settings
    assert (s.tp_size, s.mem_fraction_static, s.max_running_requests) == (8, 0.88, 48)
    assert s.enable_hierarchical_cache and s.hicache_size == 48.0
    assert s.spec
    assert s.noted["tool_call_parser"] == "kimi_k2"
    assert s.noted["trust_remote_code"] is True
    assert cmd.sim.profile == "kimi-k2.5-tp8-96g"


def test_sim_flags_and_env_gpu_dir() -> None:
    cmd = parse_command_line(
        [
            "--model",
            "m",
            "--sim-fault",
            "hold-gpu=3",
            "--sim-fault",
            "health-empty",
            "--sim-seed",
            "7",
            "--sim-time-scale",
            "1000",
        ],
        env={"AUTOTUNE_SIM_GPU_DIR": "/tmp/x"},
    )
    assert cmd.sim.faults == (Fault("hold-gpu", 3.0), Fault("health-empty"))
    assert cmd.sim.gpu_dir == "/tmp/x"
    assert cmd.sim.seed == 7 and cmd.sim.time_scale == 1000


@pytest.mark.parametrize(
    "argv",
    [
        ["--model-path", "m", "--no-such-flag"],
        ["--model-path", "m", "--mem-fraction-static", "lots"],
        ["--model-path", "m", "--sim-fault", "explode"],
        ["--model-path", "m", "--sim-fault", "hold-gpu"],
        ["--model-path", "m", "--cuda-graph-max-bs-decode", "8"],  # 0.5.14+ only
        ["--model-path", "m", "--kv-cache-dtype", "int3"],
        ["--mem-fraction-static", "0.8"],
    ],
)
def test_rejected_like_argparse_with_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_command_line(argv)
    assert exc.value.code == 2


def test_flag_table_is_versioned() -> None:
    old = {f.name for f in flags_for((0, 5, 9))}
    new = {f.name for f in flags_for((0, 5, 23))}
    assert "--cuda-graph-max-bs" in old and "--cuda-graph-max-bs" not in new
    assert "--cuda-graph-max-bs-decode" in new and "--cuda-graph-max-bs-decode" not in old
    assert parse_version("0.4.6.post5") == (0, 4, 6, 5)


def test_new_spelling_maps_to_old_field_on_new_versions() -> None:
    cmd = parse_command_line(
        ["--model", "m", "--cuda-graph-max-bs-decode", "16"], version=(0, 5, 14)
    )
    assert cmd.settings.cuda_graph_max_bs == 16


def test_all_shipped_profiles_load() -> None:
    names = list_profiles()
    assert {
        "kimi-k2.5-tp8-96g",
        "llama-3.1-70b-tp8-h100",
        "qwen3-32b-h200",
        "deepseek-v3-tp8-h200",
    } <= set(names)
    for name in names:
        assert load_profile(name).name == name


def test_profile_errors_name_the_key() -> None:
    with pytest.raises(ProfileError, match="nope"):
        load_profile("nope")
    with pytest.raises(ProfileError, match="bogus"):
        profile_from_dict({"name": "x", "bogus": 1})
    doc = tomllib.loads((PROFILE_DIR / "qwen3-32b-h200.toml").read_text())
    doc["hardware"]["gpu_count"] = "two"
    with pytest.raises(ProfileError, match=r"hardware\.gpu_count"):
        profile_from_dict(doc)
    doc["hardware"]["gpu_count"] = 1
    doc["attention"]["kind"] = "gqa"
    with pytest.raises(ProfileError, match=r"attention\.kind"):
        profile_from_dict(doc)
