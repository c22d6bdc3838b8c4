"""Small fakes of the trial seam: a launcher whose servers behave as a function of the params."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from autotune.errors import HarnessError
from autotune.trial.plan import TrialPlan
from autotune.trial.seam import Load, Startup, Stop

Behaviour = Callable[[TrialPlan], "Script"]


@dataclass(frozen=True)
class Script:
    """What the fake server does: how startup ends, how load ends, what can go wrong."""

    startup: Startup
    load: Load | None = None
    launch_error: str = ""
    interrupt_in: str = ""  # "startup" or "workload": raise KeyboardInterrupt there
    stop: Stop = field(default_factory=lambda: Stop(clean=True, seconds=0.01))


def capacity(f: float) -> int:
    """The simulator-like arithmetic of reference §1.7: 21.71 − 94.04·(1 − f) GiB at 70,272 B."""
    return int((21.71 - 94.04 * (1 - f)) * 2**30) // 70272


def kimi_like(plan: TrialPlan) -> Script:
    """Starts below 0.94, OOMs under load at 0.93, OOMs at startup from 0.94."""
    f = float(plan.params.get("mem_fraction_static", 0.88))
    ledger = {"max_total_num_tokens": capacity(f), "avail_after_graphs_gib": 94.04 * (1 - f) - 5.8}
    if f >= 0.94 - 1e-9:
        return Script(
            Startup("startup_oom", "graph_capture_failed", ("CUDA out of memory",), {}, 1.0)
        )
    ready = Startup("ready", "ready", (), ledger, 1.0, "0.5.9")
    if f >= 0.93 - 1e-9:
        load = Load("runtime_oom", "torch_oom", ("torch.OutOfMemoryError",), {"requests": 3}, 10.0)
        return Script(ready, load)
    load = Load(
        "ready",
        summary={"requests": 40, "output_throughput": 900.0},
        throughput_tok_s=900.0 + 100 * f,
        error_rate=0.0,
        p99_ttft_ms=1000.0,
        p99_itl_ms=30.0,
        min_free_gib=94.04 * (1 - f) - 6.5,
        seconds=2.0,
    )
    return Script(ready, load)


@dataclass
class FakeRun:
    script: Script
    log: list[str]

    def wait_ready(self) -> Startup:
        self.log.append("wait_ready")
        if self.script.interrupt_in == "startup":
            raise KeyboardInterrupt
        return self.script.startup

    def drive(self, ledger: Mapping[str, object]) -> Load:
        self.log.append("drive")
        if self.script.interrupt_in == "workload":
            raise KeyboardInterrupt
        if self.script.interrupt_in == "harness":
            raise HarnessError("GPU probe failed")
        assert self.script.load is not None
        return self.script.load

    def stop(self) -> Stop:
        self.log.append("stop")
        return self.script.stop


@dataclass
class FakeLauncher:
    behaviour: Behaviour = kimi_like
    log: list[str] = field(default_factory=list)
    plans: list[TrialPlan] = field(default_factory=list)
    orphan_sweeps: int = 0
    orphans: list[str] = field(default_factory=list)
    """What `stop_orphans` reports: nothing, as on a clean folder, unless a test leaves some."""

    def launch(self, plan: TrialPlan) -> FakeRun:
        self.plans.append(plan)
        script = self.behaviour(plan)
        self.log.append("launch")
        if script.launch_error:
            raise HarnessError(script.launch_error)
        plan.log_path.write_text("fake server log\n")
        return FakeRun(script, self.log)

    def extra_args(self) -> tuple[str, ...]:
        return ()

    def stop_orphans(self) -> list[str]:
        self.orphan_sweeps += 1
        return list(self.orphans)
