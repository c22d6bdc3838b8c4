"""Which way a failed launch pushes the memory settings (pure).

A failure is evidence about one side of the memory edge, and the two startup failures SGLang's
users meet first need opposite fixes (sglang#322, #4330):

* `RAISE` — the fraction is too **low**: the KV pool found no room (`Not enough memory. Please
  try to increase --mem-fraction-static`, 0.5.23's `Loaded weights leave no GPU memory for the KV
  cache`, cause `no_kv_room`) or holds not even one request (`pool_too_small`). The pool is
  `A − P·(1 − f)`, so the launch's own ledger (P and A, the free memory after weights) gives the
  lowest fraction that can hold a pool at all: `floor_fraction`.
  The KV pool running out of its own token slots under load (`logparse.events.POOL_OOM_KINDS`:
  SGLang's allocator `Decode out of memory`, a decode batch that does not fit even with one
  request left) pushes the same way: the pool grows with the fraction, and no GPU peak was seen.
* `LOWER` — the fraction is too **high**: CUDA out of memory after the pool was allocated (graph
  capture, workspaces, the request table), under load (a runtime OOM), or too little headroom
  left under the stress peak (the `headroom_gib` constraint).
* `SHRINK_HOST` — the host cache does not fit in host RAM (`Not enough host memory`, the kernel's
  OOM killer, or a trial refused before its launch for a host cache over the host memory
  bound); `GROW_HOST` — it is not larger than the GPU pool (0.5.9's assertion).
* `NONE` — not about a memory setting: a launch that held, a crash or start error for another
  reason (a bad flag, a hang), weights that do not fit the GPUs at all (no fraction helps). Such
  a failure is retried or reported, never walked away from.

Read from what a trial stored: its outcome, the `reason` line (`startup_oom (no_kv_room): Not
enough memory…`, whose cause is the log's `autotune.logparse` kind), the constraints it broke
and its ledger; the text of the reason decides where an older record carries no cause.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection
from enum import StrEnum

from autotune.config.schema import Constraint
from autotune.logparse.events import POOL_OOM_KINDS
from autotune.logparse.ledger import Ledger
from autotune.logparse.outcome import Outcome, cause_of
from autotune.memory.pool import lowest_fraction
from autotune.record.view import TrialView

__all__ = ["Push", "direction", "floor_fraction", "push_of"]


class Push(StrEnum):
    """The way a failed launch pushes the settings."""

    RAISE = "raise_fraction"
    LOWER = "lower_fraction"
    SHRINK_HOST = "shrink_host_cache"
    GROW_HOST = "grow_host_cache"
    NONE = "none"

    @property
    def words(self) -> str:
        """The push in words, for the lines that say why a point was left (`fraction is too low
        …`)."""
        return _WORDS[self]


_WORDS = {
    Push.RAISE: "the fraction is too low (no room for the KV pool, or too few token slots in it)",
    Push.LOWER: "the fraction is too high (out of GPU memory or headroom)",
    Push.SHRINK_HOST: "the host cache is too big for host RAM",
    Push.GROW_HOST: "the host cache is not larger than the GPU pool",
    Push.NONE: "not a memory setting",
}

_RAISE_CAUSES = frozenset({"no_kv_room", "pool_too_small", "kv_pool", "kv_budget"})
_RAISE_TEXT = (
    "Not enough memory",
    "increase --mem-fraction-static",
    "leave no GPU memory for the KV cache",
    "Memory pool size is too small",
    "max_running_request is zero",
    "cannot hold even one request",
)
_SHRINK_CAUSES = frozenset({"host_memory", "host_oom_killer", "host_enomem"})
_SHRINK_TEXT = (
    "Not enough host memory",
    "No host memory is left for HiCache",
    "over the host memory bound",  # refused before launch (`server.hostcheck.hicache_refusal`)
)
_GROW_CAUSES = frozenset({"hicache_too_small"})
_GROW_TEXT = ("host memory should be larger than the device memory",)
_SUGGESTED = re.compile(r"Raise --mem-fraction-static above ([0-9.]+)")
_LOWER_CONSTRAINTS = frozenset({Constraint.OOM, Constraint.HEADROOM})


def push_of(
    outcome: str,
    reason: str = "",
    violated: Collection[str] = (),
    ledger: Ledger | None = None,
) -> Push:
    """The push of one finished launch from its stored figures (NONE for one that held)."""
    ending = Outcome.of(outcome)
    cause = cause_of(reason)
    if ending.is_parameter_result:
        raise_cause = cause in _RAISE_CAUSES or cause in POOL_OOM_KINDS
        if raise_cause or any(t in reason for t in _RAISE_TEXT):
            return Push.RAISE
        if cause in _GROW_CAUSES or any(t in reason for t in _GROW_TEXT):
            return Push.GROW_HOST
        if cause in _SHRINK_CAUSES or any(t in reason for t in _SHRINK_TEXT):
            return Push.SHRINK_HOST
        if ending.is_oom:
            if ending.fails_at_startup and _weights_did_not_load(ledger):
                return Push.NONE  # the weights alone do not fit: no fraction helps
            return Push.LOWER
        return Push.NONE
    if ending == Outcome.OK and set(violated) & _LOWER_CONSTRAINTS:
        return Push.LOWER
    return Push.NONE


def direction(t: TrialView) -> Push:
    """The push of a stored trial (NONE while it runs, and for one that held)."""
    if not t.finished or t.feasible:
        return Push.NONE
    return push_of(t.outcome, " ".join([t.reason, *t.evidence]), t.violated, t.ledger)


def floor_fraction(ledger: Ledger, reason: str = "") -> float | None:
    """The lowest mem_fraction_static whose KV budget `A − P·(1 − f)` is positive, from a
    launch's ledger (P, the free memory before weights, and A, after them): `1 − A/P`; 0.5.23
    prints it in its message, which wins when given. None when the ledger lacks either."""
    m = _SUGGESTED.search(reason)
    if m:
        try:
            return float(m.group(1).rstrip("."))
        except ValueError:
            pass
    p, a = ledger.p_gib, ledger.avail_after_weights_gib
    if p is None or a is None or not math.isfinite(p) or p <= 0:
        return None
    return lowest_fraction(p, a)


def _weights_did_not_load(ledger: Ledger | None) -> bool:
    return (
        ledger is not None and ledger.p_gib is not None and ledger.avail_after_weights_gib is None
    )
