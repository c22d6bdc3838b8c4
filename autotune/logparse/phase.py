"""Startup phases of an SGLang server and the log events that move it from one to the next.

Distributed init → weight load → KV pool → CUDA-graph capture → (with speculative decoding up to
0.5.9, the same again for the draft model; from 0.5.18 the draft loads right after the target,
before the KV pool) → host cache → HTTP up and warm-up → ready.
Pure: `next_phase` maps (phase, event) to the new phase; the server handle keeps the clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from autotune.logparse.events import Event, Kind


class Phase(StrEnum):
    """A startup phase of an SGLang server, in the order a start goes through them; each has its own
    time limit (`PhaseLimits`) and names where a start that hung was stuck."""

    LAUNCH = "launch"  # process started, no SGLang line yet (imports, argument checks)
    DIST_INIT = "dist_init"
    WEIGHT_LOAD = "weight_load"
    KV_POOL = "kv_pool"
    GRAPH_CAPTURE = "graph_capture"
    DRAFT_LOAD = "draft_load"
    HOST_CACHE = "host_cache"
    WARMUP = "warmup"
    READY = "ready"


_ORDER = {phase: i for i, phase in enumerate(Phase)}

_ENTERS: Mapping[Kind, Phase] = {
    Kind.DIST_INIT_BEGIN: Phase.DIST_INIT,
    Kind.DIST_INIT_END: Phase.DIST_INIT,
    Kind.MEMORY_BASELINE: Phase.DIST_INIT,
    Kind.WEIGHT_LOAD_BEGIN: Phase.WEIGHT_LOAD,
    Kind.WEIGHT_LOAD_END: Phase.KV_POOL,
    Kind.KV_DTYPE: Phase.KV_POOL,
    Kind.SWA_POOL: Phase.KV_POOL,
    Kind.MAMBA_ALLOCATED: Phase.KV_POOL,
    Kind.KV_CAP_IGNORED: Phase.KV_POOL,
    Kind.KV_ALLOCATED: Phase.KV_POOL,
    Kind.MEMORY_POOL_END: Phase.KV_POOL,
    Kind.GRAPH_CAPTURE_BEGIN: Phase.GRAPH_CAPTURE,
    Kind.GRAPH_CAPTURING: Phase.GRAPH_CAPTURE,
    Kind.GRAPH_BATCH_SIZES: Phase.GRAPH_CAPTURE,
    Kind.DEEPGEMM_JIT: Phase.GRAPH_CAPTURE,
    Kind.POST_CAPTURE: Phase.GRAPH_CAPTURE,
    Kind.POOL_BELOW_CONTEXT: Phase.HOST_CACHE,
    Kind.SCHEDULER_SUMMARY: Phase.HOST_CACHE,
    Kind.HOST_HEADROOM: Phase.HOST_CACHE,
    Kind.HICACHE_AUTOSIZE: Phase.HOST_CACHE,
    Kind.HICACHE_SMALLER: Phase.HOST_CACHE,
    Kind.HOST_CACHE: Phase.HOST_CACHE,
    Kind.STARTUP_TIMINGS: Phase.WARMUP,
    Kind.SERVER_PROCESS: Phase.WARMUP,
    Kind.UVICORN_RUNNING: Phase.WARMUP,
    Kind.READY: Phase.READY,
}


def next_phase(phase: Phase, event: Event, weight_loads_begun: int) -> Phase:
    """The phase after `event`; `weight_loads_begun` counts the event's rank's `Load weight
    begin` lines so far, this one included. Phases only move forward, except that a rank's
    second weight load (the draft model, reference §1.6) starts `DRAFT_LOAD`, after which the
    draft's KV pool and graph capture are timed as `KV_POOL` and `GRAPH_CAPTURE` again."""
    target = _ENTERS.get(event.kind)
    if target is None:
        return phase
    if target is Phase.WEIGHT_LOAD and weight_loads_begun >= 2:
        return Phase.DRAFT_LOAD if _ORDER[phase] < _ORDER[Phase.HOST_CACHE] else phase
    if phase is Phase.DRAFT_LOAD and target in (Phase.KV_POOL, Phase.GRAPH_CAPTURE):
        return target
    return target if _ORDER[target] > _ORDER[phase] else phase


class PhaseClock:
    """The current phase and the seconds spent in each, fed events and clock readings."""

    def __init__(self, now: float) -> None:
        self.phase = Phase.LAUNCH
        self.entered = now
        self.seconds: dict[str, float] = {}
        self._loads: dict[str, int] = {}

    def feed(self, event: Event, now: float) -> Phase:
        """Move on to the phase `event` starts (counting each rank's weight loads: the second is the
        draft's), closing the time of the phase left; the phase after it."""
        if event.kind is Kind.WEIGHT_LOAD_BEGIN:
            self._loads[event.rank] = self._loads.get(event.rank, 0) + 1
        new = next_phase(self.phase, event, self._loads.get(event.rank, 0))
        if new is not self.phase:
            self._close(now)
            self.phase, self.entered = new, now
        return new

    def in_phase(self, now: float) -> float:
        """Seconds spent in the current phase at `now`, what its time limit is checked against."""
        return now - self.entered

    def totals(self, now: float) -> dict[str, float]:
        """Seconds per phase including the current one (READY itself is not timed)."""
        out = dict(self.seconds)
        if self.phase is not Phase.READY:
            out[self.phase.value] = out.get(self.phase.value, 0.0) + self.in_phase(now)
        return {k: round(v, 3) for k, v in out.items()}

    def _close(self, now: float) -> None:
        key = self.phase.value
        self.seconds[key] = self.seconds.get(key, 0.0) + (now - self.entered)


@dataclass(frozen=True)
class PhaseLimits:
    """Seconds each phase may take before the start counts as timed out (reference §7.2:
    weight load of a ~1 TB checkpoint takes many minutes; DeepGEMM JIT can add 10–20 minutes to
    graph capture; HiCache pinning of hundreds of GB is slow; warm-up allows 600 s)."""

    launch_s: float = 300.0
    dist_init_s: float = 600.0
    weight_load_s: float = 3600.0
    kv_pool_s: float = 600.0
    graph_capture_s: float = 2400.0
    draft_load_s: float = 1200.0
    host_cache_s: float = 1800.0
    warmup_s: float = 900.0

    def limit(self, phase: Phase) -> float | None:
        """The seconds `phase` may take (its `<phase>_s` field), None when it has no limit."""
        value = getattr(self, f"{phase.value}_s", None)
        return float(value) if value is not None else None
