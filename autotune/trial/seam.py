"""The seam between a trial's control flow and the servers it runs: `Launcher` starts a
`ServerRun`, which reports its start (`Startup`), its workload (`Load`) and its teardown (`Stop`).

These are the only facts `trial.run` and `trial.judge` see of a server, so the orchestration is
tested with fakes; `trial.live.LiveLauncher` implements the seam over the real server lifecycle
and workload driver. Each launcher is held to the same contract
(`tests/trial/test_launcher_contract.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from autotune.config.workload import WorkloadSpec
from autotune.trial.plan import TrialPlan


@dataclass(frozen=True)
class Startup:
    """How the server start ended. `outcome` is an `autotune.logparse.outcome.Outcome` value."""

    outcome: str
    cause: str = ""
    evidence: tuple[str, ...] = ()
    ledger: Mapping[str, object] = field(default_factory=dict)
    seconds: float = 0.0
    sglang_version: str | None = None


@dataclass(frozen=True)
class Load:
    """How the workload went. `outcome` is `ready` when the server survived it."""

    outcome: str
    cause: str = ""
    evidence: tuple[str, ...] = ()
    summary: Mapping[str, object] = field(default_factory=dict)
    throughput_tok_s: float = 0.0
    error_rate: float | None = None
    p99_ttft_ms: float | None = None
    p99_itl_ms: float | None = None
    min_free_gib: float | None = None
    seconds: float = 0.0
    stress_peak_gib: float | None = None
    """GPU memory in use at its peak under load minus what was in use when the load began."""
    growth_gib: float | None = None
    """GPU memory in use after the load minus before it, each read right after `/flush_cache`
    gave the allocator's cached blocks back (`autotune.trial.growth`); None when not measured."""


@dataclass(frozen=True)
class Stop:
    """The teardown: `clean` when every process is gone and the GPU memory came back."""

    clean: bool
    reason: str = ""
    seconds: float = 0.0
    waited: tuple[str, ...] = ()
    """What the teardown waited for (processes after SIGKILL, GPU memory), for the record."""
    log_notes: tuple[str, ...] = ()
    """What happened to the server's log file itself (truncated, deleted and written back)."""
    exit_code: int | None = None
    """The server's main process's return code (negative: the signal that ended it)."""
    sender: str = ""
    """Who sent that signal (`autotune.server.deaths`: autotune, oom_killer, outside, "")."""
    host: tuple[str, ...] = ()
    """What stood in the server's way on the host when it died (a full disk, its port taken)."""


class ServerRun(Protocol):
    """One launched server."""

    def wait_ready(self) -> Startup:
        """Wait until the server is ready or its start ended, and report how it ended."""

    def drive(self, ledger: Mapping[str, object]) -> Load:
        """Run the workload against the ready server (`ledger`: the start's figures the driver sizes
        phases by), and report what it measured."""

    def stop(self) -> Stop:
        """Stop the server and prove it gone, whatever state it is in; report the teardown."""


@runtime_checkable
class SharedRun(ServerRun, Protocol):
    """A launched server that serves more than one workload on one launch (`trial.run.
    run_shared`: `autotune confirm`'s worst cases after its soak)."""

    def rest(self) -> str:
        """Bring the ready server to rest before another workload: its cache flushed
        (`/flush_cache`, which SGLang answers only when the scheduler is idle) and its GPUs' free
        memory settled; "" when it is at rest, else why not (the server died, the flush was
        refused, the probe could not be read). Never raises."""
        ...

    def drive_workload(
        self, ledger: Mapping[str, object], workload: WorkloadSpec, limit_s: float
    ) -> Load:
        """Run `workload` (instead of the launcher's own) against the ready server, within
        `limit_s` seconds, and report what it measured, as `drive` does."""
        ...


class Launcher(Protocol):
    """Starts servers; raises `HarnessError` (or `OSError`) when the machine cannot."""

    def launch(self, plan: TrialPlan) -> ServerRun:
        """Start `plan`'s server and return its handle at once, before it is ready."""

    def extra_args(self) -> tuple[str, ...]:
        """Flags the backend adds to every launch (the simulator's GPU-state folder)."""
        ...

    def stop_orphans(self) -> list[str]:
        """Stop servers a killed autotune left running; one line per server handled."""
        ...
