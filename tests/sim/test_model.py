"""The pure model against reference §1.7 (Kimi-K2, 96 GB, TP8) and the operator's figures."""

from __future__ import annotations

import dataclasses

import pytest

from autotune.sim.flags import ServerSettings
from autotune.sim.memplan import plan_startup
from autotune.sim.profiles import Attention, Profile, load_profile
from autotune.sim.runtime import decode_throughput, forward_ooms, predict, transient_peak_gib
from autotune.sim.sizing import GiB, auto_mem_fraction, capture_batch_sizes, cell_bytes

KIMI = "kimi-k2.5-tp8-96g"


def worked_example() -> Profile:
    """Reference §1.7: P = 72.33 + 21.71 = 94.04 GiB exactly, no draft, no jitter."""
    prof = load_profile(KIMI)
    total = prof.hardware.gpu_memory_mib / 1024
    hw = dataclasses.replace(prof.hardware, cuda_context_gib=total - 94.04)
    model = dataclasses.replace(prof.model, weights_gib=72.33)
    var = dataclasses.replace(prof.variation, startup_mib=0.0)
    return dataclasses.replace(prof, hardware=hw, model=model, variation=var)


def settings(**kw: object) -> ServerSettings:
    base: dict[str, object] = {"model_path": "m", "tp_size": 8}
    base.update(kw)
    return ServerSettings(**base)  # type: ignore[arg-type]


def test_mla_cell_size_is_latent_times_layers_times_elem() -> None:
    att = Attention(kind="mla", layers=61, kv_lora_rank=512, qk_rope_head_dim=64)
    assert cell_bytes(att, 8, 2) == 70_272
    assert cell_bytes(att, 8, 1) == 35_136


def test_mha_cell_size_splits_heads_across_tp_and_replicates_past_kv_heads() -> None:
    att = Attention(kind="mha", layers=80, kv_heads=8, head_dim=128, v_head_dim=128)
    assert cell_bytes(att, 1, 2) == 8 * 256 * 80 * 2
    assert cell_bytes(att, 8, 2) == 256 * 80 * 2
    assert cell_bytes(att, 16, 2) == 256 * 80 * 2  # one head replicated


@pytest.mark.parametrize(
    ("fraction", "tokens", "kv_printed"),
    [(0.85, 116_187, "7.60"), (0.88, 159_294, "10.43"), (0.93, 231_140, "15.13")],
)
def test_worked_example_table(fraction: float, tokens: int, kv_printed: str) -> None:
    plan = plan_startup(worked_example(), settings(mem_fraction_static=fraction))
    assert plan.p_gib == pytest.approx(94.04)
    assert plan.avail_after_weights_gib == pytest.approx(21.71)
    assert plan.max_total_num_tokens == pytest.approx(tokens, abs=2)
    assert f"{plan.kv_gib:.2f}" == kv_printed


def test_default_max_running_requests_is_2048_at_088() -> None:
    plan = plan_startup(worked_example(), settings(mem_fraction_static=0.88))
    assert plan.max_num_reqs == 2048
    assert plan.max_running_requests == 2048


def test_request_table_uses_context_plus_four_int32() -> None:
    prof = worked_example()
    prof = dataclasses.replace(prof, model=dataclasses.replace(prof.model, context_length=131_072))
    plan = plan_startup(prof, settings(mem_fraction_static=0.88))
    assert plan.req_to_token_gib == pytest.approx(2048 * 131_076 * 4 / GiB)
    assert plan.req_to_token_gib == pytest.approx(1.00, abs=0.01)


def test_fp8_kv_doubles_tokens_and_page_size_floors() -> None:
    prof = worked_example()
    fp8 = plan_startup(prof, settings(mem_fraction_static=0.88, kv_cache_dtype="fp8_e4m3"))
    assert fp8.max_total_num_tokens == pytest.approx(318_600, rel=0.001)
    paged = plan_startup(prof, settings(mem_fraction_static=0.88, page_size=64))
    assert paged.max_total_num_tokens == 159_232


def test_max_total_tokens_caps_but_never_raises() -> None:
    prof = worked_example()
    capped = plan_startup(prof, settings(mem_fraction_static=0.88, max_total_tokens=100_000))
    assert capped.max_total_num_tokens == 100_000
    big = plan_startup(prof, settings(mem_fraction_static=0.88, max_total_tokens=10**7))
    assert big.max_total_num_tokens == pytest.approx(159_294, abs=2)


def test_max_running_requests_does_not_size_the_pool() -> None:
    prof = worked_example()
    a = plan_startup(prof, settings(mem_fraction_static=0.88, max_running_requests=48))
    b = plan_startup(prof, settings(mem_fraction_static=0.88))
    assert a.max_total_num_tokens == b.max_total_num_tokens
    assert (a.req_to_token_gib or 0) < (b.req_to_token_gib or 0)
    assert (a.graph_gib or 0) < (b.graph_gib or 0)  # capture list capped at 48


def test_auto_fraction_matches_reference() -> None:
    assert auto_mem_fraction(97_887, 8192, 16384, 512, 8) == 0.848
    assert auto_mem_fraction(97_887, 8192, 16384, 512, 8, spec_algorithm="EAGLE3") == 0.827


def test_capture_lists() -> None:
    assert len(capture_batch_sizes(512, False, 4096)) == 52
    spec48 = capture_batch_sizes(512, True, 48)
    assert spec48[:9] == (1, 2, 3, 4, 5, 6, 7, 8, 10)
    assert max(spec48) == 48
    assert capture_batch_sizes(512, False, 100)[-1] == 100


def test_not_enough_memory_below_weights() -> None:
    plan = plan_startup(worked_example(), settings(mem_fraction_static=0.7))
    assert plan.failure is not None
    assert plan.failure.kind == "kv_pool"
    assert "mem_fraction_static=0.7" in plan.failure.message


def operator(fraction: float) -> ServerSettings:
    return settings(
        mem_fraction_static=fraction,
        max_running_requests=48,
        chunked_prefill_size=8192,
        speculative_algorithm="EAGLE3",
        speculative_draft_model_path="draft",
        enable_hierarchical_cache=True,
        hicache_size=48.0,
    )


def test_operator_profile_hits_the_logged_figures() -> None:
    prof = load_profile(KIMI)
    p85 = plan_startup(prof, operator(0.85))
    p88 = plan_startup(prof, operator(0.88))
    p93 = plan_startup(prof, operator(0.93))
    assert p85.max_total_num_tokens == pytest.approx(116_000, rel=0.01)
    assert p88.max_total_num_tokens == pytest.approx(159_277, rel=0.002)
    assert f"{p88.kv_gib:.2f}" in ("10.42", "10.43")
    assert p88.weights_gib == pytest.approx(72.33, abs=0.005)
    assert p88.graph_gib == pytest.approx(3.75, abs=0.1)
    assert p88.avail_final_gib == pytest.approx(5.47, abs=0.1)
    assert p93.ok
    assert p93.avail_final_gib == pytest.approx(0.82, abs=0.1)
    assert p88.host_cache_gb == pytest.approx(48.0, abs=0.01)


def test_operator_oom_rule_088_survives_093_dies_on_8k_chunk() -> None:
    prof = load_profile(KIMI)
    peak = transient_peak_gib(prof, 8192, 0)
    assert forward_ooms(plan_startup(prof, operator(0.93)), peak)
    assert not forward_ooms(plan_startup(prof, operator(0.88)), peak * 1.3)
    assert not forward_ooms(plan_startup(prof, operator(0.93)), transient_peak_gib(prof, 8, 0))


def test_operator_decode_rates() -> None:
    prof = load_profile(KIMI)
    assert decode_throughput(prof, 48, True) == pytest.approx(980, rel=0.1)
    assert decode_throughput(prof, 1, True) == pytest.approx(90, rel=0.15)


def test_capture_oom_and_host_memory_failures() -> None:
    prof = load_profile(KIMI)
    assert plan_startup(prof, operator(0.95)).failure.kind == "graph_capture_oom"  # type: ignore[union-attr]
    big = dataclasses.replace(operator(0.88), hicache_size=5000.0)
    assert plan_startup(prof, big).failure.kind == "host_memory"  # type: ignore[union-attr]
    over = dataclasses.replace(operator(0.88), hicache_size=400.0)
    assert plan_startup(prof, over).failure.kind == "host_oom_killer"  # type: ignore[union-attr]


def test_foreign_memory_shrinks_p_and_warns() -> None:
    prof = worked_example()
    plan = plan_startup(prof, settings(mem_fraction_static=0.88), foreign_gib=[0, 0, 20.0])
    assert plan.p_gib == pytest.approx(74.04)
    assert plan.warnings and "unbalanced" in plan.warnings[0]


def test_predict_is_fast_enough_for_search() -> None:
    prof = load_profile(KIMI)
    results = [predict(prof, operator(0.80 + i * 0.0001)) for i in range(1000)]
    assert results[0].plan.ok
    assert any(r.runtime_oom for r in results) is False  # all below 0.9
