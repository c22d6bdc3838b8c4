"""The memory model recovers a box's arithmetic from a few ledgers, never reading the profile.

Ledgers come from the simulator's pure model at the log's two-decimal precision (what
`autotune.logparse.accounting` reads from a real log); the fit sees only those and the launch
settings.
"""

from __future__ import annotations

import dataclasses

import pytest

from autotune.logparse.ledger import Ledger
from autotune.memory.fit import fit
from autotune.memory.model import Estimate, Observation, Setting
from autotune.sim.memplan import plan_startup
from autotune.sim.profiles import load_profile
from autotune.sim.startupplan import StartupPlan
from autotune.testing.oracle import Bench, bench_for, ledger_of, server_settings

KIMI = bench_for(load_profile("kimi-k2.5-tp8-96g"))
LLAMA = bench_for(load_profile("llama-3.1-70b-tp8-h100"))


def launch(
    bench: Bench, f: float, r: int = 48, h: int = 0, seed: int = 1
) -> tuple[StartupPlan, Observation]:
    params = {"mem_fraction_static": f, "max_running_requests": r, "hicache_size": h}
    plan = plan_startup(bench.profile, server_settings(bench, params), seed=seed)
    obs = Observation(
        Setting(f, r, None, float(h)), ledger_of(plan), "ok" if plan.ok else "startup_oom"
    )
    return plan, obs


@pytest.mark.parametrize("bench", [KIMI, LLAMA], ids=["kimi-mla-eagle", "llama-gqa"])
def test_fit_recovers_p_bytes_per_token_and_tokens(bench: Bench) -> None:
    _plans, obs = zip(*(launch(bench, f, seed=i) for i, f in enumerate((0.85, 0.88))), strict=True)
    model = fit(obs)
    truth, _ = launch(bench, 0.90, seed=0)
    assert model.p_gib is not None
    assert model.p_gib.mean == pytest.approx(truth.p_gib, abs=0.01)
    assert model.cell_bytes == pytest.approx(truth.cell_bytes, rel=0.002)
    predicted = model.tokens(0.90)
    assert predicted is not None
    assert predicted.mean == pytest.approx(truth.max_total_num_tokens, rel=0.001)


def test_one_ledger_is_enough_for_the_pool_line() -> None:
    _, obs = launch(KIMI, 0.88)
    model = fit([obs])
    truth, _ = launch(KIMI, 0.91, seed=5)
    assert model.cell_bytes == pytest.approx(70272, rel=0.001)
    n = model.tokens(0.91)
    assert n is not None and n.mean == pytest.approx(truth.max_total_num_tokens, rel=0.002)


def test_graph_memory_against_request_slots_from_three_launches() -> None:
    obs = [launch(KIMI, 0.88, r=r, seed=r)[1] for r in (32, 48, 96)]
    model = fit(obs)
    for r in (64, 128):
        truth, _ = launch(KIMI, 0.88, r=r)
        assert truth.graph_gib is not None and truth.draft_graph_gib is not None
        g = model.graph_gib(r)
        assert g is not None
        assert g.mean == pytest.approx(truth.graph_gib + truth.draft_graph_gib, abs=0.1)


def test_static_free_predicted_at_a_new_fraction_and_request_count() -> None:
    obs = [launch(KIMI, f, r=r, seed=i)[1] for i, (f, r) in enumerate([(0.85, 32), (0.88, 96)])]
    model = fit(obs)
    truth, _ = launch(KIMI, 0.90, r=64, seed=9)
    free = model.static_free(Setting(0.90, 64), 64)
    assert free is not None and truth.avail_final_gib is not None
    assert abs(free.mean - truth.avail_final_gib) < max(3 * free.sd, 0.1)


def test_stress_peak_grows_with_the_prefill_chunk() -> None:
    base = Ledger(p_gib=90.0, max_total_num_tokens=100_000, kv_gib=6.5, context_len=8192)
    rows = [(4096, 1.4), (8192, 2.6), (16384, 5.0)]
    obs = [
        Observation(Setting(0.88, 48, chunk), base, "ok", stress_peak_gib=peak, feasible=True)
        for chunk, peak in rows
    ]
    model = fit(obs)
    peak = model.stress_peak(Setting(0.88, 48, 12288), 48, 12288)
    assert peak is not None and peak.mean == pytest.approx(3.8, abs=0.1)


def test_runtime_oom_puts_a_floor_under_the_peak() -> None:
    ok = Observation(
        Setting(0.88, 48), Ledger(available_gpu_mem_gib=5.0), "ok", stress_peak_gib=2.0
    )
    oom = Observation(Setting(0.92, 48), Ledger(available_gpu_mem_gib=2.5), "runtime_oom")
    model = fit([ok, oom])
    peak = model.stress_peak(Setting(0.92, 48), 48, None)
    assert peak is not None and peak.mean > 2.5


def test_uncertainty_is_reported_and_readable() -> None:
    e = Estimate(2.4, 0.2)
    assert str(e) == "2.40 ± 0.20"
    assert e.p_at_least(2.0) == pytest.approx(0.977, abs=0.01)


def test_cannot_start_without_room_for_kv_or_with_too_small_a_host_cache() -> None:
    _, obs = launch(LLAMA, 0.90)
    model = fit([obs])
    no_kv = model.forecast(Setting(0.2, 48), default_slots=48, default_chunk=None)
    assert no_kv.blocked is not None and "no room for KV" in no_kv.blocked
    small = model.forecast(Setting(0.90, 48, None, 24.0), default_slots=48, default_chunk=None)
    assert small.blocked is not None and "host cache" in small.blocked
    big = model.forecast(Setting(0.90, 48, None, 96.0), default_slots=48, default_chunk=None)
    assert big.blocked is None


def test_host_ram_limit_is_learnt_from_the_failure_message() -> None:
    _, ok = launch(KIMI, 0.88, h=48)
    failed = Observation(
        Setting(0.88, 48, None, 96.0),
        Ledger(),
        "startup_error",
        reason="Not enough host memory available. Requesting 96.00 GB but only have "
        "500.00 GB free.",
    )
    model = fit([ok, failed])
    assert model.host_free_gb == 500.0
    fc = model.forecast(Setting(0.88, 48, None, 96.0), default_slots=48, default_chunk=None)
    assert fc.blocked is not None and "host RAM" in fc.blocked


def test_headroom_is_predicted_on_the_probe_scale() -> None:
    """The constraint is judged on the GPU probe, which here sees 0.1 GiB less free than the log."""
    _, a = launch(KIMI, 0.88)
    _, b = launch(KIMI, 0.86, seed=2)
    obs = []
    for o in (a, b):
        free = o.static_free_gib
        assert free is not None
        obs.append(dataclasses.replace(o, stress_peak_gib=2.5, headroom_gib=free - 2.5 - 0.1))
    model = fit(obs)
    assert model.probe_offset.mean == pytest.approx(0.1, abs=1e-6)
    fc = model.forecast(Setting(0.88, 48, None, 0.0), default_slots=48, default_chunk=None)
    assert fc.headroom is not None and a.static_free_gib is not None
    assert fc.headroom.mean == pytest.approx(a.static_free_gib - 2.6, abs=0.03)


def test_a_pool_held_to_max_total_tokens_keeps_the_line_and_stops_at_the_cap() -> None:
    """Two launches at 0.85 and 0.88 whose pools `--max-total-tokens 100000` held (before, the
    line through them was flat and the cell P/0 ran to 10^16 bytes): the model keeps SGLang's
    sizing line, which the cap cuts, so no fraction is predicted more than the cap."""
    capped = []
    for i, f in enumerate((0.85, 0.88)):
        _, o = launch(KIMI, f, seed=i)
        led, n = o.ledger, o.ledger.max_total_num_tokens
        assert n is not None and n > 100_000 and led.kv_gib is not None
        share = 100_000 / n  # the pools the cap leaves, as their KV lines would print them
        held = dataclasses.replace(
            led,
            max_total_num_tokens=100_000,
            max_total_tokens_cap=100_000,
            kv_gib=round(led.kv_gib * share, 2),
            draft_kv_gib=round(led.draft_kv_gib * share, 2) if led.draft_kv_gib else None,
        )
        capped.append(dataclasses.replace(o, ledger=held))
    model = fit(capped)
    assert model.cell_bytes == pytest.approx(70272, rel=0.002)
    assert model.tokens_cap == 100_000
    for f in (0.85, 0.90, 0.95):
        n = model.tokens(f)
        assert n is not None and n.mean == 100_000
    uncapped = fit([launch(KIMI, f, seed=i)[1] for i, f in enumerate((0.85, 0.88))])
    assert uncapped.tokens_cap is None


@pytest.mark.parametrize(
    ("outcome", "reason"),
    [
        ("runtime_oom", "runtime_oom (decode_oom): Decode out of memory. Try to lower your batch"),
        ("runtime_oom", "runtime_oom (retract_oom): ValueError: Out of memory even after"),
        ("crash", "crash (illegal_memory_access): CUDA error: an illegal memory access"),
    ],
)
def test_a_death_that_measured_no_gpu_peak_puts_no_floor_under_it(
    outcome: str, reason: str
) -> None:
    """The KV pool's own slots running out, or a crash of another kind, says nothing of the GPU
    peak: only a GPU out-of-memory under load is a floor for it."""
    ok = Observation(
        Setting(0.88, 48), Ledger(available_gpu_mem_gib=5.0), "ok", stress_peak_gib=2.0
    )
    died = Observation(Setting(0.92, 48), Ledger(available_gpu_mem_gib=2.5), outcome, reason=reason)
    assert not died.gpu_oom_under_load
    peak = fit([ok, died]).stress_peak(Setting(0.92, 48), 48, None)
    assert peak is not None and peak.mean < 2.5
