"""End to end through the simulator: every outcome and every fault, real processes and HTTP.

Each test launches `python -m autotune.sim` (Kimi-K2.5 TP8 profile, startup sped up 3000×) with
its own GPU-state folder, so the SimProbe sees exactly what that server holds.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from server_helpers import FAKE_LIMITS, Guard, make_spec, pid_alive, sleeper, wait_death

from autotune.errors import HarnessError
from autotune.logparse.outcome import Outcome
from autotune.logparse.phase import Phase, PhaseLimits
from autotune.server import pidfile, procs
from autotune.server.gpu import GiB, SimProbe
from autotune.server.launchspec import LaunchSpec
from autotune.server.lifecycle import Server
from autotune.sim.gpustate import kernel_log

pytestmark = pytest.mark.e2e


# The simulator takes longer to start, answer and let go of its GPUs than the fake server.
SIM_LIMITS: dict[str, float] = {
    **FAKE_LIMITS,
    "startup_s": 120.0,
    "stall_s": 20.0,
    "health_interval_s": 0.2,
    "unhealthy_s": 2.0,
    "stop_grace_s": 10.0,
    "release_s": 10.0,
}


def sim_spec(tmp_path: Path, *flags: str, **overrides: Any) -> LaunchSpec:
    argv = (
        sys.executable, "-m", "autotune.sim", "--model-path", "/models/Kimi-K2.5",
        "--tp-size", "8", "--sim-time-scale", "30000", "--sim-gpu-dir", str(tmp_path / "gpu"),
        *flags,
    )  # fmt: skip
    machine = {"kernel_log": kernel_log(tmp_path / "gpu")}  # as the launcher gives a sim run
    return make_spec(tmp_path, **{"argv": argv, **machine, **SIM_LIMITS, **overrides})


def gpu_dir(spec: LaunchSpec) -> Path:
    return Path(spec.argv[spec.argv.index("--sim-gpu-dir") + 1])


def launch(guard: Guard, spec: LaunchSpec) -> Server:
    return guard.server(Server.launch(spec, SimProbe(gpu_dir(spec))))


def used(spec: LaunchSpec) -> int:
    return sum(g.used for g in SimProbe(gpu_dir(spec)).snapshot())


_TITLES: dict[int, list[int]] = {}


def schedulers(server: Server) -> list[int]:
    """The pids of the server's scheduler processes, rank 0 first (read once from /proc, while
    they run, and remembered)."""
    if server.pid not in _TITLES:
        found = {}
        for p in procs.members(server.record.pgid, server.record.sid):
            title = Path(f"/proc/{p.pid}/cmdline").read_bytes().split(b"\0")[0].decode()
            if title.startswith("sglang::scheduler_TP"):
                found[int(title.removeprefix("sglang::scheduler_TP"))] = p.pid
        _TITLES[server.pid] = [found[r] for r in sorted(found)]
    return _TITLES[server.pid]


def generate(server: Server, tokens: int, api_key: str | None = None) -> None:
    body = {"input_ids": list(range(1, tokens + 1)), "sampling_params": {"max_new_tokens": 4}}
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    req = urllib.request.Request(
        f"{server.base_url}/generate", data=json.dumps(body).encode(), headers=headers
    )
    with contextlib.suppress(urllib.error.URLError, ConnectionError):  # it dies under the request
        urllib.request.urlopen(req, timeout=30).read()


def test_ready_ledger_matches_server_info_and_teardown_releases_gpus(
    tmp_path: Path, guard: Guard
) -> None:
    foreign = guard.stranger(sleeper())
    spec = sim_spec(tmp_path, "--mem-fraction-static", "0.88")
    server = launch(guard, spec)
    report = server.wait_ready()
    assert report.outcome is Outcome.READY, report.to_dict()
    led = report.ledger
    assert led.max_total_num_tokens is not None and led.max_total_num_tokens > 100_000
    assert led.weights_gib == pytest.approx(72.33) and led.ranks == 8
    assert led.graph_gib is not None and led.avail_after_graphs_gib is not None
    assert report.server_info and report.mismatches == ()
    assert used(spec) > 8 * 90 * GiB
    assert server.check_alive() is None
    down = server.stop()
    assert down.clean, down.problems
    assert down.outcome is Outcome.STOPPED
    assert used(spec) == 0
    assert pid_alive(foreign)


@pytest.mark.parametrize(
    ("flags", "cause"),
    [
        (("--mem-fraction-static", "0.5"), "no_kv_room"),
        (("--mem-fraction-static", "0.93"), "graph_capture_failed"),
        (("--mem-fraction-static", "0.97"), "torch_oom"),
        (
            (
                "--mem-fraction-static",
                "0.85",
                "--enable-hierarchical-cache",
                "--hicache-size",
                "3000",
            ),
            "host_memory",
        ),
        (
            (
                "--mem-fraction-static",
                "0.85",
                "--enable-hierarchical-cache",
                "--hicache-size",
                "400",
            ),
            "host_oom_killer",
        ),
    ],
    ids=["no-room-for-kv", "graph-capture-oom", "alloc-oom", "host-cache", "host-oom-killer"],
)
def test_startup_oom(tmp_path: Path, guard: Guard, flags: tuple[str, ...], cause: str) -> None:
    spec = sim_spec(tmp_path, *flags)
    server = launch(guard, spec)
    report = server.wait_ready()
    assert (report.outcome, report.cause) == (Outcome.STARTUP_OOM, cause), report.evidence
    assert report.evidence
    down = server.stop()
    assert down.clean and down.outcome is Outcome.STARTUP_OOM
    assert used(spec) == 0


def test_runtime_oom_under_a_large_prefill(tmp_path: Path, guard: Guard) -> None:
    spec = sim_spec(tmp_path, "--mem-fraction-static", "0.88")
    server = launch(guard, spec)
    assert server.wait_ready().outcome is Outcome.READY
    generate(server, 8000)
    death = wait_death(server)
    assert (death.outcome, death.cause) == (Outcome.RUNTIME_OOM, "torch_oom")
    assert "CUDA out of memory" in death.evidence[0]
    down = server.stop()
    assert down.clean and down.outcome is Outcome.RUNTIME_OOM


def test_fault_crash_mid_load_is_a_startup_error(tmp_path: Path, guard: Guard) -> None:
    server = launch(guard, sim_spec(tmp_path, "--sim-fault", "crash-mid-load"))
    report = server.wait_ready()
    assert report.outcome is Outcome.STARTUP_ERROR
    assert report.phase is Phase.WEIGHT_LOAD
    assert any("Scheduler hit an exception" in line for line in report.evidence)
    assert server.stop().clean


def test_fault_hang_weight_load_is_a_hang(tmp_path: Path, guard: Guard) -> None:
    spec = sim_spec(tmp_path, "--sim-fault", "hang-weight-load", stall_s=3.0)
    server = launch(guard, spec)
    report = server.wait_ready()
    assert (report.outcome, report.cause) == (Outcome.HANG, "stall:weight_load")
    assert server.stop().clean


def test_fault_slow_startup_runs_into_the_phase_limit(tmp_path: Path, guard: Guard) -> None:
    spec = sim_spec(
        tmp_path, "--sim-fault", "slow-startup=100", phase_limits=PhaseLimits(weight_load_s=1.0)
    )
    server = launch(guard, spec)
    report = server.wait_ready()
    assert (report.outcome, report.cause) == (Outcome.TIMEOUT, "phase_timeout:weight_load")
    assert server.stop().clean


@pytest.mark.parametrize("fault", ["health-empty", "health-fail"])
def test_broken_health_route_is_neither_unready_nor_dead(
    tmp_path: Path, guard: Guard, fault: str
) -> None:
    server = launch(guard, sim_spec(tmp_path, "--sim-fault", fault, unhealthy_s=1.0))
    report = server.wait_ready()
    assert report.outcome is Outcome.READY
    deadline = time.monotonic() + 2 * server.spec.unhealthy_s
    while time.monotonic() < deadline:
        assert server.check_alive() is None
        time.sleep(0.1)
    watch = server._watch
    assert watch is not None and watch.state().checks >= 2
    assert server.stop().clean


def test_fault_ignore_sigterm_is_stopped_by_sigkill(tmp_path: Path, guard: Guard) -> None:
    spec = sim_spec(tmp_path, "--sim-fault", "ignore-sigterm", stop_grace_s=1.0)
    server = launch(guard, spec)
    assert server.wait_ready().outcome is Outcome.READY
    down = server.stop()
    assert down.clean, down.problems
    assert down.signals[:2] == ("SIGTERM", "SIGKILL")
    assert used(spec) == 0


def test_fault_hold_gpu_is_waited_out(tmp_path: Path, guard: Guard) -> None:
    spec = sim_spec(tmp_path, "--sim-fault", "hold-gpu=1")
    server = launch(guard, spec)
    assert server.wait_ready().outcome is Outcome.READY
    down = server.stop()
    assert down.clean, down.problems
    assert down.seconds >= 0.9
    assert used(spec) == 0


def test_fault_hold_gpu_past_the_limit_is_a_clear_error(tmp_path: Path, guard: Guard) -> None:
    spec = sim_spec(tmp_path, "--sim-fault", "hold-gpu=30", stop_grace_s=0.5, release_s=1.0)
    server = launch(guard, spec)
    assert server.wait_ready().outcome is Outcome.READY
    schedulers(server)
    down = server.stop()
    assert not down.clean
    assert down.survivors == () and down.port_free
    assert any("more in use than before the launch" in p for p in down.problems)
    head = down.problems[0]
    ranks = schedulers(server)  # each rank's memory is its scheduler's, one GPU each
    for rank, pid in enumerate(ranks):
        assert re.search(rf"pid {pid} \(group member, exited\) holds [\d.]+ GiB on GPU {rank}\b",
                         head), head  # fmt: skip
    assert f"pid {server.pid} " not in head
    assert "past the teardown budget (stop_grace_s + release_s = 1.5 s)" in head
    with pytest.raises(HarnessError, match=f"teardown incomplete: .*pid {ranks[0]} "):
        down.raise_if_unclean()


def test_fault_hold_gpu_30_s_after_sigkill_within_the_budget_then_the_next_launch_proceeds(
    tmp_path: Path, guard: Guard
) -> None:
    """At a real 30 s: the server ignores SIGTERM, is SIGKILLed after the grace, and its GPU
    memory stays held 30 s after it died; `stop_grace_s + release_s` covers that, so the
    teardown is clean and the next launch on the same GPUs goes ahead."""
    spec = sim_spec(
        tmp_path, "--sim-fault", "ignore-sigterm", "--sim-fault", "hold-gpu=30",
        stop_grace_s=0.5, release_s=32.0,
    )  # fmt: skip
    server = launch(guard, spec)
    assert server.wait_ready().outcome is Outcome.READY
    schedulers(server)
    down = server.stop()
    assert down.clean, down.problems
    assert down.signals[:2] == ("SIGTERM", "SIGKILL")
    assert 29.5 <= down.seconds < 32.5
    back = down.waited[-1]
    assert back.startswith("GPU memory back at the baseline 3"), down.waited
    assert f"waited for: pid {schedulers(server)[0]} (group member, exited) held " in back
    assert used(spec) == 0
    nxt = launch(guard, sim_spec(tmp_path))
    assert nxt.wait_ready().outcome is Outcome.READY
    assert nxt.stop().clean


def test_foreign_gpu_memory_refuses_or_waits(tmp_path: Path, guard: Guard) -> None:
    from autotune.sim.gpustate import write_holder

    stranger = guard.stranger(sleeper())
    spec = sim_spec(tmp_path, foreign_wait_s=30.0)
    write_holder(gpu_dir(spec), stranger.pid, {3: 4 * GiB}, {i: 100 * GiB for i in range(8)})
    with pytest.raises(HarnessError, match=f"pid {stranger.pid} holds 4.00 GiB"):
        Server.launch(spec, SimProbe(gpu_dir(spec)))
    assert not spec.log_path.exists()
    assert pid_alive(stranger)

    # With the wait policy the launch goes ahead once the holder is gone.
    waiting = sim_spec(tmp_path, foreign_gpu="wait", foreign_wait_s=30.0)
    stranger.kill()
    stranger.wait()
    server = launch(guard, waiting)
    assert server.wait_ready().outcome is Outcome.READY
    assert server.stop().clean


def test_api_key_never_written_and_a_restarted_autotune_stops_its_orphan(
    tmp_path: Path, guard: Guard
) -> None:
    from autotune.server.teardown import stop_orphans

    key = "sk-test-0123456789"
    spec = sim_spec(tmp_path, "--api-key", key, api_key=key)
    server = launch(guard, spec)
    report = server.wait_ready()
    assert report.outcome is Outcome.READY, report.evidence
    assert report.server_info, "autotune's own checks authenticate"
    assert key not in json.dumps(report.server_info)
    [(path, record)] = pidfile.records(spec.run_dir)
    assert key not in path.read_text() and "--api-key" in record.argv
    autotune_files = [p for p in tmp_path.rglob("*") if p.is_file() and p != spec.log_path]
    assert all(key not in p.read_text(errors="replace") for p in autotune_files)
    with pytest.raises(HarnessError, match="still running"):
        Server.launch(sim_spec(tmp_path), SimProbe(gpu_dir(spec)))
    # autotune is "restarted": the handle is gone, only the pidfile is left.
    done = stop_orphans(spec.run_dir, grace_s=10.0)
    assert any("stopped" in line for line in done), done
    server.process.wait(timeout=5)
    assert used(spec) == 0
    assert not pidfile.records(spec.run_dir)


# ---- the simulator as SGLang's process tree -------------------------------------------------


def _alive(pid: int) -> bool:
    info = procs.read_proc(pid)
    return info is not None and not info.gone


def _args(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").replace(b"\0", b" ").decode()


def test_teardown_of_a_tp8_tree_leaves_nothing_and_each_rank_s_memory_is_its_scheduler_s(
    tmp_path: Path, guard: Guard
) -> None:
    """The tree `ps --forest` shows for SGLang: the main process, eight schedulers and a
    detokenizer, all in the server's process group; each GPU held by its rank's scheduler. The
    teardown leaves no process of it and the memory back at zero."""
    spec = sim_spec(tmp_path, "--mem-fraction-static", "0.88")
    server = launch(guard, spec)
    assert server.wait_ready().outcome is Outcome.READY
    members = procs.members(server.record.pgid, server.record.sid)
    assert {p.pgid for p in members} == {server.record.pgid}
    children = {_args(p.pid): p.pid for p in members if p.ppid == server.pid}
    expected = [f"sglang::scheduler_TP{r}" for r in range(8)] + ["sglang::detokenizer"]
    assert sorted(children) == sorted(expected)
    assert len(members) == 10
    snapshot = SimProbe(gpu_dir(spec)).snapshot()
    for gpu in snapshot:
        assert dict(gpu.pids).keys() == {children[f"sglang::scheduler_TP{gpu.index}"]}
    down = server.stop()
    assert down.clean, down.problems
    assert procs.members(server.record.pgid, server.record.sid) == []
    assert used(spec) == 0


@pytest.mark.parametrize(
    ("version", "also"),
    [
        ("0.5.23", r"Subprocess scheduler_7 \(pid=\d+\) crashed with exit code -11\."),
        ("0.5.9", r"\[.* TP0\] Scheduler watchdog timeout \(self\.watchdog_timeout=15000\.0, "),
    ],
)
def test_a_rank_that_dies_while_its_peers_wait_in_the_collective_is_a_crash(
    tmp_path: Path, guard: Guard, version: str, also: str
) -> None:
    """`rank-dies`: the last rank's scheduler segfaults under load. 0.5.23's SubprocessWatchdog
    reports its exit code; on 0.5.9 the seven peers wait in the collective until their
    watchdogs fire (`--watchdog-timeout 15000` at a time scale of 30000: half a second). Either
    way the rank's own crash is the verdict, not the hang it caused: `crash (fatal_signal)`,
    faulthandler's line first."""
    spec = sim_spec(
        tmp_path, "--mem-fraction-static", "0.88", "--sim-version", version,
        "--sim-fault", "rank-dies=0.3", "--watchdog-timeout", "15000",
    )  # fmt: skip
    server = launch(guard, spec)
    assert server.wait_ready().outcome is Outcome.READY
    threading.Thread(target=generate, args=(server, 3000), daemon=True).start()
    death = wait_death(server)  # judged on the rank's line, while the peers still wait
    assert (death.outcome, death.cause) == (Outcome.CRASH, "fatal_signal"), death.evidence
    assert death.evidence[0] == "Fatal Python error: Segmentation fault"
    assert server.process.wait(timeout=15) == -signal.SIGKILL  # SGLang ends its own tree
    down = server.stop()
    assert down.clean, down.problems
    assert (down.outcome, down.cause) == (Outcome.CRASH, "fatal_signal"), down.evidence
    assert down.evidence[0] == "Fatal Python error: Segmentation fault"
    assert re.search(also, spec.log_path.read_text())  # what SGLang printed after the rank died
    assert used(spec) == 0


def test_orphaned_schedulers_of_a_sigkilled_main_are_killed_by_group_and_their_memory_released(
    tmp_path: Path, guard: Guard
) -> None:
    """`orphan-scheduler`: someone SIGKILLs the main process; its eight schedulers live on,
    reparented, in the server's process group, each holding its GPU. The death is `killed`; the
    teardown SIGKILLs the group, waits for each orphan and proves the memory back at zero."""
    spec = sim_spec(tmp_path, "--mem-fraction-static", "0.88", "--sim-fault", "orphan-scheduler")
    server = launch(guard, spec)
    assert server.wait_ready().outcome is Outcome.READY
    ranks = schedulers(server)
    os.kill(server.pid, signal.SIGKILL)
    death = wait_death(server)
    assert (death.outcome, death.cause) == (Outcome.KILLED, "signal:SIGKILL"), death.evidence
    holders = {pid for g in SimProbe(gpu_dir(spec)).snapshot() for pid in g.pids}
    assert holders == set(ranks)
    assert all(_alive(pid) for pid in ranks)
    down = server.stop()
    assert down.clean, down.problems
    assert "SIGKILL" in down.signals
    waited = " ".join(down.waited)
    assert all(f"pid {pid} (group member" in waited for pid in ranks), down.waited
    assert not any(_alive(pid) for pid in ranks)
    assert used(spec) == 0


def test_preflight_sees_a_foreign_leftover_s_memory_as_foreign(
    tmp_path: Path, guard: Guard
) -> None:
    """Schedulers someone else's server left behind (its main process SIGKILLed, the
    `orphan-scheduler` fault) hold the GPUs: the launch is refused, naming each orphan's pid,
    and nothing of theirs is touched."""
    shared = tmp_path / "gpu"
    log = tmp_path / "foreign.log"
    argv = [sys.executable, "-m", "autotune.sim", "--model-path", "/models/Kimi-K2.5",
            "--tp-size", "8", "--sim-time-scale", "30000", "--sim-gpu-dir", str(shared),
            "--port", "0", "--skip-server-warmup", "--sim-fault", "orphan-scheduler"]  # fmt: skip
    with log.open("wb") as fh:
        foreign = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT,
                                   start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while b"fired up" not in log.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.05)
        orphans = [p.pid for p in procs.members(foreign.pid, foreign.pid) if p.ppid == foreign.pid
                   and _args(p.pid).startswith("sglang::scheduler")]  # fmt: skip
        assert len(orphans) == 8
        foreign.kill()
        foreign.wait()
        spec = sim_spec(tmp_path)
        with pytest.raises(HarnessError, match="held by processes autotune did not start") as err:
            Server.launch(spec, SimProbe(shared))
        for rank, pid in enumerate(orphans):
            assert f"GPU {rank}: pid {pid} holds " in str(err.value)
        assert all(_alive(pid) for pid in orphans)
        assert not spec.log_path.exists()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(foreign.pid, signal.SIGKILL)
