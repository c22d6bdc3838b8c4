"""SGLang-compatible flag parsing and strict profile loading."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from autotune.sim.flags import Fault, flags_for, parse_command_line, parse_version
from autotune.sim.profiles import (
    PROFILE_DIR,
    ProfileError,
    list_profiles,
    load_profile,
    profile_from_dict,
)
from autotune.testing.oracle import bench_for, best_stable
from tests.sim.conftest import OPERATOR as FLAGS

OPERATOR = [
    *FLAGS,
    *("--mem-fraction-static", "0.88", "--host", "127.0.0.1", "--port", "30000"),
    *("--trust-remote-code", "--tool-call-parser", "kimi_k2", "--reasoning-parser", "kimi_k2"),
]


def test_operator_command_line_parses() -> None:
    cmd = parse_command_line(OPERATOR)
    s = cmd.settings
    assert (s.tp_size, s.mem_fraction_static, s.max_running_requests) == (8, 0.88, 48)
    assert s.enable_hierarchical_cache and s.hicache_size == 48
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
    new = {f.name for f in flags_for("0.5.23")}
    assert "--cuda-graph-max-bs" in old and "--cuda-graph-max-bs" not in new
    assert "--cuda-graph-max-bs-decode" in new and "--cuda-graph-max-bs-decode" not in old
    tp9 = next(f for f in flags_for("0.5.9") if f.dest == "tensor_parallel_size")
    tp23 = next(f for f in flags_for("0.5.23") if f.dest == "tp_size")
    assert tp9.names == ("--tensor-parallel-size", "--tp-size")
    assert tp23.names == ("--tp-size", "--tensor-parallel-size")
    assert parse_version("0.4.6.post5") == (0, 4, 6, 5)


def test_new_spelling_maps_to_old_field_on_new_versions() -> None:
    cmd = parse_command_line(
        ["--model", "m", "--cuda-graph-max-bs-decode", "16", "--tp", "8"], version="0.5.23"
    )
    assert cmd.settings.cuda_graph_max_bs == 16
    assert cmd.settings.tp_size == 8
    assert cmd.sim.version == "0.5.23"


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_hicache_size_is_an_int_flag(version: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        parse_command_line(["--model", "m", "--hicache-size", "48"], version).settings.hicache_size
        == 48
    )
    with pytest.raises(SystemExit) as exc:
        parse_command_line(["--model", "m", "--hicache-size", "24.5"], version)
    assert exc.value.code == 2
    assert "argument --hicache-size: invalid int value: '24.5'" in capsys.readouterr().err


def test_removed_flag_is_ambiguous_in_0523(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_command_line(["--model", "m", "--cuda-graph-max-bs", "8"], "0.5.23")
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, " \
        "--cuda-graph-max-bs-prefill" in err  # fmt: skip


def test_sim_version_flag_and_profile_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_command_line(["--model", "m"]).sim.version == "0.5.9"
    assert parse_command_line(["--model", "m"], default_version="0.5.23").sim.version == "0.5.23"
    named = parse_command_line(["--model", "m", "--sim-version", "0.5.23"], default_version="0.5.9")
    assert named.sim.version == "0.5.23"
    assert named.argv == ("--model", "m")
    with pytest.raises(SystemExit):
        parse_command_line(["--model", "m", "--sim-version", "0.5.14"])
    assert "argument --sim-version: invalid choice: '0.5.14'" in capsys.readouterr().err


def test_deprecated_flag_warns_like_0523(capsys: pytest.CaptureFixture[str]) -> None:
    cmd = parse_command_line(["--model", "m", "--disable-cuda-graph"], "0.5.23")
    assert cmd.settings.decode_graph_disabled and cmd.settings.prefill_graph_disabled
    assert (
        "'--disable-cuda-graph' is deprecated and will be removed in a future release. Use "
        "'--cuda-graph-backend-{decode,prefill}=disabled' instead." in capsys.readouterr().err
    )


def test_human_readable_ints_in_0523() -> None:
    s = parse_command_line(["--model", "m", "--max-total-tokens", "128k"], "0.5.23").settings
    assert s.max_total_tokens == 128_000
    with pytest.raises(SystemExit):
        parse_command_line(["--model", "m", "--max-total-tokens", "128k"], "0.5.9")


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


BENCH_PROFILES = Path(__file__).resolve().parents[2] / "scripts" / "bench_profiles"


@pytest.mark.parametrize("path", sorted(BENCH_PROFILES.rglob("*.toml")), ids=lambda p: p.stem)
def test_every_benchmark_profile_loads_under_its_own_name_and_has_a_stable_setting(
    path: Path,
) -> None:
    profile = load_profile(str(path))
    assert profile.name == path.stem
    assert best_stable(bench_for(profile)) > 0


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
    doc["attention"]["kind"] = "mha"
    doc["sglang_version"] = "0.5.14"
    with pytest.raises(ProfileError, match=r"sglang_version: expected one of 0\.5\.9, 0\.5\.23"):
        profile_from_dict(doc)


@pytest.mark.parametrize(
    ("table", "key", "value", "message"),
    [
        ("hardware", "cuda_context_gib", float("nan"), r"cuda_context_gib: must be a finite"),
        ("model", "weights_gib", float("inf"), r"model\.weights_gib: must be a finite number"),
        ("model", "context_length", 0, r"model\.context_length: must be positive, got 0"),
        ("model", "weights_tp", 0, r"model\.weights_tp: must be positive, got 0"),
    ],
)
def test_a_value_the_simulator_cannot_size_a_box_by_is_named(
    table: str, key: str, value: float, message: str
) -> None:
    """Numbers the loader once let through to a division or an int(): each is one line naming
    the key, not a traceback in the simulator or the benchmark."""
    doc = tomllib.loads((PROFILE_DIR / "qwen3-32b-h200.toml").read_text())
    doc[table][key] = value
    with pytest.raises(ProfileError, match=message):
        profile_from_dict(doc)


def test_a_draft_that_accepts_less_than_a_token_per_step_is_named() -> None:
    doc = tomllib.loads((PROFILE_DIR / "kimi-k2.5-tp8-96g.toml").read_text())
    doc["draft"]["accept_length"] = 0.5
    with pytest.raises(ProfileError, match=r"draft\.accept_length: must be above 0\.999"):
        profile_from_dict(doc)
    doc["draft"]["accept_length"] = 2.5
    doc["draft"]["num_steps"] = 0
    with pytest.raises(ProfileError, match=r"draft\.num_steps: must be positive"):
        profile_from_dict(doc)


def test_a_profile_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    text = (PROFILE_DIR / "qwen3-32b-h200.toml").read_text()
    path.write_bytes(text.replace('description = "', 'description = "caf\u00e9 ').encode("latin-1"))
    with pytest.raises(ProfileError, match="not UTF-8 text"):
        load_profile(path)


def test_kimi_profile_speaks_059_on_the_operators_gpus() -> None:
    prof = load_profile("kimi-k2.5-tp8-96g")
    assert prof.sglang_version == "0.5.9"
    assert prof.hardware.gpu_name.startswith("NVIDIA RTX PRO 6000 Blackwell")
    assert prof.hardware.gpu_memory_mib == 97_887


def test_a_target_that_carries_its_draft_layers_needs_no_draft_path() -> None:
    """SGLang's GLM-4.5 recipe (`--speculative-algorithm EAGLE`, no draft path): 0.5.23 takes the
    model path as the draft's for the architectures whose checkpoint holds the MTP layers; for any
    other the flag is required, as before."""
    argv = ["--model-path", "zai-org/GLM-4.5-Air-FP8", "--speculative-algorithm", "EAGLE"]
    cmd = parse_command_line(argv, version="0.5.23", architecture="Glm4MoeForCausalLM")
    assert cmd.settings.speculative_draft_model_path == "zai-org/GLM-4.5-Air-FP8"
    with pytest.raises(SystemExit) as exc:
        parse_command_line(argv, version="0.5.23", architecture="LlamaForCausalLM")
    assert exc.value.code == 2
