"""Fault matrix, machine rows: what is in the way is foreign (a port, GPU memory), autotune is
killed mid-trial, the storage is unwritable or locked, the results disk fills up."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState

from autotune.sim.gpustate import read_gpu_state, write_holder
from tests.reliability.helpers import (
    World,
    fill_disk,
    lock_storage,
    one_line,
    wait_for_log,
    wait_for_text,
)

pytestmark = pytest.mark.e2e
GiB = 1 << 30


def _launch_failures(world: World, expected: str) -> None:
    """Three trials fail before launch for the same foreign reason, then the run stops (exit 1)."""
    done = world.run()
    assert done.rc == 1, done.out + done.err
    line = one_line(done.err)
    assert "3 trials in a row failed for reasons outside the" in line, line
    assert expected in line, line
    trials = world.trials()
    launched = [t for t in trials if t.state != TrialState.WAITING]
    assert len(launched) == 3
    for t in launched:
        assert (t.state, t.user_attrs["outcome"]) == (TrialState.FAIL, "harness_error")
        assert expected in t.user_attrs["reason"]
    assert world.problems() == []
    assert not (world.study_dir / "trials/0000/server.log").exists()  # nothing was launched


def test_port_taken_by_a_foreign_process(world: World) -> None:
    port = world.foreign_listener()
    world.study(server=f"port = {port}", n_trials=3)
    _launch_failures(world, f"port {port} on 127.0.0.1 is in use by another process")


def test_gpus_busy_with_a_foreign_holder(world: World) -> None:
    stranger = world.foreign_sleep()
    write_holder(world.gpu_dir, stranger.pid, {0: 4 * GiB}, {i: 96 * GiB for i in range(8)})
    world.study(n_trials=3)
    _launch_failures(world, f"pid {stranger.pid} holds 4.00 GiB")


def test_gpus_busy_for_a_while_are_waited_for_when_configured(world: World) -> None:
    """With `foreign_wait_s`, a launch waits for a foreign holder to let go instead of refusing."""
    stranger = world.foreign_sleep()
    holder = write_holder(
        world.gpu_dir, stranger.pid, {0: 4 * GiB}, {i: 96 * GiB for i in range(8)}
    )
    world.study(limits="foreign_wait_s = 60")
    run = world.start(*world.run_args())
    time.sleep(2.0)
    assert run.poll() is None, "the run must wait while the foreign memory is held"
    assert not (world.study_dir / "trials/0000/server.log").exists()
    holder.unlink()  # the stranger gives its GPU memory back and keeps running
    out, err = run.communicate(timeout=120)
    assert run.returncode == 0, out + err
    (trial,) = [t for t in world.trials() if t.state != TrialState.WAITING]
    assert (trial.state, trial.user_attrs["outcome"]) == (TrialState.COMPLETE, "ok")
    assert world.problems() == []


def test_gpus_busy_with_a_foreign_simulator(world: World) -> None:
    """A whole server someone else started on the same (simulated) GPUs."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    foreign = world.stranger(
        [sys.executable, "-m", "autotune.sim", "--model-path", "moonshotai/Kimi-K2.5", "--tp", "8",
         "--sim-time-scale", "30000", "--sim-gpu-dir", str(world.gpu_dir), "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not any(g.used_bytes for g in read_gpu_state(world.gpu_dir)):
        assert time.monotonic() < deadline and foreign.poll() is None
        time.sleep(0.1)
    # Its memory is its scheduler processes' (one per GPU), children of its main process.
    [holder] = read_gpu_state(world.gpu_dir)[0].processes
    stat = Path(f"/proc/{holder}/stat").read_text()
    assert int(stat[stat.rfind(")") + 2 :].split()[1]) == foreign.pid
    world.study(n_trials=3)
    _launch_failures(world, f"GPU 0: pid {holder} holds")


@pytest.mark.parametrize("flags", ["", 'sim-fault = "hold-gpu=1"'], ids=["plain", "slow-release"])
def test_sigkill_mid_trial_then_resume(world: World, flags: str) -> None:
    """The orphan is stopped on resume; with slow-release its GPU memory lingers after it dies
    (as a driver's can), and the resume waits for it instead of refusing the next launch."""
    world.foreign_sleep()
    world.study(duration=30, n_trials=2, flags=flags)
    proc = world.start(*world.run_args())
    log = wait_for_log(world, proc, "fired up and ready")
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    assert world.leftovers(), f"the killed run leaves its server behind: {log.read_text()}"
    world.study(duration=0.5, n_trials=2, flags=flags)
    done = world.run()
    assert done.rc == 0, done.err
    assert "recovered trials [0]" in done.out and "stopped" in done.out
    trials = world.trials()
    assert not [t.number for t in trials if t.user_attrs.get("outcome") == "harness_error"]
    assert (trials[0].state, trials[0].user_attrs["outcome"]) == (TrialState.FAIL, "stale")
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(complete) == 2
    again = [t for t in trials[1:] if _point(t).get("mem_fraction_static") == 0.88]
    assert again and again[0].state in (TrialState.COMPLETE, TrialState.WAITING)  # queued again
    assert world.problems() == []


def _point(t: FrozenTrial) -> dict[str, object]:
    """A trial's parameters; for a queued trial the ones it was queued with."""
    return dict(t.params or t.system_attrs.get("fixed_params", {}))


def test_storage_unwritable(world: World) -> None:
    world.study()
    done = world.run("--storage", f"sqlite:///{world.folder}/no/such/dir/study.db")
    assert done.rc == 2
    line = one_line(done.err)
    assert "--storage" in line and "cannot open it" in line, line
    assert not world.results.exists(), "a bad --storage must leave nothing written"


def test_unreachable_postgres_storage_writes_nothing(world: World) -> None:
    world.study()
    done = world.run("--storage", "postgresql://tuner:pw@127.0.0.1:1/none")
    assert done.rc == 2
    assert "cannot open it" in one_line(done.err)
    assert not world.results.exists()


@contextmanager
def _read_only(folder: Path) -> Iterator[None]:
    """`folder` read-only: a read-only bind mount as root (who ignores permission bits), else
    its write bits taken away."""
    if os.geteuid() != 0:
        os.chmod(folder, 0o500)
        try:
            yield
        finally:
            os.chmod(folder, 0o700)
        return
    mounted = subprocess.run(["mount", "--bind", str(folder), str(folder)], check=False)
    if mounted.returncode != 0:
        pytest.skip("cannot bind-mount here")
    try:
        if subprocess.run(["mount", "-o", "remount,ro,bind", str(folder)], check=False).returncode:
            pytest.skip("cannot remount read-only here")
        yield
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def test_read_only_results_folder_is_one_line(world: World) -> None:
    """A results folder the run cannot write (a read-only mount) stops the run before anything
    starts, with one line naming the folder, and no traceback."""
    world.study()
    (world.results / "rel").mkdir(parents=True)
    with _read_only(world.results / "rel"):
        done = world.run()
    assert done.rc == 2, done.out + done.err
    line = one_line(done.err)
    assert "is not writable" in line and "--results-dir" in line, line
    assert "Traceback" not in done.err


def test_storage_locked_by_another_process(world: World) -> None:
    world.study()
    assert world.run().rc == 0
    holder = sqlite3.connect(world.study_dir / "study.db", timeout=1)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        world.study(n_trials=2)
        done = world.run(timeout=180)
    finally:
        holder.rollback()
        holder.close()
    assert done.rc in (1, 2), done.out + done.err
    line = one_line(done.err)
    assert "database is locked" in line, line
    assert world.problems() == []


def test_results_folder_in_use_by_a_running_autotune(world: World) -> None:
    # Several long trials: the first run still holds the folder however its first trial ends.
    world.study(duration=30, n_trials=5)
    first = world.start(*world.run_args())
    log = world.study_dir / "trials/0000/server.log"
    deadline = time.monotonic() + 60
    while not log.exists():
        assert time.monotonic() < deadline and first.poll() is None
        time.sleep(0.1)
    second = world.run()
    first.send_signal(signal.SIGINT)
    first.communicate(timeout=60)
    assert second.rc == 2
    assert "is in use by a running autotune" in one_line(second.err)


def test_confirm_during_a_run_leaves_the_live_trial_alone(world: World) -> None:
    """`confirm` while `run` runs the same study refuses in one line (or queues with --wait);
    the run's live trial is not stopped and ends as its parameters say."""
    world.study(duration=3, n_trials=1)
    assert world.run().rc == 0  # a finished trial to confirm
    world.study(duration=6, n_trials=2)
    first = world.start(*world.run_args())
    log = world.study_dir / "trials/0001/server.log"
    deadline = time.monotonic() + 60
    while not (log.exists() and "fired up" in log.read_text(errors="replace")):
        assert time.monotonic() < deadline and first.poll() is None
        time.sleep(0.1)
    args = ["--config", str(world.folder / "rel.toml"), "--results-dir", str(world.results)]
    refused = world.autotune("confirm", *args, "--trial", "0")
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0, out + err
    assert refused.rc == 2, refused.out + refused.err
    assert "is in use by a running autotune" in one_line(refused.err)
    live = world.trials()[1]
    assert live.state == TrialState.COMPLETE and live.user_attrs["outcome"] == "ok"
    assert world.problems() == []


def test_confirm_waits_out_a_storage_that_fails_while_it_stores_its_verdict(world: World) -> None:
    """The study storage is locked (another process's `BEGIN EXCLUSIVE`, past SQLite's 5 s busy
    timeout) from the soak's start until after it ends: confirm says so in one warning line,
    keeps trying, and stores the verdict once the storage answers (no traceback, exit 0); the
    verdict is also kept beside the soak's log."""
    world.study(duration=3, n_trials=1)
    assert world.run().rc == 0
    args = ["--config", str(world.folder / "rel.toml"), "--results-dir", str(world.results)]
    proc = world.start("confirm", *args, "--trial", "0")
    wait_for_text(world.study_dir / "confirm/0000/server.log", proc, "fired up")
    lock_storage(world, 16)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    assert "Traceback" not in err, err
    [warning] = [ln for ln in out.splitlines() if ln.startswith("warning:")]
    assert "database is locked" in warning and "trying again" in warning, warning
    assert "confirmation PASSED" in out, out
    stored = optuna.load_study(study_name="rel", storage=world.url).user_attrs["confirmation"]
    kept = json.loads((world.study_dir / "confirm/0000/verdict.json").read_text())
    assert stored == kept and stored["passed"] is True
    assert world.problems() == []


def test_a_verdict_the_storage_never_takes_is_one_line_and_kept(tmp_path: Path) -> None:
    """A storage that never answers within the patience (two tries, each past the busy
    timeout): one warning, then one line naming the file that keeps the verdict, the URL's
    password masked."""
    from autotune.errors import HarnessError
    from autotune.review.confirm import keep_verdict
    from autotune.review.verdict import Verdict

    db = tmp_path / "study.db"
    study = optuna.create_study(study_name="s", storage=f"sqlite:///{db}")
    holder = sqlite3.connect(db, timeout=1)
    holder.execute("BEGIN EXCLUSIVE")
    notes: list[str] = []
    verdict = Verdict(params={"mem_fraction_static": 0.88}, passed=True, outcome="ok",
                      folder=str(tmp_path))  # fmt: skip
    try:
        with pytest.raises(HarnessError) as caught:
            keep_verdict(
                study, verdict, url="postgresql://u:hunter22@db/x", note=notes.append,
                patience_s=6.0,
            )  # fmt: skip
    finally:
        holder.rollback()
        holder.close()
    line = str(caught.value)
    assert "\n" not in line and "database is locked" in line, line
    assert "postgresql://u:***@db/x" in line and "hunter22" not in line, line
    assert f"kept in {tmp_path / 'verdict.json'}" in line, line
    kept = Verdict.from_attr(json.loads((tmp_path / "verdict.json").read_text()))
    assert kept == verdict
    assert len(notes) == 1 and "trying again" in notes[0]
    assert (
        "confirmation"
        not in optuna.load_study(study_name="s", storage=f"sqlite:///{db}").user_attrs
    )


def test_an_orphan_whose_autotune_lives_is_left_to_it(tmp_path: Path) -> None:
    """Only the owner, or a run that has proved the owner dead, stops a server."""
    from autotune.server import pidfile, procs
    from autotune.server.teardown import stop_orphans

    owner = subprocess.Popen(["sleep", "60"], start_new_session=True)
    server = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        mine, srv = procs.read_proc(owner.pid), procs.read_proc(server.pid)
        assert mine is not None and srv is not None
        record = pidfile.PidRecord(
            pid=server.pid, pgid=srv.pgid, sid=srv.sid, start_ticks=srv.start_ticks,
            boot_id=procs.boot_id(), host="127.0.0.1", port=1, log_path=str(tmp_path / "l"),
            argv=("sleep", "60"), launched_at=time.time(), owner_pid=owner.pid,
            owner_start_ticks=mine.start_ticks, study="rel",
        )  # fmt: skip
        pidfile.write(tmp_path, record)
        [line] = stop_orphans(tmp_path, grace_s=1, release_s=1)
        assert "left running" in line and f"pid {owner.pid}" in line, line
        assert server.poll() is None
        owner.kill()
        owner.wait()
        [line] = stop_orphans(tmp_path, grace_s=1, release_s=1)
        assert "stopped" in line, line
        assert server.wait(timeout=10) is not None
    finally:
        for p in (owner, server):
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.fixture
def small_disk(world: World) -> Iterator[Path]:
    """The results folder on a 300 MiB tmpfs of its own (needs root; skipped otherwise)."""
    world.results.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=300m", "tmpfs", str(world.results)],
        capture_output=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield world.results
    finally:
        subprocess.run(["umount", "-l", str(world.results)], check=False)


def _fill(folder: Path, leave_mib: int = 0) -> Path:
    """Write to `folder` until the disk is full, or has only `leave_mib` MiB left."""
    ballast = folder / "ballast"
    chunk = b"\0" * (1 << 20)
    with open(ballast, "wb") as f:
        try:
            while os.statvfs(folder).f_bavail * os.statvfs(folder).f_frsize > (leave_mib + 1) << 20:
                f.write(chunk)
                f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    return ballast


def _resumes_after_space_is_freed(world: World, ballast: Path, n_trials: int) -> None:
    ballast.unlink()
    done = world.run()
    assert done.rc == 0, done.out + done.err
    trials = world.trials()
    states = [(t.number, t.state.name, t.user_attrs.get("outcome")) for t in trials]
    assert sum(t.state == TrialState.COMPLETE for t in trials) == n_trials, (states, done.out)
    assert not any(t.state == TrialState.RUNNING for t in trials)
    assert world.problems() == []


def test_results_disk_full_before_a_launch(world: World, small_disk: Path) -> None:
    world.foreign_sleep()
    world.study(n_trials=1)
    assert world.run().rc == 0
    ballast = _fill(small_disk, leave_mib=100)
    world.study(n_trials=2)
    done = world.run()
    assert done.rc == 1, done.out + done.err
    line = one_line(done.err)
    assert "the results disk is full" in line and "MiB free" in line, line
    trials = world.trials()
    [refused] = [t for t in trials if t.state == TrialState.FAIL]
    assert (refused.state, refused.user_attrs["outcome"]) == (TrialState.FAIL, "harness_error")
    assert not (world.study_dir / f"trials/{refused.number:04d}").exists()  # never launched
    assert trials[-1].state == TrialState.WAITING  # its point is queued again
    _resumes_after_space_is_freed(world, ballast, n_trials=2)


def test_results_disk_full_mid_run_stops_at_the_next_launch(world: World, small_disk: Path) -> None:
    """The results disk filled to its last byte while trial 0 serves: trial 0 is recorded, the
    next launch is refused (`harness_error`, disk full) and the run stops there, exit 1 and
    one line naming the full disk, with no trial left RUNNING, even where the storage on that
    disk failed to record the refusal at first (before: the refusal's stop was lost with its
    failed tell, the run asked trial after trial into the full disk and stopped only when one
    could not be recorded at all, left RUNNING, with a line about the storage)."""
    world.foreign_sleep()
    world.study(duration=3, n_trials=2)
    proc = world.start(*world.run_args())
    wait_for_log(world, proc, "Decode batch")
    ballast = fill_disk(small_disk)  # to the last byte: SQLite's next page cannot be had
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, out + err
    line = one_line(err)
    assert "the results disk is full" in line and "stopping the study" in line, line
    trials = world.trials()
    assert not any(t.state == TrialState.RUNNING for t in trials), [t.state for t in trials]
    assert world.problems() == []
    _resumes_after_space_is_freed(world, ballast, n_trials=2)


def test_results_disk_fills_up_mid_trial(world: World, small_disk: Path) -> None:
    world.foreign_sleep()
    world.study(duration=3, n_trials=2)
    proc = world.start(*world.run_args())
    wait_for_log(world, proc, "fired up and ready")
    ballast = _fill(small_disk)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, out + err
    line = one_line(err)
    assert "No space left on device" in line or "disk is full" in line, line
    assert not world.leftovers()
    _resumes_after_space_is_freed(world, ballast, n_trials=2)


def test_storage_locked_mid_run_past_the_busy_timeout(world: World) -> None:
    """Another process holds `BEGIN EXCLUSIVE` on study.db for 12 s while trial 0 serves
    (SQLite's busy timeout is 5 s): the trial cannot be told when it ends. It is never left
    RUNNING and never recorded as a parameter result: once the storage answers again it is
    FAIL `harness_error` (trial.json agrees and keeps what it measured), its point runs again,
    one warning line says so, and the run goes on to its budget."""
    world.foreign_sleep()
    world.study(duration=2, n_trials=2)
    proc = world.start(*world.run_args())
    wait_for_log(world, proc, "fired up and ready")
    lock_storage(world, 12)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, out + err
    [line] = [ln for ln in out.splitlines() if "storage" in ln and "warning" in ln]
    assert "trial 0: the study storage failed while the trial ran" in line, line
    assert "database is locked" in line and "recorded as harness_error" in line, line
    trials = world.trials()
    first = trials[0]
    assert (first.state, first.user_attrs["outcome"]) == (TrialState.FAIL, "harness_error")
    assert "it measured ok; its point runs again" in first.user_attrs["reason"]
    assert sum(t.state == TrialState.COMPLETE for t in trials) == 2
    assert not any(t.state == TrialState.RUNNING for t in trials)
    again = [t for t in trials[1:] if _point(t) == _point(first)]
    assert again, "the point was not queued again"
    record = json.loads((world.study_dir / "trials/0000/trial.json").read_text())
    assert (record["outcome"], record["measured_outcome"]) == ("harness_error", "ok")
    assert world.problems() == []


CLOCK_JUMPS = """
import atexit, os, time
if os.environ.pop("REL_CLOCK_JUMPS", None):  # autotune only: its servers keep the real clock
    _real, _real_ns, _mono = time.time, time.time_ns, time.monotonic
    _t0, _seen = _mono(), [0]
    _JUMPS = (0.0, 6 * 3600.0, -6 * 3600.0, 30 * 86400.0, -30 * 86400.0, 365 * 86400.0)
    def _offset():
        jump = _JUMPS[int((_mono() - _t0) / 0.4) % len(_JUMPS)]
        _seen[0] += jump != 0.0
        return jump
    time.time = lambda: _real() + _offset()
    time.time_ns = lambda: _real_ns() + int(_offset() * 1e9)
    atexit.register(lambda: open(os.environ["REL_CLOCK_SEEN"], "w").write(str(_seen[0])))
"""
"""The wall clock of the autotune process jumps every 0.4 s: 6 h forward, 6 h back, a month
either way, a year ahead; time.monotonic (and the servers' clocks) stay true. The simulated
GPUs' state files, which servers and autotune share as NVML's stand-in, keep time on the
monotonic clock too, so what autotune reads of them does not jump."""


def test_wall_clock_jumps_fire_no_timeout(world: World) -> None:
    """Every time limit (startup_s 30, stall_s 3, the workload's 30 s, stop_grace_s, the
    teardown budget, the readiness check) is measured on the monotonic clock: with the wall
    clock jumping hours and months both ways all through two trials, both end `ok` and every
    phase took what it took."""
    site = world.folder / "clockjump"
    site.mkdir()
    (site / "sitecustomize.py").write_text(CLOCK_JUMPS)
    seen = world.folder / "clock-jumps-seen"
    world.foreign_sleep()
    world.study(duration=3, n_trials=2, stall_s=3)
    env = {"PYTHONPATH": str(site), "REL_CLOCK_JUMPS": "1", "REL_CLOCK_SEEN": str(seen)}
    done = world.run(env=env, timeout=180)
    assert done.rc == 0, done.out + done.err
    assert int(seen.read_text()) > 0, "the wall clock never jumped where autotune looked"
    trials = [t for t in world.trials() if t.state != TrialState.WAITING]
    assert [(t.state, t.user_attrs["outcome"]) for t in trials] == [(TrialState.COMPLETE, "ok")] * 2
    for t in trials:
        phases = t.user_attrs["record"]["phases"]
        assert 0 < phases["total"] < 60 and phases["workload"] >= 3, phases
        assert all(0 <= v < 60 for v in phases.values()), phases
    assert world.problems() == []
