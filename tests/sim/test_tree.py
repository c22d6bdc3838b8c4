"""The simulator as SGLang's process tree: one main process, a scheduler per TP rank, a
detokenizer; each rank's GPU memory held by its scheduler's pid; deaths that travel the tree as
SGLang's do (a rank's SIGQUIT, the SubprocessWatchdog, the peers' watchdogs, an orphan)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
import time

import pytest

from autotune.sim.gpustate import read_gpu_state
from tests.sim.conftest import KIMI, SMALL, Launcher, SimProcess, group_alive
from tests.sim.http import sse_events

pytestmark = pytest.mark.e2e
TP8 = [*KIMI, "--mem-fraction-static", "0.88"]
V23 = ["--sim-version", "0.5.23"]
V9 = ["--sim-version", "0.5.9"]
SCHEDULERS = [f"sglang::scheduler_TP{r}" for r in range(8)]


def forest(sim: SimProcess) -> str:
    """`ps -o pid,ppid,pgid,args --forest` of the server's process group."""
    out = subprocess.run(
        ["ps", "-o", "pid,ppid,pgid,args", "--forest", "-g", str(sim.pgid)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return out.stdout


def load(sim: SimProcess, tokens: int = 400) -> threading.Thread:
    """A streamed request kept in flight in the background (a batch runs)."""
    body = {"text": "go", "stream": True,
            "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True}}  # fmt: skip

    def run() -> None:
        with contextlib.suppress(Exception):  # the server dies under it
            sse_events(f"{sim.base}/generate", body, timeout=30)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    return worker


def test_a_tp8_server_is_one_main_eight_schedulers_and_a_detokenizer(launch_sim: Launcher) -> None:
    sim = launch_sim(TP8, scale=5000)
    sim.wait_ready()
    group = sim.group()
    main = [p for p in group if p[0] == sim.proc.pid]
    assert len(main) == 1 and "-m autotune.sim" in main[0][3]
    children = sim.children()
    assert sorted(children) == sorted([*SCHEDULERS, "sglang::detokenizer"]), forest(sim)
    assert len(group) == 10 and all(p[2] == sim.pgid for p in group)  # one process group
    assert all(os.getsid(pid) == os.getsid(sim.proc.pid) for pid in children.values())
    tree = forest(sim)
    assert tree.count(r" \_ sglang::scheduler_TP") == 8 and r" \_ sglang::detokenizer" in tree
    gpus = read_gpu_state(sim.gpu_dir)
    for gpu in gpus:  # each GPU held by its rank's scheduler, none by the main process
        assert gpu.processes.keys() == {children[f"sglang::scheduler_TP{gpu.index}"]}
        assert gpu.used_bytes > 80 * 2**30
    sim.proc.send_signal(signal.SIGTERM)
    sim.wait_exit()
    deadline = time.monotonic() + 5
    while group_alive(sim.pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not group_alive(sim.pgid)
    assert all(g.used_bytes == 0 for g in read_gpu_state(sim.gpu_dir))


def test_one_rank_is_sglang_scheduler_without_a_tp_tag(launch_sim: Launcher) -> None:
    sim = launch_sim(SMALL)
    sim.wait_ready()
    assert sorted(sim.children()) == ["sglang::detokenizer", "sglang::scheduler"]


def test_a_failing_rank_writes_its_exception_then_its_sigquit_ends_the_tree(
    launch_sim: Launcher,
) -> None:
    sim = launch_sim([*KIMI, "--mem-fraction-static", "0.95"], scale=5000)
    assert sim.wait_exit() == -signal.SIGKILL
    log = sim.log()
    ranks = [log.index(f"TP{r}] Scheduler hit an exception: Traceback") for r in range(8)]
    assert ranks == sorted(ranks)  # every rank's own lines, in rank order
    quit_line = log.index("Received sigquit from a child process. It usually means the child")
    assert quit_line > ranks[-1]
    assert not group_alive(sim.pgid)
    assert all(g.used_bytes == 0 for g in read_gpu_state(sim.gpu_dir))


def test_the_oom_killer_s_rank_is_reaped_with_its_real_exit_code(launch_sim: Launcher) -> None:
    sim = launch_sim([*SMALL, *V23, "--sim-fault", "oom-kill-startup"])
    assert sim.wait_exit() == 1
    assert "Rank 0 scheduler died during initialization (exit code: -9)." in sim.log()
    assert not group_alive(sim.pgid)


def test_rank_dies_0523_the_subprocess_watchdog_names_it_and_the_tree_goes(
    launch_sim: Launcher,
) -> None:
    sim = launch_sim([*TP8, *V23, "--sim-fault", "rank-dies=0.2"], scale=5000)
    sim.wait_ready()
    tp7 = sim.children()["sglang::scheduler_TP7"]
    assert sim.wait_exit(15) == -signal.SIGKILL
    log = sim.log()
    assert "Fatal Python error: Segmentation fault" in log
    assert (f"] Subprocess scheduler_7 (pid={tp7}) crashed with exit code -11. Triggering "
            "SIGQUIT for cleanup...") in log  # fmt: skip
    assert log.index("Fatal Python error") < log.index("Subprocess scheduler_7")
    assert "SIGQUIT received. signum=None, frame=None. It usually means one child failed." in log
    assert "watchdog timeout" not in log
    assert not group_alive(sim.pgid)


def test_rank_dies_059_its_peers_wait_in_the_collective_until_their_watchdogs(
    launch_sim: Launcher,
) -> None:
    args = [*TP8, *V9, "--sim-fault", "rank-dies=0.3", "--watchdog-timeout", "5000"]
    sim = launch_sim(args, scale=5000)  # the watchdog fires 1 s after the death
    sim.wait_ready()
    load(sim)
    assert sim.wait_for("Fatal Python error: Segmentation fault", 10)
    time.sleep(0.3)
    assert sim.proc.poll() is None  # the peers hang: alive, holding their memory
    held = {g.index: set(g.processes) for g in read_gpu_state(sim.gpu_dir)}
    assert all(held[i] for i in range(7)) and not held[7]
    assert sim.wait_exit(15) == -signal.SIGKILL
    log = sim.log()
    lines = re.findall(r"\[[\d\- :]+ TP(\d)\] Scheduler watchdog timeout "
                       r"\(self\.watchdog_timeout=5000\.0, self\.soft=False\)", log)  # fmt: skip
    assert sorted(lines) == [str(r) for r in range(7)]
    assert log.index("Fatal Python error") < log.index("Scheduler watchdog timeout")
    assert "SIGQUIT received. signum=None, frame=None. It usually means one child failed." in log
    assert "Subprocess scheduler_" not in log  # 0.5.9 has no SubprocessWatchdog
    assert not group_alive(sim.pgid)


def test_orphan_schedulers_outlive_a_sigkilled_parent_holding_their_memory(
    launch_sim: Launcher,
) -> None:
    sim = launch_sim([*TP8, "--sim-fault", "orphan-scheduler"], scale=5000)
    sim.wait_ready()
    ranks = {t: p for t, p in sim.children().items() if t.startswith("sglang::scheduler")}
    os.kill(sim.proc.pid, signal.SIGKILL)
    sim.proc.wait(timeout=10)
    time.sleep(0.3)
    alive = {p[0]: p for p in sim.group()}
    assert set(ranks.values()) <= alive.keys()  # every scheduler lives on, in the group
    assert all(alive[pid][1] != sim.proc.pid for pid in ranks.values())  # reparented
    assert not any("detokenizer" in p[3] for p in alive.values())  # it died with its parent
    gpus = read_gpu_state(sim.gpu_dir)
    for gpu in gpus:
        assert gpu.processes.keys() == {ranks[f"sglang::scheduler_TP{gpu.index}"]}
    os.killpg(sim.pgid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while group_alive(sim.pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(g.used_bytes == 0 for g in read_gpu_state(sim.gpu_dir))


def test_without_the_fault_the_schedulers_die_with_their_parent(launch_sim: Launcher) -> None:
    sim = launch_sim(TP8, scale=5000)
    sim.wait_ready()
    os.kill(sim.proc.pid, signal.SIGKILL)  # only the main process: PR_SET_PDEATHSIG does the rest
    sim.proc.wait(timeout=10)
    deadline = time.monotonic() + 5
    while group_alive(sim.pgid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not group_alive(sim.pgid)
    assert all(g.used_bytes == 0 for g in read_gpu_state(sim.gpu_dir))
