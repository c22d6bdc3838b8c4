"""Whether a server's processes were stopped by a signal from outside while its workload ran.

A stop shorter than the stall watchdog's `stall_s` ends nothing: the server resumes on SIGCONT
and the workload goes on, but every request that waited on it waited for the stop too, so the
throughput and the latencies measured are not the parameters' own. SGLang never stops itself,
so a process in state T (`server.procs.stopped_of`) is someone else's doing; a thread samples
the server's processes every `STOP_POLL_S` while the workload runs and keeps each stop it saw.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection

from autotune.server.procs import process_name, stopped_of

STOP_POLL_S = 0.5
"""How often the server's processes are read while the workload runs: a stop shorter than this
may pass unseen, and one that short moves the figures by less than the run-to-run noise."""


class StopWatch:
    """Samples the states of `pids` (the server's processes, taken before the workload) in a
    thread; `stops()` names each one seen stopped and for how long it was seen so."""

    def __init__(self, pids: Collection[int], poll_s: float = STOP_POLL_S) -> None:
        self._pids = frozenset(pids)
        self._poll_s = poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stopped", daemon=True)
        self._seen: dict[int, tuple[float, float]] = {}
        self._names: dict[int, str] = {}

    def __enter__(self) -> StopWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            now = time.monotonic()
            for pid in stopped_of(self._pids):
                first, _ = self._seen.get(pid, (now, now))
                self._seen[pid] = (first, now)
                self._names.setdefault(pid, process_name(pid))
            if self._stop.wait(self._poll_s):
                return

    def stops(self, while_: str = "the workload ran") -> list[str]:
        """One line per server process seen stopped (empty: none)."""
        return [
            f"pid {pid} ({self._names.get(pid, '?')}) was stopped by a signal from outside for "
            f"about {max(last - first, self._poll_s):.1f} s while {while_} (SGLang never stops "
            "itself): what the workload measured is not the parameters' own"
            for pid, (first, last) in sorted(self._seen.items())
        ]
