"""The GPU probe read while a live trial runs: the free memory and the peak sampled in a thread
under load (`FreeMemoryWatch`: the measured headroom and `stress_peak_gib`), and a reading
taken once it settles (`settled_usage`, after `/flush_cache`, for `trial.growth`).

Kept apart from the live launcher (`trial.live`) because these only read a `GpuProbe`: they hold
no server, and are tested with a scripted probe.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection

from autotune.errors import HarnessError
from autotune.server.gpu import GpuMemory, GpuProbe
from autotune.server.procs import process_name

HEADROOM_POLL_S = 0.2
PROBE_ERRORS = (HarnessError, OSError, ValueError)
"""What a GPU probe's snapshot raises when it cannot be read: that sample is missing."""
SETTLE_S = 1.0
"""How long a reading after `/flush_cache` may take to settle: NVML follows the driver at once;
the simulator's GPU-state file is written beside the HTTP answer."""
SETTLE_POLL_S = 0.05


def settled_usage(probe: GpuProbe, devices: tuple[int, ...] | None) -> dict[int, int] | None:
    """Bytes in use per selected GPU once two successive readings agree (or `SETTLE_S` passed);
    None when the probe cannot be read."""
    deadline = time.monotonic() + SETTLE_S
    last: dict[int, int] | None = None
    while True:
        try:
            snapshot = probe.snapshot()
        except PROBE_ERRORS:
            return None
        now = {g.index: g.used for g in snapshot if devices is None or g.index in devices}
        if now == last or time.monotonic() >= deadline:
            return now
        last = now
        time.sleep(SETTLE_POLL_S)


INTRUDER_BYTES = 256 * 2**20
"""How much GPU memory a process autotune did not start may take while the server starts or
serves before the trial's measurements are not the parameters' own: about a CUDA context's."""
PROXIES = ("nvidia-cuda-mps",)
"""Processes that hold GPU memory on behalf of their clients (the MPS server, which NVML lists
with the memory of every client process under MPS): never a stranger."""


class FreeMemoryWatch:
    """Samples the GPU probe in a thread; `min_free_gib` is the least free memory seen on the
    server's GPUs (those it holds memory on) while the workload ran: the measured headroom.

    With `ours` (the server's processes, asked again whenever a pid it has not classed shows on
    a GPU), it also keeps what every other process took on those GPUs while the workload ran
    (`intruders`): memory that moved the free memory and the peak, and may have ended the server,
    without the parameters having a part in it."""

    def __init__(
        self,
        probe: GpuProbe,
        devices: tuple[int, ...] | None,
        ours: Callable[[], Collection[int]] | None = None,
    ) -> None:
        self._probe = probe
        self._devices = devices
        self._ours_now = ours
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="headroom", daemon=True)
        self.min_free_gib: float | None = None
        self._first_used: dict[int, int] = {}
        self._max_used: dict[int, int] = {}
        self._ours: set[int] = set()
        self._proxies: set[int] = set()
        """Holders on behalf of others (`PROXIES`), kept across refreshes of `_ours`."""
        self._first_foreign: dict[tuple[int, int], int] = {}
        self._max_foreign: dict[tuple[int, int], int] = {}
        self._sampled = False
        self._names: dict[int, str] = {}
        self._our_gpus: set[int] = set()

    def intruders(self, while_: str = "the workload ran") -> list[str]:
        """One line per process autotune did not start that took more than `INTRUDER_BYTES` on
        a GPU the server's processes hold memory on while the watch ran (`while_` says when, in
        the line; empty: none, or no `ours` to tell them by)."""
        out = []
        for (index, pid), top in sorted(self._max_foreign.items()):
            if index not in self._our_gpus:
                continue  # a GPU the server holds nothing on: another job's own
            took = top - self._first_foreign[(index, pid)]
            if took > INTRUDER_BYTES:
                name = self._names.get(pid, "?")
                out.append(
                    f"GPU {index}: pid {pid} ({name}), a process autotune did not start, took "
                    f"{took / 2**30:.2f} GiB while {while_}"
                )
        return out

    @property
    def peak_gib(self) -> float | None:
        """The transient peak: the most memory in use minus what was in use at the start."""
        rises = [self._max_used[i] - first for i, first in self._first_used.items()]
        return max(rises) / 2**30 if rises else None

    def __enter__(self) -> FreeMemoryWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self._sample()  # the state the workload ended in, however it ended

    def _run(self) -> None:
        while True:
            self._sample()
            if self._stop.wait(HEADROOM_POLL_S):
                return

    def _sample(self) -> None:
        try:
            snapshot = self._probe.snapshot()
        except PROBE_ERRORS:
            return
        gpus = [g for g in snapshot if self._devices is None or g.index in self._devices]
        busy = [g for g in gpus if g.used > 0] or gpus
        for g in busy:
            self._first_used.setdefault(g.index, g.used)
            self._max_used[g.index] = max(self._max_used.get(g.index, 0), g.used)
        if busy:
            free = min(g.free for g in busy) / 2**30
            self.min_free_gib = free if self.min_free_gib is None else min(self.min_free_gib, free)
        if self._ours_now is not None:
            self._foreign(busy)

    def _foreign(self, gpus: list[GpuMemory]) -> None:
        """Each other process's use of `gpus`, from the first sample it showed in (0 for one that
        came later), and which GPUs the server's own processes hold memory on."""
        assert self._ours_now is not None
        for g in gpus:
            for pid, used in g.pids.items():
                if pid in self._ours:
                    self._our_gpus.add(g.index)
                    continue
                key = (g.index, pid)
                if key not in self._first_foreign:
                    self._ours = {*self._ours_now(), *self._proxies}
                    if pid in self._ours:
                        self._our_gpus.add(g.index)
                        continue
                    name = self._names.setdefault(pid, process_name(pid))  # while it runs
                    if name.startswith(PROXIES):
                        self._proxies.add(pid)
                        self._ours.add(pid)
                        continue
                    self._first_foreign[key] = 0 if self._sampled else used
                self._max_foreign[key] = max(self._max_foreign.get(key, 0), used)
        self._sampled = True
