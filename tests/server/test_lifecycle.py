"""Launch, readiness, liveness and teardown against a fake SGLang server (real processes, HTTP)."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

import pytest
from server_helpers import Guard, fake_spec, launch_ready, pid_alive, sleeper, wait_death

from autotune.errors import HarnessError, UsageError
from autotune.logparse.outcome import Outcome
from autotune.logparse.phase import Phase, PhaseLimits
from autotune.server import pidfile
from autotune.server.lifecycle import Server
from autotune.server.teardown import stop_orphans


def test_ready_then_clean_stop_spares_a_foreign_process(tmp_path: Path, guard: Guard) -> None:
    foreign = guard.stranger(sleeper())
    server = guard.server(Server.launch(fake_spec(tmp_path, "child")))
    report = server.wait_ready()
    assert report.outcome is Outcome.READY, report
    assert report.phase is Phase.READY
    assert report.ledger.max_total_num_tokens == 159277
    assert report.ledger.kv_gib == pytest.approx(10.42)
    assert report.mismatches == ()
    assert {"dist_init", "weight_load", "kv_pool", "graph_capture"} <= set(report.phase_seconds)
    assert report.ready_line_at is not None and report.ready_at is not None
    assert server.check_alive() is None
    assert len(list((tmp_path / "run").glob("*.pid.json"))) == 1

    down = server.stop()
    assert down.clean, down.problems
    assert down.outcome is Outcome.STOPPED
    assert down.signals[0] == "SIGTERM"
    assert not list((tmp_path / "run").glob("*.pid.json"))
    assert pid_alive(foreign), "teardown must never touch a process autotune did not start"
    assert server.stop() is down


def test_startup_oom_is_a_value_with_evidence(tmp_path: Path, guard: Guard) -> None:
    server = guard.server(Server.launch(fake_spec(tmp_path, "no-kv-room")))
    report = server.wait_ready()
    assert (report.outcome, report.cause) == (Outcome.STARTUP_OOM, "no_kv_room")
    assert any("Not enough memory" in line for line in report.evidence)
    assert report.ledger.weights_gib == pytest.approx(72.33)
    down = server.stop()
    assert down.clean and down.outcome is Outcome.STARTUP_OOM


@pytest.mark.parametrize(
    ("mode", "outcome", "cause", "reason"),
    [
        ("runtime-oom", Outcome.RUNTIME_OOM, "torch_oom", "CUDA out of memory"),
        ("exit-after-ready", Outcome.CRASH, "exited_after_ready", "crash (exited_after_ready)"),
    ],
    ids=["runtime-oom", "silent-exit-is-a-crash"],
)
def test_a_death_after_ready_is_seen_by_check_alive(
    tmp_path: Path, guard: Guard, mode: str, outcome: Outcome, cause: str, reason: str
) -> None:
    server = launch_ready(guard, fake_spec(tmp_path, mode))
    death = wait_death(server)
    assert (death.outcome, death.cause) == (outcome, cause)
    assert reason in server.dead_reason()  # type: ignore[operator]
    down = server.stop()
    assert down.clean and down.outcome is outcome


def test_stall_during_weight_load_is_a_hang(tmp_path: Path, guard: Guard) -> None:
    server = guard.server(Server.launch(fake_spec(tmp_path, "hang-load", stall_s=1.0)))
    report = server.wait_ready()
    assert (report.outcome, report.cause) == (Outcome.HANG, "stall:weight_load")
    assert report.phase is Phase.WEIGHT_LOAD
    assert server.stop().clean


def test_phase_limit_is_a_timeout_even_while_the_log_moves(tmp_path: Path, guard: Guard) -> None:
    limits = PhaseLimits(weight_load_s=1.0)
    spec = fake_spec(tmp_path, "crawl-load", phase_limits=limits, stall_s=30.0)
    server = guard.server(Server.launch(spec))
    report = server.wait_ready()
    assert (report.outcome, report.cause) == (Outcome.TIMEOUT, "phase_timeout:weight_load")
    assert server.stop().clean


def test_ready_line_without_any_working_route_is_not_ready(tmp_path: Path, guard: Guard) -> None:
    spec = fake_spec(tmp_path, "health-fail", "batches", ready_check_s=0.5)
    server = guard.server(Server.launch(spec))
    # The fired-up line is there but neither /health_generate nor /generate answers.
    report = server.wait_ready()
    assert (report.outcome, report.cause) == (Outcome.TIMEOUT, "phase_timeout:ready_check")
    assert any("/generate" in line for line in report.evidence)
    assert server.stop().clean


def test_failing_health_route_with_working_generation_is_ready_and_alive(
    tmp_path: Path, guard: Guard
) -> None:
    server = launch_ready(guard, fake_spec(tmp_path, "health-fail", "generate"))
    time.sleep(1.5)  # several health checks, each failing on /health and passing on /generate
    assert server.check_alive() is None
    watch = server._watch
    assert watch is not None and watch.state().checks >= 2
    assert watch.state().failures_in_a_row == 0
    assert server.stop().clean


def test_health_failing_alone_while_batches_flow_keeps_server_alive(
    tmp_path: Path, guard: Guard
) -> None:
    server = launch_ready(guard, fake_spec(tmp_path, "health-late", "batches"))
    # Force the watch to report failures from now on, while batches keep coming.
    server.spec = fake_spec(tmp_path, unhealthy_s=0.5)
    watch = server._watch
    assert watch is not None
    watch._url = f"http://127.0.0.1:{server.spec.port}/nothing-here"  # every check fails
    deadline = time.monotonic() + 1.2
    while time.monotonic() < deadline:
        assert server.check_alive() is None
        time.sleep(0.05)
    assert watch.state().failures_in_a_row > 0
    serving = server.serving()
    assert serving.decode_lines > 0 and serving.max_running == 4
    assert server.stop().clean


def test_failing_health_without_batches_is_death(tmp_path: Path, guard: Guard) -> None:
    server = launch_ready(guard, fake_spec(tmp_path, "health-late"))
    watch = server._watch
    assert watch is not None
    watch._url = f"http://127.0.0.1:{server.spec.port}/nothing-here"
    death = wait_death(server)
    assert (death.outcome, death.cause) == (Outcome.HANG, "unhealthy")
    assert "no batches" in death.evidence[0]
    assert server.stop().clean


def test_a_vanished_server_process_with_failing_checks_is_a_crash(
    tmp_path: Path, guard: Guard
) -> None:
    server = launch_ready(guard, fake_spec(tmp_path, "child", unhealthy_s=60.0))
    [child] = [m for m in server._members if m.pid != server.pid]
    os.kill(child.pid, signal.SIGKILL)  # the kernel's OOM killer takes a scheduler
    watch = server._watch
    assert watch is not None
    watch._url = f"http://127.0.0.1:{server.spec.port}/nothing-here"
    death = wait_death(server)
    assert (death.outcome, death.cause) == (Outcome.CRASH, "process_lost")
    assert str(child.pid) in death.evidence[0]
    assert server.stop().clean


def test_readiness_waits_for_health_generate(tmp_path: Path, guard: Guard) -> None:
    server = guard.server(Server.launch(fake_spec(tmp_path, "health-late")))
    report = server.wait_ready()
    assert report.outcome is Outcome.READY
    assert report.ready_at is not None and report.ready_line_at is not None
    assert report.ready_at - report.ready_line_at >= 0.4
    assert server.stop().clean


def test_ignored_sigterm_ends_with_sigkill(tmp_path: Path, guard: Guard) -> None:
    spec = fake_spec(tmp_path, "ignore-sigterm", stop_grace_s=0.5)
    server = launch_ready(guard, spec)
    down = server.stop()
    assert down.clean
    assert down.signals[:2] == ("SIGTERM", "SIGKILL")


def test_a_child_that_left_the_group_is_killed_too(tmp_path: Path, guard: Guard) -> None:
    server = launch_ready(guard, fake_spec(tmp_path, "escaped-child"))
    escaped = [m for m in server._members if m.pgid != server.record.pgid]
    assert escaped, "the fake server's escaped child should be known"
    guard.must_die.extend(escaped)
    down = server.stop()
    assert down.clean
    assert any(s.startswith("SIGKILL:") for s in down.signals)


def test_port_in_use_is_refused_before_launch(tmp_path: Path, guard: Guard) -> None:
    spec = fake_spec(tmp_path)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", spec.port))
        sock.listen()
        with pytest.raises(HarnessError, match="in use"):
            Server.launch(spec)
    assert not spec.log_path.exists()


def test_host_and_port_belong_to_autotune(tmp_path: Path) -> None:
    spec = fake_spec(tmp_path)
    with pytest.raises(UsageError, match="--port"):
        Server.launch(fake_spec(tmp_path, argv=(*spec.argv, "--port", "1")))


def test_pidfile_masks_the_api_key_and_a_second_launch_is_refused(
    tmp_path: Path, guard: Guard
) -> None:
    spec = fake_spec(tmp_path, api_key="sekrit-123")
    spec = fake_spec(tmp_path, api_key="sekrit-123", argv=(*spec.argv, "--mode", "sekrit-123"))
    server = guard.server(Server.launch(spec))
    [(path, record)] = pidfile.records(spec.run_dir)
    assert "sekrit-123" not in path.read_text()
    assert record.pid == server.pid and record.port == spec.port
    with pytest.raises(HarnessError, match="still running"):
        Server.launch(fake_spec(tmp_path))
    assert server.stop().clean


def test_stop_orphans_stops_only_what_autotune_started(tmp_path: Path, guard: Guard) -> None:
    spec = fake_spec(tmp_path, "child")
    server = launch_ready(guard, spec)
    # A foreign process with a forged pidfile: right pid, wrong start time.
    foreign = guard.stranger(sleeper())
    record = server.record
    forged = pidfile.PidRecord(
        pid=foreign.pid,
        pgid=foreign.pid,
        sid=foreign.pid,
        start_ticks=1,
        boot_id=record.boot_id,
        host="127.0.0.1",
        port=1,
        log_path="x",
        argv=("sleep",),
        launched_at=0.0,
    )
    pidfile.write(spec.run_dir, forged)
    # autotune "restarts": the handle is forgotten, only the pidfiles remain.
    done = stop_orphans(spec.run_dir, grace_s=5.0)
    assert any("stopped" in line for line in done), done
    assert pid_alive(foreign)
    assert not pidfile.records(spec.run_dir)
    assert not guard.leftovers()
    server.process.wait(timeout=5)


def test_startup_report_is_json_safe(tmp_path: Path, guard: Guard) -> None:
    server = guard.server(Server.launch(fake_spec(tmp_path)))
    report = server.wait_ready()
    json.dumps(report.to_dict())
    json.dumps(server.stop().to_dict())
