"""After a stop: waiting until a server's GPU memory is back at the pre-launch baseline and its
port is free, and naming what still holds them (`wait_released`).

Kept apart from the handle (`server.lifecycle.Server`) and from stopping the processes
(`server.teardown`): this reads the GPU probe and the port, never signals anything, and judges
memory against the baseline taken before the launch, counting every pid seen of the server
(`procs.Seen`) as the server's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from autotune.server import deaths, procs
from autotune.server.gpu import GiB, GpuMemory, GpuProbe, unreleased
from autotune.server.launchspec import LaunchSpec
from autotune.server.teardown import Clock, Sleep, port_is_free


def wait_released(
    spec: LaunchSpec,
    probe: GpuProbe | None,
    baseline: Sequence[GpuMemory],
    seen: procs.Seen,
    started: float,
    deadline: float,
    *,
    clock: Clock,
    sleep: Sleep,
) -> tuple[list[str], list[str], bool]:
    """Wait until GPU memory is back at the baseline and the port is free, up to `deadline`.
    Every pid of the server seen is ours here, so memory its schedulers still hold is waited
    for rather than taken for a newcomer's. A port another process listens on (one that took
    it while the server started) is not ours to wait for: it is named in the record and the
    port counts as released. Returns the problems, what was waited for, and whether the port
    is free."""
    devices = spec.devices()
    holders: dict[int, dict[int, int]] = {}
    held_by: dict[int, dict[int, int]] = {}
    waited = busy = False
    taken = ""
    looked = float("-inf")
    while True:
        problems: list[str] = []
        if probe is not None:
            ours = seen.pids_now()
            snapshot = probe.snapshot()
            problems = unreleased(baseline, snapshot, ours, devices, spec.gpu_tolerance_bytes)
            holders = _holders(snapshot, ours, devices)
            for pid, gpus in holders.items():
                held_by.setdefault(pid, {}).update(gpus)
        port_free = port_is_free(spec.host, spec.port)
        if not port_free and clock() - looked >= 0.5:  # one /proc scan per look
            looked = clock()
            taken = deaths.port_line(spec.host, spec.port, seen.pids_now())
        port_free = port_free or bool(taken)
        if (not problems and port_free) or clock() >= deadline:
            break
        waited = waited or bool(problems)
        busy = busy or not port_free
        sleep(0.05)
    elapsed = clock() - started
    budget = spec.stop_grace_s + spec.release_s
    record: list[str] = []
    if problems:
        who = _describe(seen, holders, "holds") or "no process of the server holds it"
        head = (
            f"GPU memory not back at the baseline {elapsed:.1f} s after the stop began, past "
            f"the teardown budget (stop_grace_s + release_s = {budget:g} s): {who}"
        )
        problems = [head, *(p for p in problems if "our pid" not in p)]
    elif waited:
        who = _describe(seen, held_by, "held") or "no process of the server held it"
        back = f"GPU memory back at the baseline {elapsed:.2f} s after the stop began"
        record.append(f"{back}, waited for: {who}")
    if taken:
        record.append(f"{taken}; not waited for")
    elif busy and port_free:
        record.append(f"port {spec.port} free {elapsed:.2f} s after the stop began")
    return problems, record, port_free


def _describe(seen: procs.Seen, holders: Mapping[int, Mapping[int, int]], verb: str) -> str:
    """`pid P (main process, exited) holds 90.00 GiB on GPUs 0-7`, one per holder."""
    parts = []
    for pid, gpus in sorted(holders.items()):
        info = procs.read_proc(pid)
        live = info is not None and not info.gone
        state = f"state {procs.describe_state(info.state)}" if live and info else "exited"
        total = sum(gpus.values()) / GiB
        where = _gpu_list(sorted(gpus))
        role = seen.role_of(pid)
        parts.append(f"pid {pid} ({role}, {state}) {verb} {total:.2f} GiB on {where}")
    return ", ".join(parts)


def _holders(
    snapshot: Sequence[GpuMemory], ours: set[int], devices: tuple[int, ...] | None
) -> dict[int, dict[int, int]]:
    """Our pids holding memory on the selected GPUs: pid -> GPU index -> bytes."""
    out: dict[int, dict[int, int]] = {}
    for gpu in snapshot:
        if devices is not None and gpu.index not in devices:
            continue
        for pid, used in gpu.pids.items():
            if pid in ours:
                out.setdefault(pid, {})[gpu.index] = used
    return out


def _gpu_list(indices: Sequence[int]) -> str:
    """`GPU 3`, `GPUs 0-7`, `GPUs 0, 2, 5`."""
    if len(indices) == 1:
        return f"GPU {indices[0]}"
    if list(indices) == list(range(indices[0], indices[-1] + 1)):
        return f"GPUs {indices[0]}-{indices[-1]}"
    return "GPUs " + ", ".join(map(str, indices))
