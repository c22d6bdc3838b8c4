"""The one reader of what Optuna holds for a trial and for a study: every attribute autotune
stores (`keys`) read back by its name, here and nowhere else, into typed fields.

A trial's attributes (`Stored`, read by `stored`) are what `autotune.study.loop.tell` wrote: the
outcome and reason it was told with, the flat figures (capacity, throughput, headroom, stress
peak), the whole `record` (params, ledger, evidence, workload summary, log path, versions, host),
the trial folder and worker, the search's rule and forecast, and Optuna's own system attributes
(the point it was queued with, the constraints). Nothing here is derived: the figures a review
prints are `autotune.record.view.TrialView`'s, built on this; the search learns from these
fields as written (`autotune.search.records`). A study's attributes (`StudyRecord`, read by
`study_record`) are its objectives, backend, baseline, seeds, confirmations and the search's
stop, and what `autotune check` timed.

A figure stored both flat and inside the record is read once, with the fallback every reader
takes: the flat attribute, else the record's (the stress peak: the record's, else the flat one).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.distributions import distribution_to_json
from optuna.trial import FrozenTrial

from autotune.config.schema import Constraint, Scalar
from autotune.logparse.ledger import Ledger
from autotune.record import internals, keys


@dataclass(frozen=True)
class Stored:
    """One trial's attributes as stored, typed; a field is None (or empty) when not stored."""

    outcome: str | None = None
    """The outcome the trial was told with (`keys.OUTCOME`); None before it was told."""
    reason: str | None = None
    """The reason it was told with (`keys.REASON`); None before it was told."""
    has_record: bool = False
    """Whether the whole record (`keys.RECORD`) is stored."""
    recorded_outcome: str = ""
    """The outcome the record says."""
    recorded_reason: str = ""
    params: Mapping[str, Scalar] = field(default_factory=dict)
    """Every parameter the record says the trial ran with (fixed ones too)."""
    ledger: Ledger = field(default_factory=Ledger)
    evidence: tuple[str, ...] = ()
    """The record's evidence lines, as written (unmasked)."""
    capacity_tokens: float | None = None
    throughput_tok_s: float | None = None
    headroom_gib: float | None = None
    """The least free GPU memory seen while the workload ran (`keys.HEADROOM`)."""
    stress_peak_gib: float | None = None
    """What the probe saw the load take on top of the free memory after startup."""
    growth_gib: float | None = None
    error_rate: float | None = None
    p99_ttft_ms: float | None = None
    p99_itl_ms: float | None = None
    median_tpot_ms: float | None = None
    phases: Mapping[str, float] = field(default_factory=dict)
    """Seconds per phase of the trial (`total` for the whole); non-numbers left out."""
    workload_phases: Mapping[str, float] = field(default_factory=dict)
    """Seconds each phase of the workload took, in order (skipped phases left out)."""
    ended_early: Mapping[str, str] = field(default_factory=dict)
    """The workload's phases that ended early (`[workload] end_early`), each with its why
    ("ended at 212 s of 900: throughput within 2% over 3 windows …")."""
    log_path: str | None = None
    argv: tuple[str, ...] = ()
    """The server's command line as recorded (unmasked)."""
    sglang_version: str | None = None
    host: str | None = None
    backend: str | None = None
    """The backend the record says the trial ran on (`sim`, `sglang`)."""
    trial_dir: str | None = None
    """The trial folder the trial recorded when it was launched (`keys.TRIAL_DIR`)."""
    worker: Mapping[str, object] | None = None
    """Who runs or ran the trial (`keys.WORKER`, `study.storage.Worker.from_dict` reads it)."""
    seeded_from: tuple[str, ...] = ()
    search_rule: str | None = None
    """The capacity search's rule that chose the point (`keys.SEARCH_RULE`); None when none."""
    search_done: str | None = None
    """Why the capacity search had nothing left after this trial (`keys.SEARCH_STOP`)."""
    stress_repeats: int = 1
    """How many times the trial ran its stress phases (`keys.STRESS_REPEATS`); 1 when unset."""
    kappa: float | None = None
    """How far the capacity search had widened its margins (`keys.FORECAST`'s `kappa`)."""
    queued: Mapping[str, object] = field(default_factory=dict)
    """The point an enqueued trial was queued with (Optuna's `fixed_params`)."""
    enqueued: bool = False
    constraints: Mapping[str, float] = field(default_factory=dict)
    """The trial's named constraints (≤ 0 satisfied; `internals.constraints`)."""
    runs_as: int | None = None
    """The measured trial a skipped trial stands for: SGLang runs its point as that one's
    (`keys.RUNS_AS`); None for every other trial."""


def stored(t: FrozenTrial) -> Stored:
    """Read one trial's attributes (pure)."""
    a = t.user_attrs
    raw = a.get(keys.RECORD)
    rec = _mapping(raw)
    led = rec.get("ledger")
    workload = _mapping(rec.get("workload"))
    overall = _mapping(workload.get("overall"))
    phases = _mapping(rec.get("phases"))
    log_path = rec.get("log_path")
    version = rec.get("sglang_version")
    host = rec.get("host")
    backend = rec.get("backend")
    trial_dir = a.get(keys.TRIAL_DIR)
    worker = a.get(keys.WORKER)
    recorded = rec.get("params")
    done = a.get(keys.SEARCH_STOP)
    rule = a.get(keys.SEARCH_RULE)
    short = bool(a.get(keys.SHORT_LOAD))  # the check's short load: not the workload's figures
    return Stored(
        outcome=_text(a.get(keys.OUTCOME)),
        reason=_text(a.get(keys.REASON)),
        has_record=isinstance(raw, Mapping),
        recorded_outcome=str(rec.get("outcome", "") or ""),
        recorded_reason=str(rec.get("reason", "") or ""),
        params=dict(recorded) if isinstance(recorded, Mapping) else {},
        ledger=Ledger.from_dict(led) if isinstance(led, Mapping) else Ledger(),
        evidence=tuple(str(e) for e in rec.get("evidence", ()) or ()),
        capacity_tokens=_num(a.get(keys.CAPACITY, rec.get("capacity_tokens"))),
        throughput_tok_s=None
        if short
        else _num(a.get(keys.THROUGHPUT, rec.get("throughput_tok_s"))),
        headroom_gib=_num(a.get(keys.HEADROOM, rec.get("headroom_gib"))),
        stress_peak_gib=_num(rec.get("stress_peak_gib", a.get(keys.STRESS_PEAK))),
        growth_gib=None if short else _num(rec.get(keys.GROWTH)),
        error_rate=_num(rec.get("error_rate")),
        p99_ttft_ms=_num(rec.get("p99_ttft_ms")),
        p99_itl_ms=_num(rec.get("p99_itl_ms")),
        median_tpot_ms=_num(_mapping(overall.get("tpot_ms")).get("p50")),
        phases={k: float(v) for k, v in phases.items() if _num(v) is not None},
        workload_phases=_workload_phases(workload),
        ended_early=_ended_early(workload),
        log_path=log_path if isinstance(log_path, str) and log_path else None,
        argv=tuple(str(x) for x in rec.get("argv", ()) or ()),
        sglang_version=str(version) if version else None,
        host=str(host) if host else None,
        backend=str(backend) if isinstance(raw, dict) and backend else None,
        trial_dir=trial_dir if isinstance(trial_dir, str) else None,
        worker=worker if isinstance(worker, Mapping) else None,
        seeded_from=tuple(str(o) for o in a.get(keys.SEEDED_FROM, ()) or ()),
        search_rule=None if rule is None else str(rule),
        search_done=str(done) if done else None,
        stress_repeats=max(1, n) if isinstance(n := a.get(keys.STRESS_REPEATS), int) else 1,
        kappa=_num(_mapping(t.system_attrs.get(keys.FORECAST)).get("kappa")),
        queued=internals.fixed_params(t),
        enqueued=internals.is_enqueued(t),
        constraints=internals.constraints(t),
        runs_as=same if isinstance(same := a.get(keys.RUNS_AS), int) else None,
    )


def required_headroom(trials: Sequence[FrozenTrial]) -> float | None:
    """The study's `min_headroom_gib` read back from the first trial that stored both its
    headroom constraint (required − measured) and the measured headroom, for readers without
    the study file; None when no trial holds both."""
    for t in trials:
        s = stored(t)
        c = s.constraints.get(Constraint.HEADROOM)
        if c is not None and s.headroom_gib is not None:
            return round(c + s.headroom_gib, 6)
    return None


def as_json(t: FrozenTrial) -> dict[str, object]:
    """The trial as the storage holds it, as JSON (the `storage` block of trial.json): every
    attribute as stored, the whole record (`keys.RECORD`) left out but whether it is there
    (the record is the rest of trial.json)."""
    user = {k: v for k, v in t.user_attrs.items() if k != keys.RECORD}
    return {
        "state": t.state.name,
        "values": list(t.values) if t.values is not None else None,
        "params": dict(t.params),
        "distributions": {k: distribution_to_json(d) for k, d in t.distributions.items()},
        "user_attrs": user,
        "system_attrs": dict(t.system_attrs),
        "record": keys.RECORD in t.user_attrs,
        "datetime_start": t.datetime_start.isoformat() if t.datetime_start else None,
        "datetime_complete": t.datetime_complete.isoformat() if t.datetime_complete else None,
    }


@dataclass(frozen=True)
class SearchDone:
    """The search's stop as the study stores it (`keys.SEARCH_DONE`)."""

    reason: str
    trials: int | None
    """The counted trials when it stopped, when stored."""
    last_trial: int | None
    """The number of the last trial before the stop, when stored."""


@dataclass(frozen=True)
class CheckTimings:
    """What `autotune check` measured of its launch (`keys.CHECK`): the seconds of its launch,
    startup and teardown, the bytes of its server log, and the trial it was stored as (None
    when it was not stored)."""

    trial: int | None
    launch_s: float
    startup_s: float
    teardown_s: float
    log_bytes: int | None = None

    def to_dict(self) -> dict[str, object]:
        """The attribute as stored (`StudyRecord.of` reads it back)."""
        return {
            "trial": self.trial,
            "launch_s": self.launch_s,
            "startup_s": self.startup_s,
            "teardown_s": self.teardown_s,
            "log_bytes": self.log_bytes,
        }

    @property
    def phases(self) -> dict[str, float]:
        """The trial phases the check timed, by the names a trial's phases carry."""
        return {"launch": self.launch_s, "startup": self.startup_s, "teardown": self.teardown_s}


def _check_timings(raw: object) -> CheckTimings | None:
    data = _mapping(raw)
    launch, startup, teardown = (_num(data.get(k)) for k in ("launch_s", "startup_s", "teardown_s"))
    if launch is None or startup is None or teardown is None:
        return None
    trial, size = data.get("trial"), data.get("log_bytes")
    return CheckTimings(
        trial=trial if isinstance(trial, int) and not isinstance(trial, bool) else None,
        launch_s=launch,
        startup_s=startup,
        teardown_s=teardown,
        log_bytes=size if isinstance(size, int) and not isinstance(size, bool) else None,
    )


@dataclass(frozen=True)
class StudyRecord:
    """A study's attributes as stored, typed; a field is None (or empty) when not stored."""

    objectives: tuple[str, ...] | None = None
    """The objectives the study was created with (`keys.OBJECTIVES`)."""
    backend: str | None = None
    """The backend whose trials the study holds (`keys.BACKEND`)."""
    baseline: Mapping[str, object] | None = None
    """The operator's baseline point as queued first (`keys.BASELINE`), possibly empty."""
    seeds: object = None
    """The seed logs as stored (`keys.SEEDS`; `record.seeds.seeds_of` reads them)."""
    confirmation: object = None
    """The latest confirmation verdict (`keys.CONFIRMATION`)."""
    confirmations: tuple[object, ...] = ()
    """The short history of verdicts (`keys.CONFIRMATIONS`), oldest first."""
    search_done: SearchDone | None = None
    check: CheckTimings | None = None
    """What `autotune check` measured of its launch (`keys.CHECK`)."""

    @classmethod
    def of(cls, attrs: Mapping[str, object]) -> StudyRecord:
        """Read a study's user attributes (pure)."""
        objectives = attrs.get(keys.OBJECTIVES)
        backend = attrs.get(keys.BACKEND)
        baseline = attrs.get(keys.BASELINE)
        history = attrs.get(keys.CONFIRMATIONS)
        done = _mapping(attrs.get(keys.SEARCH_DONE))
        reason, trials, last = done.get("reason"), done.get("trials"), done.get("last_trial")
        return cls(
            objectives=tuple(str(o) for o in objectives) if isinstance(objectives, list) else None,
            backend=None if backend is None else str(backend),
            baseline=dict(baseline) if isinstance(baseline, Mapping) else None,
            seeds=attrs.get(keys.SEEDS),
            confirmation=attrs.get(keys.CONFIRMATION),
            confirmations=tuple(history) if isinstance(history, list) else (),
            search_done=SearchDone(
                str(reason),
                trials if isinstance(trials, int) else None,
                last if isinstance(last, int) else None,
            )
            if reason
            else None,
            check=_check_timings(attrs.get(keys.CHECK)),
        )

    @property
    def verdicts(self) -> tuple[object, ...]:
        """Every confirmation verdict held: the history, then the latest when it is not in it."""
        items = list(self.confirmations)
        if self.confirmation is not None and self.confirmation not in items:
            items.append(self.confirmation)
        return tuple(items)


def study_record(study: optuna.Study) -> StudyRecord:
    """Read the study's attributes (one read of the storage)."""
    return StudyRecord.of(study.user_attrs)


def _workload_phases(workload: Mapping[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for p in workload.get("phases", ()) or ():
        seconds = _num(_mapping(p).get("duration_s"))
        if seconds is not None and _mapping(p).get("ended_by") != "skipped":
            out[str(_mapping(p).get("name", ""))] = seconds
    return out


def _ended_early(workload: Mapping[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for p in workload.get("phases", ()) or ():
        m = _mapping(p)
        if m.get("ended_by") == "ended_early":
            out[str(m.get("name", ""))] = str(m.get("early_end") or "ended early")
    return out


def _text(v: object) -> str | None:
    return None if v is None else str(v)


def _mapping(v: object) -> Mapping[str, Any]:
    return v if isinstance(v, Mapping) else {}


def _num(v: object) -> float | None:
    if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    return None
