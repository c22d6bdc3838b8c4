"""The status table of a study: one row per trial with its parameters and figures (pure).

Queued points are listed with the parameters they will run; the figures are the trial views'
(`autotune.record.view`), printed as every other review surface prints them. The command puts
the study's headline (`autotune.review.headline`) and the winner's share of the box's ceiling
(`autotune.review.ceiling`) above the table. A trial the storage calls
running whose worker is gone (the command judges it, with the rule a run reaps by:
`autotune.study.storage.stale`) is shown as `running?`, with why, below the table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from optuna.trial import FrozenTrial, TrialState

from autotune.config.schema import StudyConfig
from autotune.record.stored import StudyRecord
from autotune.record.view import TrialView, view
from autotune.review import figures as fig
from autotune.review.ceiling import line as ceiling_line
from autotune.review.headline import headline
from autotune.review.source import Review, build_review
from autotune.study.objectives import best_feasible_capacity
from autotune.study.progress import duration
from autotune.study.storage import counted, stale
from autotune.study.workers import current_worker

_STATE = {
    TrialState.COMPLETE: "done",
    TrialState.FAIL: "failed",
    TrialState.RUNNING: "running",
    TrialState.WAITING: "queued",
    TrialState.PRUNED: "pruned",
}


GONE = "running?"
"""The state shown for a RUNNING trial whose worker is gone."""


def rows(
    trials: Sequence[FrozenTrial], gone: Mapping[int, str] | None = None
) -> tuple[list[str], list[list[str]]]:
    """The table as text cells: one column per parameter, then the figures (pure); the trials
    in `gone` (number: why) are shown as `running?`."""
    gone = gone or {}
    names: list[str] = []
    seen = [view(t) for t in trials]
    for v in seen:
        for k in v.params:
            if k not in names:
                names.append(k)
    head = ["#", "state", "outcome", *names, "capacity", "tok/s", "free after startup",
            "free at worst", "time", "feasible"]  # fmt: skip
    workers = {worker_label(v) for v in seen} - {""}
    if len(workers) > 1:  # several workers share the study: say which ran each trial
        head.insert(3, "worker")
    body = []
    for t, v in zip(trials, seen, strict=True):
        total = v.phases.get("total")
        verdict = ""
        if t.state == TrialState.COMPLETE:
            verdict = "yes" if not v.violated else "NO: " + ",".join(v.violated)
        body.append(
            [
                str(t.number),
                GONE if t.number in gone else _STATE.get(t.state, t.state.name.lower()),
                v.outcome,
                *[_param_cell(v, n) for n in names],
                fig.tokens(v.capacity_tokens, ""),
                f"{v.throughput_tok_s:,.0f}" if v.throughput_tok_s is not None else "",
                fig.gib(v.static_free_gib),
                fig.gib(v.free_at_peak_gib),
                duration(total) if total is not None else "",
                verdict,
            ]
        )
        if len(workers) > 1:
            body[-1].insert(3, worker_label(v))
    return head, body


def worker_label(v: TrialView) -> str:
    """host, and GPU group when there is one: `box-a:0,1,2,3`."""
    w = v.worker
    if w is None or not w.get("host"):
        return ""
    return f"{w['host']}:{w['gpus']}" if w.get("gpus") else str(w["host"])


def render(
    name: str,
    url: str,
    trials: Sequence[FrozenTrial],
    *,
    headline: str = "",
    gone: Mapping[int, str] | None = None,
    ended: str = "",
) -> str:
    """The summary line and the table, below `headline` when one is given; below the table, what
    SGLang ran other than asked (`clamp_notes`), `ended` (why the search stopped before its
    budget, `SearchEnd.line`) and one line per trial in `gone` (number: why its worker is
    gone)."""
    gone = gone or {}
    head, body = rows(trials, gone)
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    lines = [
        "  ".join([*(c.rjust(w) for c, w in zip(r[:-1], widths, strict=False)), r[-1]]).rstrip()
        for r in [head, *body]
    ]
    best = best_feasible_capacity(trials)
    ooms = sum(1 for v in map(view, trials) if v.ending.is_oom)
    summary = (
        f"study {name} ({url}): {counted(trials)} trials finished, {ooms} OOM, best feasible "
        + (f"capacity {best:,} tokens" if best is not None else "capacity: none yet")
    )
    notes = [
        f"trial {n}: {GONE} the storage says running, but {why}; the next `autotune run` of "
        "its worker marks it stale and runs its point again"
        for n, why in sorted(gone.items())
    ]
    notes = [ended, *notes] if ended else notes
    notes = [*clamp_notes([view(t) for t in trials]), *notes]
    return "\n".join([*([headline] if headline else []), summary, *lines, *notes]) + "\n"


def status_text(
    name: str,
    url: str,
    trials: Sequence[FrozenTrial],
    study: StudyRecord,
    cfg: StudyConfig | None,
    *,
    now: datetime,
) -> str:
    """`autotune status`'s whole output: the study's headline and ceiling line, the table, why
    the search ended, and which running trials' workers are gone (judged by the rule a run reaps
    by, at `now`), every secret masked; `url` is shown as given (the command masks its password)."""
    review = build_review(name, url, trials, cfg=cfg, study_attrs=study)
    me = current_worker("")
    gone = {t.number: why for t, why in stale(trials, me, (), grace_s=0, now=now)}
    ended = review.search_end.line() if review.search_end is not None else ""
    top = f"{headline(review)}\n{ceiling_line(review)}{_worst_case(review)}"
    text = render(name, url, trials, headline=top, gone=gone, ended=ended)
    return review.scrub(text)


def _worst_case(review: Review) -> str:
    """The worst case of the exported setting's confirmation on a line of its own, else of the
    latest confirmation that ran worst cases (naming the setting it confirmed: the export may
    have backed off from it); "" when no confirmation ran any."""
    c = review.confirmation
    at = ""
    if c is None or not c.cases:
        c = next((v for v in reversed(review.confirmations) if v.cases), None)
        if c is None:
            return ""
        at = " of " + " ".join(f"{k}={v}" for k, v in c.params.items())
    return f"\nconfirmation{at} {'passed' if c.passed else 'FAILED'}: {c.worst_line()}"


def clamp_notes(seen: Sequence[TrialView]) -> list[str]:
    """One line per trial SGLang ran other than asked (`TrialView.clamps`: the setting, asked,
    ran, why, the SGLang source of the rule), and one per trial skipped because SGLang would
    have run it as a measured trial (`TrialView.runs_as`)."""
    out: list[str] = []
    for v in seen:
        for c in v.clamps.clamped:
            out.append(f"trial {v.number}: SGLang ran {c.text()} [{c.source}]")
        if v.runs_as is not None:
            out.append(
                f"trial {v.number}: not launched, SGLang runs its point as trial {v.runs_as}"
            )
    return out


def _param_cell(v: TrialView, name: str) -> str:
    """A parameter as asked, and `→ ran` where SGLang ran another value (`asked→ran`)."""
    cell = _cell(v.params.get(name))
    ran = next((c.effective for c in v.clamps.clamped if c.name == name), None)
    return f"{cell}→{_cell(ran)}" if ran is not None and cell else cell


def _cell(v: object) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)
