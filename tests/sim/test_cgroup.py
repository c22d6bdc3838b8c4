"""The simulator in a container with a memory limit (`[hardware] cgroup_memory_max_gib`): SGLang
0.5.23 bounds the host pool by the cgroup's headroom, prints its `HiCache memory headroom` line
and refuses a pool above `(min(host, cgroup) − 10 GiB) ÷ ranks`; 0.5.9 reads no cgroup, pins the
pools and the container's OOM killer ends the rank that goes past the limit."""

from __future__ import annotations

import dataclasses
import signal
from pathlib import Path

from autotune.logparse.accounting import build_ledger
from autotune.logparse.lines import parse_text
from autotune.sim.flags import ServerSettings, parse_command_line
from autotune.sim.memplan import plan_startup
from autotune.sim.profiles import Profile, load_profile
from autotune.sim.sizing import GiB
from tests.sim.conftest import Launcher

QWEN = "qwen3-32b-h200"
KIMI = "kimi-k2.5-tp8-96g"


def _limited(name: str, gib: float) -> Profile:
    prof = load_profile(name)
    return dataclasses.replace(
        prof, hardware=dataclasses.replace(prof.hardware, cgroup_memory_max_gib=gib)
    )


def _settings(version: str, *argv: str) -> ServerSettings:
    return parse_command_line(["--model-path", "m", *argv], version).settings


def test_0523_bounds_the_pool_by_the_cgroup_headroom() -> None:
    prof = _limited(QWEN, 64.0)
    flags = ("--enable-hierarchical-cache", "--hicache-size", "58")
    plan = plan_startup(prof, _settings("0.5.23", *flags), version="0.5.23")
    assert plan.failure is not None and plan.failure.kind == "host_memory"
    assert "only have 57.98 GB free" in plan.failure.message  # (64 − 10) GiB for one rank
    assert plan.host_headroom_gib == (900e9 / GiB, 64.0)
    fits = _settings("0.5.23", "--enable-hierarchical-cache", "--hicache-size", "57")
    assert plan_startup(prof, fits, version="0.5.23").ok
    free = plan_startup(load_profile(QWEN), _settings("0.5.23", *flags), version="0.5.23")
    assert free.ok and free.host_headroom_gib is None  # no limit: no headroom line


def test_0523_auto_sizing_budgets_within_the_cgroup() -> None:
    prof = _limited(QWEN, 40.0)
    plan = plan_startup(prof, _settings("0.5.23", "--enable-hierarchical-cache"), version="0.5.23")
    assert plan.ok and plan.host_auto_ratio is not None and plan.host_budget_gb is not None
    assert plan.host_budget_gb == int(int(30 * GiB) * 0.8) / 1e9
    assert plan.host_cache_gb is not None and plan.host_cache_gb <= plan.host_budget_gb


def test_059_pins_past_the_cgroup_and_its_oom_killer_ends_a_rank() -> None:
    prof = _limited(KIMI, 200.0)
    s = parse_command_line(
        ["--model-path", "m", "--tp", "8", "--enable-hierarchical-cache", "--hicache-size", "48",
         "--mem-fraction-static", "0.88"], "0.5.9"
    ).settings  # fmt: skip
    plan = plan_startup(prof, s)
    assert plan.failure is not None and plan.failure.kind == "host_oom_killer"
    assert plan.host_cache_gb is not None
    assert plan.failure.rank == int(200 * GiB // (plan.host_cache_gb * 1e9)) == 4  # the fifth
    assert plan.host_headroom_gib is None  # 0.5.9 never reads the cgroup
    assert plan_startup(load_profile(KIMI), s).ok


def test_the_headroom_line_is_sglangs_and_the_ledger_keeps_it(
    launch_sim: Launcher, tmp_path: Path
) -> None:
    text = (Path(__file__).parents[2] / "autotune/sim/shipped/qwen3-32b-h200.toml").read_text()
    profile = tmp_path / "limited.toml"
    profile.write_text(text.replace("[hardware]\n", "[hardware]\ncgroup_memory_max_gib = 64.0\n"))
    sim = launch_sim(
        ["--model-path", "Qwen/Qwen3-32B", "--sim-profile", str(profile), "--sim-version",
         "0.5.23", "--enable-hierarchical-cache", "--hicache-size", "70"], scale=5000,
    )  # fmt: skip
    assert sim.wait_exit() == -signal.SIGKILL
    log = sim.log()
    assert "HiCache memory headroom: host 838.2 GiB, cgroup 64.0 GiB\n" in log
    assert "Requesting 70.00 GB but only have 57.98 GB free" in log
    ledger = build_ledger(parse_text(log).events)
    assert ledger.host_available_gib == 838.2 and ledger.cgroup_headroom_gib == 64.0
