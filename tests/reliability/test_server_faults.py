"""Fault matrix, server rows: each fault injected into the simulator under `autotune run`.

Every test runs the real command in its own session with a foreign `sleep` alongside, then
checks what the study recorded, that storage and results folder agree (no lost trial), and
(through the `world` fixture) that no process is left and the foreign one still runs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import sys
import time

import pytest
from optuna.trial import TrialState

from autotune.config.schema import Limits
from autotune.loadgen import workload_from_dict
from autotune.logparse.outcome import Outcome
from autotune.server import pidfile
from autotune.server.gpu import SimProbe
from autotune.server.preflight import free_port
from autotune.trial.live import LiveLauncher
from autotune.trial.plan import TrialPlan
from autotune.trial.run import run_trial
from autotune.trial.trialfile import TrialRecord
from tests.reliability.helpers import (
    EAGLE,
    STRESS,
    World,
    server_record,
    wait_for_log,
    wait_for_text,
)

pytestmark = pytest.mark.e2e
STALL_S = 3.0
"""The silence the tests about stalls judge a hang by: short, so they end soon, and past a loaded
machine's pause in a launch (1.5 s read a slow simulator's launch as the hang)."""


def _run(world: World, env: dict[str, str] | None = None, **study: object) -> None:
    """The study of `study` run to its end (exit 0), a foreign process alive beside it."""
    world.foreign_sleep()
    world.study(**study)
    done = world.run(env=env)
    assert done.rc == 0, done.err


def _only_trial(world: World, state: TrialState, outcome: str) -> dict[str, object]:
    trial, *queued = world.trials()
    assert all(t.state == TrialState.WAITING for t in queued)  # grid points not yet run
    assert (trial.state, trial.user_attrs["outcome"]) == (state, outcome), trial.user_attrs
    assert world.problems() == []
    record = json.loads((world.study_dir / "trials/0000/trial.json").read_text())
    assert isinstance(record, dict)
    return record


def test_hang_in_weight_load(world: World) -> None:
    _run(world, flags='sim-fault = "hang-weight-load"', stall_s=STALL_S)
    record = _only_trial(world, TrialState.FAIL, "hang")
    assert "weight_load" in str(record["reason"])


@pytest.mark.parametrize("fault", ["health-empty", "health-fail"])
def test_broken_health_while_serving_works(world: World, fault: str) -> None:
    _run(world, flags=f'sim-fault = "{fault}"', duration=1.0)
    record = _only_trial(world, TrialState.COMPLETE, "ok")
    workload = record["workload"]
    assert isinstance(workload, dict)
    assert workload["overall"]["completed"] > 0 and workload["overall"]["failed"] == 0


def test_a_server_refusing_every_request_is_not_a_parameter_result(world: World) -> None:
    """The server starts, stays up, answers its health checks and logs no failure, but answers
    HTTP 500 to every generation request (`refuse-generate`). Before, each trial was COMPLETE
    `ok` with error rate 1.0: an infeasible parameter result, and the search learned that every
    fraction fails. Now each is FAIL `refused` with the server's answer as evidence, its point
    runs again, and three in a row stop the study with one line naming the answer and the fix."""
    world.foreign_sleep()
    world.study(flags='sim-fault = "refuse-generate"', n_trials=5)
    done = world.run()
    assert done.rc == 1, done.out + done.err
    assert "3 trials in a row failed for reasons outside the parameters" in done.err, done.err
    assert "refused (http_500)" in done.err and "Internal Server Error" in done.err
    assert "check [workload]" in done.err, done.err
    ran = [t for t in world.trials() if t.state != TrialState.WAITING]
    assert [(t.state, t.user_attrs["outcome"]) for t in ran] == [(TrialState.FAIL, "refused")] * 3
    record = json.loads((world.study_dir / "trials/0000/trial.json").read_text())
    assert record["state"] == "fail" and record["error_rate"] == 1.0
    assert re.fullmatch(r"\d+ of \d+ requests failed: HTTP 500: .*Internal Server Error.*",
                        record["evidence"][0]), record["evidence"]  # fmt: skip
    assert world.problems() == []


KEYED = {"workload": 'api_key_env = "REL_API_KEY"'}
"""With an API key the server's output goes through the masking writer: the verdicts must be
the same (the writer is given a moment to write the last lines of a dying server)."""


@pytest.mark.parametrize("keyed", [False, True], ids=["plain", "keyed"])
def test_non_oom_crash_mid_load(world: World, keyed: bool) -> None:
    _run(
        world,
        env={"REL_API_KEY": "sk-rel-crash-0123456789"} if keyed else None,
        flags='sim-fault = "crash-mid-load"',
        **(KEYED if keyed else {}),
    )
    record = _only_trial(world, TrialState.COMPLETE, "startup_error")
    assert world.trials()[0].constraints["crash"] > 0
    assert "Scheduler hit an exception" in str(record["evidence"])


def test_oom_at_startup(world: World) -> None:
    _run(world, baseline=0.97)
    record = _only_trial(world, TrialState.COMPLETE, "startup_oom")
    assert "out of memory" in str(record["evidence"]).lower()
    assert world.trials()[0].constraints["oom"] > 0


@pytest.mark.parametrize("keyed", [False, True], ids=["plain", "keyed"])
def test_oom_under_load(world: World, keyed: bool) -> None:
    _run(
        world,
        env={"REL_API_KEY": "sk-rel-oom-0123456789"} if keyed else None,
        phases=STRESS,
        baseline=0.93,
        flags=EAGLE,
        **(KEYED if keyed else {}),
    )
    record = _only_trial(world, TrialState.COMPLETE, "runtime_oom")
    assert "CUDA out of memory" in str(record["evidence"])
    assert record["capacity_tokens"] > 0  # the capacity it measured is kept


def test_server_ignoring_sigterm_is_killed(world: World) -> None:
    _run(world, flags='sim-fault = "ignore-sigterm"')
    record = _only_trial(world, TrialState.COMPLETE, "ok")
    assert record["phases"]["teardown"] >= 1.5  # the whole grace, then SIGKILL


def test_gpu_memory_held_briefly_is_waited_out(world: World) -> None:
    _run(world, flags='sim-fault = "hold-gpu=1.5"', release_s=10, n_trials=2)
    first, second, *queued = world.trials()
    assert (first.state, first.user_attrs["outcome"]) == (TrialState.COMPLETE, "ok")
    record = json.loads((world.study_dir / "trials/0000/trial.json").read_text())
    assert record["phases"]["teardown"] >= 1.4  # its memory was waited for
    # The next launch was not refused: its trial ran and has its own record.
    assert second.state == TrialState.COMPLETE, second.user_attrs
    assert (world.study_dir / "trials/0001/trial.json").exists()
    assert all(t.state == TrialState.WAITING for t in queued)
    assert world.problems() == []


def test_gpu_memory_never_released_stops_the_run_clearly(world: World) -> None:
    world.foreign_sleep()
    world.study(flags='sim-fault = "hold-gpu=60"', release_s=1, n_trials=2)
    done = world.run()
    assert done.rc == 1, done.out + done.err
    assert "trial 0: teardown" in done.err and "stopping the study" in done.err
    assert "more in use than before the launch" in done.err
    # The line names the holder and the budget it was given.
    # Each rank's memory is its scheduler process's, one GPU each.
    holders = re.findall(
        r"pid \d+ \(group member, exited\) holds [\d.]+ GiB on GPU (\d)\b", done.err
    )
    assert holders == [str(rank) for rank in range(8)], done.err
    assert "past the teardown budget (stop_grace_s + release_s = 2.5 s)" in done.err
    assert done.err.count("\n") == 1
    [trial, *queued] = world.trials()
    assert trial.state == TrialState.COMPLETE and trial.user_attrs["outcome"] == "ok"
    assert all(t.state == TrialState.WAITING for t in queued)  # nothing launched after it
    assert world.problems() == []


# ------------------------------------------------------------------------------------------------
# Hangs while serving: the process lives, nothing comes back
# ------------------------------------------------------------------------------------------------


def test_server_frozen_with_sigstop_while_serving_is_killed_from_outside(world: World) -> None:
    """SIGSTOP to the whole server mid-workload: alive, silent. Judged within stall_s (STALL_S)
    of the last answer, and since SGLang never stops itself, FAIL `killed` (`signal:stopped`,
    its stopped pids named), the point queued again and run; the server killed (SIGKILL ends a
    stopped process). Before: FAIL `hang`, counted against the point as if it hung."""
    world.foreign_sleep()
    world.study(duration=8, stall_s=STALL_S)
    proc = world.start(*world.run_args())
    wait_for_log(world, proc, "Decode batch")
    record = server_record(world)
    os.killpg(record.pgid, signal.SIGSTOP)
    frozen = time.monotonic()
    wait_for_text(world.study_dir / "trials/0000/trial.json", proc, "killed")
    ended = time.monotonic() - frozen
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err
    first, *rest = world.trials()
    assert (first.state, first.user_attrs["outcome"]) == (TrialState.FAIL, "killed")
    trial = json.loads((world.study_dir / "trials/0000/trial.json").read_text())
    assert "killed (signal:stopped)" in str(trial["reason"]), trial["reason"]
    assert "no answer to the workload" in str(trial["reason"])
    assert "state T: stopped" in str(trial["evidence"]), trial["evidence"]
    assert f"pid {record.pid}" in str(trial["evidence"]) and "signal from outside" in str(
        trial["evidence"]
    )
    # stall_s after the freeze, then the 1.5 s grace for SIGTERM (pending while stopped), SIGKILL
    assert ended < STALL_S + 1.5 + 5, ended
    assert trial["phases"]["workload"] < STALL_S + 3, trial["phases"]
    assert any("state T: stopped" in w for w in trial["teardown"]), trial["teardown"]
    # the point ran again, and held
    assert [t.user_attrs["outcome"] for t in rest if t.state == TrialState.COMPLETE] == ["ok"]
    assert world.problems() == []


def test_server_paused_from_outside_and_resumed_while_serving_is_disturbed(world: World) -> None:
    """SIGSTOP to the whole server mid-workload, SIGCONT 1.5 s later: shorter than stall_s
    (10 s), so nothing ends, but the throughput and latencies measured hold the pause. FAIL
    `disturbed` (`signal:stopped`), each stopped process named, the point queued again and run
    (before: COMPLETE `ok` at a lower throughput, stored as the parameters' own figures)."""
    world.foreign_sleep()
    world.study(duration=6)
    proc = world.start(*world.run_args())
    wait_for_log(world, proc, "Decode batch")
    record = server_record(world)
    os.killpg(record.pgid, signal.SIGSTOP)
    time.sleep(1.5)
    os.killpg(record.pgid, signal.SIGCONT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    first, *rest = world.trials()
    assert (first.state, first.user_attrs["outcome"]) == (TrialState.FAIL, "disturbed")
    trial = json.loads((world.study_dir / "trials/0000/trial.json").read_text())
    assert str(trial["reason"]).startswith("disturbed (signal:stopped): pid "), trial["reason"]
    assert f"pid {record.pid} " in str(trial["evidence"]), trial["evidence"]
    assert "stopped by a signal from outside for about" in str(trial["evidence"])
    assert [t.user_attrs["outcome"] for t in rest if t.state == TrialState.COMPLETE] == ["ok"]
    assert world.problems() == []


def test_server_stopped_with_sigstop_while_it_starts_is_killed_from_outside(world: World) -> None:
    """SIGSTOP to the whole server while it loads its weights (slowed so the test can): the log
    goes quiet for stall_s, and since its processes are stopped by a signal, FAIL `killed`
    (`signal:stopped`), not the startup's hang; the point runs again and holds."""
    world.foreign_sleep()
    world.study(flags='sim-fault = "slow-startup=100"', stall_s=STALL_S)
    proc = world.start(*world.run_args())
    wait_for_log(world, proc, "Load weight begin")
    os.killpg(server_record(world).pgid, signal.SIGSTOP)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    first, *rest = world.trials()
    assert (first.state, first.user_attrs["outcome"]) == (TrialState.FAIL, "killed")
    trial = json.loads((world.study_dir / "trials/0000/trial.json").read_text())
    assert "killed (signal:stopped)" in str(trial["reason"]), trial["reason"]
    assert "no log output for" in str(trial["reason"])
    assert "stopped by a signal from outside" in str(trial["evidence"]), trial["evidence"]
    assert [t.user_attrs["outcome"] for t in rest if t.state == TrialState.COMPLETE] == ["ok"]
    assert world.problems() == []


STUCK = (sys.executable, "-m", "autotune.testing.fakeserver", "--log", "--mode", "generate")


def _fake_trial(
    world: World, modes: tuple[str, ...], workload: dict[str, object], workload_s: float = 60
) -> tuple[TrialRecord, float]:
    """One trial of the fake SGLang server in `modes` through the real trial runner and live
    launcher (stall_s 1.5 s): its record and how long it took; the server is proved gone."""
    world.foreign_sleep()
    limits = Limits(startup_s=30, stall_s=1.5, workload_s=workload_s, stop_grace_s=1.5,
                    release_s=3)  # fmt: skip
    spec = workload_from_dict(
        {"input_len": 8, "request_timeout_s": 30, "drain_timeout_s": 2, **workload}
    )
    study_dir = world.study_dir
    launcher = LiveLauncher(
        workload=spec, limits=limits, run_dir=study_dir / "run",
        probe=SimProbe(study_dir / "sim-gpu"), extra=(), version="0.5.9", study="rel",
    )  # fmt: skip
    argv = [*STUCK]
    for mode in modes:
        argv += ["--mode", mode]
    plan = TrialPlan(
        number=0, params={}, env={}, host="127.0.0.1", port=free_port("127.0.0.1"),
        argv=(*argv, "--marker", str(world.folder)), trial_dir=study_dir / "trials/0000",
        limits=limits, backend="sglang",
    )  # fmt: skip
    t0 = time.monotonic()
    record = run_trial(plan, launcher, clock=time.monotonic, phase=lambda _: None)
    took = time.monotonic() - t0
    assert pidfile.records(study_dir / "run") == []  # stopped and proved gone
    return record, took


def _steady(seconds: float) -> list[dict[str, object]]:
    return [{"kind": "steady", "concurrency": 2, "duration_s": seconds}]


def test_health_answering_while_generate_hangs_is_a_hang(world: World) -> None:
    """`/health` (and `/health_generate`) answer 200 while every `/generate` after the first few
    hangs and the log is silent: the HTTP front is alive, generation is stuck. Judged a hang
    within stall_s, never an `ok` trial with failed requests; the server is stopped. The fake
    server (`autotune.testing.fakeserver`, mode `stuck-after=6`) runs through the real trial
    runner and live launcher."""
    record, took = _fake_trial(
        world, ("stuck-after=6",), {"output_len": 1, "stream": False, "phases": _steady(20)}
    )
    assert (record.state, record.outcome) == ("fail", "hang"), record.reason
    assert "hang (stall:serving)" in record.reason and "no answer to the workload" in record.reason
    assert record.phases["workload"] < 1.5 + 3, record.phases  # not the 20 s phase, not 30 s
    assert took < 15, took


def test_streams_that_stop_while_the_log_moves_are_a_hang(world: World) -> None:
    """Every streamed answer stops after two tokens and never ends while the server lives and
    its log keeps printing batch lines: the output is lost between the scheduler and the client.
    Judged a hang within stall_s, never an `ok` trial with nothing completed; the server is
    stopped. The fake server (modes `batches`, `stall-stream=2`) runs through the real trial
    runner and live launcher."""
    record, took = _fake_trial(
        world, ("batches", "stall-stream=2"),
        {"output_len": 16, "stream": True, "phases": _steady(20)},
    )  # fmt: skip
    assert (record.state, record.outcome) == ("fail", "hang"), record.reason
    assert "no byte of any streamed answer" in record.reason, record.reason
    assert "while the log kept moving" in record.reason, record.reason
    assert took < 15, took


def test_a_server_that_exits_0_by_itself_mid_load_is_killed_not_a_crash(world: World) -> None:
    """The server exits 0 on its own while it serves (no failure line, no signal, no stop of
    ours; SGLang exits 0 only when told to stop): FAIL `killed (clean_exit)`, its point queued
    again, never a parameter crash. The fake server (mode `exit-after=5`) runs through the real
    trial runner and live launcher."""
    record, _ = _fake_trial(
        world, ("exit-after=5",),
        {"output_len": 8, "stream": True, "request_timeout_s": 10, "phases": _steady(4)},
        workload_s=30,
    )  # fmt: skip
    assert (record.state, record.outcome) == ("fail", "killed"), record.reason
    assert record.reason.startswith("killed (clean_exit): the server's main process exited 0")
    assert Outcome.of(record.outcome).requeued


# ------------------------------------------------------------------------------------------------
# The server log rotated or deleted mid-trial
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("keyed", [False, True], ids=["plain", "keyed"])
@pytest.mark.parametrize("how", ["copytruncate", "delete"])
def test_server_log_rotated_or_deleted_mid_trial(world: World, how: str, keyed: bool) -> None:
    """logrotate's copytruncate (three times) or `rm server.log` while the server serves: the
    trial ends as its parameters say (no stall taken for a hang, no line read twice or lost
    after the truncation, no hole of NULs), the record says what happened to the file, and a
    deleted log is written back at the teardown."""
    world.foreign_sleep()
    world.study(duration=4, **(KEYED if keyed else {}))
    env = {"REL_API_KEY": "sk-rel-rotate-0123456789"} if keyed else None
    proc = world.start(*world.run_args(), env=env)
    log = wait_for_log(world, proc, "Decode batch")
    if how == "copytruncate":
        for i in range(3):
            shutil.copyfile(log, log.with_name(f"server.log.{i + 1}"))
            os.truncate(log, 0)
            time.sleep(0.6)
    else:
        log.unlink()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err
    record = _only_trial(world, TrialState.COMPLETE, "ok")
    overall = record["workload"]["overall"]  # type: ignore[index]
    assert overall["completed"] > 0 and overall["failed"] == 0, overall
    notes = " ".join(record["log_notes"])  # type: ignore[arg-type]
    text = log.read_bytes()
    if how == "copytruncate":
        assert "server.log was truncated while the server ran (copytruncate)" in notes, notes
        assert b"\0" not in text and text.startswith(b"[")  # appended from byte 0, no hole
    else:
        assert "server.log was deleted while the server ran; written back" in notes, notes
        assert b"fired up and ready" in text and b"Decode batch" in text
        assert stat.S_IMODE(log.stat().st_mode) == 0o600
    if keyed:
        assert b"sk-rel-rotate" not in text


def test_scheduler_killed_while_the_http_front_answers_is_a_hang(world: World) -> None:
    """The simulator's `oom-kill=1` on SGLang 0.5.9 (no subprocess watchdog): a second into
    serving the OS kills scheduler rank 0; the server process, its HTTP front and `/health`
    live on, generation stops and the log goes quiet. A hang within stall_s, not a timeout."""
    world.foreign_sleep()
    # SGLang's own watchdog (300 s, 10 ms at this time scale) pushed out of the way: the rule
    # tested is autotune's.
    world.study(
        flags='sim-fault = "oom-kill=1"\nwatchdog-timeout = 100000000',
        duration=30,
        stall_s=STALL_S,
    )
    done = world.run()
    assert done.rc == 0, done.out + done.err
    record = _only_trial(world, TrialState.FAIL, "hang")
    assert "hang (stall:serving)" in str(record["reason"]), record["reason"]
    assert record["phases"]["workload"] < 1 + 1.5 + 3, record["phases"]


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_a_rank_that_dies_mid_load_is_a_crash_not_the_hang_it_causes(
    world: World, version: str
) -> None:
    """`rank-dies=1`: a second into the workload the last rank's scheduler process segfaults and
    its peers wait in the collective it never joins (on 0.5.9 until their own watchdogs end the
    tree, on 0.5.23 until the SubprocessWatchdog does). The rank's crash decides: COMPLETE
    `crash (fatal_signal)`, faulthandler's line first; a parameter result, not a `hang`; every
    process of the tree gone."""
    world.foreign_sleep()
    world.study(
        server=f'sim_version = "{version}"',
        flags='sim-fault = "rank-dies=1"\nwatchdog-timeout = 15000',
        duration=30,
        stall_s=STALL_S,  # the stall is seen first: the rank's crash must still decide
    )
    done = world.run()
    assert done.rc == 0, done.out + done.err
    trial, *_ = world.trials()
    assert (trial.state, trial.user_attrs["outcome"]) == (TrialState.COMPLETE, "crash"), (
        trial.user_attrs
    )
    record = json.loads((world.study_dir / "trials/0000/trial.json").read_text())
    assert str(record["reason"]).startswith("crash (fatal_signal): "), record["reason"]
    assert record["evidence"][0] == "Fatal Python error: Segmentation fault", record["evidence"]
    assert world.problems() == []
