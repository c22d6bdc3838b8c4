"""The study file: a valid file loads into the expected values; every bad value is a one-line
error naming the dotted key, with exit code 2 through the command line."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from autotune.cli.main import main
from autotune.config.schema import Choices, Fixed, FloatRange, IntRange
from autotune.config.studyfile import SHIPPED_STUDIES, load_study
from autotune.errors import ConfigError
from tests.study.conftest import VALID


def test_valid_study_loads(study_file: Callable[[str], Path]) -> None:
    cfg = load_study(study_file(VALID))
    assert cfg.name == "t"
    assert cfg.server.backend == "sim"
    assert cfg.server.flags == (
        ("model_path", "/models/kimi"),
        ("tp_size", 8),
        ("trust_remote_code", True),
    )
    assert cfg.search.params[0] == FloatRange("mem_fraction_static", 0.8, 0.94, 0.02)
    assert cfg.search.params[1] == Choices("max_running_requests", (32, 48, 64))
    assert dict(cfg.search.baseline) == {
        "mem_fraction_static": 0.88,
        "max_running_requests": 48,
        "hicache_size": 48,
    }
    assert cfg.objectives == ("capacity", "throughput")
    assert cfg.constraints.min_headroom_gib == 1.0
    assert cfg.budget.n_trials == 5
    assert cfg.sampler.name == "tpe" and cfg.sampler.seed == 3


def test_integer_range_and_fixed_value(study_file: Callable[[str], Path]) -> None:
    text = VALID.replace(
        "max_running_requests = { choices = [32, 48, 64] }",
        'max_running_requests = { low = 16, high = 64, step = 16 }\nschedule_policy = "lpm"',
    )
    cfg = load_study(study_file(text))
    assert IntRange("max_running_requests", 16, 64, 16) in cfg.search.params
    assert Fixed("schedule_policy", "lpm") in cfg.search.params


def test_several_nodes_need_a_command_that_launches_every_node(
    study_file: Callable[[str], Path],
) -> None:
    text = VALID.replace("tp-size = 8\n", "tp-size = 8\nnnodes = 2\n")
    with pytest.raises(ConfigError, match="starts one server process on this box"):
        load_study(study_file(text))
    launcher = 'command = ["srun", "--nodes=2", "python", "-m", "sglang.launch_server"]\n'
    cfg = load_study(study_file(text.replace("[server]\n", "[server]\n" + launcher)))
    assert ("nnodes", 2) in cfg.server.flags


def test_shipped_studies_load() -> None:
    root = SHIPPED_STUDIES
    # the operator's current setting; the demo starts from their second try, which crashed
    for name, fraction in (("kimi", 0.88), ("demo", 0.93)):
        cfg = load_study(root / f"{name}.toml")
        assert cfg.search.baseline["mem_fraction_static"] == fraction
        assert cfg.search.baseline["max_running_requests"] == 48


def _replace(old: str, new: str) -> str:
    assert old in VALID, old
    return VALID.replace(old, new)


def _after(anchor: str, added: str) -> str:
    """The valid study with `added` written right after `anchor`."""
    return _replace(anchor, anchor + added)


def _before(anchor: str, added: str) -> str:
    """The valid study with `added` written right before `anchor`."""
    return _replace(anchor, added + anchor)


_SERVER_NOT_TABLE = "server = 1\n" + VALID[VALID.index("[search]") :]
_NO_SEARCH = VALID[: VALID.index("[search]")] + VALID[VALID.index("[workload]") :]


# (study text, dotted key expected at the start of the message, a word of the fix)
BAD: list[tuple[str, str, str]] = [
    (VALID + "\n[extra]\nx = 1\n", "extra", "unknown key"),
    (
        _before("[search]\n", "[server.limits]\nforeign_wait_s = -5\n\n"),
        "server.limits.foreign_wait_s",
        "≥ 0",
    ),
    (_after("[budget]\n", "ntrials = 3\n"), "budget.ntrials", "n_trials"),
    (_replace('backend = "sim"', 'backend = "docker"'), "server.backend", "sim, sglang"),
    (_replace('backend = "sim"', "backend = 3"), "server.backend", "string"),
    (_replace("sim_time_scale = 0.05", "sim_time_scale = 0"), "server.sim_time_scale", "> 0"),
    (
        _replace("sim_time_scale = 0.05", 'sim_time_scale = "fast"'),
        "server.sim_time_scale",
        "number",
    ),
    (_after("[server]\n", "port = 70000\n"), "server.port", "65535"),
    (_after("[server]\n", "port = -1\n"), "server.port", "≥ 0"),
    (_after("[server]\n", "command = []\n"), "server.command", "non-empty"),
    (_after("[server]\n", 'command = "python"\n'), "server.command", "list"),
    (_after("[server]\n", 'env = { "1BAD" = "x" }\n'), "server.env.1BAD", "variable"),
    (_after("[server]\n", "env = { A = 1 }\n"), "server.env.A", "string"),
    (_after("[server]\n", "limits = { startup_s = -5 }\n"), "server.limits.startup_s", "> 0"),
    (_after("[server]\n", "limits = { start = 5 }\n"), "server.limits.start", "unknown"),
    (_after("tp-size = 8\n", "port = 1234\n"), "server.flags.port", "server.port"),
    (_after("tp-size = 8\n", "TP_SIZE = 8\n"), "server.flags.TP_SIZE", "flag name"),
    (
        _after("tp-size = 8\n", "nnodes = 2\nnode-rank = 0\n"),
        "server.flags.nnodes",
        "a launch on every node",
    ),
    (_after("tp-size = 8\n", "tp_size = 8\n"), "server.flags.tp_size", "same flag"),
    (_after("tp-size = 8\n", "x = { a = 1 }\n"), "server.flags.x", "string, number"),
    (
        _after("tp-size = 8\n", "mem_fraction_static = 0.9\n"),
        "server.flags.mem_fraction_static",
        "one place",
    ),
    (
        _after("tp-size = 8\n", "enable_hierarchical_cache = true\n"),
        "server.flags.enable_hierarchical_cache",
        "hicache_size",
    ),
    (
        _replace("low = 0.80, high = 0.94", "low = 0.80, high = 1.2"),
        "search.mem_fraction_static",
        "(0, 1)",
    ),
    (
        _replace("low = 0.80, high = 0.94", "low = 0.0, high = 0.94"),
        "search.mem_fraction_static",
        "(0, 1)",
    ),
    (
        _replace("low = 0.80, high = 0.94", "low = 0.94, high = 0.80"),
        "search.mem_fraction_static.high",
        "greater than low",
    ),
    (_replace("step = 0.02 }", "step = -0.02 }"), "search.mem_fraction_static.step", "> 0"),
    (_replace("step = 0.02 }", "step = 0.03 }"), "search.mem_fraction_static.step", "divide"),
    (
        _replace("step = 0.02 }", "step = 0.02, lo = 1 }"),
        "search.mem_fraction_static.lo",
        "unknown",
    ),
    (
        _replace("step = 0.02 }", "step = 0.02, log = true }"),
        "search.mem_fraction_static.log",
        "step",
    ),
    (
        _replace("low = 0.80, high = 0.94, step = 0.02", "high = 0.94"),
        "search.mem_fraction_static.low",
        "missing",
    ),
    (
        _replace("low = 0.80, high = 0.94, step = 0.02", 'low = "a", high = 0.94'),
        "search.mem_fraction_static.low",
        "number",
    ),
    (
        _replace("mem_fraction_static = { low", "mem_fraction_static = [0.8, 0.9]\nx = { low"),
        "search.mem_fraction_static",
        "choices",
    ),
    (
        _replace(
            "mem_fraction_static = { low = 0.80, high = 0.94, step = 0.02 }",
            "mem_fraction_static = 1.5",
        ),
        "search.mem_fraction_static",
        "(0, 1)",
    ),
    (_replace("choices = [32, 48, 64]", "choices = [0, 48]"), "search.max_running_requests", "≥ 1"),
    (
        _replace("choices = [32, 48, 64]", "choices = []"),
        "search.max_running_requests.choices",
        "non-empty",
    ),
    (
        _replace("choices = [32, 48, 64]", "choices = [48, 48]"),
        "search.max_running_requests.choices",
        "duplicate",
    ),
    (
        _replace("choices = [32, 48, 64]", "choices = [[1]]"),
        "search.max_running_requests.choices",
        "strings, numbers",
    ),
    (
        _replace(
            "max_running_requests = { choices = [32, 48, 64] }",
            "max_running_requests = { low = 8.5, high = 64 }",
        ),
        "search.max_running_requests",
        "whole numbers",
    ),
    (
        _replace("hicache_size = { choices = [0, 48] }", "hicache_size = { choices = [-1, 48] }"),
        "search.hicache_size",
        "≥ 0",
    ),
    (
        _replace("hicache_size = { choices = [0, 48] }", "hicache_size = { low = -8, high = 48 }"),
        "search.hicache_size",
        "≥ 0",
    ),
    (
        _replace("hicache_size = { choices = [0, 48] }", "Bad_Flag = 1"),
        "search.Bad_Flag",
        "flag name",
    ),
    (
        _replace(
            "hicache_size = { choices = [0, 48] }",
            "hicache-size = { choices = [0, 48] }\nhicache_size = 1",
        ),
        "search.hicache_size",
        "same flag",
    ),
    (
        _replace(
            "mem_fraction_static = { low = 0.80, high = 0.94, step = 0.02 }\n"
            "max_running_requests = { choices = [32, 48, 64] }\n"
            "hicache_size = { choices = [0, 48] }",
            "mem_fraction_static = 0.88",
        ),
        "search",
        "at least one",
    ),
    (
        _replace(
            "[baseline]\nmem_fraction_static = 0.88", "[baseline]\nmem_fraction_static = 0.97"
        ),
        "baseline.mem_fraction_static",
        "outside",
    ),
    (
        _replace(
            "[baseline]\nmem_fraction_static = 0.88", "[baseline]\nmem_fraction_static = 0.87"
        ),
        "baseline.mem_fraction_static",
        "outside",
    ),
    (
        _replace(
            "max_running_requests = 48\nhicache_size = 48",
            "max_running_requests = 40\nhicache_size = 48",
        ),
        "baseline.max_running_requests",
        "outside",
    ),
    (
        _after("hicache_size = 48\n", "chunked_prefill_size = 8192\n"),
        "baseline.chunked_prefill_size",
        "not a search parameter",
    ),
    (
        _replace("[constraints]\nmax_error_rate = 0.05", "[constraints]\nmax_error_rate = 1.5"),
        "constraints.max_error_rate",
        "[0, 1)",
    ),
    (
        _replace("min_headroom_gib = 1.0", "min_headroom_gib = -1.0"),
        "constraints.min_headroom_gib",
        "≥ 0",
    ),
    (
        _after("min_headroom_gib = 1.0", "\nmax_p99_ttft_ms = 0"),
        "constraints.max_p99_ttft_ms",
        "> 0",
    ),
    (_after("min_headroom_gib = 1.0", '\nno_oom = "yes"'), "constraints.no_oom", "true or false"),
    (_after("min_headroom_gib = 1.0", "\nmax_latency = 5"), "constraints.max_latency", "unknown"),
    (_replace("n_trials = 5", "n_trials = 0"), "budget.n_trials", "≥ 1"),
    (_replace("n_trials = 5", "n_trials = 2.5"), "budget.n_trials", "whole number"),
    (_after("n_trials = 5", "\ntimeout_s = -1"), "budget.timeout_s", "> 0"),
    (_replace('name = "tpe"', 'name = "bayes"'), "sampler.name", "tpe"),
    (_replace("seed = 3", "seed = -3"), "sampler.seed", "≥ 0"),
    (
        _before("[budget]", '[objectives]\nmaximize = ["latency"]\n\n'),
        "objectives.maximize",
        "capacity",
    ),
    (_before("[budget]", "[objectives]\nmaximize = []\n\n"), "objectives.maximize", "at least one"),
    (
        _before("[budget]", '[objectives]\nmaximize = ["capacity", "capacity"]\n\n'),
        "objectives.maximize",
        "twice",
    ),
    (_before("[budget]", '[storage]\npath = "x"\n\n'), "storage.path", "url"),
    (_SERVER_NOT_TABLE, "server", "table"),
    (_replace("[server.flags]", "[server.flagz]"), "server.flagz", "flags"),
    (VALID.replace("[search]", "[searchx]"), "searchx", "unknown key"),
    (_NO_SEARCH, "search", "missing"),
    (_replace("duration_s = 1.0", "duration_s = -1.0"), "workload.phases[0].duration_s", ""),
    (_replace('kind = "steady"', 'kind = "burst"'), "workload.phases[0].kind", ""),
    (_after("[workload]\n", "foo = 1\n"), "workload.foo", ""),
    (
        _replace('sim_profile = "kimi-k2.5-tp8-96g"', 'sim_profile = "kimi"'),
        "server.sim_profile",
        "not found",
    ),
    (_after("[server]\n", "env = 3\n"), "server.env", "table"),
    (_after("[server]\n", 'host = ""\n'), "server.host", "host name"),
    (
        _replace("choices = [32, 48, 64]", "choices = [32, 48], low = 1"),
        "search.max_running_requests.low",
        "unknown",
    ),
    (
        _replace(
            "hicache_size = { choices = [0, 48] }",
            "hicache_ratio = { low = 0, high = 4, log = true }",
        ),
        "search.hicache_ratio.low",
        "log",
    ),
    (_after("n_trials = 5", '\ntimeout_s = "8h"'), "budget.timeout_s", "number"),
    (
        _before("[budget]", '[objectives]\nminimize = ["capacity"]\n\n'),
        "objectives.minimize",
        "unknown",
    ),
    (
        _replace("trust_remote_code = true", "trust_remote_code = [true, {a = 1}]"),
        "server.flags.trust_remote_code",
        "list flag",
    ),
    (_after("[server]\n", "sim_seed = -1\n"), "server.sim_seed", "≥ 0"),
]


class Refused:
    """`autotune run` on a study text, with more arguments, results under tmp_path/results:
    exit code 2 and a one-line error, which the call returns."""

    def __init__(
        self,
        study_file: Callable[[str], Path],
        capsys: pytest.CaptureFixture[str],
        results: Path,
    ) -> None:
        self.study_file, self.capsys, self.results = study_file, capsys, results

    def __call__(self, text: str, *args: str) -> str:
        path = self.study_file(text)
        code = main(["run", "--config", str(path), "--results-dir", str(self.results), *args])
        err = self.capsys.readouterr().err
        assert code == 2, err
        assert len(err.strip().splitlines()) == 1, err
        return err


@pytest.fixture
def refused(
    study_file: Callable[[str], Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> Refused:
    return Refused(study_file, capsys, tmp_path / "results")


@pytest.mark.parametrize(
    ("text", "key", "hint"), BAD, ids=[f"{i}-{b[1]}" for i, b in enumerate(BAD)]
)
def test_bad_study_file_is_one_line_error_with_exit_2(
    text: str, key: str, hint: str, refused: Refused, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError) as exc:
        load_study(refused.study_file(text))
    assert exc.value.key == key
    assert hint in str(exc.value)
    assert refused(text).startswith(f"autotune: error: {key}")
    assert not (tmp_path / "results").exists()


def test_toml_syntax_error_names_the_file(
    study_file: Callable[[str], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = study_file(VALID + "\n[server\n")
    assert main(["run", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "TOML" in err and len(err.strip().splitlines()) == 1


def test_missing_study_file_is_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--study", "nosuchstudy"]) == 2
    assert re.search(r"nosuchstudy.toml.*--config", capsys.readouterr().err)
    assert main(["run", "--config", str(tmp_path / "missing.toml")]) == 2
    assert "cannot read" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--n-trials", "0"], "--n-trials"),
        (["--timeout", "-5"], "--timeout"),
        (["--sampler", "bayes"], "--sampler bayes"),
        (["--study", "../etc"], "--study"),
        (["--storage", "nonsense"], "--storage nonsense: cannot open it"),
        (["--storage", "sqlite:////nonexistent/dir/x.db"], "cannot open it"),
    ],
)
def test_bad_command_line_values(args: list[str], needle: str, refused: Refused) -> None:
    assert needle in refused(VALID, *args)


def test_run_without_study_is_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run"]) == 2
    assert "--study" in capsys.readouterr().err


def test_the_simulator_speaks_the_release_the_study_names(
    study_file: Callable[[str], Path],
) -> None:
    from autotune.config.space import base_command
    from autotune.errors import ConfigError
    from autotune.server.flagcheck import check_argv

    text = VALID.replace('backend = "sim"', 'backend = "sim"\nsim_version = "0.5.23"')
    cfg = load_study(study_file(text))
    program = base_command(cfg.server, "sim")
    assert program[-2:] == ("--sim-version", "0.5.23")
    # the release's own parser: 0.5.23 has no --cuda-graph-max-bs any more, 0.5.9 has
    old = [*program[:-2], "--model-path", "m", "--cuda-graph-max-bs", "8"]
    new = [*program, "--model-path", "m", "--cuda-graph-max-bs", "8"]
    assert check_argv(old, backend="sim") == []
    assert check_argv(new, backend="sim") != []
    with pytest.raises(ConfigError, match=r"server\.sim_version"):
        load_study(
            study_file(VALID.replace('backend = "sim"', 'backend = "sim"\nsim_version = "9"'))
        )
