"""Fault matrix, deaths from outside the parameters: the server killed or stopped by someone
else, its port taken after the launch, its disk full. Each is a FAIL trial with its reason, the
exit status and who sent the signal recorded, its point queued again and counted toward the
three-in-a-row stop; a real OOM under load stays COMPLETE `runtime_oom`.

Every fault is the real thing done by the test to the live server `autotune run` launched: a
signal with `os.kill` on the pid from the study's pidfile, a foreign listener on the port the
pidfile names, a real full tmpfs. The `world` fixture checks that nothing of ours is left and
that the foreign processes (a `sleep`, the listener) still run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from optuna.trial import FrozenTrial, TrialState

from autotune.logparse.outcome import OOM_RULED_OUT
from autotune.record import keys
from autotune.server import pidfile
from autotune.sim.gpustate import write_holder
from tests.reliability.helpers import EAGLE, STRESS, World, fill_disk, one_line, wait_for_log

pytestmark = pytest.mark.e2e

SERVING = "Decode batch"
"""A line the simulated server logs only while it serves the workload."""


def _record(world: World, number: int) -> dict[str, object]:
    data = json.loads((world.study_dir / f"trials/{number:04d}/trial.json").read_text())
    assert isinstance(data, dict)
    return data


def _point(t: FrozenTrial) -> dict[str, object]:
    return dict(t.params or t.system_attrs.get("fixed_params", {}))


def _server_pid(world: World, proc: subprocess.Popen[str], not_pid: int = 0) -> pidfile.PidRecord:
    """The pidfile of the server the run has up now (another than `not_pid`)."""
    deadline = time.monotonic() + 60
    while True:
        records = [r for _, r in pidfile.records(world.study_dir / "run") if r.pid != not_pid]
        if records:
            return records[0]
        assert time.monotonic() < deadline, "no server was launched"
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)


def _signal_mid_load(
    world: World, proc: subprocess.Popen[str], number: int, sig: signal.Signals, not_pid: int = 0
) -> int:
    """Send `sig` to trial `number`'s server once it serves the workload; returns its pid."""
    record = _server_pid(world, proc, not_pid)
    wait_for_log(world, proc, SERVING, number=number)
    os.kill(record.pid, sig)
    return record.pid


def _failed(
    world: World, proc: subprocess.Popen[str], outcome: str
) -> tuple[FrozenTrial, dict[str, object]]:
    """The run ended well and its first trial is FAIL `outcome`: the trial and its record."""
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    first = world.trials()[0]
    attrs = first.user_attrs
    assert (first.state, attrs["outcome"]) == (TrialState.FAIL, outcome), attrs
    return first, _record(world, 0)


def _requeued_and_run(world: World, first: FrozenTrial) -> None:
    """The point of the trial cut short is queued again (behind the grid's own queue), and the
    run went on to its budget: one trial counted, `ok`; the one cut short did not count."""
    trials = world.trials()
    again = [t for t in trials[1:] if _point(t) == _point(first)]
    assert again and again[-1].state == TrialState.WAITING, "the point was not queued again"
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert [t.user_attrs["outcome"] for t in complete] == ["ok"], [t.user_attrs for t in trials]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
def test_a_signal_from_outside_mid_load_is_killed_and_run_again(
    world: World, sig: signal.Signals
) -> None:
    """Someone else's SIGKILL, or SIGTERM, to the server while it serves: FAIL `killed`, the
    sender `outside` and the exit status recorded, the point queued again and run (before: a
    SIGKILL was COMPLETE `crash (exited_after_ready)` with no signal recorded, and a SIGTERM
    `ok` with the drain's HTTP 503s counted as its error rate)."""
    world.foreign_sleep()
    world.study(duration=4, n_trials=1)
    proc = world.start(*world.run_args())
    _signal_mid_load(world, proc, 0, sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    first = world.trials()[0]
    attrs = first.user_attrs
    assert (first.state, attrs["outcome"]) == (TrialState.FAIL, "killed"), attrs
    assert attrs[keys.SENDER] == "outside", attrs
    record = _record(world, 0)
    assert record["outcome"] == "killed" and record["sender"] == "outside"
    assert record["exit_code"] == attrs[keys.EXIT_CODE]
    if sig is signal.SIGKILL:
        assert (attrs[keys.EXIT_CODE], attrs[keys.EXIT_SIGNAL]) == (-9, "SIGKILL")
        assert "SIGKILL" in str(attrs["reason"]), attrs["reason"]
    else:
        assert "SIGTERM" in str(attrs["reason"]) or "SIGTERM received" in str(record["evidence"])
    _requeued_and_run(world, first)
    assert world.problems() == []


def _child_titled(pid: int, title: str) -> int:
    """The pid of `pid`'s child process whose command line (its `setproctitle` title) starts
    with `title`."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            ppid = int(stat.rpartition(")")[2].split()[1])
            if ppid == pid and cmdline.startswith(title):
                return int(entry.name)
        time.sleep(0.05)
    raise AssertionError(f"no child {title} of {pid}")


def test_a_rank_sigkilled_from_outside_is_killed_not_the_oom_killer(world: World) -> None:
    """Someone else's SIGKILL to one scheduler of a 0.5.23 server while it serves: SGLang's
    watchdog reports `crashed with exit code -9` and its hint names the OOM killer, but the
    simulated machine's kernel, watched from the launch, logged no OOM kill. FAIL `killed`
    (signal:SIGKILL), the point queued again (before: COMPLETE `runtime_oom (host_oom_killer)`,
    infeasible, and the search ended on it)."""
    world.foreign_sleep()
    world.study(server='sim_version = "0.5.23"', duration=4, n_trials=1)
    proc = world.start(*world.run_args())
    record = _server_pid(world, proc)
    wait_for_log(world, proc, SERVING, number=0)
    os.kill(_child_titled(record.pid, "sglang::scheduler_TP7"), signal.SIGKILL)
    first, trial = _failed(world, proc, "killed")
    reason = str(trial["reason"])
    assert reason.startswith("killed (signal:SIGKILL): ") and "scheduler_7" in reason, reason
    assert OOM_RULED_OUT in trial["evidence"], trial["evidence"]  # type: ignore[operator]
    _requeued_and_run(world, first)
    assert world.problems() == []


def test_a_server_log_made_immutable_is_a_machine_error_not_the_servers_hang(world: World) -> None:
    """The trial's server.log made immutable (`chattr +i`) while the server starts: the log
    cannot grow, the stall watchdog sees a silent server, and the host's state names the log.
    FAIL `machine_error (log_unwritable)`, not the parameters' `hang (stall:launch)`."""
    world.foreign_sleep()
    world.study(duration=4, n_trials=1, stall_s=3)
    proc = world.start(*world.run_args())
    log = wait_for_log(world, proc, "server_args=")
    try:
        done = subprocess.run(["chattr", "+i", str(log)], capture_output=True, check=False)
        if done.returncode != 0:
            proc.kill()
            proc.communicate()
            pytest.skip(f"chattr +i is not possible here: {done.stderr.decode().strip()}")
        out, err = proc.communicate(timeout=120)
    finally:
        subprocess.run(["chattr", "-i", str(log)], capture_output=True, check=False)
    assert proc.returncode in (0, 1), out + err
    first = world.trials()[0]
    attrs = first.user_attrs
    assert (first.state, attrs["outcome"]) == (TrialState.FAIL, "machine_error"), attrs
    trial = _record(world, 0)
    assert str(trial["reason"]).startswith("machine_error (log_unwritable): "), trial["reason"]
    assert any("cannot be written" in line for line in trial["host_state"]), trial  # type: ignore[attr-defined]
    assert world.problems() == []


def test_three_deaths_from_outside_in_a_row_stop_the_run(world: World) -> None:
    """Three servers in a row SIGKILLed from outside while serving: three FAIL `killed`, each
    point queued again, and the run stops with exit 1 and one line naming the reason."""
    world.foreign_sleep()
    world.study(duration=30, n_trials=1)
    proc = world.start(*world.run_args())
    pid = 0
    for number in range(3):
        pid = _signal_mid_load(world, proc, number, signal.SIGKILL, not_pid=pid)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, out + err
    line = one_line(err)
    assert "3 trials in a row failed for reasons outside the" in line, line
    assert "killed" in line, line
    launched = [t for t in world.trials() if t.state != TrialState.WAITING]
    assert [(t.state, t.user_attrs["outcome"]) for t in launched] == [
        (TrialState.FAIL, "killed")
    ] * 3
    assert all(t.user_attrs[keys.SENDER] == "outside" for t in launched)
    assert world.trials()[-1].state == TrialState.WAITING  # the last point waits to run again
    assert world.problems() == []


def test_port_taken_after_the_launch_is_a_machine_error(world: World) -> None:
    """Another process listens on the free port autotune chose, after the launch and before the
    server binds it (the start is slowed so the test can): SGLang's uvicorn logs `[Errno 98] …
    address already in use` and the warm-up gives up; FAIL `machine_error` with that line first
    and the holder named, the listener untouched, the point run again on another port (before:
    `startup_error`, a parameter result, with other lines as evidence)."""
    world.foreign_sleep()
    world.study(flags='sim-fault = "slow-startup=100"', n_trials=1)
    proc = world.start(*world.run_args())
    record = _server_pid(world, proc)
    listener = world.stranger(
        [sys.executable, "-c", "import socket, sys, time\ns = socket.socket()\n"
         f"s.bind(('127.0.0.1', {record.port})); s.listen()\nprint('up', flush=True)\n"
         "time.sleep(600)"],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    assert listener.stdout is not None and listener.stdout.readline().strip() == b"up"
    first, trial = _failed(world, proc, "machine_error")
    evidence = trial["evidence"]
    assert isinstance(evidence, list) and "[Errno 98]" in evidence[0], evidence
    assert "address already in use" in evidence[0]
    held = f"port {record.port} on 127.0.0.1 is held by pid {listener.pid}"
    host = trial["host_state"]
    assert isinstance(host, list) and any(held in line for line in host), host
    assert listener.poll() is None
    _requeued_and_run(world, first)
    assert world.problems() == []


def _foreign_gpu_trial(
    world: World,
    proc: subprocess.Popen[str],
    server: pidfile.PidRecord,
    holder: subprocess.Popen[bytes],
) -> tuple[FrozenTrial, list[str]]:
    """The holder stays until trial 0's server is torn down, as a foreign job would, then goes
    (so the point can run again); the run's end, and trial 0, FAIL `machine_error`, with its
    evidence."""
    deadline = time.monotonic() + 60
    while any(r.pid == server.pid for _, r in pidfile.records(world.study_dir / "run")):
        assert time.monotonic() < deadline and proc.poll() is None, "trial 0 never ended"
        time.sleep(0.05)
    os.killpg(holder.pid, signal.SIGKILL)
    holder.wait()
    world.foreign.remove(holder)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    first = world.trials()[0]
    attrs = first.user_attrs
    assert (first.state, attrs["outcome"]) == (TrialState.FAIL, "machine_error"), attrs
    evidence = _record(world, 0)["evidence"]
    assert isinstance(evidence, list), evidence
    return first, [str(e) for e in evidence]


def test_gpu_memory_taken_by_another_process_mid_load_is_a_machine_error(world: World) -> None:
    """Another process (a `sleep` the test registers in the simulator's GPU state, as NVML would
    list it) takes 20 GiB on the server's first GPU while the workload runs: the next forward no
    longer fits and the server dies out of memory. FAIL `machine_error` (`foreign_gpu`) with the
    holder named first and the OOM after it, the point queued again and run once the holder is
    gone (before: COMPLETE `runtime_oom`, a parameter result, and the holder's memory counted in
    the trial's stress peak)."""
    world.foreign_sleep()
    # the next launch waits for the GPU to be free of the holder rather than refuse
    world.study(duration=6, n_trials=1, limits="foreign_wait_s = 60")
    proc = world.start(*world.run_args())
    server = _server_pid(world, proc)
    wait_for_log(world, proc, SERVING, number=0)
    holder = world.foreign_sleep()
    write_holder(world.gpu_dir, holder.pid, {0: 20 << 30}, {0: 96 << 30})
    wait_for_log(world, proc, "out of memory", number=0)
    first, evidence = _foreign_gpu_trial(world, proc, server, holder)
    assert evidence[0].startswith(
        f"GPU 0: pid {holder.pid} (sleep), a process autotune did not "
        "start, took 20.00 GiB while the workload ran"
    ), evidence
    assert "the server then ended: runtime_oom" in evidence[1], evidence
    assert "foreign_gpu" in str(first.user_attrs["reason"]), first.user_attrs
    _requeued_and_run(world, first)
    assert world.problems() == []


def test_gpu_memory_taken_by_another_process_during_the_start_is_a_machine_error(
    world: World,
) -> None:
    """Another process takes 6 GiB on the server's first GPU while it starts (slowed so the test
    can): the free memory SGLang sizes the pool from is not the parameters' own, so the start is
    FAIL `machine_error` (`foreign_gpu`) with the holder named, whatever the start printed, and
    the point runs again once the holder is gone."""
    world.foreign_sleep()
    world.study(flags='sim-fault = "slow-startup=100"', n_trials=1, limits="foreign_wait_s = 60")
    proc = world.start(*world.run_args())
    server = _server_pid(world, proc)
    wait_for_log(world, proc, "Load weight begin", number=0)
    holder = world.foreign_sleep()
    write_holder(world.gpu_dir, holder.pid, {0: 6 << 30}, {0: 96 << 30})
    first, evidence = _foreign_gpu_trial(world, proc, server, holder)
    assert evidence[0].startswith(
        f"GPU 0: pid {holder.pid} (sleep), a process autotune did not "
        "start, took 6.00 GiB while the server started"
    ), evidence
    assert evidence[1].startswith("the start then ended: "), evidence
    _requeued_and_run(world, first)
    assert world.problems() == []


@pytest.fixture
def full_cache_disk(world: World) -> Iterator[Path]:
    """A 16 MiB tmpfs, full, for the server's kernel cache (needs root; skipped otherwise)."""
    folder = world.folder / "cache"
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(folder)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def test_disk_full_under_the_server_is_a_machine_error(world: World, full_cache_disk: Path) -> None:
    """The disk the server writes its Triton kernel cache to (`TRITON_CACHE_DIR`) is full: the
    CUDA graph capture fails with `[Errno 28] No space left on device`, SGLang's tree dies. FAIL
    `machine_error` with that line first, never a parameter result; three in a row stop the run
    (exit 1); with the space back the same command runs the points again, `ok` (before: the
    simulator died of its own GPU-state writes on a full disk, and the trial was COMPLETE
    `startup_error`)."""
    world.foreign_sleep()
    ballast = fill_disk(full_cache_disk)
    env = f'env = {{ TRITON_CACHE_DIR = "{full_cache_disk / "triton"}" }}'
    world.study(server=env, n_trials=1)
    done = world.run()
    assert done.rc == 1, done.out + done.err
    line = one_line(done.err)
    assert "3 trials in a row failed for reasons outside the" in line and "machine_error" in line
    launched = [t for t in world.trials() if t.state != TrialState.WAITING]
    assert [(t.state, t.user_attrs["outcome"]) for t in launched] == [
        (TrialState.FAIL, "machine_error")
    ] * 3
    evidence = _record(world, 0)["evidence"]
    assert isinstance(evidence, list) and "[Errno 28] No space left on device" in evidence[0]
    ballast.unlink()
    done = world.run()
    assert done.rc == 0, done.out + done.err
    complete = [t for t in world.trials() if t.state == TrialState.COMPLETE]
    assert [t.user_attrs["outcome"] for t in complete] == ["ok"]
    assert world.problems() == []


def test_a_real_oom_under_load_stays_a_parameter_result(world: World) -> None:
    """The server's own CUDA OOM under the stress phase, and its own SIGKILL of its tree after
    it: COMPLETE `runtime_oom`, never `killed` (the signal is recorded, with no outside
    sender)."""
    world.foreign_sleep()
    # not about stalls: the helper's 1.5 s once read a busy machine's pause in launch as a hang
    world.study(phases=STRESS, baseline=0.93, flags=EAGLE)
    done = world.run()
    assert done.rc == 0, done.err
    trial, *queued = world.trials()
    assert all(t.state == TrialState.WAITING for t in queued)
    attrs = trial.user_attrs
    assert (trial.state, attrs["outcome"]) == (TrialState.COMPLETE, "runtime_oom"), attrs
    # "" where the server's own SIGKILL of its tree came first, "autotune" where our stop of
    # the server that had logged its OOM did (a busy machine); never outside, never the kernel
    assert attrs[keys.SENDER] in ("", "autotune") and attrs[keys.EXIT_CODE] is not None
    assert "CUDA out of memory" in str(_record(world, 0)["evidence"])
    assert world.problems() == []


@pytest.mark.parametrize(
    ("sig", "when"),
    [
        (signal.SIGINT, SERVING),
        (signal.SIGINT, "Load weight begin"),
        (signal.SIGQUIT, SERVING),
    ],
    ids=["sigint-serving", "sigint-startup", "sigquit-serving"],
)
def test_a_handled_stop_signal_from_outside_is_killed_not_a_crash(
    world: World, sig: signal.Signals, when: str
) -> None:
    """Someone else's SIGINT to the server (it handles it and exits 130, 128 + SIGINT), while it
    starts or serves, or SIGQUIT while it serves (SGLang's handler logs `SIGQUIT received … It
    usually means one child failed.` and kills its tree, though no child failed): FAIL `killed`,
    sender `outside`, the point queued again (before: COMPLETE `crash (exited_after_ready)`,
    `startup_error (exited_during_startup)` or `crash (sigquit)`, infeasible)."""
    world.foreign_sleep()
    world.study(duration=4, n_trials=1)
    proc = world.start(*world.run_args())
    record = _server_pid(world, proc)
    wait_for_log(world, proc, when, number=0)
    os.kill(record.pid, sig)
    first, trial = _failed(world, proc, "killed")
    assert str(trial["reason"]).startswith(f"killed (signal:{sig.name}): "), trial["reason"]
    assert trial["sender"] == "outside", trial
    _requeued_and_run(world, first)
    assert world.problems() == []


HOLDER = Path(__file__).parents[1] / "server" / "exit_holder.py"


def test_a_rank_sigkilled_from_outside_is_killed_while_the_main_process_still_dies(
    world: World,
) -> None:
    """As above (one scheduler of a 0.5.23 server SIGKILLed from outside), with the main process
    held in its exit (ptrace) after its own SIGQUIT handler killed the tree, as a busy machine
    or a slow `kill_process_tree` does: the watchdog's `crashed with exit code -9` is read while
    the main process still runs. FAIL `killed`, the OOM killer ruled out (before: COMPLETE
    `runtime_oom (host_oom_killer)`, whenever the line was read before the main process died:
    every time two studies ran side by side)."""
    world.foreign_sleep()
    world.study(server='sim_version = "0.5.23"', duration=4, n_trials=1)
    proc = world.start(*world.run_args())
    record = _server_pid(world, proc)
    wait_for_log(world, proc, SERVING, number=0)
    holder = subprocess.Popen(
        [sys.executable, str(HOLDER), str(record.pid), "3"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        seized = holder.stdout.readline().strip()
        if seized != "seized":
            proc.kill()
            proc.communicate()
            pytest.skip(f"ptrace is refused here: {seized}")
        os.kill(_child_titled(record.pid, "sglang::scheduler_TP7"), signal.SIGKILL)
        first, trial = _failed(world, proc, "killed")
    finally:
        holder.wait(timeout=60)
        assert holder.stdout is not None
        holder.stdout.close()
    assert str(trial["reason"]).startswith("killed (signal:SIGKILL): "), trial["reason"]
    assert OOM_RULED_OUT in trial["evidence"], trial["evidence"]  # type: ignore[operator]
    _requeued_and_run(world, first)
    assert world.problems() == []
