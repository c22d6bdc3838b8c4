"""The simulator lowers settings as each SGLang release does and prints the same lines: request
slots cut to the pool (0.5.23 `resolve_max_num_reqs`; 0.5.9 keeps an explicit value), the decode
graph batch cut to the request table, the pool-below-context warning (0.5.23 only)."""

from __future__ import annotations

import pytest

from autotune.logparse.accounting import build_ledger
from autotune.logparse.clamps import Clamps
from autotune.logparse.lines import parse_lines
from autotune.sim.flags import ServerSettings
from autotune.sim.memplan import plan_startup
from autotune.sim.profiles import load_profile
from autotune.sim.startupplan import StartupPlan
from tests.sim.conftest import SMALL, Launcher


def _plan(version: str, **kw: int) -> StartupPlan:
    s = ServerSettings(model_path="Qwen/Qwen3-32B", mem_fraction_static=0.85, **kw)
    return plan_startup(load_profile("qwen3-32b-h200"), s, version=version)


def test_0_5_23_cuts_the_request_slots_to_half_the_pool_and_0_5_9_keeps_them() -> None:
    new = _plan("0.5.23", max_running_requests=2048, max_total_tokens=2048)
    old = _plan("0.5.9", max_running_requests=2048, max_total_tokens=2048)
    assert new.max_running_requests == 1024
    assert old.max_running_requests == 2048
    notes = [text for _, text in new.notes]
    assert (
        "max_running_requests was reduced from the requested 2048 to 1024 (per dp worker) due "
        "to the available KV cache capacity." in notes
    )
    assert not any("reduced" in text for _, text in old.notes)
    below = _plan("0.5.23", max_running_requests=1000, max_total_tokens=2048)
    assert below.max_running_requests == 1000


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_the_decode_graph_batch_is_cut_to_the_request_table(version: str) -> None:
    plan = _plan(version, max_running_requests=100, cuda_graph_max_bs=512)
    assert max(plan.capture_bs) == 100


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_the_log_shows_each_clamp_as_the_release_prints_it(
    launch_sim: Launcher, version: str
) -> None:
    graph_flag = "--cuda-graph-max-bs-decode" if version == "0.5.23" else "--cuda-graph-max-bs"
    sim = launch_sim(
        [*SMALL, "--sim-version", version, "--mem-fraction-static", "0.85",
         "--max-total-tokens", "2048", "--max-running-requests", "2048", graph_flag, "4096",
         "--context-length", "40960"],
        scale=5000,
    )  # fmt: skip
    sim.wait_ready()
    log = sim.log()
    led = build_ledger(parse_lines(log.splitlines()).events)
    got = {c.name: (c.asked, c.effective) for c in Clamps.of(led).clamped}
    below = "KV pool holds 2048 tokens, fewer than --context-length 40960. One full-length"
    if version == "0.5.23":
        assert "max_running_requests was reduced from the requested 2048 to 1024" in log
        assert below in log
        assert got["max_running_requests"] == (2048, 1024)
        assert got["cuda_graph_max_bs"][0] == 4096 and got["cuda_graph_max_bs"][1] in (1024, 1025)
    else:
        assert "reduced" not in log and below not in log
        assert "max_running_requests" not in got  # 0.5.9 runs the explicit value
        assert got["cuda_graph_max_bs"] == (4096, 2048)
    assert got["context_length"] == (40960, 2048)


def test_post_capture_sizing_is_off_when_the_prefill_graph_is_below_the_chunk() -> None:
    env = {"SGLANG_ENABLE_POST_CAPTURE_KV_SIZING": "1"}
    prof = load_profile("qwen3-32b-h200")

    def post(version: str, **kw: int) -> bool:
        s = ServerSettings(model_path="Qwen/Qwen3-32B", mem_fraction_static=0.85, **kw)
        return plan_startup(prof, s, version=version, env=env).post_capture

    assert post("0.5.23", chunked_prefill_size=8192)
    assert not post("0.5.23", chunked_prefill_size=8192, cuda_graph_max_bs_prefill=4096)
    assert not post("0.5.9", chunked_prefill_size=8192)  # 0.5.9 has no post-capture sizing
