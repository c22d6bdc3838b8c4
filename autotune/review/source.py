"""What every review command starts from: the study found and read, the winner chosen.

`open_source` finds the study from the command line the way `status` does (the results folder's
`study.db`, or --storage), reading the study file too when there is one (`export` and `confirm`
need it for the launch command; `report` and `explain` use it for the search space and the
headroom constraint and do without: the space is then the one Optuna stored with the trials).
The space gives a point its identity (`config.space.point_key`: the trial that ran the exported
point, the soak of it, the baseline's trial) and the fraction its step. `build_review` is pure:
trials in, a `Review` out.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.config.schema import MEMORY_CONSTRAINTS, Fixed, Scalar, StudyConfig
from autotune.config.space import PointKey, Space, fraction_step, point_key, stored_space
from autotune.errors import UsageError
from autotune.logparse.outcome import Outcome
from autotune.masking import redact, scrub
from autotune.record.stored import StudyRecord, study_record
from autotune.record.stored import required_headroom as stored_headroom
from autotune.record.view import SearchEnd, TrialView, search_end, views
from autotune.review.plotdata import study_cell_bytes
from autotune.review.soak import SOAK_CASE, WorstCases
from autotune.review.verdict import CaseResult, Verdict
from autotune.review.winner import (
    CONFIRM_AGAIN,
    DEFAULT_TOLERANCE,
    Margin,
    Winner,
    choose,
)
from autotune.study.storage import STUDY_DB, default_storage_url, load_existing


@dataclass(frozen=True)
class Source:
    """A study opened for review."""

    name: str
    url: str
    study: optuna.Study
    cfg: StudyConfig | None
    folder: Path
    addressed: str = ""
    """The arguments that named the study on the command line (`--study NAME`, or `--config PATH`
    with `--results-dir`, `--storage`), for the commands the review tells the operator to run."""


@dataclass(frozen=True)
class Review:
    """A study as the morning review sees it."""

    name: str
    storage: str
    trials: tuple[TrialView, ...]
    winner: Winner | None
    confirmations: tuple[Verdict, ...]
    """Recorded soaks, oldest first."""
    fraction_step: float
    min_headroom_gib: float | None
    cell_bytes: float | None
    running: int
    queued: int
    secrets: tuple[str, ...] = ()
    """Literal secrets (the API key the workload reads) to mask in every output."""
    baseline: Mapping[str, Scalar] | None = None
    """The operator's baseline point (its searched parameters), None when the study has none."""
    search_end: SearchEnd | None = None
    """Why the search ended before its budget (nothing left worth a launch), None if it did not."""
    space: Space | None = None
    """The search space (the study file's, else the one the trials were stored with): a
    point's identity (`config.space.point_key`) and the fraction's step."""
    addressed: str = ""
    """The arguments that name the study in a command the review suggests (`Source.addressed`;
    `--study NAME` when empty)."""

    @property
    def study_args(self) -> str:
        """`--study NAME`, or the arguments the operator named the study with."""
        return study_args(self.name, self.addressed)

    @property
    def baseline_trial(self) -> TrialView | None:
        """The latest finished trial that ran the baseline (a feasible one first)."""
        if not self.baseline:
            return None
        baseline = point_key(self.baseline, self.space)
        found = None
        for t in self.trials:
            if t.kind in ("running", "skipped") or not baseline.within(
                point_key(t.params, self.space)
            ):
                continue
            if found is None or t.feasible or not found.feasible:
                found = t
        return found

    def scrub(self, text: str) -> str:
        """`text` with the study's secrets masked: every surface passes what it prints through
        this."""
        return scrub(text, self.secrets)

    @property
    def confirmation(self) -> Verdict | None:
        """The latest soak of the exported setting."""
        if self.winner is None:
            return None
        return self.confirmation_of(self.winner.params)

    def confirmation_of(self, params: Mapping[str, Scalar]) -> Verdict | None:
        """The latest soak of the point `params`."""
        return latest_confirmation(self.confirmations, params, self.space)

    @property
    def confirmed(self) -> bool | None:
        """True/False when the exported setting was soaked and passed/failed; None if not."""
        c = self.confirmation
        return c.passed if c is not None else None

    def confirmed_label(self, params: Mapping[str, Scalar] | None = None) -> str:
        """How the exported setting (or `params`) fared in a soak, in words."""
        c = self.confirmation if params is None else self.confirmation_of(params)
        if c is None:
            return f"UNCONFIRMED (run `autotune confirm {self.study_args}`)"
        worst = f"; {c.worst_line()}" if c.cases else ""
        if c.passed:
            cases = f" and {len(c.cases)} worst cases" if c.cases else ""
            return f"CONFIRMED by a soak{cases} ({c.at}){worst}"
        return f"FAILED its confirmation soak: {c.reason or c.outcome}{worst}"

    def trial(self, number: int) -> TrialView:
        """Trial `number`'s view; a number the study does not have is the operator's `UsageError`,
        naming the range it has."""
        for t in self.trials:
            if t.number == number:
                return t
        numbers = [t.number for t in self.trials]
        span = f"{min(numbers)}..{max(numbers)}" if numbers else "none"
        raise UsageError(f"--trial {number}: study {self.name} has no such trial (trials {span})")


def study_args(name: str, addressed: str = "") -> str:
    """The arguments a suggested command names the study `name` with: as the operator named it
    (`addressed`), else `--study NAME`."""
    return addressed or f"--study {name}"


def open_source(
    name: str, url: str, folder: Path, cfg: StudyConfig | None, addressed: str = ""
) -> Source:
    """The study `name` in the storage at `url`; a clear error when it has no results yet.
    `addressed`: the arguments that named it (`Source.addressed`)."""
    if url == default_storage_url(folder) and not (folder / STUDY_DB).is_file():
        raise UsageError(f"study {name} has no results in {folder}; run `autotune run "
                         f"{study_args(name, addressed)}` first or pass --results-dir")  # fmt: skip
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return Source(name, url, load_existing(name, url), cfg, folder, addressed)


def build_review(
    name: str,
    storage: str,
    trials: Sequence[FrozenTrial],
    *,
    cfg: StudyConfig | None,
    study_attrs: StudyRecord | Mapping[str, object],
    tolerance: float = DEFAULT_TOLERANCE,
    margin: Margin | None = None,
    addressed: str = "",
) -> Review:
    """Read the trials and choose the winner (pure). `study_attrs`: the study's record
    (`record.stored.study_record`), or its attributes as stored."""
    held = study_attrs if isinstance(study_attrs, StudyRecord) else StudyRecord.of(study_attrs)
    seen = views(trials)
    space: Space = cfg.search if cfg is not None else stored_space(trials)
    step = fraction_step(space)
    cell = study_cell_bytes(seen)
    required = _min_headroom(cfg, trials)
    confirmations = _confirmations(held)

    def chosen(worst: WorstCases | None = None) -> Winner | None:
        return choose(
            seen,
            space=space,
            tolerance=tolerance,
            margin=margin,
            cell_bytes=cell,
            min_headroom_gib=required or 0.0,
            worst=worst,
        )

    winner = _soaked(confirmed_choice(chosen, confirmations, space), confirmations, space)
    return Review(
        name=name,
        storage=storage,
        trials=tuple(seen),
        winner=winner,
        confirmations=confirmations,
        fraction_step=step,
        min_headroom_gib=required,
        cell_bytes=cell,
        running=sum(1 for t in trials if t.state == TrialState.RUNNING),
        queued=sum(1 for t in trials if t.state == TrialState.WAITING),
        secrets=secrets_of(cfg),
        baseline=baseline_of(held, cfg),
        search_end=search_end(held, trials),
        space=space,
        addressed=addressed,
    )


def review_of(
    source: Source, *, tolerance: float = DEFAULT_TOLERANCE, margin: Margin | None = None
) -> Review:
    """The review of an opened study with the given winner rule."""
    trials = source.study.get_trials(deepcopy=False)
    if not any(t.state != TrialState.WAITING for t in trials):
        raise UsageError(
            f"study {source.name} has no trials yet; run "
            f"`autotune run {study_args(source.name, source.addressed)}`"
        )
    return build_review(
        source.name,
        redact(source.url),
        trials,
        cfg=source.cfg,
        study_attrs=study_record(source.study),
        tolerance=tolerance,
        margin=margin,
        addressed=source.addressed,
    )


def baseline_of(study: StudyRecord, cfg: StudyConfig | None) -> dict[str, Scalar] | None:
    """The baseline the study queued first (stored on it), else the study file's."""
    held = study.baseline
    if held:
        return {str(k): v for k, v in held.items() if isinstance(v, bool | int | float | str)}
    if cfg is None or not cfg.search.baseline:
        return None
    searched = {p.name for p in cfg.search.params if not isinstance(p, Fixed)}
    return {k: v for k, v in cfg.search.baseline.items() if k in searched} or None


MAX_BACKOFFS = 8
"""The most confirmations of successive backed-off points one review hears out."""


def confirmed_choice(
    chosen: Callable[[WorstCases | None], Winner | None],
    confirmations: Sequence[Verdict],
    space: Space | None,
) -> Winner | None:
    """The winner `chosen` gives once every confirmation of the points it lands on is heard.
    A confirmation at the exported point that measured a peak above the soak's margin, or
    whose soak or worst case failed serving, moves the margin (`review.soak.soak_plan`); where
    the point it moves to was confirmed too and failed as well, that moves it again, each
    finding kept: a soak that failed is a peak the trials never showed, so the export backs
    off beyond it and says so rather than print a setting its confirmation refuted."""
    winner = chosen(None)
    found: WorstCases | None = None
    heard: set[PointKey] = set()
    while winner is not None and len(heard) < MAX_BACKOFFS:
        heard.add(point_key(winner.params, space))
        worst = _worst_cases(winner, confirmations, space)
        if worst is None:
            break
        found = worst if found is None else found.joined(worst)
        winner = chosen(found)
        if winner is None or point_key(winner.params, space) in heard:
            break
    if winner is not None and point_key(winner.params, space) in heard:
        again = _worst_cases(winner, confirmations, space)
        if again is not None and again.failed:
            return _refuted_floor(winner)
    return winner


REFUTED_FLOOR = (
    "the export cannot back off beyond the setting whose confirmation failed (no lower "
    "fraction can start, and no less demand is left to trade): no setting of the space is "
    "known to pass a soak this long on this box"
)
"""The note of an export the margin could not move past a point its own confirmation refuted:
confirming it again would soak the same setting."""


def _refuted_floor(winner: Winner) -> Winner:
    """`winner` where the margin landed back on a point whose confirmation failed: its notes no
    longer send the operator to confirm the same setting again, and say why it stays."""
    notes = tuple(n.replace(CONFIRM_AGAIN, "") for n in winner.notes)
    return replace(winner, notes=(*notes, REFUTED_FLOOR))


def _worst_cases(
    winner: Winner | None, confirmations: Sequence[Verdict], space: Space | None
) -> WorstCases | None:
    """What the latest confirmation of the point the soak's margin exports found there that
    ran worst cases or whose soak failed serving, for the margin to cover (None: no such
    confirmation, or another margin)."""
    if winner is None or winner.soak is None:
        return None
    for c in reversed(confirmations):
        soak = _soak_failure(c)
        cases = (soak, *c.cases) if soak is not None else c.cases
        if cases and c.covers(winner.params, space):
            served = [x for x in cases if _served(x)]
            peaks = tuple((x.name, x.peak_gib) for x in served if x.peak_gib is not None)
            failed = tuple(x.name for x in served if not x.passed)
            unrun = tuple(x.name for x in cases if not _served(x))
            return WorstCases(peaks, failed, winner.steps_back, unrun)
    return None


def _soak_failure(c: Verdict) -> CaseResult | None:
    """The confirmation's soak itself as a failed case, where it failed for its memory: it ran
    out of memory or crashed serving, or it broke a memory constraint (the headroom); None where
    the soak passed (whatever its worst cases did) or failed otherwise (at startup, cut short,
    a latency limit: no fraction a step lower answers those)."""
    if c.passed:
        return None
    ending = Outcome.of(c.outcome)
    memory = ending.fails_at_runtime or (
        ending is Outcome.OK and any(v in MEMORY_CONSTRAINTS for v in c.violated)
    )
    if not memory:
        return None
    sent = f"{c.soak_factor:g}× the trials' workload" if c.soak_factor else "the soak"
    # no peak: a soak's is measured from its workload's start, so it holds the growth over the
    # soak, which the margin counts on its own; the failure backs off a step beyond the point
    return CaseResult(
        SOAK_CASE, sent, False, c.outcome, None, c.headroom_gib, c.reason, c.folder, c.folder
    )


def _served(case: CaseResult) -> bool:
    """Whether a worst case served its burst: it passed, or it failed serving (out of memory,
    a crash, a hang, a broken constraint), not at startup nor cut short by autotune or the
    machine (those say nothing of the setting's peak)."""
    o = Outcome.of(case.outcome)
    return case.passed or not (o.fails_at_startup or o.requeued or o is Outcome.UNKNOWN)


def latest_confirmation(
    confirmations: Sequence[Verdict], params: Mapping[str, Scalar], space: Space | None
) -> Verdict | None:
    """The latest of `confirmations` that soaked the point `params` (of `space`)."""
    return next((c for c in reversed(confirmations) if c.covers(params, space)), None)


def _soaked(winner: Winner | None, confirmations: Sequence[Verdict], space: Space) -> Winner | None:
    """A winner backed off to a point no trial ran, with the figures of the latest confirmation
    soak of that point where it passed: what ran, on every surface."""
    if winner is None or not winner.predicted:
        return winner
    latest = latest_confirmation(confirmations, winner.params, space)
    if latest is None or not latest.passed or latest.capacity_tokens is None:
        return winner
    return winner.measured_by_soak(
        latest.capacity_tokens, latest.throughput_tok_s, latest.headroom_gib
    )


def _confirmations(study: StudyRecord) -> tuple[Verdict, ...]:
    return tuple(c for c in map(Verdict.from_attr, study.verdicts) if c is not None)


def secrets_of(cfg: StudyConfig | None) -> tuple[str, ...]:
    """The API key the study's workload reads from the environment, when it is set here."""

    name = cfg.workload.api_key_env if cfg is not None else None
    value = os.environ.get(str(name)) if name else None
    return (value,) if value else ()


def _min_headroom(cfg: StudyConfig | None, trials: Sequence[FrozenTrial]) -> float | None:
    if cfg is not None:
        return cfg.constraints.min_headroom_gib or None
    return stored_headroom(trials) or None


def _scalars(params: Mapping[object, object]) -> dict[str, Scalar]:
    """The parameter values of a stored point (a JSON object)."""
    return {str(k): v for k, v in params.items() if isinstance(v, bool | int | float | str)}
