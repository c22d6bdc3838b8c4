"""Three `autotune run` workers share one study on the real PostgreSQL server.

Each worker has its own GPU group (`--gpus`), port (`--port`) and so its own results subfolder
and simulated GPU-state folder; they share only the database. Every process started here carries
the test's folder in its command line, so `no_leftovers` finds any survivor.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState

from autotune.server.preflight import free_port
from autotune.study.storage import counted
from autotune.study.workers import HOST_ENV, same_point
from tests.simstudy import LLAMA_TP2, leftovers, sim_study, workload

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

N_TRIALS = 15
GROUPS = ("0,1", "2,3", "4,5")
STUDY = sim_study(
    profile="llama-3.1-70b-tp8-h100",
    flags=LLAMA_TP2,
    search="[search]\nmem_fraction_static = { low = 0.80, high = 0.95, step = 0.01 }\n"
    "max_running_requests = { choices = [8, 16, 32] }",
    load=workload("DURATION", stress=False, input_len=64, output_len=8, concurrency=2),
    headroom_gib=None,
    sampler=None,
    n_trials="N_TRIALS",
    tail='\n[storage]\nheartbeat_s = 1\ngrace_s = 3\n\n[sampler]\nname = "tpe"\nseed = 1\n',
)


def _write_study(folder: Path, duration: float) -> Path:
    path = folder / "w.toml"
    text = STUDY.replace("DURATION", str(duration)).replace("N_TRIALS", str(N_TRIALS))
    path.write_text(text)
    return path


def _cmd(folder: Path, url: str, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "autotune", "run", "--config", str(folder / "w.toml"),
        "--results-dir", str(folder / "results"), "--storage", url, *extra,
    ]  # fmt: skip


def _start(
    folder: Path, url: str, gpus: str, port: int, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    out = open(folder / f"worker-{gpus.replace(',', '-')}.out", "ab")  # noqa: SIM115
    try:
        return subprocess.Popen(
            _cmd(folder, url, "--gpus", gpus, "--port", str(port)),
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=folder,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
    finally:
        out.close()


def _finish(procs: Sequence[subprocess.Popen[bytes]], timeout_s: float) -> list[int | None]:
    deadline = time.monotonic() + timeout_s
    codes: list[int | None] = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            codes.append(None)
    return codes


def _output(folder: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted(folder.glob("worker-*.out")))


def _trials(url: str) -> list[FrozenTrial]:
    return optuna.load_study(study_name="w", storage=url).get_trials()


SIDE_BY_SIDE = timedelta(seconds=1)
"""How long two trials must overlap to have run side by side. A trial's start is Optuna's ask,
a moment before its worker looks for a running twin: a twin told in between (a few
milliseconds) is rightly not a twin any more, though the two spans touch."""


def _overlap(a: FrozenTrial, b: FrozenTrial) -> bool:
    end_a = a.datetime_complete or datetime.max
    end_b = b.datetime_complete or datetime.max
    assert a.datetime_start is not None and b.datetime_start is not None
    return a.datetime_start + SIDE_BY_SIDE < end_b and b.datetime_start + SIDE_BY_SIDE < end_a


def _dump(trials: Sequence[FrozenTrial]) -> str:
    return "\n".join(
        f"{t.number} {t.state.name} {t.user_attrs.get('outcome')} "
        f"{t.user_attrs.get('worker', {}).get('host')} {t.datetime_start} {t.datetime_complete} "
        f"{t.params} {t.system_attrs.get('fixed_params')} {t.user_attrs.get('reason', '')[:80]}"
        for t in trials
    )


def _check_shared_study(folder: Path, url: str) -> list[FrozenTrial]:
    """What every run must leave: the budget exactly, no repeats side by side, every record."""
    trials = _trials(url)
    assert not [t.number for t in trials if t.state == TrialState.RUNNING]
    assert counted(trials) == N_TRIALS
    launched = [t for t in trials if t.user_attrs.get("outcome") not in ("skipped", "stale")]
    assert len(launched) == N_TRIALS
    for i, a in enumerate(launched):
        for b in launched[i + 1 :]:
            if _overlap(a, b):
                assert not same_point(a.params, b.params), _dump(trials)
    # no lost record: each launched trial's record is in the study and in its worker's folder
    records = sorted((folder / "results" / "w").glob("gpus-*/trials/*/trial.json"))
    numbers = sorted(json.loads(p.read_text())["number"] for p in records)
    assert numbers == sorted(t.number for t in launched)
    for t in launched:
        worker = t.user_attrs["worker"]
        assert worker["gpus"] in GROUPS and worker["host"]
        trial_dir = Path(t.user_attrs["trial_dir"])
        assert trial_dir.parent.parent.name == "gpus-" + worker["gpus"].replace(",", "-")
        record = json.loads((trial_dir / "trial.json").read_text())
        assert same_point(record["params"], t.params)
        assert record["outcome"] == t.user_attrs["outcome"]
        assert t.user_attrs["record"]["number"] == t.number
        assert "--port" in record["argv"]
    return trials


def test_three_workers_share_a_study(no_leftovers: Path, pg_url: str) -> None:
    folder = no_leftovers
    _write_study(folder, duration=0.5)
    ports = [free_port("127.0.0.1") for _ in GROUPS]
    url = pg_url.replace("postgresql://", "postgres://")  # as some users write it
    procs = [_start(folder, url, g, p) for g, p in zip(GROUPS, ports, strict=True)]
    codes = _finish(procs, timeout_s=150)
    assert codes == [0, 0, 0], _output(folder)
    trials = _check_shared_study(folder, pg_url)
    launched = [t for t in trials if t.user_attrs.get("outcome") != "skipped"]
    assert {t.user_attrs["worker"]["gpus"] for t in launched} == set(GROUPS)
    by_port = {t.user_attrs["worker"]["gpus"]: t.user_attrs["record"]["argv"][-1] for t in launched}
    assert by_port == {g: str(p) for g, p in zip(GROUPS, ports, strict=True)}
    # every simulated GPU-state folder is the worker's own
    for g in GROUPS:
        assert (folder / "results" / "w" / f"gpus-{g.replace(',', '-')}" / "sim-gpu").is_dir()
    status = subprocess.run(
        [sys.executable, "-m", "autotune", "status", "--study", "w", "--storage", url],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=folder,
    )
    assert status.returncode == 0, status.stderr
    assert f"{N_TRIALS} trials finished" in status.stdout
    header = next(ln for ln in status.stdout.splitlines() if ln.lstrip().startswith("#"))
    assert " worker " in header and ":2,3" in status.stdout
    # report and export read the shared study too
    for command in (["report"], ["export", "--format", "flags"]):
        done = subprocess.run(
            [sys.executable, "-m", "autotune", *command, "--config", str(folder / "w.toml"),
             "--results-dir", str(folder / "results"), "--storage", url],
            capture_output=True, text=True, timeout=120, cwd=folder,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        if command[0] == "export":
            assert "--mem-fraction-static" in done.stdout
    assert (folder / "results" / "w" / "report.html").is_file()


def test_killed_worker_trial_is_failed_by_the_others(no_leftovers: Path, pg_url: str) -> None:
    folder = no_leftovers
    _write_study(folder, duration=2.0)
    ports = [free_port("127.0.0.1") for _ in GROUPS]
    victim_env = {HOST_ENV: "box-c"}  # the third worker stands for another machine
    procs = [
        _start(folder, pg_url, g, p, victim_env if g == GROUPS[2] else None)
        for g, p in zip(GROUPS, ports, strict=True)
    ]
    victim = procs[2]
    victim_dir = folder / "results" / "w" / "gpus-4-5" / "trials"
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and victim.poll() is None:
            logs = list(victim_dir.glob("*/server.log"))
            if any("fired up and ready" in p.read_text(errors="replace") for p in logs):
                break
            time.sleep(0.1)
        else:
            raise AssertionError("the third worker never had a server serving\n" + _output(folder))
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=30)
        assert leftovers(victim_dir.parent), "the killed worker should have left its server"
    finally:
        codes = _finish(procs, timeout_s=150)
    assert codes[:2] == [0, 0], _output(folder)
    trials = _check_shared_study(folder, pg_url)
    stale = [t for t in trials if t.user_attrs.get("outcome") == "stale"]
    assert len(stale) == 1, [(t.number, t.user_attrs.get("outcome")) for t in trials]
    dead = stale[0]
    assert dead.user_attrs["worker"]["host"] == "box-c"
    assert "no heartbeat" in dead.user_attrs["reason"]
    assert "for over 3 s" in dead.user_attrs["reason"]
    assert (Path(dead.user_attrs["trial_dir"]) / "server.log").is_file()  # its log stays
    rerun = [t for t in trials if same_point(t.params, dead.params) and t.state.is_finished()]
    rerun = [t for t in rerun if t.user_attrs.get("outcome") not in ("stale", "skipped")]
    assert rerun and rerun[0].user_attrs["worker"]["host"] != "box-c"  # its point was not lost
    # the orphaned server is its own host's to stop: the worker's next start does it
    assert leftovers(victim_dir.parent)
    again = subprocess.run(
        _cmd(folder, pg_url, "--gpus", GROUPS[2], "--port", str(ports[2])),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=folder,
        start_new_session=True,
        env={**os.environ, **victim_env},
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert "stopped orphaned servers" in again.stdout
    assert not leftovers(folder)
    assert counted(_trials(pg_url)) == N_TRIALS
