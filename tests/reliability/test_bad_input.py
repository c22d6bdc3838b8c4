"""Fault matrix, input rows: every invalid study-file value, unknown keys, and studies this
machine cannot run (SGLang missing, a model path that does not exist, a host cache larger than
host RAM). Each stops `autotune run` before anything is launched or written: one line naming the
value and the fix, exit code 2.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from autotune.cli.main import main
from autotune.errors import HarnessError
from autotune.server import hostcheck
from autotune.server.gpu import GpuMemory
from autotune.server.hostcheck import machine_ram_gb
from tests.reliability.helpers import World, one_line

BAD_VALUES = [
    ('backend = "sim"', 'backend = "tgi"', "server.backend"),
    ("sim_time_scale = 30000", "sim_time_scale = 0", "server.sim_time_scale"),
    ("sim_time_scale = 30000", "sim_time_scale = 30000\nsim_seed = -1", "server.sim_seed"),
    ("sim_time_scale = 30000", "sim_time_scale = 30000\nport = 70000", "server.port"),
    ("sim_time_scale = 30000", 'sim_time_scale = 30000\nhost = ""', "server.host"),
    ("sim_time_scale = 30000", "sim_time_scale = 30000\ncommand = []", "server.command"),
    ("tp-size = 8", "tp-size = 8\nport = 1234", "server.flags.port"),
    ("tp-size = 8", 'tp-size = 8\napi-key = "x"', "server.flags.api_key"),
    ("tp-size = 8", "tp-size = 8\nmodel_path = 'y'", "server.flags.model_path"),
    ("tp-size = 8", "tp-size = { a = 1 }", "server.flags.tp-size"),
    ("tp-size = 8", 'tp-size = 8\nkv-cache-dtype = "fp7"', "server.flags.kv_cache_dtype"),
    ("tp-size = 8", "tp-size = 8\nmem-fractoin-static = 0.9", "server.flags.mem_fractoin_static"),
    ("max_running_requests = 48", "max_running_requests = 48\nmax_runing_requests = 4",
     "search.max_runing_requests"),
    ("max_running_requests = 48",
     'max_running_requests = 48\nkv_cache_dtype = { choices = ["auto", "fp7"] }',
     "search.kv_cache_dtype"),
    ("[server.limits]", '[server.env]\n"1BAD" = "x"\n\n[server.limits]', "server.env.1BAD"),
    ("startup_s = 30", "startup_s = 0", "server.limits.startup_s"),
    ("stall_s = 10", 'stall_s = "soon"', "server.limits.stall_s"),
    ("release_s = 3", "release_s = -1", "server.limits.release_s"),
    ("high = 0.97", "high = 1.2", "search.mem_fraction_static"),
    ("step = 0.01", "step = 0.07", "search.mem_fraction_static"),
    ("max_running_requests = 48", "max_running_requests = 0", "search.max_running_requests"),
    ("max_running_requests = 48", "max_running_requests = 48\nchunked_prefill_size = 0",
     "search.chunked_prefill_size"),
    ("max_running_requests = 48", "max_running_requests = 48\nhicache_size = -1",
     "search.hicache_size"),
    ("max_running_requests = 48", "max_running_requests = { choices = [] }",
     "search.max_running_requests"),
    ("mem_fraction_static = 0.88\n", "mem_fraction_static = 0.99\n",
     "baseline.mem_fraction_static"),
    ("mem_fraction_static = 0.88\n", "mem_fraction_static = 0.885\n",
     "baseline.mem_fraction_static"),
    ("input_len = 200", "input_len = -5", "workload.input_len"),
    ("concurrency = 2", "concurrency = 0", "workload.phases[0].concurrency"),
    ('kind = "steady"', 'kind = "burst"', "workload.phases[0].kind"),
    ("[budget]", '[objectives]\nmaximize = ["speed"]\n\n[budget]', "objectives.maximize"),
    ("[budget]", "[constraints]\nmax_error_rate = -0.5\n\n[budget]", "constraints.max_error_rate"),
    ("n_trials = 1", "n_trials = 0", "budget.n_trials"),
    ("n_trials = 1", "n_trials = 1\ntimeout_s = -1", "budget.timeout_s"),
    ('name = "grid"', 'name = "annealing"', "sampler.name"),
    ('name = "grid"', 'name = "grid"\nseed = -1', "sampler.seed"),
    ('name = "grid"', 'name = "grid"\n\n[storage]\nurl = 5', "storage.url"),
]  # fmt: skip

UNKNOWN_KEYS = [
    ("[server]", "colour = 1\n\n[server]", "colour", ""),
    ("startup_s = 30", "startup = 30", "server.limits.startup", "startup_s"),
    ("n_trials = 1", "ntrials = 1", "budget.ntrials", "n_trials"),
    ("duration_s = 0.5", "duraton_s = 0.5", "workload.phases[0].duraton_s", "duration_s"),
    ('name = "grid"', 'nam = "grid"', "sampler.nam", "name"),
    ("[budget]", "[constraints]\nmax_error = 0.1\n\n[budget]", "constraints.max_error", ""),
    ("mem_fraction_static = 0.88\n", "mem_fraction_static = 0.88\nmem_fraction = 0.9\n",
     "baseline.mem_fraction", ""),
]  # fmt: skip


def _fails_before_launch(world: World, capsys: pytest.CaptureFixture[str], text: str) -> str:
    path = world.folder / "rel.toml"
    path.write_text(text)
    code = main(world.run_args())
    err = capsys.readouterr().err
    assert code == 2, err
    assert not world.results.exists(), "nothing may be written before the study file is valid"
    return one_line(err)


def _edit(world: World, old: str, new: str) -> str:
    text = world.study().read_text()
    assert text.count(old) >= 1, old
    return text.replace(old, new, 1)


@pytest.mark.parametrize(("old", "new", "key"), BAD_VALUES, ids=[k for *_, k in BAD_VALUES])
def test_every_invalid_value_is_one_line_naming_the_key(
    world: World, capsys: pytest.CaptureFixture[str], old: str, new: str, key: str
) -> None:
    line = _fails_before_launch(world, capsys, _edit(world, old, new))
    assert line.startswith("autotune: error: ") and key in line, line


@pytest.mark.parametrize(
    ("old", "new", "key", "hint"), UNKNOWN_KEYS, ids=[k for _, _, k, _ in UNKNOWN_KEYS]
)
def test_unknown_keys_are_named_with_a_suggestion(
    world: World, capsys: pytest.CaptureFixture[str], old: str, new: str, key: str, hint: str
) -> None:
    line = _fails_before_launch(world, capsys, _edit(world, old, new))
    assert key in line and ("unknown" in line or "not a search parameter" in line), line
    assert hint in line, line


def test_hicache_larger_than_the_profiles_host_ram_is_rejected_before_launch(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    text = _edit(world, "max_running_requests = 48", "max_running_requests = 48\n"
                 "hicache_size = { choices = [0, 300] }")  # fmt: skip
    line = _fails_before_launch(world, capsys, text)
    assert "search.hicache_size: 300 GB per rank × 8 ranks" in line, line
    assert "the simulator profile's 2100.0 GB of host RAM available" in line, line  # kimi's
    assert "Lower hicache_size to at most 261" in line, line  # (2100 GB − 10 GiB) ÷ 8


def _stand_in(world: World, old: str, new: str) -> str:
    """The real backend with the simulator as its command (SGLang itself is not installed)."""
    command = f'backend = "sglang"\ncommand = ["{sys.executable}", "-m", "autotune.sim"]'
    return _edit(world, old, new).replace('backend = "sim"', command)


class _EightGpus:
    """NVML as a box with eight idle 96 GB GPUs shows it."""

    def snapshot(self) -> list[GpuMemory]:
        return [GpuMemory(i, 96 * 2**30, 2**29) for i in range(8)]


def test_hicache_larger_than_the_machines_ram_is_rejected_on_the_real_backend(
    world: World, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hostcheck, "NvmlProbe", _EightGpus)
    ram = machine_ram_gb()
    assert ram is not None
    per_rank = int(ram / 8) + 1
    text = _stand_in(world, "max_running_requests = 48",
                     f"max_running_requests = 48\nhicache_size = {per_rank}")  # fmt: skip
    line = _fails_before_launch(world, capsys, text)
    assert f"{per_rank} GB per rank" in line and "this machine's" in line, line


class _NoDriver:
    """NVML on a machine without the NVIDIA driver (what `NvmlProbe` raises there)."""

    def snapshot(self) -> list[GpuMemory]:
        raise HarnessError("NVML could not start (NVML Shared Library Not Found)")


def test_no_gpu_on_the_real_backend_is_one_line_before_any_launch(
    world: World, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hostcheck, "NvmlProbe", _NoDriver)
    path = world.folder / "rel.toml"
    path.write_text(_stand_in(world, "max_running_requests = 48", "max_running_requests = 48"))
    code = main(world.run_args())
    err = capsys.readouterr().err
    assert code == 1, err
    line = one_line(err)
    assert line.startswith("autotune: error: no GPU can be read on this machine"), line
    assert "--backend sim" in line
    assert not world.results.exists()


def test_missing_model_path_on_the_real_backend(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = world.folder / "models" / "kimi"
    text = _stand_in(world, '"moonshotai/Kimi-K2.5"', f'"{missing}"')
    line = _fails_before_launch(world, capsys, text)
    assert "server.flags.model-path" in line and str(missing) in line, line
    assert "does not exist" in line


@pytest.mark.parametrize("wrapper", [[], ["nice", "--adjustment=5"]], ids=["plain", "wrapped"])
def test_sglang_not_installed_is_a_clear_message(
    wrapper: list[str], world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util

    assert importlib.util.find_spec("sglang") is None  # this environment has no SGLang
    words = [*wrapper, sys.executable, "-m", "sglang.launch_server"]
    command = "command = [" + ", ".join(f'"{w}"' for w in words) + "]"
    text = world.study().read_text()
    line = _fails_before_launch(
        world, capsys, text.replace('backend = "sim"', f'backend = "sglang"\n{command}')
    )
    assert f"SGLang is not installed for {sys.executable}" in line, line
    assert "--backend sim" in line, line


def test_missing_server_program_is_named(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    text = (
        world.study()
        .read_text()
        .replace(
            'backend = "sim"', 'backend = "sglang"\ncommand = ["/opt/nowhere/python", "-m", "x"]'
        )
    )
    line = _fails_before_launch(world, capsys, text)
    assert "server.command" in line and "/opt/nowhere/python" in line, line


def test_the_study_file_itself_missing(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--config", str(world.folder / "none.toml")]) == 2
    assert "none.toml" in one_line(capsys.readouterr().err)
    assert not Path(world.folder / "results").exists()


def test_a_study_file_given_as_a_name_points_at_config(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", "--study", str(world.folder / "glm.toml"), "--backend", "sim"]) == 2
    line = one_line(capsys.readouterr().err)
    assert "glm.toml" in line and "pass --config PATH" in line, line
    assert not Path(world.folder / "results").exists()
