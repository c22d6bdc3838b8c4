"""Failures that say nothing about memory (a crash, a start error): one retry, and the streak
that ends the search.

Such a failure neither bounds the memory settings nor feeds the model, so the planner must not
read it as an edge; but one fluke should not cost a setting, and a run of them means something
besides memory is broken, which no further launch of the search can fix. The planner applies the
same policy before a model exists (`search.start`) and with one (`search.state`, `search.edge`),
so it is defined here once.
"""

from __future__ import annotations

from collections.abc import Sequence

from autotune.config.space import point_key
from autotune.search.points import Point, Push

RETRIES = 1
"""A failure that is not about memory (a crash, a start error) is run once more at the same
setting: one fluke is not a fault of the setting."""
NOT_MEMORY_STREAK = 3
"""This many launches in a row that failed for reasons not about memory end the search."""


def retry_once(p: Point, known: Sequence[Point]) -> bool:
    """A failure that says nothing about memory, at a setting not yet tried RETRIES more times."""
    if p.feasible or p.observation is None or p.push is not Push.NONE:
        return False
    mine = point_key(p.params)
    same = [q for q in known if point_key(q.params) == mine]
    return len(same) <= RETRIES and p is same[-1]


def retry_why(p: Point) -> str:
    """The why of a `retry` of `p`: what failed, and that the same setting runs once more."""
    o = p.observation
    reason = o.reason.split(":", 1)[0] if o and o.reason else (o.outcome if o else "failed")
    return (
        f"trial {p.number} failed for a reason that is not a memory setting ({reason}); the "
        "same setting once more, to tell a fluke from a fault"
    )


def not_memory(known: Sequence[Point]) -> str | None:
    """The closing report when the latest launches all failed for reasons not about memory."""
    tail = list(known)[-NOT_MEMORY_STREAK:]
    if len(tail) < NOT_MEMORY_STREAK or not all(
        not p.feasible and p.observation is not None and p.push is Push.NONE for p in tail
    ):
        return None
    o = tail[-1].observation
    assert o is not None
    return (
        f"the last {NOT_MEMORY_STREAK} launches failed for reasons that are not a memory setting "
        f"(the latest: {o.reason or o.outcome}); read the server's log (`autotune ledger LOG`) "
        "before searching on"
    )
