"""Seed logs (`[search] seed_logs`): a server log of an earlier start seeds the memory model.

The log is a real simulator trial's `trials/0000/server.log` (the simulated Kimi-K2.5 box at
f = 0.88), made once per module by a 1-trial study; the checks are the study file's strict
errors, what a seed becomes for the planner, and a whole study with and without the seed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest

from autotune.config.studyfile import load_study
from autotune.errors import ConfigError
from autotune.record.seeds import read_seed
from tests import simstudy

EDGE = 0.906
"""Where the simulated box's stress headroom reaches the study's 0.5 GiB (docs/search.md)."""
SEED_LINE = 'hicache_size = 48\nseed_logs = ["{log}"]\n'


def _study(folder: Path, name: str, *, n_trials: int, seed: str | None = None) -> Path:
    text = simstudy.sim_study(low=0.80, step=0.01, sampler="capacity")
    text = text.replace("n_trials = 3", f"n_trials = {n_trials}")
    if seed is not None:
        text = text.replace("hicache_size = 48\n", SEED_LINE.format(log=seed))
    path = folder / f"{name}.toml"
    path.write_text(text)
    return path


def _launched(path: Path) -> list[optuna.trial.FrozenTrial]:
    url = f"sqlite:///{path.parent / 'results' / path.stem / 'study.db'}"
    trials = optuna.load_study(study_name=path.stem, storage=url).get_trials()
    return [t for t in trials if t.user_attrs.get("outcome") != "skipped"]


@pytest.fixture(scope="module")
def seed_log(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """trials/0000/server.log (and its trial.json) of a 1-trial study at the baseline 0.88."""
    folder = tmp_path_factory.mktemp("seed")
    path = _study(folder, "night", n_trials=1)
    done = simstudy.run(path, "run")
    assert done.returncode == 0, done.stdout + done.stderr
    log = folder / "results" / "night" / "trials" / "0000" / "server.log"
    assert log.is_file()
    yield log
    simstudy.assert_none_left(folder)


# ---- the study file's errors --------------------------------------------------------------


def test_a_missing_seed_log_is_one_line_naming_the_key(tmp_path: Path) -> None:
    path = _study(tmp_path, "s", n_trials=1, seed="nope/server.log")
    with pytest.raises(ConfigError) as err:
        load_study(path)
    assert str(err.value).startswith("search.seed_logs: nope/server.log: no such file")
    assert "\n" not in str(err.value)


def test_seed_logs_must_be_a_list_of_strings(tmp_path: Path) -> None:
    path = _study(tmp_path, "s", n_trials=1)
    path.write_text(path.read_text().replace("hicache_size = 48\n", "seed_logs = 3\n"))
    with pytest.raises(ConfigError, match=r"^search\.seed_logs: must be a list of strings"):
        load_study(path)


def test_a_log_without_a_ledger_is_refused(tmp_path: Path, seed_log: Path) -> None:
    head = seed_log.read_text().splitlines()[0]  # the server_args line alone
    (tmp_path / "short.log").write_text(head + "\n")
    cfg = load_study(_study(tmp_path, "s", n_trials=1, seed="short.log"))
    with pytest.raises(ConfigError, match=r"^search\.seed_logs: short\.log: no memory ledger"):
        read_seed(cfg.search.seed_logs[0], cfg)


def _seed_error(tmp_path: Path, seed_log: Path, old: str, new: str) -> str:
    """The one error reading `seed_log` gives for the study seeded by it, `old` made `new`."""
    path = _study(tmp_path, "s", n_trials=1, seed=str(seed_log))
    path.write_text(path.read_text().replace(old, new))
    cfg = load_study(path)
    with pytest.raises(ConfigError) as err:
        read_seed(cfg.search.seed_logs[0], cfg)
    return str(err.value)


def test_a_log_of_another_server_is_refused(tmp_path: Path, seed_log: Path) -> None:
    text = _seed_error(tmp_path, seed_log, "tp-size = 8", "tp-size = 4")
    assert text.startswith("search.seed_logs: ") and "ran --tp-size 8" in text
    assert "server.flags.tp_size" in text and "remove it" in text


@pytest.mark.parametrize(
    ("old", "new", "match"),
    [
        (
            "max_running_requests = 48",
            "max_running_requests = 32",
            r"ran max_running_requests=48, the study fixes 32",
        ),
        (
            'backend = "sim"',
            'backend = "sglang"',
            r"a sim trial's log .* cannot seed a sglang study",
        ),
    ],
    ids=["a-fixed-search-value-the-log-did-not-run", "a-sim-trials-log-cannot-seed-a-real-study"],
)
def test_a_log_the_study_did_not_run_is_refused(
    tmp_path: Path, seed_log: Path, old: str, new: str, match: str
) -> None:
    assert re.search(match, _seed_error(tmp_path, seed_log, old, new))


def test_a_bad_seed_stops_run_with_exit_2_and_writes_nothing(
    tmp_path: Path, seed_log: Path
) -> None:
    path = _study(tmp_path, "s", n_trials=1, seed=str(seed_log))
    path.write_text(path.read_text().replace("tp-size = 8", "tp-size = 4"))
    done = simstudy.run(path, "run")
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip().count("\n") == 0 and "search.seed_logs:" in done.stderr
    assert not (tmp_path / "results" / "s" / "study.db").exists()


# ---- what a seed is -------------------------------------------------------------------------


def test_a_seed_is_the_observation_its_trial_recorded(tmp_path: Path, seed_log: Path) -> None:
    cfg = load_study(_study(tmp_path, "s", n_trials=1, seed=str(seed_log)))
    rec = read_seed(cfg.search.seed_logs[0], cfg)
    assert rec["params"] == {
        "mem_fraction_static": 0.88,
        "max_running_requests": 48,
        "hicache_size": 48,
    }
    assert rec["outcome"] == "ok" and rec["feasible"] is True
    assert rec["ledger"]["max_total_num_tokens"] == 159_312
    assert rec["stress_peak_gib"] is not None  # from the trial.json beside the log
    assert "trial.json beside it says sim" in rec["origin"]
    bare = tmp_path / "bare.log"
    shutil.copy(seed_log, bare)
    alone = read_seed(bare, cfg)
    assert alone["stress_peak_gib"] is None and "producer unknown" in alone["origin"]
    assert alone["ledger"] == rec["ledger"]


# ---- a whole study --------------------------------------------------------------------------


def _best(trials: list[optuna.trial.FrozenTrial]) -> tuple[int, int]:
    """(best stable capacity, launches until it was first held)."""
    feasible = [
        t
        for t in trials
        if t.user_attrs.get("outcome") == "ok" and float(t.user_attrs["headroom_gib"]) >= 0.5
    ]
    best = max(int(t.user_attrs["capacity_tokens"]) for t in feasible)
    first = min(t.number for t in feasible if int(t.user_attrs["capacity_tokens"]) == best)
    return best, first + 1


def test_a_seeded_study_starts_toward_the_edge_and_needs_fewer_launches(
    tmp_path: Path, seed_log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bare = tmp_path / "bare" / "server.log"  # what an operator's journal gives: no trial.json
    bare.parent.mkdir()
    shutil.copy(seed_log, bare)
    runs = {
        "plain": _study(tmp_path, "plain", n_trials=8),
        "seeded": _study(tmp_path, "seeded", n_trials=8, seed=str(seed_log)),
        "journal": _study(tmp_path, "journal", n_trials=8, seed="bare/server.log"),
    }
    figures: dict[str, tuple[int, int, int, float]] = {}
    for name, path in runs.items():
        done = simstudy.run(path, "run", timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        launched = _launched(path)
        best, to_best = _best(launched)
        first = float(launched[0].params["mem_fraction_static"])
        figures[name] = (best, to_best, len(launched), first)
        if name != "plain":
            assert "the memory model starts from seed log" in done.stdout
            assert all(t.number >= 0 for t in launched)  # seeds are never trials
    with capsys.disabled():
        for name, (best, to_best, n, first) in figures.items():
            print(
                f"\nkimi profile, {name}: first launch f={first:g}, best stable {best:,} tokens "
                f"after {to_best} launch(es), {n} launched in all"
            )
    plain, seeded, journal = figures["plain"], figures["seeded"], figures["journal"]
    assert plain[3] == 0.88  # the baseline first, as today
    for fig in (seeded, journal):
        assert fig[3] != 0.88 and abs(fig[3] - EDGE) < abs(0.88 - EDGE)
        assert fig[0] == plain[0]  # the same best stable capacity
    assert seeded[1] < plain[1] and seeded[2] < plain[2]
    assert journal[1] <= plain[1]


def test_explain_names_the_seed(tmp_path: Path, seed_log: Path) -> None:
    path = _study(tmp_path, "s", n_trials=1, seed=str(seed_log))
    assert simstudy.run(path, "run").returncode == 0
    done = subprocess.run(
        simstudy.command(path, "explain", "--trial", "0"), capture_output=True, text=True,
        timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "also learnt from seed log" in done.stdout and "server.log" in done.stdout
