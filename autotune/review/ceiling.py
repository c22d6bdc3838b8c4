"""The winner's KV pool as a share of the box's ceiling: one line every review surface prints.

The ceiling (`autotune.memory.ceiling.Ceiling`, docs/review.md "The ceiling") is the pool the
box would hold if the reserve `P·(1 − f)` held only what the trials measured it needs: the
request table, the draft's part, the CUDA graphs, the workspaces, the stress peak and the margin
the export keeps free at it. The line says how much of it the winner takes and how much of the
reserve held nothing the trials measured:

    ceiling: winner 159,277 tokens = 86% of the ceiling 185,100 tokens; 1.62 GiB/GPU of its
    reserve (11.29 GiB) held nothing the trials measured (it needs request table 0.04, draft
    0.84, CUDA graphs 3.70, workspaces 1.20, stress peak 2.50 + margin 0.50)

This module only picks the figures; the arithmetic is memory's. They are:

* the trial whose figures the export shows: the one that ran the exported setting, else the
  chosen trial whose fraction the margin backed off (`Winner.source`, `Winner.chosen`);
* the study's bytes per token (`Review.cell_bytes`), the conversion the winner's predicted pool
  uses;
* the margin kept free at the stress peak: with `--margin soak` (the default) the soak's need
  (the required headroom, the growth over the soak and how far its worst peak may rise:
  `SoakPlan.need_gib`); with `--margin 2GiB` that much (never below the required headroom);
  with a number of steps, or `--trial N` (no margin), the required headroom alone, so the steps
  are part of what is left.

Where a figure it needs was not measured, `Share.missing` names it and the line says so instead
of a number. Pure.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from autotune.config.schema import FRACTION
from autotune.memory.ceiling import Ceiling, ReserveNeeds, ceiling
from autotune.memory.pool import reserve_gib
from autotune.record.view import TrialView
from autotune.review import figures as fig
from autotune.review.source import Review

AT_CEILING_GIB = 0.005
"""Less than this much of the reserve either way (it prints as 0.00) is at the ceiling."""


@dataclass(frozen=True)
class Share:
    """A setting's KV pool against the box's ceiling, or what is missing to say."""

    who: str
    """`winner`, or `trial 3` for `export --trial 3`."""
    tokens: int | None
    fraction: float | None
    basis: int | None
    """The trial whose figures the ceiling was worked out from."""
    ceiling: Ceiling | None
    missing: tuple[str, ...] = ()
    """The figures the ceiling needs that were not measured (empty when `ceiling` is set)."""
    above: tuple[int, int] | None = None
    """A trial that held more than the ceiling (its number, its tokens): it kept less free at
    its stress peak than the margin the ceiling keeps, which the line then says."""

    @property
    def share(self) -> float | None:
        """The setting's tokens as a share of the ceiling (1.0: at it)."""
        if self.ceiling is None or self.tokens is None:
            return None
        return self.ceiling.share(self.tokens)

    @property
    def unused_gib(self) -> float | None:
        """GiB per GPU of the setting's reserve that held nothing the trials measured
        (negative: short of the needs)."""
        if self.ceiling is None or self.fraction is None:
            return None
        return self.ceiling.unused_gib(self.fraction)

    @property
    def needs(self) -> ReserveNeeds | None:
        """What the trials measured the setting's reserve must hold."""
        if self.ceiling is None or self.fraction is None:
            return None
        return self.ceiling.needs_at(self.fraction)

    def line(self) -> str:
        """The ceiling line as every surface prints it."""
        if self.basis is None:
            return "ceiling: not known: no feasible trial yet, so no winner to measure it by"
        if self.missing:
            return f"ceiling: not known: {_missing(self.missing)}"
        c, share, unused, needs = self.ceiling, self.share, self.unused_gib, self.needs
        assert c is not None and unused is not None and needs is not None
        if share is None:
            return (
                "ceiling: none: what the trials measured the reserve needs leaves no room for a "
                f"KV pool ({_needs(needs)})"
            )
        head = (
            f"ceiling: {self.who} {fig.tokens(self.tokens)} tokens = {share:.0%} of the ceiling "
            f"{fig.tokens(c.tokens)} tokens"
        )
        assert self.fraction is not None
        reserve = f"its reserve ({fig.gib(reserve_gib(c.p_gib, self.fraction))} GiB)"
        if abs(unused) < AT_CEILING_GIB:
            tail = f"{reserve} holds only what the trials measured it needs"
        elif unused > 0:
            tail = f"{fig.gib(unused)} GiB/GPU of {reserve} held nothing the trials measured"
        else:
            tail = f"{reserve} is {fig.gib(-unused)} GiB/GPU short of what the trials measured"
        capped = (
            f"; the pool is held to --max-total-tokens {fig.tokens(c.capped_at)}, which the "
            "ceiling leaves out"
            if c.capped_at is not None
            else ""
        )
        above = ""
        if self.above is not None and self.above[1] > c.tokens:
            number, held = self.above
            above = (
                f"; trial {number} held {fig.tokens(held)} tokens, above the ceiling: it kept "
                f"less than the {fig.gib(needs.margin)} GiB margin free at its stress peak"
            )
        return f"{head}; {tail} (it needs {_needs(needs)}){capped}{above}"

    def to_dict(self) -> dict[str, object]:
        """The share as JSON values (the `ceiling` field of `export --format json`)."""
        c, needs = self.ceiling, self.needs
        return {
            "line": self.line(),
            "tokens": c.tokens if c is not None else None,
            "share": self.share,
            "unused_gib": self.unused_gib,
            "fraction": c.fraction if c is not None else None,
            "trial": self.basis,
            "needs_gib": (
                {
                    "request_table": needs.request_table,
                    "draft": needs.draft,
                    "graphs": needs.graphs,
                    "workspaces": needs.workspaces,
                    "stress_peak": needs.stress_peak,
                    "margin": needs.margin,
                }
                if needs is not None
                else None
            ),
            "missing": list(self.missing),
        }


def of_winner(review: Review) -> Share:
    """The winner's share of the ceiling, from the trial whose figures it exports, keeping the
    margin its export keeps (`basis` None and `missing` `a feasible trial` while there is
    none)."""
    w = review.winner
    if w is None:
        return Share("winner", None, None, None, None, ("a feasible trial",))
    basis = w.source if w.source is not None and w.source.feasible else w.chosen
    f = w.params.get(FRACTION)
    fraction = float(f) if isinstance(f, int | float) and not isinstance(f, bool) else None
    share = share_of(
        review,
        basis,
        who="winner",
        tokens=w.capacity_tokens,
        fraction=fraction,
        margin_gib=winner_margin_gib(review),
    )
    held = [t for t in review.trials if t.feasible and t.capacity_tokens is not None]
    top = max(held, key=lambda t: (t.capacity_tokens or 0, -t.number), default=None)
    if top is None or top.capacity_tokens is None:
        return share
    return dataclasses.replace(share, above=(top.number, top.capacity_tokens))


def of_trial(review: Review, t: TrialView) -> Share:
    """Trial `t` as it ran (`export --trial N`: no margin beyond the required headroom)."""
    return share_of(
        review,
        t,
        who=f"trial {t.number}",
        tokens=t.capacity_tokens,
        fraction=t.fraction,
        margin_gib=review.min_headroom_gib or 0.0,
    )


def share_of(
    review: Review,
    basis: TrialView,
    *,
    who: str,
    tokens: int | None,
    fraction: float | None,
    margin_gib: float,
) -> Share:
    """`tokens` at `fraction` against the ceiling `basis`'s figures give, keeping `margin_gib`
    free at the stress peak; what is missing named where a figure was not measured."""
    missing = _missing_figures(basis)
    if tokens is None:
        missing.append(f"the {who}'s KV pool")
    if fraction is None and FRACTION not in missing:
        missing.append(FRACTION)
    a = basis.arithmetic(review.cell_bytes) if not missing else None
    c = ceiling(a, margin_gib) if a is not None else None
    if c is None and not missing:
        missing.append("the bytes per token (the log's KV line)")
    return Share(who, tokens, fraction, basis.number, c, tuple(missing))


def winner_margin_gib(review: Review) -> float:
    """The free memory at the stress peak the winner's export keeps, GiB: the soak's need, a
    GiB margin (at least the required headroom), else the required headroom."""
    w = review.winner
    required = review.min_headroom_gib or 0.0
    if w is None:
        return required
    if w.soak is not None:
        return max(w.soak.need_gib, required)
    if w.margin.headroom_gib is not None:
        return max(w.margin.headroom_gib, required)
    return required


def line(review: Review) -> str:
    """The winner's ceiling line (`Share.line`), for every surface below the headline."""
    return of_winner(review).line()


def _missing_figures(t: TrialView) -> list[str]:
    """The figures of trial `t` the ceiling needs that its record lacks."""
    led = t.ledger
    out: list[str] = []
    if t.fraction is None:
        out.append(FRACTION)
    if led.p_gib is None:
        out.append("P (the free memory before the weights)")
    if led.avail_after_weights_gib is None:
        out.append("A (the free memory the weights left)")
    if t.static_free_gib is None:
        out.append("the free memory after startup")
    if t.stress_peak_gib is None or t.free_at_peak_gib is None:
        out.append("the stress peak")
    return out


def _missing(names: tuple[str, ...]) -> str:
    said = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    verb = "was" if len(names) == 1 else "were"
    return f"{said} {verb} not measured"


def _needs(n: ReserveNeeds) -> str:
    parts = [f"request table {fig.gib(n.request_table)}"]
    if n.draft:
        parts.append(f"draft {fig.gib(n.draft)}")
    parts += [
        f"CUDA graphs {fig.gib(n.graphs)}",
        f"workspaces {fig.gib(n.workspaces)}",
        f"stress peak {fig.gib(n.stress_peak)} + margin {fig.gib(n.margin)}",
    ]
    return ", ".join(parts)
