"""The progress line's expected times before the night's first trial, seeded with `autotune
check`'s launch (`Tally.seed`)."""

from __future__ import annotations

from autotune.config.workload import Steady, Stress, WorkloadSpec
from autotune.study.progress import Tally, status_line, workload_plan

SPEC = WorkloadSpec(phases=(Steady("agents", 8, 900.0), Stress("stress")))


def test_a_seeded_tally_expects_the_checks_startup_and_teardown_from_the_first_trial() -> None:
    fresh = Tally(n_trials=4, plan=workload_plan(SPEC))
    seeded = Tally(n_trials=4, plan=workload_plan(SPEC))
    seeded.seed({"launch": 1.0, "startup": 600.0, "teardown": 60.0})
    assert fresh.expected("startup") is None
    assert seeded.expected("startup") == 600.0 and seeded.expected("teardown") == 60.0
    total, exact = seeded.per_trial() or (0.0, True)
    assert total == 1.0 + 600.0 + 900.0 + 60.0 and not exact  # the stress round is not timed yet
    line = status_line(seeded, k=1, number=0, phase="startup", phase_elapsed=5.0,
                       trial_elapsed=6.0, remaining_s=None)  # fmt: skip
    assert "(expected 10m00s)" in line and "ETA ≥ " in line
