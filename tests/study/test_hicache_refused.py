"""`autotune run` end to end through the simulator in a container with a memory limit (the
profile's `[hardware] cgroup_memory_max_gib`): a host cache candidate over the host memory bound
is refused before its launch, one line saying the value, the limit, where it came from and the
fix, recorded as the `startup_oom` SGLang would end it with; the other candidates run. A study
whose every host cache candidate is over the bound stops before anything is written (exit 2)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tests import simstudy
from tests.simstudy import sim_study

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
QWEN = 'model-path = "Qwen/Qwen3-32B"'
REFUSAL = (
    "hicache_size = 70 GB per rank × 1 rank = 70 GB of host cache is over the host memory bound: "
    "the simulator profile's hardware.cgroup_memory_max_gib = 64.0 GiB (64.0 GiB free), under "
    "the simulator profile's 900.0 GB of host RAM available, less the 10 GiB reserve, leaves "
    "58.0 GB per rank; SGLang 0.5.23 refuses it at startup (Not enough host memory available). "
    "Lower hicache_size to at most 57, or give the container more memory"
)


def _study(folder: Path, choices: str) -> Path:
    """One H200 in a container limited to 64 GiB, SGLang 0.5.23, a grid over host caches."""
    shipped = (ROOT / "autotune/sim/shipped/qwen3-32b-h200.toml").read_text()
    profile = folder / "limited.toml"
    profile.write_text(
        shipped.replace('sglang_version = "0.5.9"', 'sglang_version = "0.5.23"').replace(
            "[hardware]\n", "[hardware]\ncgroup_memory_max_gib = 64.0\n"
        )
    )
    search = f"[search]\nmem_fraction_static = 0.88\nhicache_size = {{ choices = [{choices}] }}"
    path = folder / "e2e.toml"
    path.write_text(
        sim_study(profile=str(profile), flags=QWEN, search=search, headroom_gib=None, n_trials=3)
    )
    return path


def _run(folder: Path, choices: str, code: int) -> subprocess.CompletedProcess[str]:
    """`autotune run` of `_study(folder, choices)`, which must exit with `code`."""
    done = simstudy.run(_study(folder, choices), "run")
    assert done.returncode == code, done.stdout + done.stderr
    return done


def test_a_host_cache_over_the_cgroup_is_refused_before_launch_and_the_rest_run(
    no_leftovers: Path,
) -> None:
    folder = no_leftovers
    done = _run(folder, "0, 40, 70", 0)
    assert "search.hicache_size: 70 GB per rank is over the host memory bound" in done.stdout
    assert f"startup_oom [not launched] — {REFUSAL}\n" in done.stdout, done.stdout
    url = f"sqlite:///{folder / 'results' / 'e2e' / 'study.db'}"
    trials = optuna.load_study(study_name="e2e", storage=url).get_trials()
    by_size = {t.params["hicache_size"]: t for t in trials}
    assert sorted(by_size) == [0, 40, 70]
    refused = by_size[70]
    assert refused.state == TrialState.FAIL
    assert refused.user_attrs["outcome"] == "startup_oom"
    assert refused.user_attrs["reason"] == f"not launched: {REFUSAL}"
    assert "trial_dir" not in refused.user_attrs  # never launched: no server, no folder
    for size in (0, 40):
        ran = by_size[size]
        assert ran.state == TrialState.COMPLETE, ran.user_attrs.get("reason")
        log = Path(ran.user_attrs["trial_dir"]) / "server.log"
        assert ("HiCache memory headroom: host 838.2 GiB, cgroup 64.0 GiB" in log.read_text()) == (
            size > 0
        )


def test_a_study_whose_every_host_cache_is_over_the_bound_stops_before_launch(
    no_leftovers: Path,
) -> None:
    folder = no_leftovers
    done = _run(folder, "0, 60, 70", 2)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("autotune: error: search.hicache_size: 70 GB per rank × 1 rank")
    assert "hardware.cgroup_memory_max_gib = 64.0 GiB" in lines[0]
    assert not (folder / "results").exists()
