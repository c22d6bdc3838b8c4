"""Workers of one study on one machine never share a GPU: a second worker whose `--gpus` group
overlaps a live worker's is refused in one line (exit 2) before it touches the study."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from autotune.errors import UsageError
from autotune.study.workers import gpu_claim
from tests.reliability.helpers import World, one_line, wait_for_text
from tests.simstudy import LLAMA_TP2, limits, sim_study, workload

STUDY = sim_study(
    profile="llama-3.1-70b-tp8-h100",
    time_scale=30000,
    flags=LLAMA_TP2,
    server_limits=limits(stop_grace_s=2, release_s=3),
    search="[search]\nmem_fraction_static = { low = 0.80, high = 0.95, step = 0.01 }\n"
    "max_running_requests = 16",
    load=workload(30, stress=False, input_len=64, output_len=8, concurrency=2, drain_s=2),
    headroom_gib=None,
    sampler="tpe",
    n_trials=4,
)


def test_overlapping_groups_are_refused_and_disjoint_ones_are_not(tmp_path: Path) -> None:
    def claim(gpus: str) -> None:
        with gpu_claim(tmp_path, gpus, "s"):
            pass

    with gpu_claim(tmp_path, "0,1", "s"):
        claim("2,3")
        with pytest.raises(UsageError) as e:
            claim("1,2")
        assert str(e.value).startswith("--gpus 1,2: GPU 1 is in use by another worker of study s")
        assert "--gpus 0,1)" in str(e.value)
        with pytest.raises(UsageError, match="with --gpus groups run on this machine"):
            claim("")
    with gpu_claim(tmp_path, "", "s"), pytest.raises(UsageError, match="runs on all this mach"):
        claim("3")
    claim("1,2")  # every lock went with its holder


@pytest.mark.e2e
def test_a_second_worker_on_an_overlapping_group_is_refused(world: World) -> None:
    """Two `autotune run` workers of one study on one machine: the first on GPUs 0,1 serves a
    trial; the second, on 1,2, is refused in one line and writes nothing of its own."""
    world.foreign_sleep()
    study = world.folder / "rel.toml"
    study.write_text(STUDY)
    args = ["run", "--config", str(study), "--results-dir", str(world.results)]
    first = world.start(*args, "--gpus", "0,1")
    log = world.study_dir / "gpus-0-1/trials/0000/server.log"
    wait_for_text(log, first, "fired up and ready")
    second = world.autotune(*args, "--gpus", "1,2")
    assert second.rc == 2, second.out + second.err
    line = one_line(second.err)
    assert line.startswith(
        "autotune: error: --gpus 1,2: GPU 1 is in use by another worker of study rel on this "
        f"machine (pid {first.pid}, --gpus 0,1)"
    ), line
    assert not (world.study_dir / "gpus-1-2").exists()
    first.send_signal(signal.SIGINT)
    out, err = first.communicate(timeout=60)
    assert first.returncode == 130, out + err
