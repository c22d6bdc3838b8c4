"""What must be true before a server is launched, checked rather than assumed.

* no server autotune started earlier under the same run folder still runs (its pidfile says so:
  its main process, or any process of its group, session or recorded members, such as a
  scheduler the kernel still holds after SIGKILL);
* the port is free;
* no process autotune did not start holds memory on the GPUs the server will use: a leftover
  process lowers P, the free memory SGLang sizes its pool from, and silently shrinks the KV pool
  (reference §7.3). The policy is to refuse, to wait (bounded), or to ignore.

Each failed check is a `HarnessError` whose message names what is in the way and what to do.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Collection
from pathlib import Path

from autotune.errors import HarnessError, UsageError
from autotune.server import pidfile
from autotune.server.gpu import GpuMemory, GpuProbe, foreign_holders
from autotune.server.teardown import live_processes, port_is_free

FOREIGN_POLICIES = ("refuse", "wait", "ignore")


def running_servers(run_dir: Path) -> list[pidfile.PidRecord]:
    """Servers autotune started under `run_dir` of which some process still runs."""
    return [record for _, record in pidfile.records(run_dir) if live_processes(record)]


def _listed(record: pidfile.PidRecord) -> str:
    others = sorted(p.pid for p in live_processes(record) if p.pid != record.pid)
    still = f"; its processes {', '.join(map(str, others))} still run" if others else ""
    return f"pid {record.pid} (port {record.port}{still})"


def check_no_server_running(run_dir: Path) -> None:
    """Refuse (`HarnessError`) while a server autotune started under `run_dir` still runs: two
    servers on one GPU group would size their pools from each other's leftovers."""
    alive = running_servers(run_dir)
    if alive:
        listed = ", ".join(_listed(r) for r in alive)
        raise HarnessError(
            f"a server autotune started earlier is still running: {listed}; "
            "stop it first (autotune stops such servers when a study resumes)"
        )


def check_port(host: str, port: int) -> None:
    """Refuse (`HarnessError`) when another process listens on `port`: SGLang would fail to bind it
    after loading its weights."""
    if not port_is_free(host, port):
        raise HarnessError(
            f"port {port} on {host} is in use by another process; free it or choose another port"
        )


def gpu_baseline(
    probe: GpuProbe,
    devices: Collection[int] | None,
    policy: str,
    wait_s: float,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> list[GpuMemory]:
    """The pre-launch snapshot, once no stranger holds memory on `devices` (per `policy`)."""
    if policy not in FOREIGN_POLICIES:
        raise UsageError(f"foreign_gpu={policy!r}: use one of {', '.join(FOREIGN_POLICIES)}")
    deadline = clock() + wait_s
    while True:
        snapshot = probe.snapshot()
        foreign = foreign_holders(snapshot, (), devices)
        if not foreign or policy == "ignore":
            return snapshot
        if policy == "refuse" or clock() >= deadline:
            waited = "" if policy == "refuse" else f" after waiting {wait_s:g} s"
            raise HarnessError(
                f"GPU memory is held by processes autotune did not start{waited} "
                f"({'; '.join(foreign)}); they would shrink the KV pool. "
                "Stop them, or set the policy to wait or ignore"
            )
        sleep(min(5.0, max(0.1, deadline - clock())))


def free_port(host: str) -> int:
    """A port the OS says is free now (bind to 0); the server binds it moments later."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
