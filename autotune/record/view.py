"""One stored trial read back: a flat, immutable `TrialView`, and every figure of it.

A trial's attributes are read once, by `autotune.record.stored` (the one reader of what Optuna
holds: `outcome`, `reason`, the flat figures, the whole `record` with params, ledger, workload
summary, log path, versions, host, and Optuna's constraints, ≤ 0 satisfied); the view is built
from that reading and keeps it (`TrialView.stored`). Every figure is None when the trial never
got that far, so a study that is still running, or one whose records are older, still reads.

Each figure that the review prints in more than one place is one property here, computed by the
functions of `autotune.memory.arithmetic` and `autotune.memory.pool`, and every surface (status,
explain, export, the report) reads it from the view:

* `capacity_tokens`: the KV pool, `max_total_num_tokens`;
* `reserve_gib`: `P·(1 − f)`, what SGLang leaves outside the static budget (docs/sglang-memory.md);
* `static_free_gib`: the free GPU memory once startup allocated everything (after CUDA graphs);
* `free_at_peak_gib`: the headroom left at the worst moment, the least free GPU memory seen
  while the workload ran (what the `headroom_gib` constraint checks);
* `stress_peak_gib`: what the load took at that moment on top of the free memory after startup,
  `static_free_gib − free_at_peak_gib`, so the three always add up;
* `predict(f)`: the same figures for another fraction, by SGLang's arithmetic.

The study's own end is read here too (`search_end`): the search's stop is a study attribute
(`keys.SEARCH_DONE`), not a trial.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from optuna.trial import FrozenTrial, TrialState

from autotune.config.schema import CHUNK, FRACTION, REQUESTS, Scalar
from autotune.logparse.clamps import Clamps
from autotune.logparse.ledger import Ledger
from autotune.logparse.outcome import Outcome, cause_of
from autotune.masking import masked_argv, scrub
from autotune.memory.arithmetic import Arithmetic, AtFraction, arithmetic, free_after_capture_gib
from autotune.memory.pool import reserve_gib, under_load
from autotune.record.stored import Stored, StudyRecord, stored

KINDS = ("feasible", "infeasible", "oom", "failed", "running", "skipped")
"""How a trial is drawn: feasible; complete but a constraint broken; out of memory; failed for a
reason outside the parameters (hang, harness error, interrupted); not finished yet; never
launched (skipped: the search was done, or another worker had the point), which is not drawn."""

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
    free_at_peak_gib: float | None
    """The headroom left at the worst moment: the least free GPU memory seen while the workload
    ran (a trial that served it; None for one that ran out of memory or never got there)."""
    stress_peak_gib: float | None
    """What the load took at its worst on top of the free memory after startup:
    `static_free_gib − free_at_peak_gib` (the probe's own rise when the least free memory was not
    recorded). None for a trial that did not serve the workload."""
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
    workload_phases: Mapping[str, float] = field(default_factory=dict)
    """Seconds each phase of the workload took (`warmup-0`, `agents`, `stress-2`, …), in order."""
    recorded_headroom_gib: float | None = None
    """The headroom as stored, also for a trial that did not end `ok` (the status table)."""
    finished: bool = False
    seeded_from: tuple[str, ...] = ()
    """Where the seed logs the search's memory model started from came from (`record.seeds`)."""
    growth_gib: float | None = None
    """How far the server's footprint grew over the trial's workload (`keys.GROWTH`)."""
    kappa: float | None = None
    """How much the capacity search had widened its margins when it proposed this trial."""
    stored: Stored = field(default_factory=Stored, repr=False)
    """The trial's attributes as stored, which every figure above is read from (the search
    learns from them as written: `autotune.search.records`)."""

    @property
    def ending(self) -> Outcome:
        """The trial's outcome as an `Outcome`, which every rule that depends on an ending asks."""
        return Outcome.of(self.outcome)

    @property
    def clamps(self) -> Clamps:
        """What the trial asked for beside what SGLang ran of it (`logparse.clamps`)."""
        return Clamps.of(self.ledger)

    @property
    def runs_as(self) -> int | None:
        """The measured trial this one was not launched for: SGLang runs its point as that
        trial's (`keys.RUNS_AS`)."""
        return self.stored.runs_as

    @property
    def counted(self) -> bool:
        """Whether the trial counts toward the budget (finished, and not cut short)."""
        return self.state == "complete" or (self.state == "failed" and self.ending.counted)

    @property
    def fraction(self) -> float | None:
        """The `mem_fraction_static` the trial ran at, None when it did not set one."""
        return _num(self.params.get(FRACTION))

    @property
    def requests(self) -> int | None:
        """max_running_requests as run, else as the server reported it."""
        v = _num(self.params.get(REQUESTS))
        if v is None:
            return self.ledger.max_running_requests
        return int(v)

    @property
    def chunk(self) -> int | None:
        """chunked_prefill_size as run, else as the server reported it."""
        v = _num(self.params.get(CHUNK))
        if v is None or v <= 0:
            return self.ledger.chunked_prefill_size
        return int(v)

    @property
    def feasible(self) -> bool:
        """Whether the trial finished and met every constraint: only such a trial can win."""
        return self.kind == "feasible"

    @property
    def static_free_gib(self) -> float | None:
        """Free GPU memory once startup allocated everything, CUDA graphs included (the last
        figure the log shows); None for a server that did not finish starting."""
        return None if self.ending.fails_at_startup else _static_free(self.ledger)

    @property
    def reserve_gib(self) -> float | None:
        """`P·(1 − f)`: the memory SGLang leaves outside the static budget (weights + KV pool) for
        everything allocated later and for the transient peak."""
        p, f = self.ledger.p_gib, self.fraction
        return reserve_gib(p, f) if p is not None and f is not None else None

    @property
    def launched(self) -> bool:
        """False for a trial recorded without a launch (skipped, or refused for a full disk)."""
        return self.kind != "skipped"

    @property
    def cause(self) -> str:
        """The short cause of a failure (`torch_oom`, `hicache_too_small`, …), "" if none."""
        return cause_of(self.reason)

    def arithmetic(self, cell_bytes: float | None = None) -> Arithmetic | None:
        """SGLang's pool arithmetic of this launch, with its stress peak; None without P and A
        in the log (or without a fraction). `cell_bytes` is the study's fitted bytes per token."""
        if self.fraction is None:
            return None
        return arithmetic(
            self.ledger, self.fraction, stress_peak_gib=self.stress_peak_gib, cell_bytes=cell_bytes
        )

    def predict(self, fraction: float, cell_bytes: float | None = None) -> AtFraction | None:
        """What `fraction` would give with everything else of this launch held fixed (its P, A,
        post-pool allocations and stress peak): the one prediction the review prints."""
        a = self.arithmetic(cell_bytes)
        return a.at(fraction) if a is not None else None

    def label(self) -> str:
        """`#4 f=0.89 r=48`: short enough for a hover or a legend."""
        parts = [f"#{self.number}"]
        if self.fraction is not None:
            parts.append(f"f={self.fraction:g}")
        if self.requests is not None:
            parts.append(f"r={self.requests}")
        return " ".join(parts)


def view(t: FrozenTrial) -> TrialView:
    """Read one Optuna trial into a `TrialView` (pure): its attributes once (`stored`), then
    every figure from them."""
    s = stored(t)
    outcome = s.outcome if s.outcome is not None else s.recorded_outcome
    ledger = s.ledger
    violated = tuple(sorted(k for k, v in s.constraints.items() if v > 0))
    reason = scrub(s.reason if s.reason is not None else s.recorded_reason)
    kind = _kind(t.state, outcome, violated, reason)
    capacity = s.capacity_tokens
    if capacity is None or capacity <= 0:  # a trial cut short keeps what its ledger showed
        capacity = _num(ledger.max_total_num_tokens)
    free_at_peak, peak = _peak_figures(
        outcome, _static_free(ledger), s.headroom_gib, s.stress_peak_gib
    )
    log_path = s.log_path
    if log_path is None and s.trial_dir is not None:  # a trial still running
        log_path = f"{s.trial_dir}/server.log"
    return TrialView(
        number=t.number,
        state=_STATES.get(t.state, t.state.name.lower()),
        outcome=outcome,
        kind=kind,
        params=_params(t, s),
        capacity_tokens=int(capacity) if capacity is not None and capacity > 0 else None,
        throughput_tok_s=s.throughput_tok_s if outcome == "ok" else None,
        free_at_peak_gib=free_at_peak,
        stress_peak_gib=peak,
        ledger=ledger,
        violated=violated,
        error_rate=s.error_rate,
        p99_ttft_ms=s.p99_ttft_ms,
        p99_itl_ms=s.p99_itl_ms,
        median_tpot_ms=s.median_tpot_ms,
        reason=reason,
        log_path=log_path or None,
        argv=masked_argv(s.argv),
        sglang_version=s.sglang_version,
        host=s.host,
        seconds=s.phases.get("total"),
        started=t.datetime_start,
        evidence=tuple(scrub(e) for e in s.evidence),
        trial_dir=s.trial_dir,
        worker=s.worker,
        phases=dict(s.phases),
        workload_phases=dict(s.workload_phases),
        recorded_headroom_gib=s.headroom_gib,
        finished=t.state.is_finished(),
        seeded_from=s.seeded_from,
        growth_gib=s.growth_gib,
        kappa=s.kappa,
        stored=s,
    )


@dataclass(frozen=True)
class SearchEnd:
    """The search found nothing left worth a launch: why, and after how many trials."""

    reason: str
    trials: int

    def line(self) -> str:
        """`search done after 6 trials: what is left to learn is smaller than one step: …`"""
        return f"search done after {self.trials} trials: {self.reason}"


_DONE_REASON = "not launched: search done: "


def search_end(
    study: StudyRecord | Mapping[str, object], trials: Sequence[FrozenTrial]
) -> SearchEnd | None:
    """The search's stop as the study records it (`keys.SEARCH_DONE`; `study` is the study's
    record, or its attributes as stored), while it holds: None once a trial ran after it (a
    later run found something worth a launch after all). A study from
    before the stop was a study attribute says it with a FAIL trial, `skipped` with the reason
    `not launched: search done: …`, as its last trial."""
    ran = [t for t in trials if t.state != TrialState.WAITING]
    last = max((t.number for t in ran), default=-1)
    done = (study if isinstance(study, StudyRecord) else StudyRecord.of(study)).search_done
    at = done.last_trial if done is not None else None
    if done is not None and at is not None and at >= last:
        count = done.trials if done.trials is not None else sum(1 for t in ran if view(t).counted)
        return SearchEnd(done.reason, count)
    final = max(ran, key=lambda t: t.number, default=None)
    reason = (stored(final).reason or "") if final is not None else ""
    if final is not None and final.state == TrialState.FAIL and reason.startswith(_DONE_REASON):
        return SearchEnd(reason[len(_DONE_REASON) :], sum(1 for t in ran if view(t).counted))
    return None


def views(trials: Sequence[FrozenTrial]) -> list[TrialView]:
    """Every trial that ran or runs (queued ones are left out), in trial order."""
    return [view(t) for t in trials if t.state != TrialState.WAITING]


def _params(t: FrozenTrial, s: Stored) -> dict[str, Scalar]:
    """Every parameter the trial ran with: recorded (fixed ones too), then sampled; for a queued
    trial, the point it was queued with."""
    params: dict[str, Scalar] = {}
    if t.state == TrialState.WAITING:
        for k, v in s.queued.items():
            if isinstance(v, bool | int | float | str):
                params[k] = v
    params.update(s.params)
    params.update(t.params)
    return params


def _static_free(led: Ledger) -> float | None:
    return free_after_capture_gib(led)


def _peak_figures(
    outcome: str, static_free: float | None, least_free: float | None, rise: float | None
) -> tuple[float | None, float | None]:
    """(free at the worst moment, stress peak) of a trial, consistent with its free memory after
    startup: the least free memory seen is the measurement, the peak is what it took from the
    startup's free memory. Only a trial that served the workload has them."""
    if outcome != "ok":
        return None, None
    return under_load(static_free, least_free, rise)


def _kind(state: TrialState, outcome: str, violated: Sequence[str], reason: str = "") -> str:
    if state in (TrialState.RUNNING, TrialState.WAITING):
        return "running"
    ending = Outcome.of(outcome)
    if ending == Outcome.SKIPPED or (
        state == TrialState.FAIL and reason.startswith("not launched")
    ):
        return "skipped"
    if ending.is_oom or "oom" in violated:
        return "oom"
    if state != TrialState.COMPLETE:
        return "failed"
    return "infeasible" if violated else "feasible"


def _num(v: object) -> float | None:
    if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    return None
