"""`autotune init --from-log` on server logs in the shapes of every SGLang release it reads (0.4,
0.5.8, 0.5.9, 0.5.18, 0.5.23), as a real process: the study it writes validates, its baseline is
what the log's start ran (a fraction SGLang computed itself to its last digit), its request-slot
choices are ones the pool holds at the workload's own lengths, and a baseline the default
constraints already rule out is said so, in the file and in one line on the terminal."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from autotune.bootstrap.fromlog import log_facts
from autotune.config.schema import Choices, FloatRange, StudyConfig
from autotune.config.studyfile import load_study
from tests import simstudy
from tests.bootstrap.test_init import PROGRAM

LOGS = Path(__file__).parents[1] / "fixtures" / "logs"
RELEASE_LOGS = (
    "v0_4_qwq32b_tp4_l4",  # 0.4: QwQ-32B TP4 on L4, SGLang's own 2049 slots, 0.53 GB free
    "v0_4_6_tp2",  # 0.4.6: SGLang's own 4096 slots
    "v0_5_8_kimi_vl_computed_fraction_tp8",  # 0.5.8: a fraction SGLang computed for a VLM
    "v0_5_9_kimi_tp8_eagle3",  # 0.5.9: the operator's 0.88, 48 slots
    "v0_5_18_eagle3_hicache_tp2",  # 0.5.18
    "v0_5_23_hicache_tp2",  # 0.5.23: the resolved dict
)
COMPUTED = 0.8260405859375
"""The fraction in the 0.5.8 log's server_args line: SGLang's own 0.869 × its VLM factor."""


def init(folder: Path, name: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`autotune init NAME ARGS --out NAME.toml` as a real process in `folder`."""
    return subprocess.run(
        [sys.executable, "-m", "autotune", "init", name, *args, "--out", f"{name}.toml"],
        capture_output=True, text=True, timeout=120, cwd=folder,
    )  # fmt: skip


def _slots(cfg: StudyConfig) -> tuple[int, ...]:
    p = next(p for p in cfg.search.params if p.name == "max_running_requests")
    assert isinstance(p, Choices)
    return tuple(int(v) for v in p.values)


def _mean(spec: dict[str, object]) -> int:
    value = spec.get("mean", spec.get("value"))
    assert isinstance(value, int)
    return value


@pytest.mark.parametrize("name", RELEASE_LOGS)
def test_a_log_of_each_release_gives_a_study_that_validates(name: str, tmp_path: Path) -> None:
    log = LOGS / f"{name}.log"
    done = init(tmp_path, "s", "--from-log", str(log))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("wrote s.toml: ")
    assert "Traceback" not in done.stderr
    cfg = load_study(tmp_path / "s.toml")
    facts = log_facts(log)
    # the baseline is what the log's start ran, to the digit
    assert cfg.search.baseline["mem_fraction_static"] == facts.fraction
    fraction = cfg.search.params[0]
    assert isinstance(fraction, FloatRange)
    baseline = cfg.search.baseline["mem_fraction_static"]
    assert isinstance(baseline, float) and fraction.low <= baseline <= fraction.high

    # every slot count the pool holds at the workload's prompt + answer (or the log ran at once)
    raw = tomllib.loads((tmp_path / "s.toml").read_text())
    per_request = _mean(raw["workload"]["input_len"]) + _mean(raw["workload"]["output_len"])
    pool = facts.ledger.max_total_num_tokens
    assert pool
    most = max(pool // per_request, facts.serving.max_running or 0)
    slots = _slots(cfg)
    assert all(v <= most for v in slots), (slots, pool, per_request)
    assert len(slots) >= 3 or most < 4
    # the log's own slot count stays the baseline only where the pool holds it
    logged = cfg.search.baseline.get("max_running_requests")
    assert logged is None or logged in slots
    steady = next(p for p in raw["workload"]["phases"] if p["kind"] == "steady")
    assert steady["concurrency"] <= max(most, max(slots))
    assert steady["concurrency"] >= min(max(slots), most)


def test_the_pool_of_qwq_on_l4_sizes_the_slots_not_sglangs_2049(tmp_path: Path) -> None:
    """The tester's log shape: 46,080 tokens of pool, SGLang's own 2049 request slots."""
    done = init(tmp_path, "q", "--from-log", str(LOGS / "v0_4_qwq32b_tp4_l4.log"))
    assert done.returncode == 0, done.stderr
    cfg = load_study(tmp_path / "q.toml")
    slots = _slots(cfg)
    assert max(slots) <= 13 and 2049 not in slots  # 46,080 / 4,340 = 10; the log ran 13
    assert "max_running_requests" not in cfg.search.baseline
    text = (tmp_path / "q.toml").read_text()
    assert "2049 request slots, what the log's start ran with (its summary line), are more" in text
    steady = next(p for p in tomllib.loads(text)["workload"]["phases"] if p["kind"] == "steady")
    assert steady["concurrency"] == 13
    assert "cut to 13 clients" in text


def test_a_baseline_under_the_default_headroom_is_said_in_one_line(tmp_path: Path) -> None:
    done = init(tmp_path, "q", "--from-log", str(LOGS / "v0_4_qwq32b_tp4_l4.log"))
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "min_headroom_gib" in line]
    assert len(said) == 1 and said[0].startswith("autotune: warning: the baseline is infeasible")
    assert "0.53 GiB free after startup" in said[0]
    assert "min_headroom_gib = 0.5 would hold it" in said[0]
    text = (tmp_path / "q.toml").read_text()
    constraints = text[text.index("[constraints]") : text.index("[budget]")]
    assert "min_headroom_gib = 0.5 would hold it" in constraints.replace("\n# ", " ")
    cfg = load_study(tmp_path / "q.toml")
    assert cfg.constraints.min_headroom_gib == 1.0  # said, not changed
    # 5.47 GiB free in the Kimi log: nothing to say
    done = init(tmp_path, "k", "--from-log", str(LOGS / "v0_5_9_kimi_tp8_eagle3.log"))
    assert done.returncode == 0
    assert "infeasible" not in done.stderr + (tmp_path / "k.toml").read_text()


def test_a_command_s_own_slots_stay_the_baseline_past_the_pool(tmp_path: Path) -> None:
    """Slots the operator's command sets are the baseline even past what the pool holds."""
    cmd = f"{PROGRAM} --model-path Qwen/QwQ-32B --tp-size 4 --max-running-requests 64"
    log = LOGS / "v0_4_qwq32b_tp4_l4.log"
    done = init(tmp_path, "q", "--from-cmd", cmd, "--from-log", str(log))
    assert done.returncode == 0, done.stderr
    cfg = load_study(tmp_path / "q.toml")
    slots = _slots(cfg)
    assert cfg.search.baseline["max_running_requests"] == 64 and 64 in slots
    assert all(v <= 13 for v in slots if v != 64)
    assert "the command's 64 stays the baseline" in (tmp_path / "q.toml").read_text()
    # a command that leaves the slots to SGLang: the log's 2049 is SGLang's, not searched
    cmd = f"{PROGRAM} --model-path Qwen/QwQ-32B --tp-size 4"
    done = init(tmp_path, "r", "--from-cmd", cmd, "--from-log", str(log))
    assert done.returncode == 0, done.stderr
    cfg = load_study(tmp_path / "r.toml")
    assert "max_running_requests" not in cfg.search.baseline and max(_slots(cfg)) <= 13


@pytest.mark.e2e
def test_a_computed_fraction_launches_as_sglang_ran_it(tmp_path: Path) -> None:
    """The 0.5.8 log's 0.8260405859375: the baseline, inside a range without a step, and the
    flag the baseline trial launches with on the simulator, every digit."""
    log = LOGS / "v0_5_8_kimi_vl_computed_fraction_tp8.log"
    done = init(tmp_path, "k", "--from-log", str(log), "--sim-profile", "kimi-k2.5-tp8-96g")
    assert done.returncode == 0, done.stderr
    path = tmp_path / "k.toml"
    text = path.read_text()
    assert "mem_fraction_static = 0.8260405859375" in text
    fraction = load_study(path).search.params[0]
    assert isinstance(fraction, FloatRange) and fraction.step is None
    assert "no step: the baseline 0.8260405859375" in text
    # a short load, and no seed: the baseline is launched first
    start, end = text.index("[workload]"), text.index("[constraints]")
    text = text[:start] + simstudy.workload(stress=False) + text[end:]
    path.write_text("".join(line for line in text.splitlines(True) if "seed_logs" not in line))
    run = simstudy.run(path, "run", "--backend", "sim", "--n-trials", "1")
    assert run.returncode == 0, run.stdout + run.stderr
    record = json.loads((tmp_path / "results/k/trials/0000/trial.json").read_text())
    argv = record["argv"]
    assert argv[argv.index("--mem-fraction-static") + 1] == repr(COMPUTED)
    assert record["params"]["mem_fraction_static"] == COMPUTED
    simstudy.assert_none_left(tmp_path)


def test_the_fraction_of_a_hybrid_model_s_log_counts_its_state_pool() -> None:
    """A Qwen3.5-9B TP2 start at 0.8 without its server_args line (public notes, SGLang main
    2026-04): the fraction its pool implies counts the Mamba state pool, carved from the same
    budget; from the KV lines alone it read 0.604."""
    facts = log_facts(LOGS / "v0_5_10_qwen35_mamba_tp2.log")
    assert facts.fraction == pytest.approx(0.8, abs=0.002)
