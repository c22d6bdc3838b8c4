"""What the operator sees while a study runs.

On a terminal one status line is redrawn every second (trial k of N, phase with elapsed and
expected time, best feasible capacity, OOMs so far, ETA) under the permanent one-line summaries of
finished trials. Anywhere else (a log file, systemd's journal) the same facts are plain lines, one
per event, so nothing depends on a terminal. Formatting is pure; the clock and stream are injected.

The times are honest from the first trial on: before a phase has been seen, its expected time
comes from the study's workload (the steady and Poisson phases' durations), and an ETA that
rests on a phase not timed yet (the first startup) is shown as a lower bound, `ETA ≥ 6h40m`.
During the workload the line names the workload's phase (`agents`, `stress-1`) once a trial has
timed them, and the plan (`warmup → agents 15m00s → stress`) before. After Ctrl-C the teardown
says what it waits for: the server draining its requests, up to the study's grace period.

`warnings_before_launch` is the other thing the operator reads before the first launch: one line
per setting that will make the night say less than it could (a workload that cannot fill the
searched request slots, flags the simulator profile cannot serve, a host cache smaller than the
device pool). They warn; they do not refuse.
"""

from __future__ import annotations

import math
import shutil
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, TextIO

from autotune.config.schema import (
    FRACTION,
    HICACHE,
    REQUESTS,
    Choices,
    Fixed,
    FloatRange,
    IntRange,
    Param,
    Scalar,
    StudyConfig,
)
from autotune.config.space import fraction_step, snap
from autotune.config.workload import Poisson, Steady, Stress, Warmup, WorkloadSpec
from autotune.memory.cell import cell_from_geometry
from autotune.memory.pool import pool_tokens
from autotune.record.view import TrialView
from autotune.sim.profiles import Profile

TRIAL_PHASES = ("launch", "startup", "workload", "teardown")
NOT_LAUNCHED = "not launched: "
"""How the reason of a trial recorded without a launch begins (a full disk, a refused host
cache); its line says so instead of figures it never measured."""


class Planned(NamedTuple):
    """One phase of the workload as the study file plans it: its name, kind and duration (None
    when only a run can tell: warm-up and stress phases end when their requests do)."""

    name: str
    kind: str
    seconds: float | None


def workload_plan(
    spec: WorkloadSpec, checked: Mapping[str, float] | None = None
) -> tuple[Planned, ...]:
    """The workload's phases as the progress line and the check's night plan plan them: steady
    and Poisson phases with their durations, a stress phase with the round `autotune check`
    timed (`checked`, seconds by phase name) times its rounds, warmup and stress phases whose
    length only a timed trial tells."""
    out = []
    for ph in spec.phases:
        if isinstance(ph, Steady | Poisson):
            out.append(Planned(ph.name, "steady" if isinstance(ph, Steady) else "poisson",
                               ph.duration_s))  # fmt: skip
        elif isinstance(ph, Stress):
            one = (checked or {}).get(ph.name)
            out.append(Planned(ph.name, "stress", one * ph.rounds if one is not None else None))
        elif isinstance(ph, Warmup):
            out.append(Planned(ph.name, "warmup", None))
    return tuple(out)


@dataclass
class Tally:
    """Running figures of the study, fed by finished trials, and its workload's plan."""

    n_trials: int
    done: int = 0
    best_capacity: int | None = None
    ooms: int = 0
    trial_seconds: list[float] = field(default_factory=list)
    phase_seconds: dict[str, list[float]] = field(default_factory=dict)
    plan: tuple[Planned, ...] = ()
    """The workload's phases as the study file plans them."""
    workload_seconds: dict[str, list[float]] = field(default_factory=dict)
    """Seconds each workload phase took, by name, in the trials that ran it."""

    def add(
        self,
        *,
        counted: bool,
        feasible_capacity: int | None,
        oom: bool,
        phases: Mapping[str, float],
        workload_phases: Mapping[str, float] | None = None,
    ) -> None:
        """Take in one finished trial: whether it counts, its feasible capacity, whether it ran out
        of memory, and the seconds of its trial and workload phases, which the ETA is estimated
        from."""
        self.done += 1 if counted else 0
        self.ooms += 1 if oom else 0
        if feasible_capacity is not None:
            self.best_capacity = max(self.best_capacity or 0, feasible_capacity)
        for name, seconds in phases.items():
            if name == "total":
                self.trial_seconds.append(seconds)
            else:
                self.phase_seconds.setdefault(name, []).append(seconds)
        for name, seconds in (workload_phases or {}).items():
            self.workload_seconds.setdefault(name, []).append(seconds)

    def seed(self, phases: Mapping[str, float]) -> None:
        """Take in trial phases timed before the first trial (`autotune check`'s launch, startup
        and teardown), so the first trial's expected times and ETA rest on them."""
        for name, seconds in phases.items():
            self.phase_seconds.setdefault(name, []).append(seconds)

    def expected(self, phase: str) -> float | None:
        """The median time the phase took so far; for the workload before any trial timed it,
        the study's plan when every phase of it has a duration."""
        seen = self.phase_seconds.get(phase)
        if seen:
            return statistics.median(seen)
        if phase == "workload" and self.plan:
            steps = [self.expected_workload_phase(p) for p in self.plan]
            if all(s is not None for s in steps):
                return sum(s or 0.0 for s in steps)
        return None

    def expected_workload_phase(self, p: Planned) -> float | None:
        """How long workload phase `p` should take: the median of the trials that timed it, else its
        planned duration (None for a phase not timed yet whose length is not planned)."""
        seen = self.workload_seconds.get(p.name)
        return statistics.median(seen) if seen else p.seconds

    def planned_workload_s(self) -> float:
        """What the workload's plan says at least (phases of unknown length count as 0)."""
        return sum(self.expected_workload_phase(p) or 0.0 for p in self.plan)

    def per_trial(self, phase: str = "", phase_elapsed: float = 0.0) -> tuple[float, bool] | None:
        """Seconds one trial takes and whether that is exact (False: a lower bound, some phase
        not timed yet); None when nothing is known at all."""
        if self.trial_seconds:
            return statistics.median(self.trial_seconds), True
        total, exact, known = 0.0, True, False
        for name in TRIAL_PHASES:
            seen = self.expected(name)
            if seen is None and name == "workload" and self.plan:
                seen, exact = self.planned_workload_s(), False
            if seen is None:
                exact = False
                seen = phase_elapsed if name == phase else 0.0
            else:
                known = True
            if name == phase:
                seen = max(seen, phase_elapsed)
            total += seen
        return (total, exact) if known or phase_elapsed > 0 else None

    def eta(
        self,
        elapsed_in_trial: float,
        remaining_s: float | None,
        *,
        phase: str = "",
        phase_elapsed: float = 0.0,
    ) -> tuple[float, bool] | None:
        """Seconds left for the study and whether that is exact (False: a lower bound, it rests on
        a phase not timed yet); None when nothing is known yet. The time the study has left
        (`remaining_s`) caps it, and a capped ETA is exact."""
        est = self.per_trial(phase, phase_elapsed)
        if est is None:
            return None
        per_trial, exact = est
        left = max(self.n_trials - self.done, 0)
        eta = max(per_trial - elapsed_in_trial, 0.0) + per_trial * max(left - 1, 0)
        if remaining_s is not None and eta >= remaining_s:
            return remaining_s, True
        return eta, exact

    def workload_phase(self, elapsed: float) -> str:
        """The workload phase running `elapsed` seconds in, by name (`agents (steady, 3m left)`),
        once a trial has timed the phases up to it; "" before."""
        at = 0.0
        for p in self.plan:
            took = self.workload_seconds.get(p.name)
            if not took:
                return ""
            length = statistics.median(took)
            if elapsed < at + length:
                return f"{p.name} ({p.kind}, {duration(at + length - elapsed)} left)"
            at += length
        if self.plan:
            return f"{self.plan[-1].name} ({self.plan[-1].kind}, running over)"
        return ""

    def plan_text(self) -> str:
        """The workload's phases in order, with the durations the study file gives them."""
        steps = [p.name + (f" {duration(p.seconds)}" if p.seconds else "") for p in self.plan]
        return " → ".join(steps)


def duration(seconds: float | None) -> str:
    """Seconds as the progress line prints them: `45s`, `6m05s`, `2h07m`; `?` when unknown."""
    if seconds is None:
        return "?"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def eta_text(eta: tuple[float, bool] | None) -> str:
    """`ETA 1h05m`, or `ETA ≥ 6h40m` while it rests on a phase not timed yet (`Tally.eta`)."""
    if eta is None:
        return f"ETA {duration(None)}"
    seconds, exact = eta
    return f"ETA {'' if exact else '≥ '}{duration(seconds)}"


def params_text(params: Mapping[str, Scalar]) -> str:
    """A trial's parameters as `name=value` words."""
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
    draining_s: float | None = None,
) -> str:
    """The live line; `draining_s` (the stop grace) when the operator asked to stop."""
    expected = f"expected {duration(tally.expected(phase))}"
    best = f"{tally.best_capacity:,} tok" if tally.best_capacity is not None else "none yet"
    name = phase
    if phase == "workload":
        sub = tally.workload_phase(phase_elapsed)
        if sub:
            name = f"workload: {sub},"
        elif tally.plan:
            planned = tally.planned_workload_s()
            least = f"≥ {duration(planned)}" if planned else "?"
            if tally.expected(phase) is None:
                expected = f"expected {least}"
            expected += f": {tally.plan_text()}"
    elif phase == "teardown" and draining_s is not None:
        name = f"teardown: waiting for the server to drain (up to {draining_s:g} s),"
    eta = eta_text(tally.eta(trial_elapsed, remaining_s, phase=phase, phase_elapsed=phase_elapsed))
    return (
        f"trial {k}/{tally.n_trials} (#{number}) {name} {duration(phase_elapsed)}"
        f" ({expected}) | best feasible {best} | OOMs {tally.ooms} | {eta}"
    )


def finished_line(
    *,
    k: int,
    n: int,
    number: int,
    outcome: str,
    reason: str,
    capacity: int | None,
    throughput: float | None,
    headroom: float | None,
    feasible: bool | None,
    seconds: float,
) -> str:
    """One finished trial; `headroom` is the free memory at the worst moment; `reason` why it
    ended so, or for one that served and broke a constraint, what it broke. A figure the trial
    did not measure is left out rather than printed as 0."""
    why = f" — {reason}" if reason else ""
    if outcome == "skipped":
        return f"trial {k}/{n} (#{number}) skipped [not launched]{why}"
    if reason.startswith(NOT_LAUNCHED):
        rest = reason[len(NOT_LAUNCHED) :]
        return f"trial {k}/{n} (#{number}) {outcome} [not launched] — {rest}"
    verdict = {True: "feasible", False: "infeasible", None: "failed"}[feasible]
    parts = [f"capacity {capacity:,} tok" if capacity else "no KV pool"]
    if throughput is not None:
        parts.append(f"{throughput:,.0f} tok/s")
    if headroom is not None:
        parts.append(f"{headroom:.2f} GiB free at the worst moment")
    return (
        f"trial {k}/{n} (#{number}) {outcome} [{verdict}]: {', '.join(parts)}, "
        f"{duration(seconds)}{why}"
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
        self._draining_s: float | None = None

    def stopping(self, grace_s: float) -> None:
        """The operator asked to stop (called from a signal handler: it only sets a value, so
        it cannot wait for the lock the interrupted code may hold); the teardown that follows
        says it waits for the server to drain, up to `grace_s`."""
        self._draining_s = grace_s

    # events -------------------------------------------------------------------------------------

    def message(self, text: str) -> None:
        """Print one permanent line above the status line (which is redrawn below it on a
        terminal)."""
        with self._lock:
            self._clear()
            self._out.write(text + "\n")
            self._redraw()
            self._out.flush()

    def trial_started(self, k: int, number: int, params: Mapping[str, Scalar]) -> None:
        """Announce trial `k` of the budget (study trial `number`) and its parameters, and start the
        once-a-second redraw on a terminal."""
        now = self._clock()
        with self._lock:
            self._k, self._number, self._trial_t0 = k, number, now
            self._phase, self._phase_t0 = "launch", now
        self.message(f"trial {k}/{self.tally.n_trials} (#{number}) {params_text(params)}")
        if self._live and self._thread is None:
            self._thread = threading.Thread(target=self._tick, name="progress", daemon=True)
            self._thread.start()

    def phase(self, name: str) -> None:
        """The trial entered phase `name`: redraw the status line on a terminal, print it
        elsewhere."""
        with self._lock:
            self._phase, self._phase_t0 = name, self._clock()
        if not self._live:
            self.message(self._status())
        else:
            with self._lock:
                self._redraw()
                self._out.flush()

    def trial_finished(self, line: str) -> None:
        """Print the trial's one-line summary and clear its phase."""
        with self._lock:
            self._phase = ""
        self.message(line)

    def close(self) -> None:
        """Stop the redraw thread and clear the status line, leaving only the permanent lines."""
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
            draining_s=self._draining_s,
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


# ------------------------------------------------------------------------------------------------
# Before the first launch: what will make the night say less than it could (warnings, one line)
# ------------------------------------------------------------------------------------------------


def warnings_before_launch(
    cfg: StudyConfig, trials: Sequence[TrialView] = (), profile: Profile | None = None
) -> list[str]:
    """One line per setting that will waste trials: the workload cannot fill the searched request
    slots, the fixed flags ask for what the simulator profile does not have, or the host cache is
    smaller than the device pool will be. `profile` is the simulator's (sim backend); `trials`
    are the study's finished ones (their ledgers size the pools on a resumed study)."""
    out = _concurrency(cfg)
    if profile is not None:
        out += _flags_vs_profile(cfg, profile)
    out += _host_cache(cfg, trials, profile)
    return out


def _values(p: Param) -> list[float]:
    if isinstance(p, Fixed):
        vals: list[Scalar] = [p.value]
    elif isinstance(p, Choices):
        vals = list(p.values)
    elif isinstance(p, IntRange | FloatRange):
        vals = [p.low, p.high]
    else:
        vals = []
    return [float(v) for v in vals if isinstance(v, int | float) and not isinstance(v, bool)]


def _param(cfg: StudyConfig, name: str) -> Param | None:
    return next((p for p in cfg.search.params if p.name == name), None)


def _concurrency(cfg: StudyConfig) -> list[str]:
    p = _param(cfg, REQUESTS)
    if p is None or isinstance(p, Fixed):
        return []
    steady = [ph for ph in cfg.workload.phases if isinstance(ph, Steady)]
    if not steady or any(isinstance(ph, Poisson) for ph in cfg.workload.phases):
        return []  # open-loop arrivals can fill any number of slots
    busiest = max(steady, key=lambda ph: ph.concurrency)
    above = sorted({int(v) for v in _values(p) if v > busiest.concurrency})
    if not above:
        return []
    return [
        f"workload: at most {busiest.concurrency} requests run at once (phase "
        f"{busiest.name}: concurrency {busiest.concurrency}), but the search tries "
        f"{REQUESTS} up to {above[-1]}: above {busiest.concurrency} its slots stay empty and "
        "throughput cannot differ; raise the phase's concurrency or narrow "
        f"search.{REQUESTS}"
    ]


def _flags(cfg: StudyConfig) -> dict[str, object]:
    return {k.replace("-", "_"): v for k, v in cfg.server.flags}


def _flags_vs_profile(cfg: StudyConfig, profile: Profile) -> list[str]:
    flags = _flags(cfg)
    out = []
    where = f"the simulator profile {profile.name}"
    spec = flags.get("speculative_algorithm")
    if spec and profile.draft is None:
        out.append(
            f"server.flags.speculative_algorithm = {spec}, but {where} has no draft model: "
            "the rehearsal serves without one, so its memory has no draft in it; remove the "
            "speculative-* flags or pick a profile with a [draft]"
        )
    tp = flags.get("tp_size", flags.get("tensor_parallel_size", flags.get("tp")))
    if isinstance(tp, int) and tp > profile.hardware.gpu_count:
        out.append(
            f"server.flags.tp_size = {tp}, but {where} has {profile.hardware.gpu_count} "
            "GPU(s): every launch will fail; lower tp_size or pick another profile"
        )
    return out


def _host_cache(
    cfg: StudyConfig, trials: Sequence[TrialView], profile: Profile | None
) -> list[str]:
    h, f = _param(cfg, HICACHE), _param(cfg, FRACTION)
    if h is None or f is None:
        return []
    sizes = sorted(v for v in _values(h) if v > 0)
    fractions = _values(f)
    if not sizes or not fractions:
        return []
    small, low, top = sizes[0], min(fractions), max(fractions)
    pools = _pools(cfg, trials, profile)
    if pools is None:
        return []
    host_bytes_per_token, device_tokens = pools
    host = int(small * 1e9 // host_bytes_per_token)
    device = device_tokens(top)
    if device is None or host > device:
        return []
    step = fraction_step(cfg.search)
    grid = [snap(low + i * step, step) for i in range(int((top - low) / step + 1e-9) + 1)]
    first = next((x for x in grid if (device_tokens(x) or 0) >= host), top)
    where = (
        f"from {FRACTION} {first:g} on (at {top:g}: about {device:,})"
        if first < top
        else f"at {FRACTION} {top:g} (about {device:,})"
    )
    if first <= low:
        where = f"already at {FRACTION} {low:g}, the lowest searched (at {top:g}: about {device:,})"
    return [
        f"search.{HICACHE}: {small:g} GB per rank holds about {host:,} tokens, fewer than the "
        f"device KV pool will hold {where}: SGLang 0.5.9 refuses to start with a host cache no "
        f"larger than the device pool (0.5.23 warns); raise {HICACHE} above "
        f"{math.ceil(device * host_bytes_per_token / 1e9):g} GB or use 0 (off)"
    ]


def _pools(
    cfg: StudyConfig, trials: Sequence[TrialView], profile: Profile | None
) -> tuple[float, Callable[[float], int | None]] | None:
    """(host bytes per token, device tokens at a fraction), from a finished trial's ledger when
    one has them, else from the simulator profile; None when neither can tell."""
    for t in trials:
        led = t.ledger
        if led.host_cache_gb and led.host_cache_tokens and t.arithmetic() is not None:

            def at(frac: float, t: TrialView = t) -> int | None:
                p = t.predict(frac)
                return p.tokens if p is not None else None

            return led.host_cache_gb * 1e9 / led.host_cache_tokens, at
    if profile is None:
        return None
    return _profile_pools(cfg, profile)


def _profile_pools(
    cfg: StudyConfig, profile: Profile
) -> tuple[float, Callable[[float], int | None]] | None:
    """SGLang's arithmetic (docs/sglang-memory.md) over the profile's box and model: P is the GPU
    less the CUDA context, A what the weights leave, the pool `A − P·(1 − f)` at the cell the
    model's geometry gives. The draft is left out, so the device pool is, if anything, larger."""
    flags = _flags(cfg)
    tp_flag = flags.get("tp_size", flags.get("tensor_parallel_size", flags.get("tp", 1)))
    tp = tp_flag if isinstance(tp_flag, int) and tp_flag > 0 else 1
    att = profile.attention
    cell = cell_from_geometry(
        layers=att.layers,
        elem_bytes=1 if str(flags.get("kv_cache_dtype", "")).startswith("fp8") else 2,
        mla=att.kind == "mla",
        kv_lora_rank=att.kv_lora_rank,
        qk_rope_head_dim=att.qk_rope_head_dim,
        kv_heads=att.kv_heads,
        head_dim=att.head_dim,
        v_head_dim=att.v_head_dim,
        tp=tp,
    )
    if cell <= 0:
        return None
    p = profile.hardware.gpu_memory_mib / 1024 - profile.hardware.cuda_context_gib
    a = p - profile.model.weights_gib * profile.model.weights_tp / tp

    def at(frac: float) -> int | None:
        return pool_tokens(p, a, frac, cell)

    return float(cell), at
