"""autotune's own clock, watched while a trial runs: a paused autotune is a disturbed measurement.

A laptop lid, a VM migration, Ctrl-Z or `kill -STOP` stops autotune while the server under test
goes on. The workload driver then sends nothing and reads nothing; when autotune runs again its
figures hold the pause (a throughput divided by time nobody served, a TTFT as long as the stop)
and its watchdogs (the stall rule, `workload_s`, the startup limits) take the pause for the
server's. Neither is the server's result, so a trial during which autotune was paused for more
than `server.limits.pause_s` in all (launch to the end of the workload) is failed as
`disturbed` and its point runs again (`Outcome.DISTURBED`, `Outcome.requeued`).

How a pause is seen (`ClockWatch`):

* a thread looks at the clocks every `TICK_S` and finds more time gone than it waited. A stopped
  process sees the jump on CLOCK_MONOTONIC and CLOCK_BOOTTIME alike; a suspended machine on
  CLOCK_BOOTTIME only (Linux stops CLOCK_MONOTONIC during suspend), so both are read and the
  larger jump counts;
* the process's CPU time over the jump tells a pause from a busy autotune: one long call that
  holds the interpreter (a thread waiting for its turn) burns CPU, a stopped process burns none.
  The pause is the jump less that CPU time, and only jumps of `LEAST_PAUSE_S` or more count;
* SIGCONT, when it arrives: its handler proves the process was stopped (SIGSTOP, Ctrl-Z), and
  the reason says so. A SIGCONT alone is no pause (the kernel sends one with every terminal
  hang-up, and `kill -CONT` to a running process is harmless): only the measured jump counts.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from types import FrameType, TracebackType

TICK_S = 0.25
"""How often the watching thread looks at the clocks."""
LEAST_PAUSE_S = 1.0
"""A jump shorter than this is the scheduler's, not a pause (the thread woke late)."""
SIGCONT_WINDOW_S = 2.0
"""A SIGCONT this close to a jump explains it (the handler and the thread wake together)."""
MEASURED_PHASES = ("launch", "startup", "workload")
"""The phases whose pauses disturb what the trial measures; a pause in the teardown does not."""

Clock = Callable[[], float]


def boottime() -> float:
    """CLOCK_BOOTTIME (it counts a suspend); CLOCK_MONOTONIC where the system has no such clock."""
    clock_id = getattr(time, "CLOCK_BOOTTIME", None)
    if clock_id is None:
        return time.monotonic()
    return time.clock_gettime(clock_id)


@dataclass(frozen=True)
class Pause:
    """One stretch during which autotune did not run: `seconds` long, seen in `phase` at
    `at` (on the watch's monotonic clock); `suspended` when only CLOCK_BOOTTIME moved (the
    whole machine slept)."""

    seconds: float
    phase: str
    at: float
    suspended: bool = False


@dataclass(eq=False)
class ClockWatch:
    """Watches autotune's clocks for pauses while a trial runs (see the module docstring).

    As a context manager it starts the watching thread and, on the main thread, a SIGCONT
    handler; `look` is the thread's one step, public so that tests drive it with injected
    clocks. It owns its settings as given (`tick_s` between looks, `least_s` the shortest jump
    that counts, the three clocks it reads), the pauses and SIGCONTs seen so far, and the thread
    and handler it installed. `phase` names the trial's phase the pauses are attributed to
    (`following` keeps it current)."""

    _: KW_ONLY
    tick_s: float = TICK_S
    least_s: float = LEAST_PAUSE_S
    monotonic: Clock = time.monotonic
    boot: Clock = boottime
    cpu: Clock = time.process_time
    phase: str = field(init=False, default="")
    _lock: threading.Lock = field(init=False, repr=False, default_factory=threading.Lock)
    _pauses: list[Pause] = field(init=False, repr=False, default_factory=list)
    _sigconts: list[float] = field(init=False, repr=False, default_factory=list)
    _last: tuple[float, float, float] = field(init=False, repr=False)
    """The clocks at the last look (first read when the watch is made)."""
    _stop: threading.Event = field(init=False, repr=False, default_factory=threading.Event)
    _thread: threading.Thread | None = field(init=False, repr=False, default=None)
    _previous: signal.Handlers | Callable[[int, FrameType | None], object] | int | None = field(
        init=False, repr=False, default=None
    )
    """SIGCONT's handler before ours, put back on exit."""
    _handling: bool = field(init=False, repr=False, default=False)

    def __post_init__(self) -> None:
        self._last = self._read()

    # the watching -------------------------------------------------------------------------------

    def _read(self) -> tuple[float, float, float]:
        return self.monotonic(), self.boot(), self.cpu()

    def look(self, waited_s: float | None = None) -> Pause | None:
        """Read the clocks; a `Pause` when more than `waited_s` (the tick) plus `least_s` went by
        since the last look and autotune did not spend it on the CPU."""
        waited = self.tick_s if waited_s is None else waited_s
        with self._lock:  # one look at a time: a jump is counted once
            now = self._read()
            (m0, b0, c0), (m1, b1, c1) = self._last, now
            self._last = now
            on_monotonic, on_boot = m1 - m0, b1 - b0
            gap = max(on_monotonic, on_boot) - waited
            if gap < self.least_s:
                return None
            seconds = gap - max(c1 - c0, 0.0)
            if seconds < self.least_s:
                return None  # autotune was busy, not stopped
            pause = Pause(
                seconds=seconds,
                phase=self.phase,
                at=m1,
                suspended=on_boot - on_monotonic >= self.least_s,
            )
            self._pauses.append(pause)
        return pause

    def sigcont(self) -> None:
        """A SIGCONT arrived (called by its handler, or by a test). It takes no lock: the handler
        runs on the main thread, which may hold the lock where the signal lands (one append is
        atomic)."""
        self._sigconts.append(self.monotonic())

    def following(self, phase: Callable[[str], None]) -> Callable[[str], None]:
        """`phase`, which also tells the watch which phase the trial is in."""

        def both(name: str) -> None:
            self.phase = name
            phase(name)

        return both

    # what it saw --------------------------------------------------------------------------------

    @property
    def pauses(self) -> tuple[Pause, ...]:
        """The pauses seen so far, in order (a copy: the watching thread may add more)."""
        with self._lock:
            return tuple(self._pauses)

    def paused_s(self, phases: tuple[str, ...] = MEASURED_PHASES) -> float:
        """Seconds autotune was paused in all during `phases`."""
        return sum(p.seconds for p in self.pauses if p.phase in phases)

    def disturbance(self, limit_s: float, phases: tuple[str, ...] = MEASURED_PHASES) -> str:
        """Why the trial's measurement is not the server's, one line, when autotune was paused
        more than `limit_s` in all during `phases`; "" otherwise. Example: `autotune was paused
        20.3 s during workload (SIGCONT received)`."""
        seen = [p for p in self.pauses if p.phase in phases]
        total = sum(p.seconds for p in seen)
        if total <= limit_s:
            return ""
        where: dict[str, float] = {}
        for p in seen:
            where[p.phase] = where.get(p.phase, 0.0) + p.seconds
        if len(seen) == 1:
            text = f"autotune was paused {total:.1f} s during {seen[0].phase}"
        else:
            parts = ", ".join(f"{s:.1f} s during {name}" for name, s in where.items())
            text = f"autotune was paused {total:.1f} s in all ({len(seen)} pauses: {parts})"
        why = []
        if self._explained(seen):
            why.append("SIGCONT received")
        if any(p.suspended for p in seen):
            why.append("the machine was suspended: CLOCK_BOOTTIME moved, CLOCK_MONOTONIC did not")
        return text + (f" ({'; '.join(why)})" if why else "")

    def _explained(self, seen: list[Pause]) -> bool:
        conts = list(self._sigconts)
        return any(abs(c - p.at) <= SIGCONT_WINDOW_S for p in seen for c in conts)

    # the thread and the handler -----------------------------------------------------------------

    def __enter__(self) -> ClockWatch:
        self._last = self._read()
        self._install()
        self._thread = threading.Thread(target=self._run, name="clockwatch", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self._uninstall()

    def _run(self) -> None:
        while not self._stop.wait(self.tick_s):
            self.look()

    def _install(self) -> None:
        """SIGCONT's handler, on the main thread only (elsewhere Python refuses one); it is
        made restartable so a system call it lands in is resumed rather than interrupted."""

        def handler(signum: int, frame: FrameType | None) -> None:
            self.sigcont()

        try:
            self._previous = signal.signal(signal.SIGCONT, handler)
        except ValueError:  # not the main thread
            return
        signal.siginterrupt(signal.SIGCONT, False)
        self._handling = True

    def _uninstall(self) -> None:
        if self._handling:
            signal.signal(signal.SIGCONT, self._previous or signal.SIG_DFL)
            self._handling = False
