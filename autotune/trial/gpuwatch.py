"""The GPU probe read while a live trial runs: the free memory and the peak sampled in a thread
under load (`FreeMemoryWatch`: the measured headroom and `stress_peak_gib`), and a reading
taken once it settles (`settled_usage`, after `/flush_cache`, for `trial.growth`).

Kept apart from the live launcher (`trial.live`) because these only read a `GpuProbe`: they hold
no server, and are tested with a scripted probe.
"""

from __future__ import annotations

import threading
import time

from autotune.errors import HarnessError
from autotune.server.gpu import GpuProbe

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


class FreeMemoryWatch:
    """Samples the GPU probe in a thread; `min_free_gib` is the least free memory seen on the
    server's GPUs (those it holds memory on) while the workload ran: the measured headroom."""

    def __init__(self, probe: GpuProbe, devices: tuple[int, ...] | None) -> None:
        self._probe = probe
        self._devices = devices
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="headroom", daemon=True)
        self.min_free_gib: float | None = None
        self._first_used: dict[int, int] = {}
        self._max_used: dict[int, int] = {}

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
