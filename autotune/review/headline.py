"""The one line every review surface starts with: the answer, against the operator's baseline.

    baseline 0.88: 159,312 tokens → export 0.89: 173,683 tokens (+9%), 2.10 GiB free at the
    worst moment, UNCONFIRMED

The baseline is the point the study queued first (`[baseline]` of the study file); its figures are
the latest finished trial that ran it. The exported side is what `export` prints: the winner, or
one trial as it ran (`--trial N`), with the same figures and the same confirmation state. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from autotune.config.schema import Scalar
from autotune.review import figures as fig
from autotune.review.source import Review


@dataclass(frozen=True)
class Answer:
    """The exported side of the headline."""

    params: Mapping[str, Scalar]
    capacity_tokens: int | None
    free_at_peak_gib: float | None
    predicted: bool
    trial: int | None = None
    """Set when one trial is exported as it ran (`export --trial N`)."""
    forced: str = ""
    """Why this export was refused and forced (`trial 6 ran out of memory (runtime_oom)`)."""


def of_winner(review: Review) -> Answer | None:
    """The winner's side of the headline (its point, capacity, free memory at the worst moment and
    whether the figures are predicted), None when the study has no winner."""
    w = review.winner
    if w is None:
        return None
    return Answer(w.params, w.capacity_tokens, w.free_at_peak_gib, w.predicted)


def headline(review: Review, answer: Answer | None = None) -> str:
    """The answer in one line (the winner's when `answer` is None)."""
    answer = answer or of_winner(review)
    left = _baseline(review)
    if answer is None:
        return f"{left} → nothing to export yet: no feasible trial"
    base = review.baseline_trial
    against = base.params if base is not None else review.baseline or _constants(review)
    name = fig.point(answer.params, against)
    if answer.trial is not None:
        name = f"trial {answer.trial} ({name})"
    gain = "" if answer.forced else _gain(review, answer)
    parts = [f"{fig.tokens(answer.capacity_tokens)} tokens{gain}"]
    if answer.free_at_peak_gib is not None:
        parts.append(f"{fig.gib(answer.free_at_peak_gib)} GiB {fig.FREE_AT_WORST}")
    if answer.predicted:
        parts.append("predicted")
    if answer.forced:
        parts.append(f"FORCED: {answer.forced}")
    parts.append(_confirmation(review, answer.params))
    return f"{left} → export {name}: {', '.join(parts)}"


def _constants(review: Review) -> dict[str, Scalar]:
    """The parameters every launched trial ran with the same value (not worth a word)."""
    ran = [t.params for t in review.trials if t.launched]
    if not ran:
        return {}
    first = ran[0]
    return {k: v for k, v in first.items() if all(p.get(k) == v for p in ran)}


def _baseline(review: Review) -> str:
    if not review.baseline:
        return "no baseline in the study"
    name = fig.point(review.baseline)
    t = review.baseline_trial
    if t is None:
        return f"baseline {name}: not run yet"
    if t.feasible:
        return f"baseline {name}: {fig.tokens(t.capacity_tokens)} tokens"
    started = t.capacity_tokens and not t.ending.fails_at_startup
    cap = f"{fig.tokens(t.capacity_tokens)} tokens, " if started else ""
    return f"baseline {name}: {cap}{fig.ending(t)}"


def _gain(review: Review, answer: Answer) -> str:
    t = review.baseline_trial
    if t is None or not t.feasible or not t.capacity_tokens or answer.capacity_tokens is None:
        return ""
    change = answer.capacity_tokens / t.capacity_tokens - 1.0
    return f" ({change:+.0%})"


def _confirmation(review: Review, params: Mapping[str, Scalar]) -> str:
    c = review.confirmation_of(params)
    if c is None:
        return "UNCONFIRMED"
    return "CONFIRMED" if c.passed else "FAILED its confirmation soak"
