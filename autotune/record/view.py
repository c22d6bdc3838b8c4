"""One stored trial read back: a flat, immutable `TrialView`.

Trials are read from what `autotune.trial.run` stored as user attributes (`outcome`, `reason`,
`capacity_tokens`, `throughput_tok_s`, `headroom_gib` and the whole `record`: params, ledger,
workload summary, log path, versions, host; names in `autotune.record.keys`) and from Optuna's
constraints (≤ 0 satisfied). Every figure is None when the trial never got that far, so a study
that is still running, or one whose records are older, still reads.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from autotune.config.studyfile import Scalar
from autotune.logparse.ledger import Ledger
from autotune.logparse.outcome import Outcome
from autotune.masking import masked_argv, scrub
from autotune.record import keys

FRACTION = "mem_fraction_static"
REQUESTS = "max_running_requests"
KINDS = ("feasible", "infeasible", "oom", "failed", "running")
"""How a trial is drawn: feasible; complete but a constraint broken; out of memory; failed for a
reason outside the parameters (hang, harness error, interrupted); not finished yet."""

_STATES = {
    TrialState.COMPLETE: "complete",
    TrialState.FAIL: "failed",
    TrialState.RUNNING: "running",
    TrialState.WAITING: "queued",
    TrialState.PRUNED: "pruned",
}


@dataclass(frozen=True)
class TrialView:
    """What the review needs of one trial; figures are None when not measured."""

    number: int
    state: str
    outcome: str
    kind: str
    params: Mapping[str, Scalar]
    capacity_tokens: int | None
    throughput_tok_s: float | None
    headroom_gib: float | None
    """Least free GPU memory seen under load (the measured headroom)."""
    stress_peak_gib: float | None
    """Transient use on top of the static allocations at the worst moment of the workload."""
    ledger: Ledger
    violated: tuple[str, ...] = ()
    error_rate: float | None = None
    p99_ttft_ms: float | None = None
    p99_itl_ms: float | None = None
    median_tpot_ms: float | None = None
    reason: str = ""
    log_path: str | None = None
    argv: tuple[str, ...] = ()
    sglang_version: str | None = None
    host: str | None = None
    seconds: float | None = None
    started: datetime | None = None
    evidence: tuple[str, ...] = field(default=())
    trial_dir: str | None = None
    worker: Mapping[str, object] | None = None
    phases: Mapping[str, float] = field(default_factory=dict)
    """Seconds spent in each phase of the trial (`total` for the whole)."""
    recorded_headroom_gib: float | None = None
    """The headroom as stored, also for a trial that did not end `ok` (the status table)."""
    finished: bool = False

    @property
    def ending(self) -> Outcome:
        return Outcome.of(self.outcome)

    @property
    def counted(self) -> bool:
        """Whether the trial counts toward the budget (finished, and not cut short)."""
        return self.state == "complete" or (self.state == "failed" and self.ending.counted)

    @property
    def fraction(self) -> float | None:
        return _num(self.params.get(FRACTION))

    @property
    def requests(self) -> int | None:
        """max_running_requests as run, else as the server reported it."""
        v = _num(self.params.get(REQUESTS))
        if v is None:
            return self.ledger.max_running_requests
        return int(v)

    @property
    def feasible(self) -> bool:
        return self.kind == "feasible"

    @property
    def static_free_gib(self) -> float | None:
        """Free GPU memory once startup allocated everything (the last figure the log shows)."""
        led = self.ledger
        return (
            led.available_gpu_mem_gib
            if led.available_gpu_mem_gib is not None
            else led.avail_after_graphs_gib
        )

    def label(self) -> str:
        """`#4 f=0.89 r=48`: short enough for a hover or a legend."""
        parts = [f"#{self.number}"]
        if self.fraction is not None:
            parts.append(f"f={self.fraction:g}")
        if self.requests is not None:
            parts.append(f"r={self.requests}")
        return " ".join(parts)


def view(t: FrozenTrial) -> TrialView:
    """Read one Optuna trial into a `TrialView` (pure)."""
    a = t.user_attrs
    rec = _mapping(a.get(keys.RECORD))
    outcome = str(a.get(keys.OUTCOME, rec.get("outcome", "")) or "")
    ledger_raw = rec.get("ledger")
    ledger = Ledger.from_dict(ledger_raw) if isinstance(ledger_raw, Mapping) else Ledger()
    headroom = _num(a.get(keys.HEADROOM, rec.get("headroom_gib")))
    violated = tuple(sorted(k for k, v in t.constraints.items() if v > 0))
    kind = _kind(t.state, outcome, violated)
    capacity = _num(a.get(keys.CAPACITY, rec.get("capacity_tokens")))
    throughput = _num(a.get(keys.THROUGHPUT, rec.get("throughput_tok_s")))
    overall = _mapping(_mapping(rec.get("workload")).get("overall"))
    static_free = (
        ledger.available_gpu_mem_gib
        if ledger.available_gpu_mem_gib is not None
        else ledger.avail_after_graphs_gib
    )
    peak = _num(rec.get("stress_peak_gib", a.get(keys.STRESS_PEAK)))
    if peak is None and outcome == "ok" and static_free is not None and headroom is not None:
        peak = max(static_free - headroom, 0.0)
    phases = _mapping(rec.get("phases"))
    log_path = rec.get("log_path")
    trial_dir = a.get(keys.TRIAL_DIR)
    if not log_path and isinstance(trial_dir, str):  # a trial still running
        log_path = f"{trial_dir}/server.log"
    worker = a.get(keys.WORKER)
    version = rec.get("sglang_version")
    host = rec.get("host")
    return TrialView(
        number=t.number,
        state=_STATES.get(t.state, t.state.name.lower()),
        outcome=outcome,
        kind=kind,
        params=params_of(t),
        capacity_tokens=int(capacity) if capacity is not None and capacity > 0 else None,
        throughput_tok_s=throughput if outcome == "ok" else None,
        headroom_gib=headroom if outcome == "ok" else None,
        stress_peak_gib=peak,
        ledger=ledger,
        violated=violated,
        error_rate=_num(rec.get("error_rate")),
        p99_ttft_ms=_num(rec.get("p99_ttft_ms")),
        p99_itl_ms=_num(rec.get("p99_itl_ms")),
        median_tpot_ms=_num(_mapping(overall.get("tpot_ms")).get("p50")),
        reason=scrub(str(a.get(keys.REASON, rec.get("reason", "")) or "")),
        log_path=str(log_path) if isinstance(log_path, str) and log_path else None,
        argv=masked_argv(str(x) for x in rec.get("argv", ()) or ()),
        sglang_version=str(version) if version else None,
        host=str(host) if host else None,
        seconds=_num(phases.get("total")),
        started=t.datetime_start,
        evidence=tuple(scrub(str(e)) for e in rec.get("evidence", ()) or ()),
        trial_dir=trial_dir if isinstance(trial_dir, str) else None,
        worker=worker if isinstance(worker, Mapping) else None,
        phases={k: float(v) for k, v in phases.items() if _num(v) is not None},
        recorded_headroom_gib=headroom,
        finished=t.state.is_finished(),
    )


def views(trials: Sequence[FrozenTrial]) -> list[TrialView]:
    """Every trial that ran or runs (queued ones are left out), in trial order."""
    return [view(t) for t in trials if t.state != TrialState.WAITING]


def params_of(t: FrozenTrial) -> dict[str, Scalar]:
    """Every parameter the trial ran with: recorded (fixed ones too), then sampled."""
    params: dict[str, Scalar] = {}
    recorded = _mapping(t.user_attrs.get(keys.RECORD)).get("params")
    if isinstance(recorded, Mapping):
        params.update(recorded)
    params.update(t.params)
    return params


def _kind(state: TrialState, outcome: str, violated: Sequence[str]) -> str:
    if state in (TrialState.RUNNING, TrialState.WAITING):
        return "running"
    if Outcome.of(outcome).is_oom or "oom" in violated:
        return "oom"
    if state != TrialState.COMPLETE:
        return "failed"
    return "infeasible" if violated else "feasible"


def _mapping(v: object) -> Mapping[str, Any]:
    return v if isinstance(v, Mapping) else {}


def _num(v: object) -> float | None:
    if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    return None
