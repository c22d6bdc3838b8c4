"""Fault matrix, harness rows: autotune itself disturbed while a trial runs. It is paused
(SIGSTOP, then SIGCONT: a laptop lid, a VM migration, Ctrl-Z and `fg`), its terminal hangs up
(SIGHUP: an SSH session dropped), or its standard output is closed (`autotune run | head -3`).

Each test runs the real `autotune run` in its own session against the simulator; the `world`
fixture checks that nothing of ours is left running and that the foreign `sleep` lives."""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import pytest
from optuna.trial import FrozenTrial, TrialState

from autotune.cli.streams import Tolerant, tolerant_streams
from tests.reliability.helpers import World, hangup_default, wait_for_log

pytestmark = pytest.mark.e2e

PAUSED = re.compile(
    r"autotune was paused (?P<s>[\d.]+) s during workload \(SIGCONT received\); the measurement "
    r"is not the server's \(it measured (?P<measured>.*)\)"
)


SECOND_PHASE = """
[[workload.phases]]
kind = "steady"
name = "after"
concurrency = 2
duration_s = 2
"""


def _one_point(path: Path) -> None:
    """Search one point only (the grid over `mem_fraction_static` = 0.88): the point a disturbed
    trial queues again is the next one to run."""
    text, n = re.subn(
        r"^mem_fraction_static = \{ low .*$", "mem_fraction_static = { choices = [0.88] }",
        path.read_text(), flags=re.M,
    )  # fmt: skip
    assert n == 1
    path.write_text(text)


def _set_limits(path: Path, **limits: float) -> None:
    """Change `[server.limits]` values the helper's study file fixes."""
    text = path.read_text()
    for key, value in limits.items():
        text, n = re.subn(rf"^{key} = .*$", f"{key} = {value:g}", text, flags=re.M)
        assert n == 1, key
    path.write_text(text)


def _record(world: World, number: int) -> dict[str, object]:
    data = json.loads((world.study_dir / f"trials/{number:04d}/trial.json").read_text())
    assert isinstance(data, dict)
    return data


def _stop_autotune(world: World, seconds: float) -> tuple[subprocess.Popen[str], float]:
    """Start the run, wait until trial 0 serves its workload, SIGSTOP autotune (only its own
    process: the server runs on) for `seconds`, SIGCONT it; the process and the stop's length."""
    proc = world.start(*world.run_args())
    wait_for_log(world, proc, "Decode batch")
    time.sleep(0.5)
    os.kill(proc.pid, signal.SIGSTOP)
    t0 = time.monotonic()
    time.sleep(seconds)
    os.kill(proc.pid, signal.SIGCONT)
    return proc, time.monotonic() - t0


def _rerun(world: World, first: FrozenTrial) -> FrozenTrial:
    """The trial that ran the disturbed trial's point again: COMPLETE, `ok`."""
    trials = world.trials()
    assert [t.number for t in trials] == [0, 1], [(t.number, t.state, t.params) for t in trials]
    again = [t for t in trials[1:] if t.params == first.params]
    assert again, [(t.number, t.state, t.params) for t in trials]
    assert (again[0].state, again[0].user_attrs["outcome"]) == (TrialState.COMPLETE, "ok")
    return again[0]


def _interrupted_and_queued_again(world: World) -> None:
    trial, *rest = world.trials()
    assert (trial.state, trial.user_attrs["outcome"]) == (TrialState.FAIL, "interrupted")
    assert [(t.state, t.system_attrs.get("fixed_params")) for t in rest] == [
        (TrialState.WAITING, trial.params)
    ]


def test_autotune_stopped_mid_workload_is_disturbed_and_its_point_runs_again(
    world: World,
) -> None:
    """A 4 s stop, short of every watchdog (stall_s = 10): before, the trial was stored `ok` with
    the stop in its figures. Now it is FAIL `disturbed`, the pause in its reason, and the same
    point runs again (`n_trials = 1` is reached by the rerun)."""
    world.foreign_sleep()
    study = world.study(duration=6)
    _one_point(study)
    _set_limits(study, stall_s=10)
    proc, stopped = _stop_autotune(world, 4.0)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    assert "Traceback" not in err, err
    first = world.trials()[0]
    assert (first.state, first.user_attrs["outcome"]) == (TrialState.FAIL, "disturbed")
    reason = str(first.user_attrs["reason"])
    m = PAUSED.fullmatch(reason)
    assert m, reason
    assert stopped - 1.0 <= float(m["s"]) <= stopped + 1.0, (reason, stopped)
    assert m["measured"].startswith("ok, "), reason  # what it stored before: an `ok` trial
    assert _record(world, 0)["outcome"] == "disturbed"
    again = _rerun(world, first)
    measured = float(m["measured"].split(", ")[1].split()[0].replace(",", ""))
    rerun = float(str(again.user_attrs["throughput_tok_s"]))
    print(f"paused {m['s']} s: measured {measured:.0f} tok/s; the rerun {rerun:.0f} tok/s")
    assert measured < rerun, (measured, rerun)  # the stop is in the disturbed figure
    assert world.problems() == []


def test_a_stop_past_the_watchdogs_is_disturbed_not_a_hang_or_timeout(world: World) -> None:
    """A 10 s stop in the first of two workload phases (3 s and 2 s), past workload_s (8 s):
    when autotune runs again, the second phase's watchdog finds the workload past its limit
    (before, the trial was `timeout (workload)`, blamed on the server, as a stall past stall_s
    was `hang`); now it is `disturbed` with that verdict kept in its reason, and its point runs
    again (and takes 5 s, within the limit)."""
    world.foreign_sleep()
    study = world.study(duration=3, phases=SECOND_PHASE)
    _one_point(study)
    _set_limits(study, workload_s=8)
    proc, stopped = _stop_autotune(world, 10.0)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    first = world.trials()[0]
    assert (first.state, first.user_attrs["outcome"]) == (TrialState.FAIL, "disturbed")
    m = PAUSED.fullmatch(str(first.user_attrs["reason"]))
    assert m, first.user_attrs["reason"]
    assert stopped - 1.0 <= float(m["s"]) <= stopped + 1.0
    assert m["measured"].startswith(("hang", "timeout")), m["measured"]  # a watchdog fired
    print(f"paused {m['s']} s: the watchdogs said {m['measured']}")
    _rerun(world, first)
    assert world.problems() == []


def test_sighup_mid_trial_stops_the_server_and_records_it_interrupted(world: World) -> None:
    """`kill -HUP` (what an SSH session dropped without tmux sends): handled like SIGTERM. Before,
    autotune died at once (129, the default action), the trial RUNNING and its server serving."""
    world.foreign_sleep()
    _one_point(world.study(duration=30))
    proc = world.start(*world.run_args())
    wait_for_log(world, proc, "Decode batch")
    t0 = time.monotonic()
    os.kill(proc.pid, signal.SIGHUP)
    out, err = proc.communicate(timeout=60)
    took = time.monotonic() - t0
    assert proc.returncode == 129, out + err
    assert "Traceback" not in err, err
    assert "recorded as interrupted" in out, out
    _interrupted_and_queued_again(world)
    assert _record(world, 0)["state"] == "interrupted"
    assert not world.leftovers(), "the server outlived the hang-up"
    assert took < 15, took
    assert world.problems() == []


def test_sighup_under_nohup_stays_ignored(world: World) -> None:
    """`nohup autotune run …` starts with SIGHUP ignored: the operator asked the run to outlive
    the terminal, so a hang-up changes nothing and the trial ends as its parameters say."""
    world.foreign_sleep()
    _one_point(world.study(duration=3))

    def nohup() -> None:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    proc = subprocess.Popen(
        [sys.executable, "-m", "autotune", *world.run_args()],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        cwd=world.folder, start_new_session=True, preexec_fn=nohup,
    )  # fmt: skip
    world.sessions.add(proc.pid)
    try:
        wait_for_log(world, proc, "Decode batch")
        os.kill(proc.pid, signal.SIGHUP)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out + err
    [trial] = world.trials()
    assert (trial.state, trial.user_attrs["outcome"]) == (TrialState.COMPLETE, "ok")
    assert world.problems() == []


def test_a_terminal_that_hangs_up_mid_trial_stops_the_server(world: World) -> None:
    """The real hang-up: autotune's controlling terminal (a pty) goes away. The kernel sends
    SIGHUP (and SIGCONT) and every later write to the terminal fails with EIO; the server is still
    stopped, the trial recorded interrupted, and autotune exits 129."""
    world.foreign_sleep()
    _one_point(world.study(duration=30))
    master, slave = os.openpty()

    def controlling_terminal() -> None:
        hangup_default()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(
        [sys.executable, "-m", "autotune", *world.run_args()],
        stdin=slave, stdout=slave, stderr=slave, cwd=world.folder, start_new_session=True,
        preexec_fn=controlling_terminal, text=True,
    )  # fmt: skip
    world.sessions.add(proc.pid)
    os.close(slave)
    seen: list[bytes] = []

    def drain() -> None:  # the live line redraws every second; keep the terminal from filling
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                return
            if not chunk:
                return
            seen.append(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        wait_for_log(world, proc, "Decode batch")
        time.sleep(0.5)
        os.close(master)  # the SSH session is gone
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    shown = b"".join(seen).decode(errors="replace")
    assert rc == 129, shown
    assert "Traceback" not in shown, shown
    _interrupted_and_queued_again(world)
    assert not world.leftovers(), "the server outlived the hang-up"
    assert world.problems() == []


@pytest.mark.parametrize("closed", ["stdout", "stdout-and-stderr"])
def test_a_closed_stdout_never_stops_the_study(world: World, closed: str) -> None:
    """`autotune run … | head -3` (and `2>&1 | head -3`): after three lines nobody reads. Before,
    the next progress line raised BrokenPipeError: a traceback, the trial left RUNNING. Now the
    study runs to its end, every trial recorded, exit 0, no traceback."""
    world.foreign_sleep()
    world.study(duration=1, n_trials=2)
    both = closed == "stdout-and-stderr"
    proc = subprocess.Popen(
        [sys.executable, "-m", "autotune", *world.run_args()],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT if both else subprocess.PIPE,
        stdin=subprocess.DEVNULL, text=True, cwd=world.folder, start_new_session=True,
    )  # fmt: skip
    world.sessions.add(proc.pid)
    assert proc.stdout is not None
    head = [proc.stdout.readline() for _ in range(3)]
    proc.stdout.close()  # `head -3` exits
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert all(head), head
    assert proc.returncode == 0, err
    if not both:
        assert "Traceback" not in err and "BrokenPipe" not in err, err
        assert "standard output is gone (Broken pipe)" in err, err
    done = [(t.state, t.user_attrs["outcome"]) for t in world.trials() if t.state.is_finished()]
    assert done == [(TrialState.COMPLETE, "ok")] * 2
    assert world.problems() == []


def test_tolerant_streams_drop_what_a_closed_pipe_cannot_take(tmp_path: Path) -> None:
    """The writer at the edge: a write to a pipe with no reader raises nowhere, the stream is
    gone, the other stream says so once, and the descriptor now takes (and drops) what
    Python's buffer still holds when the interpreter exits."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    out = open(write_end, "w", encoding="utf-8")  # noqa: SIM115 - closed below
    err_path = tmp_path / "err"
    with open(err_path, "w", encoding="utf-8") as err_file:
        o, e = Tolerant(out, "output"), Tolerant(err_file, "error")
        o.other, e.other = e, o
        assert o.write("line\n") == 5
        o.flush()
        assert o.gone == "Broken pipe" and not e.gone
        o.write("more\n")
        o.flush()
        assert not o.isatty()
    assert err_path.read_text().count("standard output is gone (Broken pipe)") == 1
    out.write("what the buffer still holds\n")
    out.flush()  # the descriptor is /dev/null now: no BrokenPipeError
    out.close()


def test_tolerant_streams_put_the_originals_back() -> None:
    before = sys.stdout, sys.stderr
    with tolerant_streams():
        assert isinstance(sys.stdout, Tolerant) and isinstance(sys.stderr, Tolerant)
        print("through the wrapper")
    assert (sys.stdout, sys.stderr) == before


def test_a_pause_within_pause_s_leaves_the_trial_its_own_outcome(world: World) -> None:
    """`server.limits.pause_s` is the limit: with 30 s allowed, the same 4 s stop leaves the trial
    `ok` (what every stop gave before), its figures holding the stop."""
    study = world.study(duration=6)
    _one_point(study)
    text = study.read_text().replace("[server.limits]\n", "[server.limits]\npause_s = 30\n")
    study.write_text(text)
    _set_limits(study, stall_s=10)
    proc, stopped = _stop_autotune(world, 4.0)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    [trial] = world.trials()
    assert (trial.state, trial.user_attrs["outcome"]) == (TrialState.COMPLETE, "ok")
    print(
        f"paused {stopped:.1f} s within pause_s: ok, {trial.user_attrs['throughput_tok_s']} tok/s"
    )
    assert world.problems() == []
