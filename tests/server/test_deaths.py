"""Who ended a server and what the host showed: the exit status and its sender on every verdict,
the kernel's OOM killer read from the kernel itself (a real memory cgroup and the real OOM
killer where this machine allows it), a port held by another process, a full disk. Real
processes throughout; the rules of `server.deaths.sender_of` also as a table."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from server_helpers import Guard, fake_spec, launch_ready, make_spec, wait_death

from autotune.logparse.outcome import Outcome
from autotune.server import deaths
from autotune.server.lifecycle import Server
from autotune.sim.gpustate import kernel_log, kernel_oom_kill


@pytest.mark.parametrize(
    ("code", "stopping", "oom", "sigterm", "failure", "sender"),
    [
        (None, False, False, False, False, ""),  # still running
        (None, False, False, True, False, "outside"),  # draining after someone's SIGTERM
        (-15, True, False, False, False, "autotune"),  # our stop
        (-9, True, False, True, False, "outside"),  # someone's SIGTERM came before our stop
        (-9, False, True, False, False, "oom_killer"),
        (-9, False, False, False, False, "outside"),  # kill -9 from someone
        (-9, False, False, False, True, ""),  # SGLang's own kill_process_tree after a failure
        (-9, False, True, False, True, "oom_killer"),  # the kernel says so: it wins
        (1, False, False, False, False, ""),  # it exited by itself
        (0, False, False, True, False, "outside"),  # 0.5.23 drains a foreign SIGTERM, exits 0
    ],
)
def test_the_sender_rule(
    code: int | None, stopping: bool, oom: bool, sigterm: bool, failure: bool, sender: str
) -> None:
    got = deaths.sender_of(
        code, stopping=stopping, oom_killed=oom, foreign_sigterm=sigterm, own_failure=failure
    )
    assert got == sender


def _script(tmp_path: Path, body: str) -> tuple[str, ...]:
    path = tmp_path / "server.py"
    path.write_text(body)
    return (sys.executable, "-u", str(path))


LIVES = "import time\nprint('Load weight begin. avail mem=10.00 GB', flush=True)\ntime.sleep(60)\n"


def test_a_sigkill_from_outside_is_recorded_with_its_sender(tmp_path: Path, guard: Guard) -> None:
    spec = make_spec(tmp_path, argv=_script(tmp_path, LIVES), stall_s=30.0, stop_grace_s=2.0)
    server = guard.server(Server.launch(spec))
    time.sleep(0.5)
    os.kill(server.pid, signal.SIGKILL)
    report = server.wait_ready()
    assert report.outcome is Outcome.KILLED, report
    end = server.exit_facts()
    assert (end.code, end.signal, end.sender) == (-9, "SIGKILL", "outside")
    down = server.stop()
    assert (down.exit_code, down.sender) == (-9, "outside")
    assert down.to_dict()["sender"] == "outside"


def test_our_own_stop_is_autotune_s(tmp_path: Path, guard: Guard) -> None:
    server = launch_ready(guard, fake_spec(tmp_path, "child"))
    assert server.exit_facts().code is None
    down = server.stop()
    assert down.outcome is Outcome.STOPPED
    assert down.sender == "autotune" and down.exit_code is not None
    assert down.host == ()  # our stop reads no host state


def test_a_sigkill_while_serving_is_a_death_from_outside(tmp_path: Path, guard: Guard) -> None:
    server = launch_ready(guard, fake_spec(tmp_path, "child"))
    os.kill(server.pid, signal.SIGKILL)
    death = wait_death(server)
    assert death.outcome is Outcome.KILLED, death
    assert server.exit_facts().sender == "outside"
    down = server.stop()  # its child is ours: killed and waited for
    assert down.clean and (down.outcome, down.sender) == (Outcome.KILLED, "outside")


@contextlib.contextmanager
def _memory_cgroup(limit: int) -> Iterator[Path]:
    """A memory cgroup of its own with `limit` bytes (cgroup v1 or v2; skipped where this
    machine does not let us make one)."""
    candidates = [Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup")]
    for root in candidates:
        limit_file = "memory.limit_in_bytes" if root.name == "memory" else "memory.max"
        if not (root / "cgroup.procs").exists():
            continue
        group = root / f"autotune-test-{os.getpid()}"
        try:
            group.mkdir()
        except OSError:
            continue
        try:
            (group / limit_file).write_text(str(limit))
        except OSError:
            group.rmdir()
            continue
        try:
            yield group
        finally:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                with contextlib.suppress(OSError):
                    group.rmdir()
                    break
                time.sleep(0.05)
        return
    pytest.skip("no memory cgroup can be made here")


GROWS = (
    "import sys, time\n"
    "print('Load weight begin. avail mem=10.00 GB', flush=True)\n"
    "time.sleep(1.0)\n"  # the test moves it into a small memory cgroup meanwhile
    "x = bytearray(400 << 20)\n"
    "for i in range(0, len(x), 4096): x[i] = 1\n"
    "time.sleep(60)\n"
)


def test_the_kernel_oom_killer_is_named_from_the_kernel_s_own_words(
    tmp_path: Path, guard: Guard
) -> None:
    """The server is moved into a 64 MiB memory cgroup and grows past it: the real OOM killer
    SIGKILLs it. The sender is `oom_killer`, known from `/dev/kmsg` (`Killed process P`) or the
    cgroup's `oom_kill` counter, and its line is in the evidence; a host-memory failure, a
    parameter result."""
    spec = make_spec(tmp_path, argv=_script(tmp_path, GROWS), stall_s=30.0, stop_grace_s=2.0)
    with _memory_cgroup(64 << 20) as group:
        server = guard.server(Server.launch(spec))
        (group / "cgroup.procs").write_text(str(server.pid))
        server._observe(force=True)  # the lifecycle notes the new cgroup's counter once a second
        report = server.wait_ready()
        end = server.exit_facts()
        down = server.stop()
    assert (end.code, end.sender) == (-9, "oom_killer"), (end, report)
    assert end.detail, end
    assert f"Killed process {server.pid} " in end.detail[0] or "oom_kill" in end.detail[0], end
    assert report.outcome in (Outcome.STARTUP_OOM, Outcome.RUNTIME_OOM), report
    assert any(line in report.evidence for line in end.detail), report.evidence
    assert down.sender == "oom_killer"


def test_a_port_held_by_another_process_is_named_and_not_waited_for(
    tmp_path: Path, guard: Guard
) -> None:
    """The server's port taken by a stranger (here before its bind): the host state names the
    holder, and the teardown does not wait the whole budget for a port that is not ours."""
    holder = guard.stranger(
        subprocess.Popen(
            [sys.executable, "-c", "import socket, sys, time\ns = socket.socket()\n"
             "s.bind(('127.0.0.1', 0)); s.listen()\nprint(s.getsockname()[1], flush=True)\n"
             "time.sleep(600)"],
            stdout=subprocess.PIPE, start_new_session=True,
        )
    )  # fmt: skip
    assert holder.stdout is not None
    port = int(holder.stdout.readline())
    holder.stdout.close()
    line = deaths.port_line("127.0.0.1", port, ours=())
    assert line.startswith(f"port {port} on 127.0.0.1 is held by pid {holder.pid} ("), line
    assert line.endswith("), a process autotune did not start"), line
    assert deaths.port_line("127.0.0.1", port, ours=(holder.pid,)) == ""
    spec = make_spec(tmp_path, argv=_script(tmp_path, "import sys\nsys.exit(1)\n"), port=port,
                     stop_grace_s=2.0, release_s=10.0)  # fmt: skip
    # The preflight refuses a port in use; launch as if it had been free a moment before.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("autotune.server.preflight.check_port", lambda host, port: None)
        server = guard.server(Server.launch(spec))
    report = server.wait_ready()
    assert any(f"is held by pid {holder.pid}" in e for e in report.evidence), report
    t0 = time.monotonic()
    down = server.stop()
    assert time.monotonic() - t0 < 5.0, "the teardown waited for a port that is not ours"
    assert down.clean, down.problems
    assert any("not waited for" in w for w in down.waited), down.waited
    assert holder.poll() is None


def test_a_full_disk_is_one_line_and_a_disk_with_room_none(tmp_path: Path) -> None:
    assert deaths.disk_line(tmp_path) == ""
    line = deaths.disk_line(tmp_path, full_below=1 << 62)
    assert line.startswith(f"the disk under {tmp_path} is full: ") and "MiB free of" in line


def test_no_listener_no_port_line() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # bound, not listening
        assert deaths.port_line("127.0.0.1", s.getsockname()[1], ours=()) == ""


def test_a_simulated_machine_s_kernel_log_speaks_for_its_oom_killer_from_its_start(
    tmp_path: Path,
) -> None:
    """A simulated machine's kernel log that appears after the launch is read from its start:
    silent while it holds no OOM kill (so a rank's SIGKILL came from outside), naming the
    process once the simulator acted the OOM killer out (and then not silent, whichever pid it
    named: a child the scans never saw cannot pass as killed from outside)."""
    log = kernel_log(tmp_path / "gpu")
    watch = deaths.KernelOomWatch(str(log), appears_later=True)
    try:
        assert not log.exists() and watch.watching and watch.silent()
        kernel_oom_kill(tmp_path / "gpu", 4242, "python")
        assert not watch.silent()
        assert watch.killed({4242}).startswith("kernel log: Out of memory: Killed process 4242")
        assert watch.killed({1}) == ""
    finally:
        watch.close()
