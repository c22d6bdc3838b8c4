"""What the operator sees while a study runs.

On a terminal one status line is redrawn every second (trial k of N, phase with elapsed and
expected time, best feasible capacity, OOMs so far, ETA) under the permanent one-line summaries of
finished trials. Anywhere else (a log file, systemd's journal) the same facts are plain lines, one
per event, so nothing depends on a terminal. Formatting is pure; the clock and stream are injected.
"""

from __future__ import annotations

import shutil
import statistics
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TextIO

from autotune.config.studyfile import Scalar


@dataclass
class Tally:
    """Running figures of the study, fed by finished trials."""

    n_trials: int
    done: int = 0
    best_capacity: int | None = None
    ooms: int = 0
    trial_seconds: list[float] = field(default_factory=list)
    phase_seconds: dict[str, list[float]] = field(default_factory=dict)

    def add(
        self,
        *,
        counted: bool,
        feasible_capacity: int | None,
        oom: bool,
        phases: Mapping[str, float],
    ) -> None:
        self.done += 1 if counted else 0
        self.ooms += 1 if oom else 0
        if feasible_capacity is not None:
            self.best_capacity = max(self.best_capacity or 0, feasible_capacity)
        for name, seconds in phases.items():
            if name == "total":
                self.trial_seconds.append(seconds)
            else:
                self.phase_seconds.setdefault(name, []).append(seconds)

    def expected(self, phase: str) -> float | None:
        seen = self.phase_seconds.get(phase)
        return statistics.median(seen) if seen else None

    def eta(self, elapsed_in_trial: float, remaining_s: float | None) -> float | None:
        if not self.trial_seconds:
            return None
        per_trial = statistics.median(self.trial_seconds)
        left = max(self.n_trials - self.done, 0)
        eta = max(per_trial - elapsed_in_trial, 0.0) + per_trial * max(left - 1, 0)
        return min(eta, remaining_s) if remaining_s is not None else eta


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def params_text(params: Mapping[str, Scalar]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


def status_line(
    tally: Tally,
    *,
    k: int,
    number: int,
    phase: str,
    phase_elapsed: float,
    trial_elapsed: float,
    remaining_s: float | None,
) -> str:
    expected = tally.expected(phase)
    best = f"{tally.best_capacity:,} tok" if tally.best_capacity is not None else "none yet"
    return (
        f"trial {k}/{tally.n_trials} (#{number}) {phase} {duration(phase_elapsed)}"
        f" (expected {duration(expected)}) | best feasible {best} | OOMs {tally.ooms}"
        f" | ETA {duration(tally.eta(trial_elapsed, remaining_s))}"
    )


def finished_line(
    *,
    k: int,
    n: int,
    number: int,
    outcome: str,
    reason: str,
    capacity: int,
    throughput: float,
    headroom: float | None,
    feasible: bool | None,
    seconds: float,
) -> str:
    verdict = {True: "feasible", False: "infeasible", None: "failed"}[feasible]
    room = f", headroom {headroom:.2f} GiB" if headroom is not None else ""
    why = f" — {reason}" if reason and outcome != "ok" else ""
    return (
        f"trial {k}/{n} (#{number}) {outcome} [{verdict}]: capacity {capacity:,} tok, "
        f"{throughput:,.0f} tok/s{room}, {duration(seconds)}{why}"
    )


class Progress:
    """Live view on a terminal, plain lines elsewhere."""

    def __init__(
        self,
        stream: TextIO,
        tally: Tally,
        *,
        live: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
        deadline: float | None = None,
        refresh_s: float = 1.0,
    ) -> None:
        self._out = stream
        self.tally = tally
        self._live = stream.isatty() if live is None else live
        self._clock = clock
        self._deadline = deadline
        self._refresh_s = refresh_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._k = 0
        self._number = 0
        self._phase = ""
        self._phase_t0 = 0.0
        self._trial_t0 = 0.0
        self._drawn = False

    # events -------------------------------------------------------------------------------------

    def message(self, text: str) -> None:
        with self._lock:
            self._clear()
            self._out.write(text + "\n")
            self._redraw()
            self._out.flush()

    def trial_started(self, k: int, number: int, params: Mapping[str, Scalar]) -> None:
        now = self._clock()
        with self._lock:
            self._k, self._number, self._trial_t0 = k, number, now
            self._phase, self._phase_t0 = "launch", now
        self.message(f"trial {k}/{self.tally.n_trials} (#{number}) {params_text(params)}")
        if self._live and self._thread is None:
            self._thread = threading.Thread(target=self._tick, name="progress", daemon=True)
            self._thread.start()

    def phase(self, name: str) -> None:
        with self._lock:
            self._phase, self._phase_t0 = name, self._clock()
        if not self._live:
            self.message(self._status())
        else:
            with self._lock:
                self._redraw()
                self._out.flush()

    def trial_finished(self, line: str) -> None:
        with self._lock:
            self._phase = ""
        self.message(line)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        with self._lock:
            self._clear()
            self._out.flush()

    # drawing ------------------------------------------------------------------------------------

    def _status(self) -> str:
        now = self._clock()
        remaining = None if self._deadline is None else max(self._deadline - now, 0.0)
        return status_line(
            self.tally,
            k=self._k,
            number=self._number,
            phase=self._phase,
            phase_elapsed=now - self._phase_t0,
            trial_elapsed=now - self._trial_t0,
            remaining_s=remaining,
        )

    def _redraw(self) -> None:
        if self._live and self._phase:
            width = shutil.get_terminal_size((120, 24)).columns - 1
            self._out.write("\r\x1b[K" + self._status()[:width])
            self._drawn = True

    def _clear(self) -> None:
        if self._drawn:
            self._out.write("\r\x1b[K")
            self._drawn = False

    def _tick(self) -> None:
        while not self._stop.wait(self._refresh_s):
            with self._lock:
                self._clear()
                self._redraw()
                self._out.flush()
