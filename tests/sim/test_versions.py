"""The pure model per simulated release: 0.5.9 exactly as calibrated, 0.5.23's order and rules."""

from __future__ import annotations

import dataclasses

import pytest

from autotune.sim.flags import ServerSettings, parse_command_line
from autotune.sim.memplan import plan_startup
from autotune.sim.profiles import load_profile
from autotune.sim.runtime import transient_peak_gib
from autotune.sim.sizing import (
    GiB,
    auto_mem_fraction,
    cell_bytes,
    draft_fold_bytes,
    prefill_capture_tokens,
)
from autotune.sim.versions import VERSIONS, get_version
from tests.sim.conftest import OPERATOR

KIMI = "kimi-k2.5-tp8-96g"


def operator(fraction: float, version: str, *extra: str) -> ServerSettings:
    argv = [*OPERATOR, "--mem-fraction-static", str(fraction), *extra]
    return parse_command_line(argv, version).settings


@pytest.mark.parametrize(
    ("fraction", "tokens", "kv", "free"),
    [
        (0.85, 116_202, "7.61", "8.38"),
        (0.88, 159_312, "10.43", "5.54"),
        (0.93, 231_163, "15.13", "0.80"),
    ],
)
def test_059_mode_is_exactly_the_calibrated_operator(
    fraction: float, tokens: int, kv: str, free: str
) -> None:
    plan = plan_startup(load_profile(KIMI), operator(fraction, "0.5.9"))
    assert plan.version == "0.5.9"
    assert plan.max_total_num_tokens == tokens
    assert f"{plan.kv_gib:.2f}" == kv and f"{plan.avail_final_gib:.2f}" == free


def test_0523_folds_the_draft_layer_into_the_cell() -> None:
    prof = load_profile(KIMI)
    assert prof.draft is not None
    cell = cell_bytes(prof.attention, 8, 2)
    assert (cell, draft_fold_bytes(cell, prof.attention, prof.draft.attention)) == (70_272, 1_152)
    plan = plan_startup(prof, operator(0.88, "0.5.23"), version="0.5.23")
    assert plan.sizing_cell_bytes == 71_424
    # A = P − W − W_draft; N = (A − P·(1 − f)) / 71,424 B
    assert plan.avail_after_draft_weights_gib == pytest.approx(plan.p_gib - 72.3349 - 0.65)
    rest = plan.avail_after_draft_weights_gib - plan.p_gib * 0.12
    assert plan.max_total_num_tokens == int(rest * GiB) // 71_424
    assert plan.max_total_num_tokens == pytest.approx(146_958, abs=50)


def test_0523_request_table_has_a_padding_row() -> None:
    prof = load_profile(KIMI)
    plan = plan_startup(prof, operator(0.88, "0.5.23"), version="0.5.23")
    assert plan.req_to_token_gib == pytest.approx(49 * (262_144 + 4 + 4) * 4 / GiB)


def test_0523_edge_is_about_a_hundredth_higher() -> None:
    prof = load_profile(KIMI)
    peak = transient_peak_gib(prof, 8192, 0)

    def edge(version: str) -> float:
        ok = [
            f / 1000
            for f in range(880, 960)
            if (p := plan_startup(prof, operator(f / 1000, version), version=version)).ok
            and (p.avail_final_gib or 0.0) > peak
        ]
        return max(ok)

    assert edge("0.5.9") == pytest.approx(0.912, abs=0.001)
    assert 0.005 <= edge("0.5.23") - edge("0.5.9") <= 0.012


def test_0523_weights_can_leave_no_kv_room() -> None:
    plan = plan_startup(load_profile(KIMI), operator(0.5, "0.5.23"), version="0.5.23")
    assert plan.failure is not None and plan.failure.kind == "kv_budget"
    assert plan.failure.message.startswith(
        "Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.5. "
        "Raise --mem-fraction-static above 0.777 (minimum viable = 1 - available/pre = 0.7760)."
    )


def test_0523_auto_fraction_matches_its_own_resolution() -> None:
    # facts §4.4, produced by 0.5.23's resolution: 0.833, 0.842 with 64 running requests
    assert auto_mem_fraction(97_887, 8192, 16384, 512, 8, version="0.5.23",
                             prefill_graph_sizes=58, mla=True) == 0.833  # fmt: skip
    assert auto_mem_fraction(97_887, 8192, 16384, 64, 8, version="0.5.23",
                             prefill_graph_sizes=58, mla=True) == 0.842  # fmt: skip
    prof = load_profile(KIMI)
    s = parse_command_line(["--model", "m", "--tp", "8", "--max-running-requests", "64"], "0.5.23")
    assert plan_startup(prof, s.settings, version="0.5.23").mem_fraction_static == 0.842


def test_prefill_capture_sizes() -> None:
    tokens = prefill_capture_tokens(8192)
    assert len(tokens) == 58 and tokens[0] == 4 and tokens[-1] == 8192
    prof = load_profile(KIMI)
    plan = plan_startup(prof, operator(0.88, "0.5.23"), version="0.5.23")
    assert plan.prefill_capture_tokens == tokens
    assert plan_startup(prof, operator(0.88, "0.5.9")).prefill_capture_tokens == ()


def test_0523_host_budget_is_per_rank_and_a_small_pool_only_warns() -> None:
    prof = load_profile(KIMI)
    big = plan_startup(prof, operator(0.88, "0.5.23", "--hicache-size", "400"), version="0.5.23")
    assert big.failure is not None and big.failure.kind == "host_memory"
    per_rank = (2100e9 - 10 * GiB) // 8 / 1e9
    assert f"only have {per_rank:.2f} GB free" in big.failure.message
    fits = plan_startup(prof, operator(0.88, "0.5.23"), version="0.5.23")
    assert fits.ok and fits.host_draft_tokens == fits.host_cache_tokens
    assert fits.host_draft_gb == pytest.approx(fits.host_cache_tokens * 512 / 1e9)  # type: ignore[operator]
    small = operator(0.88, "0.5.23", "--hicache-size", "0", "--hicache-ratio", "0.5")
    plan = plan_startup(prof, small, version="0.5.23")
    assert plan.ok
    assert any("is smaller than the device pool" in n for n in plan.notes_at("hicache"))
    assert plan_startup(prof, dataclasses.replace(small), version="0.5.9").failure.kind == (  # type: ignore[union-attr]
        "hicache_too_small"
    )


def test_0523_hicache_auto_sizing_shrinks_the_ratio() -> None:
    prof = load_profile(KIMI)
    hw = dataclasses.replace(prof.hardware, host_ram_available_gb=100.0)
    tight = dataclasses.replace(prof, hardware=hw)
    at = OPERATOR.index("--hicache-size")
    argv = OPERATOR[:at] + OPERATOR[at + 2 :]
    s = parse_command_line([*argv, "--mem-fraction-static", "0.88"], "0.5.23").settings
    plan = plan_startup(tight, s, version="0.5.23")
    assert plan.ok and plan.host_auto_ratio is not None
    requested, ratio = plan.host_auto_ratio
    assert requested == 2.0 and 0 < ratio < 2.0


def mha(version: str, env: dict[str, str], *extra: str) -> ServerSettings:
    return parse_command_line(["--model", "m", "--tp", "8", *extra], version, env).settings


def test_post_capture_kv_sizing_mha_only_and_opt_in() -> None:
    llama = load_profile("llama-3.1-70b-tp8-h100")
    on = {"SGLANG_ENABLE_POST_CAPTURE_KV_SIZING": "1"}
    off = plan_startup(llama, mha("0.5.23", {}), version="0.5.23")
    post = plan_startup(llama, mha("0.5.23", on), version="0.5.23", env=on)
    assert not off.post_capture and post.post_capture
    assert post.mem_fraction_static == round((81_559 - 1536 - 1024) / 81_559, 3)
    assert post.post_capture_tokens is not None and post.profiled_tokens is not None
    assert post.post_capture_tokens <= post.profiled_tokens
    assert post.max_total_num_tokens == post.post_capture_tokens
    # it keeps at least P·(1 − f) free (raised to the activation reserve: max_bs 512 < 4096)
    assert post.avail_final_gib is not None
    assert post.avail_final_gib >= post.p_gib * (1 - post.mem_fraction_static)
    assert any("reserving activation headroom" in n for n in post.notes_at("post_capture"))
    kimi = load_profile(KIMI)
    assert not plan_startup(kimi, mha("0.5.23", on), version="0.5.23", env=on).post_capture
    assert not plan_startup(llama, mha("0.5.9", on), env=on).post_capture


def test_0523_unbalanced_ranks_raise() -> None:
    prof = load_profile(KIMI)
    s = operator(0.93, "0.5.23")
    plan = plan_startup(prof, s, version="0.5.23", foreign_gib=[0, 0, 12.0])
    assert plan.failure is not None and plan.failure.kind == "tp_imbalance"
    assert "pre_model_load_memory=" in plan.failure.message
    off = {"SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK": "0"}
    warned = plan_startup(prof, s, version="0.5.23", foreign_gib=[0, 0, 12.0], env=off)
    assert warned.ok and len(warned.notes_at("init")) == 7  # every rank but the short one
    assert plan_startup(prof, s, foreign_gib=[0, 0, 12.0]).ok  # 0.5.9 (as simulated): a warning


def test_versions_are_data() -> None:
    assert set(VERSIONS) == {"0.5.9", "0.5.23"}
    assert get_version("0.5.23").graceful_exit_code == 0
    assert get_version("0.5.9").graceful_exit_code is None
    with pytest.raises(KeyError, match="not simulated"):
        get_version("0.6.0")
