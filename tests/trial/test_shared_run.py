"""Further workloads on one launch (`trial.run.run_shared`): each after the server is brought to
rest, each with its own record; the first that leaves the server dead or not at rest ends the
sharing, and the teardown's facts belong to the last workload that ran."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from autotune.config.schema import Limits
from autotune.config.workload import Stress, WorkloadSpec
from autotune.errors import HarnessError
from autotune.trial.plan import TrialPlan
from autotune.trial.run import FollowUp, Shared, run_shared, run_trial
from autotune.trial.seam import Load, Startup, Stop

READY = Startup("ready", "ready", (), {"max_total_num_tokens": 1000}, 1.0, "0.5.23")


def _load(peak: float) -> Load:
    return Load("ready", throughput_tok_s=10.0, error_rate=0.0, min_free_gib=2.0 - peak,
                seconds=1.0, stress_peak_gib=peak)  # fmt: skip


@dataclass
class OneShotRun:
    """A server of a launcher that cannot share: no `rest`, no `drive_workload`."""

    log: list[str]

    def wait_ready(self) -> Startup:
        return READY

    def drive(self, ledger: Mapping[str, object]) -> Load:
        self.log.append("soak")
        return _load(1.0)

    def stop(self) -> Stop:
        self.log.append("stop")
        return Stop(clean=True)


@dataclass
class SharingRun(OneShotRun):
    """A served fake: each workload's outcome by its only phase's name (`died` kills it)."""

    rest_fails_after: str = ""
    died: str = ""
    harness: str = ""
    stopped_by: int | None = None

    def wait_ready(self) -> Startup:
        self.log.append("ready")
        return READY

    def rest(self) -> str:
        self.log.append("rest")
        last = self.log[-2]
        return "/flush_cache answered 400" if last == self.rest_fails_after else ""

    def drive_workload(
        self, ledger: Mapping[str, object], workload: WorkloadSpec, limit_s: float
    ) -> Load:
        name = workload.phases[0].name
        self.log.append(name)
        if name == self.harness:
            raise HarnessError("the GPU probe failed")
        if name == self.died:
            self.stopped_by = -9
            return Load("runtime_oom", "torch_oom", ("torch.OutOfMemoryError",), seconds=0.5,
                        stress_peak_gib=3.0)  # fmt: skip
        return _load(1.5)

    def stop(self) -> Stop:
        self.log.append("stop")
        return Stop(clean=True, seconds=0.1, exit_code=self.stopped_by,
                    sender="oom_killer" if self.stopped_by else "")  # fmt: skip


@dataclass
class SharingLauncher:
    run: SharingRun
    launches: list[TrialPlan] = field(default_factory=list)

    def launch(self, plan: TrialPlan) -> SharingRun:
        self.launches.append(plan)
        plan.log_path.write_text("fake server log\n")
        return self.run

    def extra_args(self) -> tuple[str, ...]:
        return ()

    def stop_orphans(self) -> list[str]:
        return []


def _plan(folder: Path) -> TrialPlan:
    return TrialPlan(number=0, params={"mem_fraction_static": 0.9},
                     argv=("sglang",), env={}, host="127.0.0.1", port=30000,
                     trial_dir=folder / "0000", limits=Limits(), backend="sglang")  # fmt: skip


def _follow(plan: TrialPlan, name: str) -> FollowUp:
    burst = Stress(name, rounds=1, requests=2, input_len=100, output_len=4)
    workload = WorkloadSpec(phases=(burst,))
    return FollowUp(name, dataclasses.replace(plan, trial_dir=plan.trial_dir / name), workload, 9.0)


NAMES = ("small", "middle", "large")


def _shared(tmp_path: Path, run: SharingRun) -> tuple[list[str], Shared]:
    plan = _plan(tmp_path)
    launcher = SharingLauncher(run)
    out = run_shared(plan, launcher, lambda ledger: [_follow(plan, n) for n in NAMES],
                     clock=time.monotonic, phase=lambda p: None)  # fmt: skip
    assert len(launcher.launches) == 1
    return run.log, out


def test_every_follow_up_runs_on_the_one_launch_each_after_a_rest(tmp_path: Path) -> None:
    log, out = _shared(tmp_path, SharingRun([]))
    assert log == ["ready", "soak", "rest", "small", "rest", "middle", "rest", "large", "stop"]
    assert out.first.outcome == "ok" and out.first.stress_peak_gib == 1.0
    then = out.then
    assert [r.outcome for r in then] == ["ok", "ok", "ok"]
    assert all(r.stress_peak_gib == 1.5 for r in then)
    # each record is its own (its phases), its log the launch's
    assert all(r.log_path == str(tmp_path / "0000" / "server.log") for r in then)
    assert "startup" not in then[0].phases and "teardown" in then[-1].phases
    assert "teardown" not in out.first.phases and out.unrun == 0 and out.why == ""


def test_a_follow_up_that_kills_the_server_ends_the_sharing_and_keeps_the_teardown(
    tmp_path: Path,
) -> None:
    log, out = _shared(tmp_path, SharingRun([], died="middle"))
    assert log == ["ready", "soak", "rest", "small", "rest", "middle", "stop"]
    then = out.then
    assert [r.outcome for r in then] == ["ok", "runtime_oom"]
    assert then[1].state == "complete"  # the parameters' own failure
    assert then[1].exit_code == -9 and then[1].sender == "oom_killer"
    assert then[0].exit_code is None and out.first.exit_code is None
    assert out.unrun == 1


def test_a_server_that_does_not_come_to_rest_runs_nothing_more(tmp_path: Path) -> None:
    log, out = _shared(tmp_path, SharingRun([], rest_fails_after="small"))
    assert log == ["ready", "soak", "rest", "small", "rest", "stop"]
    assert len(out.then) == 1 and out.unrun == 2
    assert "did not come to rest after small: /flush_cache answered 400" in out.why


def test_a_harness_error_is_that_follow_up_s_and_not_the_parameters(tmp_path: Path) -> None:
    log, out = _shared(tmp_path, SharingRun([], harness="small"))
    assert log == ["ready", "soak", "rest", "small", "stop"]
    (first,) = out.then
    assert first.outcome == "harness_error" and first.state == "fail"
    assert out.first.outcome == "ok" and out.unrun == 2


def test_a_launcher_that_cannot_share_runs_only_its_own_workload(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    log: list[str] = []

    class OneShot(SharingLauncher):
        def launch(self, plan: TrialPlan) -> OneShotRun:  # type: ignore[override]
            plan.log_path.write_text("log\n")
            return OneShotRun(log)

    out = run_shared(plan, OneShot(SharingRun([])), lambda ledger: [_follow(plan, "small")],
                     clock=time.monotonic, phase=lambda p: None)  # fmt: skip
    assert log == ["soak", "stop"] and out.then == () and out.unrun == 1
    assert "one workload each" in out.why
    # run_trial is the same launch with no follow-ups
    assert run_trial(plan, OneShot(SharingRun([])), clock=time.monotonic,
                     phase=lambda p: None).outcome == "ok"  # fmt: skip
