"""`run_confirm`: the worst cases share the soak's launch, from the least to the most likely to
fail, the server at rest between them; a case that ends the server leaves the cases after it to
a fresh launch (which they share again), and the verdict says which launch each case ran on."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from autotune.config.schema import StudyConfig
from autotune.config.workload import WorkloadSpec
from autotune.logparse.ledger import Ledger
from autotune.review.confirm import Confirmed, run_confirm, with_cases
from autotune.review.worstcase import CASE_NAMES, case_plan, run_order
from autotune.trial.plan import TrialPlan
from autotune.trial.seam import Load, Startup, Stop

LEDGER = {"max_total_num_tokens": 100_000, "max_running_requests": 8,
          "chunked_prefill_size": 4096, "context_len": 32_768}  # fmt: skip
PARAMS = {"mem_fraction_static": 0.9, "max_running_requests": 48}


@dataclass
class Box:
    """What the fake servers do: the workloads that end them and how, and what ran where."""

    ends: Mapping[str, str] = field(default_factory=dict)
    """workload name → the outcome it ends the server with (`runtime_oom`, `killed`)."""
    launches: list[TrialPlan] = field(default_factory=list)
    ran: list[tuple[int, str]] = field(default_factory=list)
    """(launch, workload) in order; the soak is `soak`."""
    rests: int = 0


@dataclass
class Run:
    box: Box
    launch: int
    dead: bool = False

    def wait_ready(self) -> Startup:
        return Startup("ready", "ready", (), dict(LEDGER), 1.0, "0.5.23")

    def _load(self, name: str) -> Load:
        self.box.ran.append((self.launch, name))
        ending = self.box.ends.get(name)
        if ending:
            self.dead = True
            return Load(ending, "x", ("the server ended",), seconds=0.1, stress_peak_gib=4.0)
        return Load("ready", throughput_tok_s=5.0, error_rate=0.0, min_free_gib=1.0,
                    seconds=0.1, stress_peak_gib=2.0)  # fmt: skip

    def drive(self, ledger: Mapping[str, object]) -> Load:
        return self._load("soak" if self.launch == 0 else "first")

    def rest(self) -> str:
        self.box.rests += 1
        return "the server ended (runtime_oom)" if self.dead else ""

    def drive_workload(
        self, ledger: Mapping[str, object], workload: WorkloadSpec, limit_s: float
    ) -> Load:
        return self._load(workload.phases[0].name)

    def stop(self) -> Stop:
        return Stop(clean=True, seconds=0.1, exit_code=-9 if self.dead else 0)


@dataclass
class Launcher:
    box: Box
    workload: WorkloadSpec

    def launch(self, plan: TrialPlan) -> Run:
        self.box.launches.append(plan)
        plan.log_path.write_text("fake server log\n")
        run = Run(self.box, len(self.box.launches) - 1)
        if run.launch > 0:  # a fresh launch's own workload is its first case
            name = self.workload.phases[0].name
            run.drive = lambda ledger: run._load(name)  # type: ignore[method-assign]
        return run

    def extra_args(self) -> tuple[str, ...]:
        return ()

    def stop_orphans(self) -> list[str]:
        return []


def _confirm(cfg: StudyConfig, folder: Path, box: Box) -> Confirmed:
    return run_confirm(cfg, cfg, folder, PARAMS, trial=3,
                       cases=lambda ledger: case_plan(cfg, ledger),
                       launcher_factory=lambda c, f: Launcher(box, c.workload),
                       clock=time.monotonic)  # fmt: skip


def _confirm_ending(
    cfg: StudyConfig, folder: Path, case: str, outcome: str
) -> tuple[Box, Confirmed]:
    """`_confirm` where the workload `case` (a case's name, or `soak`) ends with `outcome`."""
    box = Box(ends={case: outcome})
    return box, _confirm(cfg, folder, box)


def _order(cfg: StudyConfig) -> list[str]:
    return [c.name for c in run_order(case_plan(cfg, Ledger.from_dict(LEDGER)))]


def test_every_case_runs_on_the_soak_s_launch_in_the_order_of_its_planned_peak(
    cfg: StudyConfig, tmp_path: Path
) -> None:
    box = Box()
    done = _confirm(cfg, tmp_path, box)
    order = _order(cfg)
    assert sorted(order) == sorted(CASE_NAMES)
    assert len(box.launches) == 1 and done.launches == 1
    assert box.ran == [(0, "soak"), *((0, n) for n in order)]
    assert box.rests == len(CASE_NAMES)  # at rest before each case
    assert [c.name for c in done.cases] == order
    soak = tmp_path / "confirm" / "0000"
    assert done.verdict.folder == str(soak) and done.verdict.passed
    assert all(c.launch == str(soak) and c.folder == str(soak / c.name) for c in done.cases)
    record = json.loads((soak / order[0] / "trial.json").read_text())
    assert record["log_path"] == str(soak / "server.log") and record["outcome"] == "ok"
    v = with_cases(done.verdict, done.cases)
    assert v.passed and v.launches == (str(soak),)
    assert "7 of 7 passed, on the soak's launch" in v.describe()
    assert all(line.rstrip().endswith("soak") for line in v.case_table().splitlines()[1:])


def test_a_case_that_kills_the_server_leaves_the_cases_after_it_to_one_fresh_launch(
    cfg: StudyConfig, tmp_path: Path
) -> None:
    order = _order(cfg)
    box, done = _confirm_ending(cfg, tmp_path, order[2], "runtime_oom")
    soak, fresh = (str(tmp_path / "confirm" / n) for n in ("0000", "0001"))
    assert done.launches == 2 and len(box.launches) == 2
    assert box.ran == [(0, "soak"), (0, order[0]), (0, order[1]), (0, order[2]),
                       *((1, n) for n in order[3:])]  # fmt: skip
    by = {c.name: c for c in done.cases}
    assert [c.name for c in done.cases] == order  # every case recorded, in the order it ran
    assert by[order[2]].outcome == "runtime_oom" and not by[order[2]].passed
    assert by[order[2]].peak_gib == 4.0 and by[order[2]].launch == soak
    assert all(by[n].launch == fresh and by[n].passed for n in order[3:])
    # the fresh launch's first case keeps its record in its own folder beside that launch's log
    first = json.loads((tmp_path / "confirm" / "0001" / order[3] / "trial.json").read_text())
    assert first["log_path"] == str(Path(fresh) / "server.log")
    v = with_cases(done.verdict, done.cases)
    assert not v.passed and f"worst case {order[2]} (runtime_oom)" in v.reason
    assert "on 2 launches" in v.describe()
    launches = {line.split()[0]: line.split()[-1] for line in v.case_table().splitlines()[1:]}
    assert launches[order[2]] == "soak" and launches[order[3]] == "0001"


def test_a_case_ended_from_outside_is_recorded_as_it_ended_and_the_rest_run_fresh(
    cfg: StudyConfig, tmp_path: Path
) -> None:
    order = _order(cfg)
    _, done = _confirm_ending(cfg, tmp_path, order[0], "killed")
    killed = done.cases[0]
    # not the parameters' result: a failed trial (the review counts it as not served)
    assert killed.outcome == "killed" and not killed.passed
    record = json.loads((Path(str(killed.folder)) / "trial.json").read_text())
    assert record["state"] == "fail"
    assert done.launches == 2 and all(c.passed for c in done.cases[1:])


def test_a_soak_that_ended_its_server_leaves_every_case_to_a_fresh_launch(
    cfg: StudyConfig, tmp_path: Path
) -> None:
    _, done = _confirm_ending(cfg, tmp_path, "soak", "runtime_oom")
    assert not done.verdict.passed and done.verdict.outcome == "runtime_oom"
    fresh = str(tmp_path / "confirm" / "0001")
    assert done.launches == 2 and all(c.launch == fresh and c.passed for c in done.cases)
    assert [c.name for c in done.cases] == _order(cfg)
