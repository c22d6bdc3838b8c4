"""Whose memory rules a log follows: SGLang changed them twice, and the log says which.

Three rule sets, each checked against that release's source:

* **0.5.9** – the draft model loads after the target's CUDA graphs, so its weights, KV pool and
  graphs all come out of the reserve `P·(1 − f)`; the KV pool is sized with the target's own
  bytes per token. `Not enough host memory … only have Y GB free` reports the whole machine's
  `available − 10 GiB`; a host pool not larger than the GPU pool is an assertion (the start
  fails).
* **0.5.18** – the draft weights load before the pool is profiled (they are in A), and an
  EAGLE/STANDALONE draft's layers are folded into the target's bytes per token
  (`model_executor/pool_configurator.py`: `cell = int(cell·(1 + L_draft/L_target))`). The
  host-RAM figure is still the machine's `available − 10 GiB`; a small host pool is a warning.
* **0.5.23** – the same order and fold (`cell += int(cell·L_draft/L_target)`); the host budget is
  per rank, `(min(available, cgroup) − 10 GiB) ÷ ranks on the host`
  (`mem_cache/pool_host/base.py`), so Y is already one rank's share.

A version line (`sglang==0.5.21`, `SGLang version: 0.5.23`) picks the newest rule set at or below
it; otherwise the formats do: lines only 0.5.23 prints, then lines 0.5.18 and later print, then
the draft model's order in the log itself. A log without SGLang lines has no semantics.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from autotune.logparse.events import STARTUP_KINDS, Event, Kind


@dataclass(frozen=True)
class Semantics:
    """One rule set. `draft_in_budget`: draft weights are in A and the EAGLE draft's KV is folded
    into the cell the pool is sized with (else both come out of the reserve).
    `host_free_per_rank`: the host-memory error's "only have Y GB free" is one rank's budget
    (else the machine's). `host_smaller_fatal`: a host pool not larger than the GPU pool stops
    the start (else it is a warning)."""

    name: str
    draft_in_budget: bool
    host_free_per_rank: bool
    host_smaller_fatal: bool


V0_5_9 = Semantics(
    "0.5.9", draft_in_budget=False, host_free_per_rank=False, host_smaller_fatal=True
)
V0_5_18 = Semantics(
    "0.5.18", draft_in_budget=True, host_free_per_rank=False, host_smaller_fatal=False
)
V0_5_23 = Semantics(
    "0.5.23", draft_in_budget=True, host_free_per_rank=True, host_smaller_fatal=False
)
RULES = {s.name: s for s in (V0_5_9, V0_5_18, V0_5_23)}
_BY_VERSION = ((0, 5, 23), V0_5_23), ((0, 5, 18), V0_5_18)


def rules(name: str | None) -> Semantics:
    """The rule set a ledger names; a ledger without one (older records, the simulator's) is read
    with the 0.5.9 rules autotune modelled before it read versions."""
    return RULES.get(name or "", V0_5_9)


def for_version(version: str) -> Semantics:
    """The newest verified rule set at or below `version` ("0.5.21" → 0.5.18's)."""
    try:
        v = tuple(int(p) for p in version.split(".")[:3])
    except ValueError:
        return V0_5_9
    return next((s for at, s in _BY_VERSION if v >= at), V0_5_9)


# Lines 0.5.23 prints and 0.5.18 does not (checked against both wheels).
_ONLY_0_5_23 = frozenset({Kind.MEMORY_BASELINE, Kind.HICACHE_AUTOSIZE, Kind.HOST_HEADROOM})
# Lines 0.5.18 and later print and 0.5.9 does not.
_SINCE_0_5_18 = frozenset(
    {Kind.STARTUP_TIMINGS, Kind.SUBPROCESS_CRASHED, Kind.HICACHE_SMALLER, Kind.POST_CAPTURE}
)
# Lines that make a log SGLang's: its start lines and the ready, rank-death and no-room lines.
# (The start lines only later releases print are decided by the two sets above first.)
_SGLANG_LINES = STARTUP_KINDS | {Kind.READY, Kind.RANK_DEAD, Kind.NO_KV_ROOM}


def _since_0_5_23(e: Event) -> str | None:
    if e.kind in _ONLY_0_5_23:
        return e.kind.value
    if e.kind is Kind.SERVER_ARGS and e.label == "dict":
        return "server_args={...}"
    if e.kind is Kind.DIST_INIT_BEGIN and "Init parallel" in e.text:
        return "Init parallel begin"
    return None


def _since_0_5_18(e: Event) -> str | None:
    if e.kind in _SINCE_0_5_18:
        return e.kind.value
    if e.kind is Kind.RELEASE_LINE:
        return e.label
    if e.kind is Kind.RANK_DEAD and "died during initialization" in e.text:
        return "scheduler died during initialization"
    if e.kind is Kind.HOST_CACHE and e.label not in ("", "other"):
        return "Allocating {label} hierarchical KV host pool"
    if e.kind is Kind.NO_KV_ROOM and "draft weights are now counted" in e.text:
        return "Loaded weights leave no GPU memory"
    return None


def detect(
    events: Iterable[Event], draft_before_pool: bool = False
) -> tuple[Semantics | None, str]:
    """The rule set a log follows and what chose it; (None, "") for a log with no SGLang line.
    `draft_before_pool`: a rank loaded a second (draft) model before its first KV pool line."""
    newest: str | None = None
    since_18: str | None = None
    sglang = False
    for e in events:
        if e.kind is Kind.VERSION:
            return for_version(e.label), f"version line {e.label}"
        if newest is None:
            newest = _since_0_5_23(e)
        if since_18 is None:
            since_18 = _since_0_5_18(e)
        sglang = sglang or e.kind in _SGLANG_LINES
    if newest is not None:
        return V0_5_23, f"format: {newest} (0.5.23)"
    if since_18 is not None:
        return V0_5_18, f"format: {since_18} (0.5.18+)"
    if draft_before_pool:
        return V0_5_18, "format: the draft model loads before the KV pool (0.5.18+)"
    if sglang:
        return V0_5_9, "format: no line of 0.5.18 or later"
    return None, ""
