"""`autotune confirm`: soak the exported setting once more, longer, and record pass or fail.

The confirmation is a trial outside the search: the same launch command `export` prints, the
same server lifecycle and workload driver (`autotune.trial.run.run_trial` over
`live_launcher`), the study's workload with its steady phases `factor` times longer and its
stress phase repeated as often (how long: `autotune.review.soak`), judged by the study's
constraints. Its log and record go to `results/NAME/confirm/NNNN/`; the verdict is stored on
the study as the user attribute `confirmation`, which `report`, `explain` and `export` read: a
winner whose parameters have not passed a soak is labelled UNCONFIRMED everywhere.

After the soak, `run_confirm` runs the setting's worst cases (`autotune.review.worstcase`) on
the soak's own launch, the server at rest between them, from the least to the most likely to
fail; each case's record lies in its own folder inside its launch's (`confirm/NNNN/CASE/`), and
a case that ends the server leaves the cases after it to a fresh launch (`confirm/NNNN+1/`).
`with_cases` adds them to the verdict: it passes only when every case did too.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import optuna

from autotune.config.schema import Scalar, StudyConfig
from autotune.config.space import settings_of
from autotune.config.workload import EarlyEnd, Poisson, Steady, Stress
from autotune.errors import HarnessError
from autotune.logparse.ledger import Ledger
from autotune.record import keys
from autotune.record.stored import study_record
from autotune.record.view import TrialView
from autotune.review.soak import DEFAULT_SOAK_FACTOR
from autotune.review.verdict import CaseResult, Verdict
from autotune.review.worstcase import Case, run_order
from autotune.study.loop import patiently
from autotune.study.objectives import broken_constraints
from autotune.study.storage import STORAGE_ERRORS, storage_failure
from autotune.trial.live import live_launcher
from autotune.trial.plan import TrialPlan, plan_trial
from autotune.trial.run import FollowUp, FollowUps, Shared, run_shared
from autotune.trial.seam import Launcher
from autotune.trial.trialfile import TrialRecord, write_record

MAX_HISTORY = 20


def soak(cfg: StudyConfig, factor: float, ran: Mapping[str, float] | None = None) -> StudyConfig:
    """The study with its workload lengthened to `factor` trials: steady and Poisson phases
    `factor`× as long as a trial ran them (`ran`: the seconds, by phase name, of the phases the
    trial the soak counts from ended early, `ended_early`; the phase's `duration_s` for every
    other), stress rounds `ceil(factor)`× as many, the workload time limit scaled to match. The
    soak's factor is counted in trials as they ran (the growth it is sized for was measured over
    them), so a trial that ended its steady phase at 600 s of 900 makes a 3× soak 1,800 s long,
    not 2,700. No phase of a soak ends early (`[workload] end_early` is off): a soak exists to
    run long."""

    w = cfg.workload
    lengths = ran or {}
    phases = []
    for ph in w.phases:
        if isinstance(ph, Steady | Poisson):
            one = min(lengths.get(ph.name, ph.duration_s), ph.duration_s)
            ph = dataclasses.replace(ph, duration_s=round(one * factor, 1))
        elif isinstance(ph, Stress):
            ph = dataclasses.replace(ph, rounds=ph.rounds * math.ceil(factor))
        phases.append(ph)
    limits = dataclasses.replace(
        cfg.server.limits, workload_s=cfg.server.limits.workload_s * factor
    )
    return dataclasses.replace(
        cfg,
        workload=dataclasses.replace(w, phases=tuple(phases), end_early=EarlyEnd(enabled=False)),
        server=dataclasses.replace(cfg.server, limits=limits),
    )


def ended_early(view: TrialView) -> dict[str, float]:
    """The seconds a trial ran each workload phase it ended early (`[workload] end_early`), by
    name: the trial's length `soak` counts a soak's factor in."""
    return {
        name: view.workload_phases[name]
        for name in view.stored.ended_early
        if view.workload_phases.get(name, 0.0) > 0.0
    }


def soak_factor_for(given: float | None, margin: Mapping[str, object]) -> tuple[float, str]:
    """How many times longer the soak runs, and why when the operator did not say: `given`,
    else the soak the export's `margin` was sized for, else `DEFAULT_SOAK_FACTOR`."""
    sized = margin.get("soak_factor")
    if given is not None:
        return given, ""
    if isinstance(sized, int | float) and not isinstance(sized, bool):
        return float(sized), " (the soak the export's margin is sized for)"
    return DEFAULT_SOAK_FACTOR, ""


CasePlanner = Callable[[Ledger], Sequence[Case]]
"""The worst cases to run, planned from the ledger of the soak's launch (what SGLang ran)."""


@dataclass(frozen=True)
class Confirmed:
    """What a confirm's launches found: the soak's verdict (its cases not yet added: `with_cases`)
    and ledger, each worst case in the order it ran, whether the operator cut the cases short,
    and how many launches the confirm made (the soak's, and one after each case that ended the
    server)."""

    verdict: Verdict
    ledger: Ledger
    cases: tuple[CaseResult, ...] = ()
    cut: bool = False
    launches: int = 1


def run_confirm(
    soak_cfg: StudyConfig,
    cfg: StudyConfig,
    folder: Path,
    params: Mapping[str, object],
    *,
    trial: int,
    cases: CasePlanner | None = None,
    launcher_factory: Callable[[StudyConfig, Path], Launcher] | None = None,
    clock: Callable[[], float] = time.monotonic,
    phase: Callable[[str], None] = lambda p: None,
    on_plan: Callable[[Sequence[Case]], None] = lambda cases: None,
    on_case: Callable[[Case, CaseResult], None] = lambda c, r: None,
) -> Confirmed:
    """The soak (`soak_cfg`'s workload) on one launch of `params`, then on the same launch, with
    no restart, the worst cases `cases` plans from its ledger (each case's burst as
    `case_config` gives it, judged by `cfg`'s constraints), from the least to the most likely to
    fail (`worstcase.run_order`); `on_plan` hears the cases in that order, `on_case` each result.
    The server is brought to rest before each case (`/flush_cache`, the free memory settled:
    `trial.run.run_shared`), so each case's peak is its own. A case that
    ends the server (out of memory, a crash, a signal, a harness error) is recorded as it ended,
    and the cases after it run on a fresh launch, again sharing it; so do all the cases when the
    soak's server did not serve through the soak. The soak is judged by itself: a case never
    changes its record. An interrupted soak ends the confirm with no cases; an interrupted case
    ends the cases (`cut`): the cases before it are kept."""
    typed = {k: v for k, v in params.items() if isinstance(v, bool | int | float | str)}
    planned: list[Case] = []

    def plan_cases(ledger: Ledger) -> None:
        if cases is not None and not planned:
            planned.extend(run_order(cases(ledger)))
            on_plan(tuple(planned))

    def after_soak(launch: TrialPlan) -> FollowUps:
        def then(ledger: Mapping[str, object]) -> Sequence[FollowUp]:
            plan_cases(Ledger.from_dict(ledger))
            return [_follow_up(cfg, c, launch) for c in planned]

        return then

    plan, shared = _launch(soak_cfg, folder, typed, after_soak, launcher_factory=launcher_factory,
                           clock=clock, phase=phase)  # fmt: skip
    record = shared.first
    write_record(record, plan.trial_dir)
    broken, passed, reason = _judged(record, soak_cfg)
    verdict = _soak_verdict(record, plan, typed, trial, broken, passed, reason)
    ledger = Ledger.from_dict(record.ledger)
    if record.outcome == "interrupted" or cases is None:
        return Confirmed(verdict, ledger)
    plan_cases(ledger)
    found: list[CaseResult] = []
    cut = _kept(cfg, planned, found, plan, shared.then, on_case)
    launches = 1
    while not cut and len(found) < len(planned):
        left = planned[len(found) :]
        first, rest = left[0], left[1:]

        def more(launch: TrialPlan, rest: Sequence[Case] = rest) -> FollowUps:
            return lambda ledger: [_follow_up(cfg, c, launch) for c in rest]

        plan, shared = _launch(case_config(cfg, first), folder, typed, more,
                               launcher_factory=launcher_factory, clock=clock,
                               phase=phase)  # fmt: skip
        launches += 1
        cut = _kept(cfg, left, found, plan, (shared.first, *shared.then), on_case)
    return Confirmed(verdict, ledger, tuple(found), cut, launches)


def _follow_up(cfg: StudyConfig, case: Case, launch: TrialPlan) -> FollowUp:
    """`case` as a workload on `launch`: its record in its own folder inside the launch's."""
    alone = case_config(cfg, case)
    return FollowUp(
        name=case.name,
        plan=dataclasses.replace(launch, trial_dir=launch.trial_dir / case.name),
        workload=alone.workload,
        limit_s=alone.server.limits.workload_s,
    )


def _kept(
    cfg: StudyConfig,
    cases: Sequence[Case],
    found: list[CaseResult],
    launch: TrialPlan,
    records: Sequence[TrialRecord],
    on_case: Callable[[Case, CaseResult], None],
) -> bool:
    """Each case's record of one launch (`records`, in the order of `cases`) written in its own
    folder and judged by the study's constraints into `found`; True when one was interrupted
    (it is left out, and so are the rest)."""
    for case, record in zip(cases, records, strict=False):
        where = launch.trial_dir / case.name
        write_record(record, where)
        if record.outcome == "interrupted":
            return True
        _, passed, reason = _judged(record, cfg)
        result = CaseResult(
            name=case.name,
            sent=case.sent(),
            passed=passed,
            outcome=record.outcome,
            peak_gib=record.stress_peak_gib,
            least_free_gib=record.headroom_gib,
            reason=reason,
            folder=str(where),
            launch=str(launch.trial_dir),
        )
        found.append(result)
        on_case(case, result)
    return False


def _soak_verdict(
    record: TrialRecord,
    plan: TrialPlan,
    typed: Mapping[str, Scalar],
    trial: int,
    broken: list[str],
    passed: bool,
    reason: str,
) -> Verdict:
    return Verdict(
        params=dict(typed),
        trial=trial,
        passed=passed,
        outcome=record.outcome,
        reason=reason,
        violated=tuple(broken),
        capacity_tokens=record.capacity_tokens,
        throughput_tok_s=record.throughput_tok_s,
        headroom_gib=record.headroom_gib,
        stress_peak_gib=record.stress_peak_gib,
        error_rate=record.error_rate,
        seconds=record.phases.get("total"),
        log_path=record.log_path,
        folder=str(plan.trial_dir),
        sglang_version=record.sglang_version,
        at=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    )


def _launch(
    cfg: StudyConfig,
    folder: Path,
    typed: Mapping[str, Scalar],
    then: Callable[[TrialPlan], FollowUps],
    *,
    launcher_factory: Callable[[StudyConfig, Path], Launcher] | None,
    clock: Callable[[], float],
    phase: Callable[[str], None],
) -> tuple[TrialPlan, Shared]:
    """One launch of `typed` under `cfg` in the next `confirm/NNNN/` folder, its own workload
    then the follow-ups `then` plans for it on the same server: the plan and the records."""
    launcher = (launcher_factory or live_launcher)(cfg, folder)
    for note in launcher.stop_orphans():
        sys.stdout.write(f"stopped an orphaned server: {note}\n")
    settings = settings_of(typed, cfg.search)
    number = _next_number(folder / "confirm")
    plan = plan_trial(
        cfg,
        settings,
        number=number,
        trial_dir=folder / "confirm" / f"{number:04d}",
        extra=launcher.extra_args(),
    )
    return plan, run_shared(plan, launcher, then(plan), clock=clock, phase=phase)


def _judged(record: TrialRecord, cfg: StudyConfig) -> tuple[list[str], bool, str]:
    """The constraints `record` broke, whether it passed and why not."""
    measured = record.measured()
    broken: list[str] = []
    if measured is not None:
        broken = broken_constraints(measured, cfg.constraints)
    passed = record.state == "complete" and record.outcome == "ok" and not broken
    reason = record.reason or (f"broke {', '.join(broken)}" if broken else "")
    return broken, passed, reason


def case_config(cfg: StudyConfig, case: Case) -> StudyConfig:
    """The study with its workload replaced by the one burst of `case`. A burst queues by design
    (one more request than the KV pool holds, prefilled a chunk at a time), so its requests may
    wait as long as the burst may last (its phase's timeout) and so may the workload: a request
    that times out in the queue says nothing of the memory."""
    limit = case.burst.timeout_s
    w = cfg.workload
    workload = dataclasses.replace(
        w, phases=(case.burst,), request_timeout_s=max(w.request_timeout_s, limit)
    )
    limits = dataclasses.replace(
        cfg.server.limits, workload_s=max(cfg.server.limits.workload_s, limit)
    )
    return dataclasses.replace(
        cfg, workload=workload, server=dataclasses.replace(cfg.server, limits=limits)
    )


def with_cases(verdict: Verdict, cases: Sequence[CaseResult]) -> Verdict:
    """The soak's verdict with the worst cases added: it passes only when every case did too,
    and a failed case is named in its reason."""
    failed = [c for c in cases if not c.passed]
    if not failed:
        return dataclasses.replace(verdict, cases=tuple(cases))
    named = ", ".join(f"{c.name} ({c.verdict})" for c in failed)
    reason = "; ".join(r for r in (verdict.reason, f"worst case {named}") if r)
    return dataclasses.replace(verdict, cases=tuple(cases), passed=False, reason=reason)


VERDICT_FILE = "verdict.json"


def keep_verdict(
    study: object,
    verdict: Verdict,
    *,
    url: str,
    note: Callable[[str], None] = lambda line: None,
    patience_s: float | None = None,
) -> Path:
    """Write the verdict beside the soak's log, then store it on the study, trying again while
    the storage fails (a PostgreSQL restart, a SQLite lock) for the run's patience; a storage
    that never answers is one line naming the file that still holds the verdict."""
    path = Path(str(verdict.folder)) / VERDICT_FILE
    path.write_text(json.dumps(verdict.to_attr(), indent=1, sort_keys=True) + "\n")
    path.chmod(0o600)
    try:
        patiently(lambda: record_verdict(study, verdict), note=note, patience_s=patience_s)
    except STORAGE_ERRORS as exc:
        failure = storage_failure(exc, url, "failed")
        kept = f"the verdict is not on the study, it is kept in {path}"
        raise HarnessError(f"{failure}; {kept}") from exc
    return path


def record_verdict(study: object, verdict: Verdict) -> None:
    """Store the verdict on the study (the latest, and a short history)."""

    assert isinstance(study, optuna.Study)
    attr = verdict.to_attr()
    study.set_user_attr(keys.CONFIRMATION, attr)
    past = list(study_record(study).confirmations)
    study.set_user_attr(keys.CONFIRMATIONS, [*past, attr][-MAX_HISTORY:])


def _next_number(folder: Path) -> int:
    taken = [int(p.name) for p in folder.glob("[0-9][0-9][0-9][0-9]") if p.name.isdigit()]
    return max(taken, default=-1) + 1
