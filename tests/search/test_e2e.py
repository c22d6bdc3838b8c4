"""A short real study with the capacity-aware sampler: `autotune run` launching the simulator.

Real processes over real HTTP on 127.0.0.1. Every process started carries the test's folder in
its command line, so the `no_leftovers` fixture finds any survivor, kills it and fails the test.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest

pytestmark = pytest.mark.e2e

STUDY = """
[server]
backend = "sim"
sim_profile = "kimi-k2.5-tp8-96g"

[server.flags]
model-path = "moonshotai/Kimi-K2.5"
tp = 8
trust-remote-code = true
speculative-algorithm = "EAGLE3"
speculative-draft-model-path = "lightseekorg/kimi-k2.5-eagle3"
speculative-num-steps = 3
speculative-eagle-topk = 1
speculative-num-draft-tokens = 4

[server.limits]
startup_s = 60
stall_s = 30
workload_s = 60
stop_grace_s = 10
release_s = 10

[search]
mem_fraction_static = { low = 0.86, high = 0.94, step = 0.01 }
max_running_requests = 48
hicache_size = 48

[baseline]
mem_fraction_static = 0.88

[workload]
input_len = { dist = "uniform", min = 200, max = 600 }
output_len = 16
request_timeout_s = 30
drain_timeout_s = 5

[[workload.phases]]
kind = "steady"
concurrency = 8
duration_s = 1

[[workload.phases]]
kind = "stress"
rounds = 1
requests = 2
input_len = 8192
output_len = 4

[constraints]
min_headroom_gib = 0.5

[budget]
n_trials = 3
"""


def _ours(tag: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if tag in cmdline and state != "Z":
            pids.append(int(entry.name))
    return pids


@pytest.fixture
def no_leftovers(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    left = _ours(str(tmp_path))
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(os.getpgid(pid), signal.SIGKILL)
    assert not left, f"processes left behind: {left}"


def test_capacity_search_reaches_the_edge_on_the_simulator(no_leftovers: Path) -> None:
    folder = no_leftovers
    (folder / "search.toml").write_text(STUDY)
    cmd = [
        sys.executable, "-m", "autotune", "run", "--config", str(folder / "search.toml"),
        "--results-dir", str(folder / "results"),
    ]  # fmt: skip
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=240, cwd=folder, start_new_session=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "sampler capacity" in done.stdout
    url = f"sqlite:///{folder / 'results' / 'search' / 'study.db'}"
    trials = optuna.load_study(study_name="search", storage=url).get_trials()
    assert trials[0].params["mem_fraction_static"] == 0.88
    record = trials[0].user_attrs["record"]
    assert record["stress_peak_gib"] > 1.0  # an 8K-token chunk's activations, measured
    second = trials[1]
    assert second.params["mem_fraction_static"] > 0.88
    assert "predicted" in second.user_attrs["search_why"]
    assert "stress peak" in second.user_attrs["search_why"]
    feasible = [
        t.user_attrs["capacity_tokens"]
        for t in trials
        if t.user_attrs["outcome"] == "ok" and all(v <= 0 for v in t.constraints.values())
    ]
    assert max(feasible) > 1.15 * 159_277
    assert not any(t.user_attrs["outcome"].endswith("oom") for t in trials)
