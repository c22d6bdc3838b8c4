"""`autotune init NAME`: a valid study from a simulator log, a systemd unit or a command line,
that launches the operator's own flags at the baseline."""

from __future__ import annotations

import re
import shlex
import tempfile
import tomllib
from pathlib import Path

import pytest

from autotune.bootstrap import sizing
from autotune.bootstrap import study as bootstrap
from autotune.bootstrap.flagtable import FlagTable, probe_sglang, sim_table, split_args
from autotune.bootstrap.fromlog import log_facts
from autotune.bootstrap.sources import split_flags
from autotune.cli.main import main
from autotune.config.schema import Choices, FlagValue, StudyConfig
from autotune.config.space import fixed_flags, tuned_flags
from autotune.config.studyfile import load_study
from autotune.errors import HarnessError, UsageError
from autotune.server.flagcheck import FlagReport
from tests.bootstrap.conftest import KIMI_FLAGS, kimi_argv

KIMI = dict(KIMI_FLAGS)
MEMORY = {"mem-fraction-static": 0.88, "max-running-requests": 48,
          "enable-hierarchical-cache": True, "hicache-size": 48}  # fmt: skip
BASELINE = {"mem_fraction_static": 0.88, "max_running_requests": 48, "hicache_size": 48}
PROGRAM = "/opt/venv/bin/python -m sglang.launch_server"


def launched(cfg: StudyConfig) -> dict[str, FlagValue]:
    """The flags a trial at the baseline launches with."""
    tokens = [*fixed_flags(cfg.server), *tuned_flags(cfg.search.baseline, cfg.search)]
    flags, stray, repeated = split_flags(tokens)
    assert not stray and not repeated
    return dict(flags)


def init(folder: Path, *args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(["init", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def mem_range(cfg: StudyConfig) -> tuple[float, float]:
    p = cfg.search.params[0]
    assert p.name == "mem_fraction_static"
    return p.low, p.high  # type: ignore[union-attr]


@pytest.mark.e2e
@pytest.mark.parametrize("fixture", ["kimi_log", "kimi_log_0523"])
def test_from_a_simulator_log(
    fixture: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    log: Path = request.getfixturevalue(fixture)
    monkeypatch.chdir(tmp_path)
    rc, out, err = init(tmp_path, "kimi", "--from-log", str(log), capsys=capsys)
    assert rc == 0, err
    path = tmp_path / "configs" / "kimi.toml"
    assert out.startswith(f"wrote {Path('configs/kimi.toml')}")
    cfg = load_study(path)
    assert launched(cfg) == {**KIMI, **MEMORY}
    assert cfg.server.command == ("python", "-m", "sglang.launch_server")
    version = "0.5.23" if fixture.endswith("0523") else "0.5.9"
    assert cfg.server.sim_version == version
    assert dict(cfg.search.baseline) == BASELINE
    low, high = mem_range(cfg)
    # the pool holds a prefill chunk from about 0.78 up; the reserve holds the graphs and the
    # draft up to 0.93 (0.5.9) or 0.94 (0.5.23: the draft's weights and KV are in the budget)
    assert 0.76 <= low <= 0.80 and 0.92 <= high <= 0.95
    text = path.read_text()
    assert "P = 94.05 GiB free per GPU before the weights" in text
    assert "bytes per token" in text and "free after startup" in text
    assert f"memory rules of SGLang {version}" in text
    if version == "0.5.23":  # the resolved dict: what SGLang chose is a comment, not a flag
        assert "# chunked-prefill-size = 8192" in text
    steady = next(p for p in tomllib.loads(text)["workload"]["phases"] if p["kind"] == "steady")
    # the conftest's burst showed 16 requests at once; raised to the most slots searched (128)
    choices = tomllib.loads(text)["search"]["max_running_requests"]["choices"]
    assert steady["concurrency"] == max(choices) == 128
    assert "the log shows in the server at once" in text and "raised to 128 clients" in text
    assert 300 <= tomllib.loads(text)["workload"]["input_len"]["mean"] <= 900


def _unit(tmp_path: Path) -> Path:
    (tmp_path / "sglang.env").write_text('MODEL=moonshotai/Kimi-K2.5\nAPI_KEY="sk-not-copied"\n')
    words = [shlex.quote(w) for w in kimi_argv()]
    body = " \\\n    ".join(" ".join(words[i : i + 4]) for i in range(0, len(words), 4))
    body = body.replace("moonshotai/Kimi-K2.5", "${MODEL}")
    unit = tmp_path / "sglang.service"
    unit.write_text(
        "[Unit]\nDescription=Kimi\n\n[Service]\n"
        'Environment="CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7"\n'
        f"EnvironmentFile={tmp_path / 'sglang.env'}\n"
        f"ExecStart=-{PROGRAM} \\\n    {body} \\\n"
        "    --host 0.0.0.0 --port 30000 --api-key $API_KEY\nRestart=always\n"
    )
    return unit


def test_from_a_unit_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    rc, _, err = init(tmp_path, "kimi", "--from-unit", str(_unit(tmp_path)), capsys=capsys)
    assert rc == 0, err
    path = tmp_path / "configs" / "kimi.toml"
    cfg = load_study(path)
    assert cfg.server.command == tuple(PROGRAM.split())
    assert launched(cfg) == {**KIMI, **MEMORY}  # no --host, --port or --api-key
    assert dict(cfg.server.env) == {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
                                    "MODEL": "moonshotai/Kimi-K2.5"}  # fmt: skip
    assert dict(cfg.search.baseline) == BASELINE
    assert (cfg.server.host, cfg.server.port) == ("127.0.0.1", 0)
    text = path.read_text()
    assert "sk-not-copied" not in text and "API_KEY: set there but not copied" in text
    assert "workload.api_key_env" in err
    assert mem_range(cfg) == (0.8, 0.94)  # no log: around the current value
    assert "no log to size it from" in text


def test_from_a_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    cmd = f"{PROGRAM} {shlex.join(kimi_argv())} --port 30000"
    out = tmp_path / "elsewhere" / "k.toml"
    rc, _, err = init(tmp_path, "k", "--from-cmd", cmd, "--out", str(out), capsys=capsys)
    assert rc == 0, err
    cfg = load_study(out)
    assert cfg.server.command == tuple(PROGRAM.split())
    assert launched(cfg) == {**KIMI, **MEMORY}
    assert dict(cfg.search.baseline) == BASELINE
    assert not (tmp_path / "configs").exists()
    text = out.read_text()
    assert "SGLang does not import in /opt/venv/bin/python: flags kept as spelled" in text


def test_without_a_log_the_comment_gives_the_range_it_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Around the current value, kept within 0.5–0.97: a server run at 0.01 (a 0.3.x log of a
    small model with DP 8 did) gets the range written, not "0.08 below to 0.06 above"."""
    monkeypatch.chdir(tmp_path)
    for current, want in ((0.88, (0.8, 0.94)), (0.01, None)):
        argv = kimi_argv()
        argv[argv.index("--mem-fraction-static") + 1] = str(current)
        out = tmp_path / f"k{current}.toml"
        cmd = f"{PROGRAM} {shlex.join(argv)}"
        rc, _, err = init(tmp_path, "k", "--from-cmd", cmd, "--out", str(out), capsys=capsys)
        assert rc == 0, err
        low, high = mem_range(load_study(out))
        assert want is None or (low, high) == want
        assert f"no log to size it from: {low:g}–{high:g} around the current {current:g}" in (
            out.read_text()
        )


@pytest.mark.e2e
def test_a_log_with_the_command_sizes_the_command(
    kimi_log: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The command decides the flags (here it drops --hicache-size), the log the ranges."""
    monkeypatch.chdir(tmp_path)
    argv = kimi_argv()
    argv = argv[: argv.index("--enable-hierarchical-cache")]
    cmd = f"{PROGRAM} {shlex.join(argv)}"
    rc, _, err = init(tmp_path, "k", "--from-cmd", cmd, "--from-log", str(kimi_log), capsys=capsys)
    assert rc == 0, err
    cfg = load_study(tmp_path / "configs" / "k.toml")
    assert cfg.server.command == tuple(PROGRAM.split())
    assert launched(cfg) == {**KIMI, "mem-fraction-static": 0.88, "max-running-requests": 48}
    assert [p.name for p in cfg.search.params] == ["mem_fraction_static", "max_running_requests"]
    low, high = mem_range(cfg)
    assert 0.76 <= low <= 0.80 and 0.92 <= high <= 0.95


def test_an_existing_file_is_refused_without_force(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "configs" / "k.toml"
    path.parent.mkdir()
    path.write_text("# mine\n")
    cmd = f"{PROGRAM} --model-path m --mem-fraction-static 0.85"
    rc, out, err = init(tmp_path, "k", "--from-cmd", cmd, capsys=capsys)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and "exists; pass --force" in err
    assert path.read_text() == "# mine\n"
    rc, _, err = init(tmp_path, "k", "--from-cmd", cmd, "--force", capsys=capsys)
    assert rc == 0, err
    assert load_study(path).search.baseline["mem_fraction_static"] == 0.85


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ([], "name what to start from"),
        (["--from-log", "missing.log"], "no such file"),
        (["--from-cmd", "x", "--from-unit", "u"], "not both"),
        (["--from-cmd", "python -m sglang.launch_server --mem-fraction-static high"], "number"),
        (["--from-log", "junk.log"], "no server_args, memory or batch line"),
        (
            ["--from-cmd", "python -m sglang.launch_server --model-path m --tp 16 --nnodes 2"],
            "--nnodes 2: server.command starts one server process",
        ),
    ],
)
def test_bad_input_is_one_line_with_exit_2(
    args: list[str],
    says: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "junk.log").write_text("hello\nworld\n")
    rc, _, err = init(tmp_path, "k", *args, capsys=capsys)
    assert rc == 2 and err.count("\n") == 1 and says in err, err
    assert not (tmp_path / "configs").exists()


def test_a_study_that_does_not_validate_is_a_bug_and_not_written(tmp_path: Path) -> None:
    out = tmp_path / "k.toml"
    with pytest.raises(HarnessError, match="does not validate"):
        bootstrap.write_study(bootstrap.Draft(text="[server]\n"), out, name="k")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.sglang
def test_sglang_names_the_flags(
    sglang_python: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """With SGLang importable for the command's Python, abbreviations become its spelling."""
    monkeypatch.chdir(tmp_path)
    cmd = f"{sglang_python} -m sglang.launch_server --model m --tp 8 --mem-frac 0.88"
    rc, _, err = init(tmp_path, "k", "--from-cmd", cmd, capsys=capsys)
    assert rc == 0, err
    path = tmp_path / "configs" / "k.toml"
    cfg = load_study(path)
    assert dict(cfg.server.flags) == {"model_path": "m", "tp_size": 8}
    assert tomllib.loads(path.read_text())["server"]["flags"] == {"model-path": "m", "tp-size": 8}
    assert cfg.search.baseline["mem_fraction_static"] == 0.88


@pytest.mark.sglang
@pytest.mark.e2e
def test_sglangs_own_defaults_read_the_0523_log(sglang_python: Path, kimi_log_0523: Path) -> None:
    """SGLang 0.5.23's parser, given the log's resolved dict, finds exactly the flags given."""
    table = probe_sglang(str(sglang_python))
    assert table is not None and table.source.startswith("SGLang 0.5.23")
    split = split_args(log_facts(kimi_log_0523).args, table)
    assert dict(split.flags) == {**KIMI, **MEMORY}
    assert any(line.startswith("chunked-prefill-size = 8192") for line in split.resolved)


FIXTURES = sorted((Path(__file__).parents[1] / "fixtures" / "logs").glob("*.log"))


def _hermetic(src: bootstrap.Sources) -> bootstrap.Draft:
    """`compose` without asking any Python for SGLang: the simulator's tables."""
    return bootstrap.compose(src, inspect=lambda argv: FlagReport(), table_for=_sim_table)


def _sim_table(python: str, release: str | None) -> FlagTable:
    return sim_table(release)


@pytest.mark.parametrize("log", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_every_fixture_log_gives_a_valid_study(log: Path, tmp_path: Path) -> None:
    """Whatever the log (any release, cut short, failed, not SGLang's at all), init writes a
    study that validates or refuses in one line; never a study that does not validate."""
    for cmd in (None, f"{PROGRAM} --model-path m --tp-size 2"):
        try:
            draft = _hermetic(bootstrap.Sources(name="s", from_log=log, from_cmd=cmd))
        except UsageError as exc:
            assert "\n" not in str(exc)
            continue
        cfg = bootstrap.write_study(draft, tmp_path / "s.toml", name="s", force=True)
        low, high = mem_range(cfg)
        assert 0 < low < high < 1


def _draft(name: str) -> tuple[StudyConfig, str]:
    """The study `init` writes from fixture log `name` alone, and its text."""
    log = Path(__file__).parents[1] / "fixtures" / "logs" / f"{name}.log"
    draft = _hermetic(bootstrap.Sources(name="s", from_log=log))
    with tempfile.TemporaryDirectory() as folder:
        return bootstrap.write_study(draft, Path(folder) / "s.toml", name="s"), draft.text


def test_a_start_that_ran_out_of_gpu_memory_bounds_the_range_from_above() -> None:
    cfg, text = _draft("v0_5_23_startup_graph_capture_oom")
    assert mem_range(cfg)[1] < 0.88 and "mem_fraction_static" not in cfg.search.baseline
    assert "ran out of GPU memory: the range stays below it" in text
    cfg, text = _draft("v0_5_23_runtime_cublas_oom")  # under load: the baseline stays the top
    f = cfg.search.baseline["mem_fraction_static"]
    assert mem_range(cfg)[1] == f and "ran out of GPU memory under load" in text


def test_a_kv_pool_out_of_token_slots_under_load_bounds_the_range_from_below() -> None:
    """`Decode out of memory` is SGLang's allocator finding no free KV slots, not CUDA: a bigger
    pool helps, so the log's fraction is where the range starts, not where it tops out."""
    cfg, text = _draft("v0_5_18_runtime_decode_oom")
    assert mem_range(cfg)[0] == cfg.search.baseline["mem_fraction_static"] == 0.88
    assert mem_range(cfg)[1] > 0.88 and "out of KV pool token slots under load" in text


def test_a_start_without_room_for_a_pool_bounds_the_range_from_below() -> None:
    cfg, text = _draft("v0_5_23_startup_not_enough_memory")
    assert mem_range(cfg)[0] > 0.88 and "mem_fraction_static" not in cfg.search.baseline
    assert "no room for a KV pool" in text


def test_a_start_out_of_host_memory_offers_only_smaller_host_caches() -> None:
    cfg, text = _draft("v0_5_18_startup_host_memory")
    host = next(p for p in cfg.search.params if p.name == "hicache_size")
    assert isinstance(host, Choices) and all(isinstance(v, int) and v < 700 for v in host.values)
    assert "hicache_size" not in cfg.search.baseline
    assert "ran out of host memory" in text


def test_a_start_the_kernel_refused_host_memory_offers_only_smaller_host_caches(
    tmp_path: Path,
) -> None:
    """`[Errno 12] Cannot allocate memory` while the host pool is allocated is the host cache
    not fitting, read as the search reads it (`push_of`): only smaller sizes are offered."""
    fixture = Path(__file__).parents[1] / "fixtures" / "logs" / "v0_5_18_startup_host_memory.log"
    text = re.sub(
        r"^ValueError: Not enough host memory.*$",
        "OSError: [Errno 12] Cannot allocate memory",
        fixture.read_text(),
        flags=re.M,
    )
    log = tmp_path / "enomem.log"
    log.write_text(text)
    assert log_facts(log).verdict.cause == "host_enomem"
    draft = _hermetic(bootstrap.Sources(name="s", from_log=log))
    cfg = bootstrap.write_study(draft, tmp_path / "s.toml", name="s")
    host = next(p for p in cfg.search.params if p.name == "hicache_size")
    assert isinstance(host, Choices) and all(isinstance(v, int) and v < 700 for v in host.values)
    assert "hicache_size" not in cfg.search.baseline
    assert "ran out of host memory" in draft.text


def test_a_fraction_the_log_does_not_print_is_read_from_its_pool() -> None:
    cfg, text = _draft("tp1_no_tag")  # server_args without mem_fraction_static
    assert cfg.search.baseline["mem_fraction_static"] == 0.834
    assert "what the log's pool implies" in text


def test_a_log_from_the_pool_on_is_read_with_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An excerpt that starts after the weights (no `server_args=`, no `Load weight begin`) still
    shows the start's memory lines: it is read, and the command gives the flags."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tail.log").write_text(
        "[2025-11-30 11:18:01] Capture cuda graph end. Time elapsed: 5.92 s. mem usage=1.44 GB. "
        "avail mem=37.06 GB.\n"
        "[2025-11-30 11:18:05] max_total_num_tokens=2261377, chunked_prefill_size=16384, "
        "max_prefill_tokens=16384, max_running_requests=4096, context_len=128000, "
        "available_gpu_mem=37.06 GB\n"
    )
    assert log_facts(tmp_path / "tail.log").ledger.max_total_num_tokens == 2261377
    rc, _, err = init(tmp_path, "k", "--from-log", "tail.log", capsys=capsys)
    assert rc == 2 and "no server_args line to read the flags from" in err, err
    cmd = f"{PROGRAM} --model-path m --mem-fraction-static 0.85"
    rc, _, err = init(tmp_path, "k", "--from-log", "tail.log", "--from-cmd", cmd, capsys=capsys)
    assert rc == 0, err
    assert (
        load_study(tmp_path / "configs" / "k.toml").search.baseline["mem_fraction_static"] == 0.85
    )


def test_a_cap_on_the_kv_pool_is_kept_and_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--max-total-tokens` holds the pool at its value whatever the fraction (SGLang takes
    `min(capacity, max_total_tokens)`): the operator's flag is kept, and init says, on stderr and
    beside the flag, that the search cannot grow the pool past it while it stays."""
    monkeypatch.chdir(tmp_path)
    cmd = f"{PROGRAM} --model-path m --mem-fraction-static 0.85 --max-total-tokens 20480"
    rc, _, err = init(tmp_path, "k", "--from-cmd", cmd, capsys=capsys)
    assert rc == 0 and "caps the KV pool at 20480 tokens" in err, err
    text = (tmp_path / "configs" / "k.toml").read_text()
    assert "caps the KV pool at 20480 tokens" in text
    flags = dict(load_study(tmp_path / "configs" / "k.toml").server.flags)
    assert flags["max_total_tokens"] == 20480, flags


def test_a_served_model_name_of_the_operator_s_own_is_kept() -> None:
    """`--served-model-name llama70b` is what the clients ask for: it was written commented out,
    as a value SGLang fills in, and the export lost it; the one SGLang fills (the model path)
    is still left out."""
    table = sim_table("0.5.23")
    args = {"model_path": "m/llama", "served_model_name": "llama70b", "tokenizer_path": "m/llama"}
    split = split_args(args, table)
    assert ("served-model-name", "llama70b") in split.flags
    assert not any("served-model-name" in line for line in split.resolved)
    filled = split_args({**args, "served_model_name": "m/llama"}, table)
    assert not any(name == "served-model-name" for name, _ in filled.flags)
    assert not any("tokenizer-path" in name for name, _ in split.flags)


def test_the_operator_s_address_is_the_export_s(tmp_path: Path) -> None:
    """`--host 0.0.0.0 --port 8000` of the operator's command (or the log's `server_args=`) was
    left in a comment: the trials bind their own, and the export served on SGLang's default
    port. It is now `server.export_host`/`export_port`, and the exported command ends with it."""
    from autotune.review.export import launch_argv

    cmd = f"{PROGRAM} --model-path m --tp-size 2 --host 0.0.0.0 --port 8000"
    draft = _hermetic(bootstrap.Sources(name="s", from_cmd=cmd))
    cfg = bootstrap.write_study(draft, tmp_path / "s.toml", name="s", force=True)
    assert (cfg.server.port, cfg.server.export_host, cfg.server.export_port) == (0, "0.0.0.0", 8000)
    point = {p.name: cfg.search.baseline.get(p.name, mem_range(cfg)[0]) for p in cfg.search.params}
    argv = launch_argv(cfg, point, backend="sglang")
    assert argv[-4:] == ["--host", "0.0.0.0", "--port", "8000"]
    log = Path(__file__).parents[1] / "fixtures" / "logs" / "v0_4_qwq32b_tp4_l4.log"
    from_log = _hermetic(bootstrap.Sources(name="s", from_log=log))
    cfg = bootstrap.write_study(from_log, tmp_path / "l.toml", name="s", force=True)
    assert (cfg.server.export_host, cfg.server.export_port) == ("0.0.0.0", 8000)


def test_host_cache_sizes_over_the_log_s_headroom_line_are_left_out() -> None:
    """0.5.23's `HiCache memory headroom: host 48.4 GiB, cgroup 40.0 GiB` bounds each rank's
    pool at (40 − 10) GiB = 32.2 GB; init still offered 48, which every launch refuses."""
    from autotune.bootstrap.sizing import _host_budget_limit, log_host_budget_gb
    from autotune.logparse.accounting import build_ledger
    from autotune.logparse.lines import parse_text

    text = (
        "[2026-12-07 07:12:06] HiCache memory headroom: host 48.4 GiB, cgroup 40.0 GiB\n"
        "[2026-12-07 07:12:06] Allocating kv hierarchical KV host pool: 418527 tokens, "
        "24.00 GB host memory.\n"
    )
    ledger = build_ledger(parse_text(text).events)
    assert log_host_budget_gb(ledger) == pytest.approx(30 * 2**30 / 1e9)
    comments: list[str] = []
    assert _host_budget_limit({0, 12, 24, 48}, comments, ledger) == {0, 12, 24}
    assert "left out 48: above the host budget of 32 GB per rank" in comments


@pytest.mark.parametrize(
    ("current", "holds", "want"),
    [
        # SGLang's own 2049 slots: no 2048 beside it, none past the 4096 clients a workload runs
        (2049, 7663, [1368, 2049, 2736, 4096]),
        (48, 200, [32, 48, 64, 96, 128]),
        # a current value above the workload's clients stays the top: nothing round above it
        (5000, 9000, [1664, 2496, 3336, 5000]),
    ],
)
def test_the_request_slot_choices_are_distinct_and_within_what_the_workload_fills(
    current: int, holds: int, want: list[int]
) -> None:
    knob = sizing.mrr_knob(
        sizing.Current(max_running_requests=current, mrr_by_command=True), None, holds, 1
    )
    assert knob.value == "{ choices = [" + ", ".join(map(str, want)) + "] }", knob.value


def test_arguments_of_a_feature_that_is_off_and_open_limits_are_not_pinned() -> None:
    """An older release's log prints its own defaults for a draft it does not run
    (`speculative_num_steps=5`), a host cache it does not have and LoRA it does not load, and
    `sys.maxsize` for no queue limit: none of them is the operator's flag. With the feature on,
    its arguments are kept."""
    table = sim_table("0.5.9")
    args = {
        "model_path": "m",
        "speculative_algorithm": None,
        "speculative_num_steps": 5,
        "speculative_eagle_topk": 4,
        "enable_hierarchical_cache": False,
        "hicache_write_policy": "write_through_selective",
        "lora_backend": "triton",
        "max_queued_requests": 9223372036854775807,
        "tp_size": 4,
    }
    names = [name for name, _ in split_args(args, table).flags]
    assert names == ["model-path", "tp-size"], names
    drafted = {**args, "speculative_algorithm": "EAGLE3"}
    kept = [name for name, _ in split_args(drafted, table).flags]
    assert "speculative-num-steps" in kept and "speculative-algorithm" in kept, kept
