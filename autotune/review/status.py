"""TODO: autotune.review.status."""

from __future__ import annotations

from collections.abc import Sequence

from optuna.trial import FrozenTrial, TrialState

from autotune.study.objectives import best_feasible_capacity
from autotune.study.progress import duration
from autotune.study.storage import counted

_STATE = {
    TrialState.COMPLETE: "done",
    TrialState.FAIL: "failed",
    TrialState.RUNNING: "running",
    TrialState.WAITING: "queued",
    TrialState.PRUNED: "pruned",
}


def rows(trials: Sequence[FrozenTrial]) -> tuple[list[str], list[list[str]]]:
    """The table as text cells: one column per parameter, then the figures (pure)."""
    names: list[str] = []
    for t in trials:
        for k in list(t.params) + list(t.user_attrs.get("record", {}).get("params", {})):
            if k not in names:
                names.append(k)
    head = ["#", "state", "outcome", *names, "capacity", "tok/s", "headroom", "time", "feasible"]
    workers = {worker_label(t) for t in trials} - {""}
    if len(workers) > 1:  # several workers share the study: say which ran each trial
        head.insert(3, "worker")
    body = []
    for t in trials:
        a = t.user_attrs
        record = a.get("record") if isinstance(a.get("record"), dict) else {}
        assert isinstance(record, dict)
        params = {**record.get("params", {}), **t.params}
        headroom = a.get("headroom_gib")
        total = record.get("phases", {}).get("total")
        verdict = ""
        if t.state == TrialState.COMPLETE:
            broken = [k for k, v in t.constraints.items() if v > 0]
            verdict = "yes" if not broken else "NO: " + ",".join(broken)
        body.append(
            [
                str(t.number),
                _STATE.get(t.state, t.state.name.lower()),
                str(a.get("outcome", "")),
                *[_cell(params.get(n)) for n in names],
                f"{int(a['capacity_tokens']):,}" if "capacity_tokens" in a else "",
                f"{float(a['throughput_tok_s']):,.0f}" if "throughput_tok_s" in a else "",
                f"{headroom:.2f}" if isinstance(headroom, int | float) else "",
                duration(total) if isinstance(total, int | float) else "",
                verdict,
            ]
        )
        if len(workers) > 1:
            body[-1].insert(3, worker_label(t))
    return head, body


def worker_label(t: FrozenTrial) -> str:
    """host, and GPU group when there is one: `box-a:0,1,2,3`."""
    w = t.user_attrs.get("worker")
    if not isinstance(w, dict) or not w.get("host"):
        return ""
    return f"{w['host']}:{w['gpus']}" if w.get("gpus") else str(w["host"])


def render(name: str, url: str, trials: Sequence[FrozenTrial]) -> str:
    head, body = rows(trials)
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    lines = [
        "  ".join([*(c.rjust(w) for c, w in zip(r[:-1], widths, strict=False)), r[-1]]).rstrip()
        for r in [head, *body]
    ]
    best = best_feasible_capacity(trials)
    ooms = sum(1 for t in trials if t.user_attrs.get("outcome") in ("startup_oom", "runtime_oom"))
    summary = (
        f"study {name} ({url}): {counted(trials)} trials finished, {ooms} OOM, best feasible "
        + (f"capacity {best:,} tokens" if best is not None else "capacity: none yet")
    )
    return "\n".join([summary, *lines]) + "\n"


def _cell(v: object) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)
