"""The study file's schema: the frozen, typed `StudyConfig` and its parts, the values a few of
its keys take, and the names of the flags autotune knows.

These are the values the rest of autotune works on; `autotune.config.studyfile` is the one place
that builds them, from a study file it has validated. The workload's part, `WorkloadSpec`, is
the workload driver's (`autotune.config.workload`).

Search parameters and fixed flags are named after SGLang's flags without the leading dashes;
`mem_fraction_static` and `mem-fraction-static` mean the same flag `--mem-fraction-static`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Literal, TypeAlias

from autotune.config.workload import WorkloadSpec

Scalar: TypeAlias = bool | int | float | str
FlagValue: TypeAlias = Scalar | tuple[Scalar, ...]
Backend: TypeAlias = Literal["sim", "sglang"]

BACKENDS: tuple[Backend, ...] = ("sim", "sglang")
SAMPLERS = ("capacity", "walkdown", "grid", "tpe", "random", "gp", "nsga2")
OBJECTIVES = ("capacity", "throughput")
HICACHE = "hicache_size"
FRACTION = "mem_fraction_static"
REQUESTS = "max_running_requests"
CHUNK = "chunked_prefill_size"


def param_name(key: str) -> str:
    """The canonical name of a flag key: `mem-fraction-static` → `mem_fraction_static`."""
    return key.replace("-", "_")


def flag_of(name: str) -> str:
    """The SGLang command-line flag for a parameter name."""
    return "--" + name.replace("_", "-")


# ------------------------------------------------------------------------------------------------
# The frozen configuration
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Limits:
    """Time limits for one trial's server, in seconds (all > 0)."""

    startup_s: float = 1800.0
    stall_s: float = 600.0
    workload_s: float = 3600.0
    stop_grace_s: float = 30.0
    release_s: float = 120.0
    foreign_wait_s: float = 0.0
    """How long to wait for GPU memory held by processes autotune did not start; 0 refuses."""
    pause_s: float = 2.0
    """How long autotune itself may be paused (SIGSTOP, a suspend) between a launch and the end of
    its workload before the trial is failed as `disturbed` (`autotune.trial.clockwatch`)."""


@dataclass(frozen=True)
class ServerConfig:
    """How to launch the server under test."""

    backend: Backend
    command: tuple[str, ...]
    flags: tuple[tuple[str, FlagValue], ...]
    env: Mapping[str, str]
    host: str
    port: int
    sim_profile: str
    sim_time_scale: float | None
    sim_seed: int
    sim_version: str | None
    """The SGLang release the simulator speaks (`--sim-version`); None: the profile's."""
    limits: Limits
    export_host: str | None = None
    """The address the exported command serves on (the operator's `--host`): trials bind their
    own, so it is the export's alone; None: `host` where `port` is fixed, else none."""
    export_port: int | None = None
    """The port the exported command serves on (the operator's `--port`); None: `port` where it
    is fixed, else SGLang's default."""


@dataclass(frozen=True)
class FloatRange:
    """A float parameter searched from `low` to `high` (`step`: its grid; None: continuous; `log`:
    on a log scale), as Optuna's `FloatDistribution` takes it."""

    name: str
    low: float
    high: float
    step: float | None = None
    log: bool = False


@dataclass(frozen=True)
class IntRange:
    """An integer parameter searched from `low` to `high` in `step`s (`log`: on a log scale), as
    Optuna's `IntDistribution` takes it."""

    name: str
    low: int
    high: int
    step: int = 1
    log: bool = False


@dataclass(frozen=True)
class Choices:
    """A parameter that takes one of the listed `values` (a categorical distribution)."""

    name: str
    values: tuple[Scalar, ...]


@dataclass(frozen=True)
class Fixed:
    """A parameter the study file pins to one `value`: passed to every trial, never searched."""

    name: str
    value: Scalar


Param: TypeAlias = FloatRange | IntRange | Choices | Fixed


@dataclass(frozen=True)
class SearchConfig:
    """The search space, in the order the study file lists it, and the operator's baseline."""

    params: tuple[Param, ...]
    baseline: Mapping[str, Scalar]
    seed_logs: tuple[Path, ...] = ()
    """`[search] seed_logs`: server logs of earlier starts whose ledgers seed the memory model
    (resolved against the study file's folder; read by `autotune.record.seeds`)."""

    def names(self) -> tuple[str, ...]:
        """The searched parameters' names, in the study file's order."""
        return tuple(p.name for p in self.params)


class Constraint(StrEnum):
    """The name of one feasibility constraint, as a trial's constraint list names it
    (`study.objectives.constraint_values`): ≤ 0 when satisfied, > 0 by how much it is broken."""

    OOM = "oom"
    CRASH = "crash"
    ERROR_RATE = "error_rate"
    HEADROOM = "headroom_gib"
    P99_TTFT = "p99_ttft_ms"
    P99_ITL = "p99_itl_ms"


MEMORY_CONSTRAINTS = frozenset({Constraint.OOM, Constraint.CRASH, Constraint.HEADROOM})
"""The constraints that say the memory setting itself failed (the others are the load's)."""


@dataclass(frozen=True)
class Constraints:
    """Feasibility limits; each becomes one `trial.set_constraint` (≤ 0 means satisfied)."""

    no_oom: bool = True
    max_error_rate: float = 0.01
    min_headroom_gib: float = 0.0
    max_p99_ttft_ms: float | None = None
    max_p99_itl_ms: float | None = None


@dataclass(frozen=True)
class Budget:
    """When the study stops: after `n_trials` trials count, or at `timeout_s` seconds: no trial
    starts that the trials timed so far say would end after it."""

    n_trials: int = 20
    timeout_s: float | None = None


@dataclass(frozen=True)
class Heartbeat:
    """How workers sharing a study tell they are alive: a heartbeat every `interval_s`; a
    RUNNING trial whose heartbeat is older than `grace_s` is failed by the other workers."""

    interval_s: int = 30
    grace_s: int = 300


@dataclass(frozen=True)
class SamplerConfig:
    """Which sampler asks for points (`study.samplers` by name) and the seed it starts from."""

    name: str = "capacity"
    seed: int = 0


@dataclass(frozen=True)
class StudyConfig:
    """One study file, validated."""

    name: str
    path: Path
    description: str
    server: ServerConfig
    search: SearchConfig
    workload: WorkloadSpec
    objectives: tuple[str, ...]
    constraints: Constraints
    budget: Budget
    sampler: SamplerConfig
    storage: str | None
    heartbeat: Heartbeat = Heartbeat()
