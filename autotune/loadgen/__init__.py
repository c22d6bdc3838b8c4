"""The workload driver: realistic load at a trial's server, metrics as bench_serving defines them.

Public API (see the modules for details):
- `workload_from_dict(d, key="workload", *, base_dir=None) -> WorkloadSpec` validates `[workload]`;
- `run_workload(spec, target, facts, *, is_dead, slo=None, activity=None) -> WorkloadResult`
  drives it (`Activity.owed_s()`: how long the server has owed an answer, for a hang watchdog);
- `Target`, `ServerFacts`, `Slo`, `WorkloadResult`, `PhaseResult`, `Died`, `Summary`, `Stats`,
  `RequestRecord`, `summarize` (pure metrics over records).
"""

from autotune.config.workload import (
    LengthDist,
    Poisson,
    Sessions,
    Steady,
    Stress,
    Warmup,
    WorkloadSpec,
    workload_from_dict,
)
from autotune.loadgen.driver import (
    Activity,
    Died,
    PhaseResult,
    Target,
    WorkloadResult,
    run_workload,
)
from autotune.loadgen.metrics import RequestRecord, Slo, Stats, Summary, summarize
from autotune.loadgen.phasestart import ServerFacts, stress_plan

__all__ = [
    "Activity",
    "Died",
    "LengthDist",
    "PhaseResult",
    "Poisson",
    "RequestRecord",
    "ServerFacts",
    "Sessions",
    "Slo",
    "Stats",
    "Steady",
    "Stress",
    "Summary",
    "Target",
    "Warmup",
    "WorkloadResult",
    "WorkloadSpec",
    "run_workload",
    "stress_plan",
    "summarize",
    "workload_from_dict",
]
