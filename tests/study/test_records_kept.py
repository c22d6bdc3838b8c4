"""Records are never overwritten: a trial folder is one trial's, a lost storage is refused and
rebuilt from the folders, trial.json and the storage tell one story, and the messages of a run
name what is true (the results folder, a missing pidfile, a dead run's trial)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import threading
import time
from datetime import datetime
from pathlib import Path

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState, create_trial

from autotune.config.studyfile import load_study
from autotune.errors import HarnessError, UsageError
from autotune.record import keys
from autotune.review.status import render
from autotune.study.records import (
    MEASURED_OUTCOME,
    STORAGE_BLOCK,
    agrees,
    check_folders,
    claim,
    keep,
    rebuild_command,
)
from autotune.study.storage import STALE_REASON, Worker
from autotune.testing import audit
from tests.reliability.helpers import World, one_line, wait_for_log
from tests.study.fakes import FakeLauncher

e2e = pytest.mark.e2e


def _hashes(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.glob("trials/*/*"))
    }


def _capacity_study(world: World, n_trials: int = 3) -> None:
    world.study(n_trials=n_trials, tail="", duration=0.5)
    path = world.folder / "rel.toml"
    path.write_text(path.read_text().replace('name = "grid"', 'name = "capacity"'))


def _reviews(world: World) -> dict[str, str]:
    config = ["--config", str(world.folder / "rel.toml"), "--results-dir", str(world.results)]
    out = {}
    for command in (["status"], ["export"], ["export", "--format", "json"], ["explain"]):
        done = world.autotune(*command, *config)
        assert done.rc == 0, done.err
        out[" ".join(command)] = done.out
    return out


# ------------------------------------------------------------------------------------------------
# 1. a trial folder is one trial's: a lost storage is refused, and rebuilt
# ------------------------------------------------------------------------------------------------


@e2e
@pytest.mark.parametrize("loss", ["deleted", "emptied"])
def test_a_lost_storage_is_refused_and_rebuilt_from_the_trial_folders(
    world: World, loss: str
) -> None:
    """A demo-like study runs, study.db is lost; the next run refuses in one line and writes no
    trial folder; `autotune rebuild` gives the storage its trials back, after which status,
    export and explain answer as before the loss and a further run numbers its trials on."""
    _capacity_study(world)
    done = world.run()
    assert done.rc == 0, done.err
    before = _reviews(world)
    kept = _hashes(world.study_dir)
    assert len({k.split("/")[1] for k in kept}) == 2  # two launches
    # the search found nothing more worth a launch: a study attribute, no trial told for it
    assert not (world.study_dir / "trials/not-launched.jsonl").exists()
    assert "search done after 2 trials: " in before["status"]
    db = world.study_dir / "study.db"
    if loss == "deleted":
        db.unlink()
    else:
        db.write_bytes(b"")

    refused = world.run()
    assert refused.rc == 2, refused.out + refused.err
    assert one_line(refused.err) == (
        f"autotune: error: {world.study_dir}/trials holds 2 trial folders but the storage has 0 "
        "trials (none for 0000, 0001): restore the storage, run `autotune rebuild --study "
        f"rel --results-dir {world.results}` to rebuild it from the trial folders, or use "
        "--results-dir elsewhere"
    )
    assert _hashes(world.study_dir) == kept, "the refused run wrote into a trial folder"

    rebuilt = world.autotune(
        "rebuild", "--config", str(world.folder / "rel.toml"), "--results-dir", str(world.results)
    )
    assert rebuilt.rc == 0, rebuilt.err
    assert "from 2 trial folders: 2 trials as the storage held them" in rebuilt.out, rebuilt.out
    assert _reviews(world) == before  # the search's stop decided again from the same trials
    assert world.problems() == []
    assert _hashes(world.study_dir) == kept, "the rebuild wrote into a trial folder"

    again = world.run("--n-trials", "3")  # the search is done: it ends before an ask
    assert again.rc == 0, again.err
    assert "finished (search done: " in again.out, again.out
    assert _hashes(world.study_dir) == kept, "a trial folder was written again"
    assert [t.number for t in world.trials()] == [0, 1]
    assert world.problems() == []


@e2e
def test_a_rebuild_refuses_a_storage_that_holds_the_study(world: World) -> None:
    world.study(n_trials=1)
    assert world.run().rc == 0
    done = world.autotune(
        "rebuild", "--config", str(world.folder / "rel.toml"), "--results-dir", str(world.results)
    )
    assert done.rc == 2
    line = one_line(done.err)
    assert "study rel holds 13 trials already; a rebuild goes only into a storage without" in line


def test_a_trial_folder_is_created_once(tmp_path: Path) -> None:
    first = claim(tmp_path, 7)
    assert first == tmp_path / "trials/0007" and oct(first.stat().st_mode & 0o777) == "0o700"
    (first / "trial.json").write_text("{}")
    with pytest.raises(HarnessError, match="0007 exists already and holds another trial's"):
        claim(tmp_path, 7)
    assert (first / "trial.json").read_text() == "{}"


def test_folders_the_storage_does_not_know_are_refused(tmp_path: Path) -> None:
    for n in (0, 1, 5):
        claim(tmp_path, n)
    check_folders(tmp_path, [0, 1, 2, 3, 4, 5], "autotune rebuild --study s")
    with pytest.raises(UsageError) as e:
        check_folders(tmp_path, [0, 1], "autotune rebuild --study s")
    assert str(e.value) == (
        f"{tmp_path}/trials holds 3 trial folders but the storage has 2 trials (none for 0005): "
        "restore the storage, run `autotune rebuild --study s` to rebuild it from the trial "
        "folders, or use --results-dir elsewhere"
    )


def test_the_rebuild_command_names_what_differs_from_the_defaults(tmp_path: Path) -> None:
    assert rebuild_command("s", Path("results/s"), "sqlite:///x") == (
        "autotune rebuild --study s --storage sqlite:///x"
    )
    here = Path("results/s")
    assert rebuild_command("s", here, f"sqlite:///{here.resolve() / 'study.db'}") == (
        "autotune rebuild --study s"
    )
    assert rebuild_command("s", tmp_path / "r s" / "s", "postgresql://u:pw@h/db") == (
        f"autotune rebuild --study s --results-dir '{tmp_path}/r s' --storage "
        "'postgresql://u:***@h/db'"
    )


@e2e
def test_a_run_never_reuses_a_trial_folder(world: World) -> None:
    """Defence in depth: a trial folder the storage does know, but that holds a record already
    (two studies' folders mixed by hand), is not launched into; the run stops with one line."""
    world.study(n_trials=2)
    assert world.run("--n-trials", "1").rc == 0
    assert world.trials()[1].state == TrialState.WAITING  # the next grid point, queued
    stray = world.study_dir / "trials/0001"
    stray.mkdir(mode=0o700)
    (stray / "trial.json").write_text('{"outcome": "ok", "number": 1}\n')
    done = world.run()
    assert done.rc == 1, done.out + done.err
    line = one_line(done.err)
    assert f"trial 1: {stray} exists already and holds another trial's record" in line, line
    assert (stray / "trial.json").read_text() == '{"outcome": "ok", "number": 1}\n'
    assert not (stray / "server.log").exists()
    t1 = world.trials()[1]
    assert (t1.state, t1.user_attrs["outcome"]) == (TrialState.FAIL, "harness_error")


def test_the_advice_after_a_storage_failure_is_safe_to_follow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The storage never answers within the patience: the line tells to resume once it answers,
    and that a storage that lost trials is refused (the check above), never written over."""
    from autotune.study import loop, runner
    from autotune.study.loop import StorageFailed

    world = World(tmp_path)
    cfg = load_study(world.study(), name="rel")
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="u", storage=url)
    trial = study.ask()
    monkeypatch.setattr(loop, "STORAGE_PATIENCE_S", 0.5)
    night = runner._Night(cfg, tmp_path, FakeLauncher(), study, time.monotonic)
    night.url = url
    holder = sqlite3.connect(tmp_path / "study.db", timeout=30)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(HarnessError) as e:
            night.storage_failed(StorageFailed(trial, None, RuntimeError("database is locked")))
    finally:
        holder.rollback()
        holder.close()
    assert str(e.value).endswith(
        "trial 0 could not be recorded (the next run marks it stale and runs its point again); "
        "once the storage answers, run the same command to resume (a storage that lost trials "
        "is refused, its trial folders are never written over)"
    )


# ------------------------------------------------------------------------------------------------
# 3. trial.json and the storage agree, and the audit says when they do not
# ------------------------------------------------------------------------------------------------


def _stored(outcome: str, folder: Path, state: TrialState = TrialState.FAIL) -> FrozenTrial:
    t = create_trial(
        state=state,
        values=[1.0] if state == TrialState.COMPLETE else None,
        user_attrs={keys.OUTCOME: outcome, keys.REASON: "why", keys.TRIAL_DIR: str(folder)},
    )
    t.number = 0
    return t


def test_keep_makes_trial_json_follow_the_storage_and_keeps_what_was_measured(
    tmp_path: Path,
) -> None:
    where = claim(tmp_path, 0)
    (where / "trial.json").write_text(json.dumps({"outcome": "runtime_oom", "state": "complete"}))
    t = _stored("stale", where)
    assert audit.problems([t], tmp_path) == [
        "trial 0: trial.json says 'runtime_oom', the storage 'stale'",
        "trial 0: FAIL in the storage, complete on disk",
    ]
    assert keep(where, t)
    record = json.loads((where / "trial.json").read_text())
    assert (record["outcome"], record["state"], record[MEASURED_OUTCOME]) == (
        "stale",
        "fail",
        "runtime_oom",
    )
    assert record[STORAGE_BLOCK]["user_attrs"][keys.OUTCOME] == "stale"
    assert agrees(record, t) and audit.problems([t], tmp_path) == []
    other = claim(tmp_path, 1)
    stranger = _stored("ok", tmp_path / "elsewhere")
    stranger.number = 1
    assert not keep(other, stranger), "a folder the trial did not record as its own is left"
    assert not (other / "trial.json").exists()


def test_the_audit_flags_a_state_the_storage_does_not_hold(tmp_path: Path) -> None:
    where = claim(tmp_path, 0)
    (where / "trial.json").write_text(json.dumps({"outcome": "stale", "state": "complete"}))
    assert audit.problems([_stored("stale", where)], tmp_path) == [
        "trial 0: FAIL in the storage, complete on disk"
    ]


@e2e
def test_sigkill_during_teardown_then_resume_record_and_storage_agree(world: World) -> None:
    """autotune is SIGKILLed while it stops a server that ignores SIGTERM; trial.json is as the
    kill left it (none, or planted as written just before the kill). The resume fails the trial
    as stale and trial.json says so too, what it measured kept; the audit finds nothing."""
    world.foreign_sleep()
    world.study(n_trials=1, flags='sim-fault = "ignore-sigterm"')
    proc = world.start(*world.run_args())
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(iter(proc.stdout.readline, "")))  # type: ignore[union-attr]
    reader.start()
    deadline = time.monotonic() + 60
    while not any(") teardown" in line for line in seen):
        assert time.monotonic() < deadline and proc.poll() is None, "".join(seen)
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    reader.join(timeout=10)
    for stream in (proc.stdout, proc.stderr):
        assert stream is not None
        stream.close()
    record = world.study_dir / "trials/0000/trial.json"
    assert not record.exists(), "the kill came after the record was written"
    record.write_text(json.dumps({"number": 0, "outcome": "runtime_oom", "state": "complete"}))
    assert world.problems() == ["trial 0 is still RUNNING in the storage"]
    done = world.run()
    assert done.rc == 0, done.err
    t0 = world.trials()[0]
    assert (t0.state, t0.user_attrs["outcome"]) == (TrialState.FAIL, "stale")
    written = json.loads(record.read_text())
    assert (written["outcome"], written[MEASURED_OUTCOME]) == ("stale", "runtime_oom")
    assert world.problems() == []


# ------------------------------------------------------------------------------------------------
# 2 and 4. a dead run's trial in `status`; a stale reason with the pidfile gone
# ------------------------------------------------------------------------------------------------


def test_status_marks_a_running_trial_whose_worker_is_gone() -> None:
    t = create_trial(state=TrialState.COMPLETE, values=[1.0])
    t.number, t.state, t.values, t.datetime_complete = 0, TrialState.RUNNING, None, None
    text = render("s", "sqlite:///x", [t], gone={0: "its worker (box pid 123, GPUs all) is gone"})
    assert ["0", "running?"] in [line.split()[:2] for line in text.splitlines()]
    assert text.rstrip().endswith(
        "trial 0: running? the storage says running, but its worker (box pid 123, GPUs all) is "
        "gone; the next `autotune run` of its worker marks it stale and runs its point again"
    )
    assert "running?" not in render("s", "sqlite:///x", [t])


@e2e
def test_a_killed_run_shows_in_status_and_a_missing_pidfile_is_said(world: World) -> None:
    world.foreign_sleep()
    world.study(duration=30, n_trials=1)
    proc = world.start(*world.run_args())
    wait_for_log(world, proc, "fired up and ready")
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    status = world.autotune(
        "status", "--config", str(world.folder / "rel.toml"), "--results-dir", str(world.results)
    )
    assert status.rc == 0, status.err
    assert ["0", "running?"] in [line.split()[:2] for line in status.out.splitlines()]
    me = Worker.from_dict(world.trials()[0].user_attrs[keys.WORKER])
    assert me is not None and f"pid {me.pid}, GPUs all) is gone" in status.out, status.out

    (pidfile,) = (world.study_dir / "run").glob("server-*.pid.json")
    server = json.loads(pidfile.read_text())["pid"]
    pidfile.unlink()
    try:
        done = world.run()  # the orphan holds the simulated GPUs: the launches are refused
        reason = world.trials()[0].user_attrs[keys.REASON]
        assert "no server was left running" not in reason
        assert reason.startswith(
            f"{STALE_REASON}; its pidfile was missing, so its server could not be "
            f"stopped: pid {server}"
        ), reason
        assert "still writes its server.log and was left running" in reason, reason
        assert done.rc == 1, done.out + done.err
    finally:
        os.killpg(server, signal.SIGKILL)
        _wait_gone(server)
    assert world.problems() == []


def _wait_gone(pid: int) -> None:
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        stat = Path(f"/proc/{pid}/stat").read_text(errors="replace")
        if stat.rpartition(")")[2].split()[0] == "Z":
            return
        time.sleep(0.05)


# ------------------------------------------------------------------------------------------------
# 5. the three-in-a-row message names the results folder
# ------------------------------------------------------------------------------------------------


@e2e
def test_three_in_a_row_names_the_actual_results_folder(world: World) -> None:
    port = world.foreign_listener()
    world.study(server=f"port = {port}", n_trials=3)
    elsewhere = world.folder / "night-1"
    done = world.autotune("run", "--config", str(world.folder / "rel.toml"),
                          "--results-dir", str(elsewhere))  # fmt: skip
    assert done.rc == 1, done.out + done.err
    line = one_line(done.err)
    assert "3 trials in a row failed" in line and line.endswith(f"; see {elsewhere}/rel/trials/")
    assert "results/rel" not in line.replace(str(elsewhere), "")
    study = optuna.load_study(study_name="rel", storage=f"sqlite:///{elsewhere}/rel/study.db")
    assert audit.problems(study.get_trials(), elsewhere / "rel") == []


def test_datetime_is_kept(tmp_path: Path) -> None:
    """The storage block keeps the trial's dates, so a rebuilt trial starts when it started."""
    where = claim(tmp_path, 0)
    t = _stored("ok", where, TrialState.COMPLETE)
    t.datetime_start = datetime(2026, 1, 2, 3, 4, 5)
    assert keep(where, t)
    block = json.loads((where / "trial.json").read_text())[STORAGE_BLOCK]
    assert block["datetime_start"] == "2026-01-02T03:04:05"


@e2e
def test_a_rebuild_from_records_alone_restores_the_grid_queue(world: World) -> None:
    """Records without their `storage` block are told again as the run tells them; the grid's
    queue comes back with its numbers; a folder whose trial.json never got written is a stale
    trial whose point is queued again."""
    world.study(n_trials=2)
    assert world.run().rc == 0
    config = ["--config", str(world.folder / "rel.toml"), "--results-dir", str(world.results)]
    before = world.autotune("status", *config).out
    numbers = [(t.number, t.state, dict(t.params or t.system_attrs["fixed_params"]))
               for t in world.trials()]  # fmt: skip
    first = world.study_dir / "trials/0000/trial.json"
    record = json.loads(first.read_text())
    del record[STORAGE_BLOCK]
    first.write_text(json.dumps(record))
    (world.study_dir / "study.db").unlink()
    done = world.autotune("rebuild", *config)
    assert done.rc == 0, done.err
    assert "1 trials as the storage held them, 1 from their records alone" in done.out
    assert "11 points queued" in done.out, done.out
    assert world.autotune("status", *config).out == before
    again = [(t.number, t.state, dict(t.params or t.system_attrs["fixed_params"]))
             for t in world.trials()]  # fmt: skip
    assert again == numbers
    t0 = world.trials()[0]
    assert (
        t0.values
        == [float(record["capacity_tokens"]), float(record["throughput_tok_s"])][: len(t0.values)]
    )
    assert t0.constraints and all(v <= 0 for v in t0.constraints.values())

    (world.study_dir / "study.db").unlink()
    (world.study_dir / "trials/0001/trial.json").unlink()
    done = world.autotune("rebuild", *config)
    assert done.rc == 0, done.err
    assert "1 killed mid-trial (stale)" in done.out and "12 points queued" in done.out, done.out
    trials = world.trials()
    t1 = trials[1]
    assert (t1.state, t1.user_attrs[keys.OUTCOME]) == (TrialState.FAIL, "stale")
    assert t1.params == numbers[1][2]
    assert trials[-1].system_attrs["fixed_params"] == numbers[1][2]  # its point runs again
    finished = world.run()
    assert finished.rc == 0, finished.err
    assert world.problems() == []
    kept = json.loads((world.study_dir / "trials/0001/trial.json").read_text())
    assert kept["outcome"] == "stale"
