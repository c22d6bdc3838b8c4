"""`autotune explain`: one trial's memory arithmetic in words and numbers.

For the operator's 0.88 it reads "KV pool = 21.71 − 94.05 × (1 − 0.88) = 10.42 GiB → 159,276
tokens at 70,272 B/token; reserve P × (1 − f) 11.29 GiB = request table + draft + CUDA graphs +
other + free after startup; stress peak …", then what other fractions gave (measured where a
trial ran them, predicted otherwise) and what limits this one. Every figure is the trial view's
(`autotune.record.view`), so it is the number `status`, `export` and the report print. The text
is built by pure functions from a `Review`, so the report embeds the same words; the arithmetic
itself is docs/sglang-memory.md.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence

from autotune.config.schema import FRACTION
from autotune.config.space import PointKey, point_key, same_value, snap
from autotune.logparse.semantics import rules
from autotune.memory.arithmetic import Arithmetic, AtFraction
from autotune.memory.cell import folds_draft
from autotune.record.remedy import remedy
from autotune.record.view import TrialView
from autotune.review import figures as fig
from autotune.review.ceiling import line as ceiling_line
from autotune.review.headline import headline
from autotune.review.source import Review

NEIGHBOURS = 3

CELL_SHARE_BYTES = 16
"""Bytes per token beyond the target's KV line at which the sizing cell holds something else too
(a folded draft's KV, a state pool's share): the cell is snapped to 16 bytes."""


def explain(review: Review, t: TrialView, *, extra: Sequence[float] = ()) -> str:
    """The whole explanation of trial `t` (pure), the study's headline and the winner's ceiling
    line first."""
    lines = [headline(review), ceiling_line(review), _heading(review, t), *_clamped(t)]
    lines += _ended_early(t)
    lines += [f"The memory model that chose it also learnt from {o}" for o in t.seeded_from]
    a = t.arithmetic(review.cell_bytes)
    if a is None:
        lines.append(_no_arithmetic(t))
        return "\n".join(lines) + "\n"
    lines += _pool(a, t)
    lines += _reserve(a, t, review.min_headroom_gib)
    basis = _started_neighbour(review, t) if t.ending.fails_at_startup else None
    if basis is not None:
        b = basis.arithmetic(review.cell_bytes)
        if b is not None:
            a = b
            lines.append(
                f"This trial did not finish starting, so predictions below start from trial "
                f"{basis.number} ({FRACTION}={basis.fraction:g}), the nearest that did"
            )
    borrowed = _borrowed_peak(review, t) if a.stress_peak_gib is None else None
    if borrowed is not None:
        peak, numbers = borrowed
        a = dataclasses.replace(a, stress_peak_gib=peak)
        lines.append(
            f"Predictions below use the stress peak measured by trials "
            f"{', '.join(f'#{n}' for n in numbers)} with the same other settings: {peak:.2f} GiB"
        )
    lines += _other_fractions(a, review, t, extra)
    lines += _limits(a, review, t)
    return "\n".join(lines) + "\n"


def _clamped(t: TrialView) -> list[str]:
    """What SGLang ran of the trial other than it asked (`TrialView.clamps`), each with the
    SGLang source of the rule; for a skipped duplicate, the trial it stands for."""
    out = [
        f"  SGLang ran {c.text()}; the figures below are of what it ran [{c.source}]"
        for c in t.clamps.clamped
    ]
    if t.runs_as is not None:
        out.append(f"  its figures are trial {t.runs_as}'s: SGLang runs this point as that trial")
    return out


def _ended_early(t: TrialView) -> list[str]:
    """The workload's phases that ended before their planned end (`[workload] end_early`), each
    with the rule's why, so a short phase is not read as a cut-short trial."""
    return [f"  workload phase {name} {why}" for name, why in t.stored.ended_early.items()]


def _started_neighbour(review: Review, t: TrialView) -> TrialView | None:
    started = [
        x
        for x in review.trials
        if x.fraction is not None
        and x.static_free_gib is not None
        and not x.ending.fails_at_startup
        and x.kind not in ("running", "skipped")
        and _besides_fraction(review, x) == _besides_fraction(review, t)
    ]
    if not started or t.fraction is None:
        return None
    f = t.fraction
    return min(started, key=lambda x: (abs((x.fraction or 0.0) - f), x.number))


def _borrowed_peak(review: Review, t: TrialView) -> tuple[float, list[int]] | None:
    """The median stress peak of the trials that differ from `t` only in the fraction (the
    peak does not depend on it: the pool is allocated up front)."""
    found = [
        (x.stress_peak_gib, x.number)
        for x in review.trials
        if x.stress_peak_gib is not None
        and x.number != t.number
        and _besides_fraction(review, x) == _besides_fraction(review, t)
    ]
    if not found:
        return None
    return statistics.median(p for p, _ in found), sorted(n for _, n in found)


def _heading(review: Review, t: TrialView) -> str:
    params = ", ".join(f"{k}={fig.scalar(v)}" for k, v in t.params.items())
    verdict = {
        "feasible": "feasible",
        "infeasible": f"infeasible ({', '.join(t.violated)})",
        "oom": "out of memory",
        "failed": "failed",
        "running": "still running",
        "skipped": "never launched",
    }[t.kind]
    text = f"trial {t.number} ({params}): {t.outcome or t.state}, {verdict}"
    w = review.winner
    if w is not None and w.trial == t.number:
        if w.predicted or w.soaked:
            f = w.params.get(FRACTION)
            how = (
                "run by its confirmation soak alone, whose figures these are"
                if w.soaked
                else "never run; its figures are predicted"
            )
            text += (
                f"\nthe exported setting is this trial backed off to {FRACTION}={f} "
                f"({how}), {review.confirmed_label()}"
            )
        else:
            text += f"\nthis is the exported setting, {review.confirmed_label()}"
    if t.reason:
        text += f"\n  {t.reason}"
    hint = remedy(t)
    if hint:
        text += f"\n  what would fix it: {hint}"
    return text


def _no_arithmetic(t: TrialView) -> str:
    if t.fraction is None:
        return f"  the trial has no {FRACTION}, so there is no pool arithmetic to show"
    return (
        "  its log does not show P (free memory before weights) and what the weights left, "
        "so the pool arithmetic cannot be shown" + (f"; see {t.log_path}" if t.log_path else "")
    )


def _pool(a: Arithmetic, t: TrialView) -> list[str]:
    led = t.ledger
    f = a.fraction
    cell = f"{a.cell_bytes:,.0f} B/token" + ("" if a.cell_exact else " (from the KV line)")
    out = [
        f"P, the free memory per GPU before the weights load (min over "
        f"{led.ranks or '?'} GPUs) = {a.p_gib:.2f} GiB; mem_fraction_static is a fraction of P.",
    ]
    if a.weights_gib is not None:
        out.append(
            f"The weights took {a.weights_gib:.2f} GiB and left A = "
            f"{a.avail_after_weights_gib:.2f} GiB."
        )
    out.append(
        f"KV pool = A − P × (1 − f) = {a.avail_after_weights_gib:.2f} − {a.p_gib:.2f} × "
        f"(1 − {f:g}) = {a.kv_budget_gib:.2f} GiB → {a.tokens_from_formula:,} tokens at {cell}"
    )
    if t.capacity_tokens is not None:
        logged = f"{a.kv_logged_gib:.2f} GiB" if a.kv_logged_gib is not None else "?"
        said = f"  the log says {fig.tokens(t.capacity_tokens)} tokens, KV {logged}"
        own = a.kv_cell_bytes
        if own is not None and a.cell_bytes - own >= CELL_SHARE_BYTES:
            # the cell holds more than the target's KV: a folded draft's or a state pool's share
            extra = a.cell_bytes - own
            whose = (
                "the draft's KV, which 0.5.18+ sizes inside each token's cell"
                if folds_draft(led, rules(led.semantics))
                else "the state pool's share of each token"
            )
            out.append(
                f"{said} for the target's own, about {own:,.0f} B/token; the other {extra:,.0f} "
                f"B/token ({t.capacity_tokens * extra / 2**30:.2f} GiB) is {whose}"
            )
        else:
            out.append(
                f"{said} (P and A are printed with two decimals; the pool has one padding page)"
            )
    return out


def _reserve(a: Arithmetic, t: TrialView, min_headroom: float | None) -> list[str]:
    h = a.headroom
    reserve = fig.gib(t.reserve_gib)
    if h is None:
        return [
            f"Reserve P × (1 − f) = {reserve} GiB; the server did not get far enough to show "
            "where it went."
        ]
    started = not t.ending.fails_at_startup
    parts = [f"request table {h.request_table:.2f}"]
    if h.draft and not (h.draft_weights or h.draft_kv):
        parts.append(
            f"draft graphs {h.draft_graphs:.2f} (its weights are in A, its KV in the pool)"
        )
    elif h.draft:
        parts.append(
            f"draft {h.draft:.2f} (weights {h.draft_weights:.2f}, KV {h.draft_kv:.2f}, "
            f"graphs {h.draft_graphs:.2f})"
        )
    free = fig.gib(t.static_free_gib)
    free = f"free after startup {free}" if started else f"{free} free at the last log line"
    parts += [f"CUDA graphs {h.graphs:.2f}", f"other {h.other:.2f}", free]
    if started:
        out = [f"Reserve P × (1 − f) = {reserve} GiB = " + " + ".join(parts)]
    else:
        out = [f"Reserve P × (1 − f) = {reserve} GiB was too small to start: " + " + ".join(parts)]
    if h.other:
        out.append("  'other' is what the log lines leave unexplained: workspaces, NCCL, cuBLAS")
    if t.stress_peak_gib is not None and t.free_at_peak_gib is not None:
        need = f" (required ≥ {min_headroom:.2f})" if min_headroom is not None else ""
        out.append(
            f"Stress peak {fig.gib(t.stress_peak_gib)} GiB: what the workload took at its worst "
            f"on top of the free memory after startup → {fig.gib(t.free_at_peak_gib)} GiB "
            f"{fig.FREE_AT_WORST}{need}"
        )
    elif t.outcome == "runtime_oom":
        out.append(
            f"Under load the transient peak exceeded the {fig.gib(t.static_free_gib)} GiB free "
            "after startup: CUDA out of memory inside the forward pass"
        )
    else:
        out.append("Stress peak: not measured (the workload did not run or record it)")
    return out


def _other_fractions(
    a: Arithmetic, review: Review, t: TrialView, extra: Sequence[float]
) -> list[str]:
    step = review.fraction_step
    centre = t.fraction if t.fraction is not None else a.fraction
    fs = {snap(centre + i * step, step) for i in range(-NEIGHBOURS, NEIGHBOURS + 1)}
    fs |= {snap(x, step) for x in extra}
    fs = {f for f in fs if 0.0 < f < 1.0}
    ran = _ran_at(review, t)
    rows = [
        "Other fractions (same other settings): measured where a trial ran them, otherwise "
        "predicted with this trial's P, A, bytes per token, post-pool allocations and peak:",
        f"  {'f':>6} {'KV GiB':>7} {'tokens':>9} {'reserve':>8} {'free':>6} {'at peak':>8}  source",
    ]
    for f in sorted(fs):
        at = a.at(f)
        x = ran.get(f)
        mark = "*" if same_value(f, centre, step) else " "
        rows.append(f" {mark}" + (_measured_row(f, x, at) if x is not None else _predicted_row(at)))
    return rows


def _ran_at(review: Review, t: TrialView) -> dict[float, TrialView]:
    """The trial that ran each fraction with `t`'s other settings (`t` itself for its own)."""
    ran: dict[float, TrialView] = {}
    for x in review.trials:
        if x.fraction is None or x.kind in ("running", "skipped"):
            continue
        if _besides_fraction(review, x) != _besides_fraction(review, t):
            continue
        key = snap(x.fraction, review.fraction_step)
        held = ran.get(key)
        if held is None or (held.number != t.number and (x.number == t.number or x.feasible)):
            ran[key] = x
    return ran


def _measured_row(f: float, x: TrialView, at: AtFraction) -> str:
    kv = x.ledger.kv_gib
    predicted = fig.gib(at.free_at_peak_gib, "?")
    note = f"#{x.number} {x.outcome or x.state}, measured"
    if x.free_at_peak_gib is None or abs(x.free_at_peak_gib - (at.free_at_peak_gib or 0)) >= 0.01:
        note += f" (predicted at peak {predicted})"
    return (
        f"{f:6.3g} {fig.gib(kv, '?'):>7} {fig.tokens(x.capacity_tokens):>9} "
        f"{fig.gib(x.reserve_gib, '?'):>8} {fig.gib(x.static_free_gib, '–'):>6} "
        f"{fig.gib(x.free_at_peak_gib, '–'):>8}  {note}"
    )


def _predicted_row(at: AtFraction) -> str:
    return (
        f"{at.fraction:6.3g} {at.kv_gib:7.2f} {at.tokens:9,} {at.reserve_gib:8.2f} "
        f"{fig.gib(at.static_free_gib, '?'):>6} {fig.gib(at.free_at_peak_gib, '?'):>8}  "
        f"{_predicted(at)}"
    )


def _limits(a: Arithmetic, review: Review, t: TrialView) -> list[str]:
    need = review.min_headroom_gib or 0.0
    out = ["What limits it:"]
    highest = a.highest_fraction(need, review.fraction_step)
    if highest is not None:
        holds = ["the request table"]
        h = a.headroom
        if h is not None and h.draft:
            holds.append("the draft")
        holds += ["CUDA graphs", "the stress peak"]
        out.append(
            f"  the reserve must hold {', '.join(holds[:-1])} and {holds[-1]} with "
            f"{need:.2f} GiB to spare; by these figures the highest mem_fraction_static that "
            f"does is {highest:g} (predicted)"
        )
    above = sorted(
        (x for x in review.trials
         if x.fraction is not None and (t.fraction or a.fraction) < x.fraction
         and _besides_fraction(review, x) == _besides_fraction(review, t)
         and not x.feasible and x.kind not in ("running", "skipped")),
        key=lambda x: x.fraction or 0.0,
    )  # fmt: skip
    if above:
        x = above[0]
        out.append(
            f"  the next fraction up that ran, {x.fraction:g} (trial {x.number}), was "
            f"{x.kind}: {_why(x)}"
        )
    r = t.requests
    h = a.headroom
    if r is not None and h is not None:
        out.append(
            f"  max_running_requests={r} does not size the KV pool; it sizes the request table "
            f"({h.request_table:.2f} GiB) and the CUDA-graph batches ({h.graphs:.2f} GiB)"
        )
    return out


def _predicted(at: AtFraction) -> str:
    if at.tokens <= 0:
        return "predicted: no room for KV"
    if at.static_free_gib is not None and at.static_free_gib < 0:
        return "predicted: OOM at startup"
    if at.free_at_peak_gib is not None and at.free_at_peak_gib < 0:
        return "predicted: OOM under stress"
    return "predicted"


def _why(x: TrialView) -> str:
    if x.reason:
        return x.reason
    broke = f"broke {', '.join(x.violated)}" if x.violated else x.outcome
    if x.free_at_peak_gib is not None:
        broke += f" ({fig.gib(x.free_at_peak_gib)} GiB {fig.FREE_AT_WORST})"
    return broke


def _besides_fraction(review: Review, x: TrialView) -> PointKey:
    """The point `x` ran, less the fraction: trials with equal ones differ only in it."""
    return point_key(x.params, review.space).without((FRACTION,))
