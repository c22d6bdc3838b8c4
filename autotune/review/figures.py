"""The words and number formats every review surface prints a trial's figures with (pure).

The figures themselves are computed once, on the trial's view (`autotune.record.view`); this
module only says how they read, so `status`, `explain`, `export` and the report print the same
number the same way: capacity as `173,683 tokens`, GiB with two decimals, and the same names for
the same quantities (docs/review.md):

* "reserve P·(1 − f)": what SGLang leaves outside the static budget;
* "free after startup": the free GPU memory once CUDA graphs were captured;
* "stress peak": what the load took at its worst on top of that;
* "free at the worst moment" (the headroom the `min_headroom_gib` constraint checks).
"""

from __future__ import annotations

from collections.abc import Mapping

from autotune.config.schema import FRACTION, Scalar
from autotune.config.space import same_value
from autotune.record.view import TrialView

FREE_AT_WORST = "free at the worst moment"


def gib(value: float | None, blank: str = "") -> str:
    """GiB with two decimals (`blank` when unknown)."""
    return f"{value:.2f}" if value is not None else blank


def tokens(value: int | None, blank: str = "?") -> str:
    """A token count with thousands separators (`173,683`), `blank` when not measured."""
    return f"{value:,}" if value is not None else blank


def scalar(v: object) -> str:
    """A parameter value as the review prints it: floats in `%g` (0.88, not 0.88000), others as they
    are."""
    return f"{v:g}" if isinstance(v, float) else str(v)


def point(params: Mapping[str, Scalar], against: Mapping[str, Scalar] | None = None) -> str:
    """A setting in a few words: the fraction bare, then the other parameters, or with `against`
    only those it has and that differ from it: `0.89`, `0.9, max_running_requests=64`."""
    parts = []
    if FRACTION in params:
        parts.append(scalar(params[FRACTION]))
    for k, v in params.items():
        if k == FRACTION:
            continue
        if against is not None and (k not in against or same_value(against[k], v)):
            continue
        parts.append(f"{k}={scalar(v)}")
    return ", ".join(parts) or "(no parameters)"


def ending(t: TrialView) -> str:
    """How a trial ended, in words: `ran out of memory (runtime_oom: torch_oom)`."""
    what = t.outcome + (f": {t.cause}" if t.cause else "")
    if t.kind == "oom":
        return f"ran out of memory ({what})"
    if t.ending.fails_at_startup:
        return f"failed to start ({what})"
    if t.kind == "infeasible":
        if t.ending.is_crash:
            return f"crashed ({what})"
        return f"was infeasible (broke {', '.join(t.violated)})"
    if t.kind == "running":
        return "has not finished"
    if t.kind == "skipped":
        return "was never launched"
    if t.kind == "failed":
        return f"failed ({what or t.state})"
    return "was feasible"
