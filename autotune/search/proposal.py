"""What the capacity-aware planner is asked for (`Goal`) and what it answers (`Proposal`).

They are the planner's whole interface: the sampler builds a `Goal` from the study and records a
`Proposal` on the trial, and every rule module answers with one. They live apart from
`search.planner` so that the rule modules, which `planner` imports, can build a `Proposal`
without importing `planner` back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autotune.config.schema import Scalar
from autotune.memory.model import Forecast, MemoryModel


@dataclass(frozen=True)
class Goal:
    """What counts as stable and how bold to be."""

    min_headroom_gib: float = 0.0
    safe_p: float = 0.977
    """A setting is safe when it is stable with this probability (two standard deviations)."""
    probe_p: float = 0.25
    """An uncertain setting is worth a launch from this probability of being stable."""
    explore: bool = True
    """Whether throughput is an objective (explore requests and host cache at the edge)."""
    accept_p: float = 0.9
    """A launch that held counts as stable when the model expects it to hold again with this
    probability (a thin margin that held once is not stability)."""


@dataclass(frozen=True)
class Proposal:
    """What `plan` returns: the point to launch, the rule that chose it and why, `done` when nothing
    is left worth a launch, and the forecast and model behind it."""

    params: dict[str, Scalar]
    rule: str
    why: str
    done: str | None = None
    forecast: Forecast | None = None
    model: MemoryModel | None = field(default=None, compare=False)
    kappa: float = 1.0
    """How much wider than the model's own the margins were (`calibration`)."""
    repeats: int = 1
    """How many times the launch runs the workload's stress phases (`keys.STRESS_REPEATS`): a
    setting that must hold again holds again within one launch, at a stress phase's cost."""
