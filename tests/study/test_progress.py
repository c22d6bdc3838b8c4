"""What the operator sees: plain lines off a terminal, a redrawn status line on one."""

from __future__ import annotations

import io
import tomllib

from autotune.config.workload import workload_from_dict
from autotune.study.progress import (
    Progress,
    Tally,
    duration,
    finished_line,
    status_line,
    workload_plan,
)

KIMI_WORKLOAD = """
[workload]
[[workload.phases]]
kind = "warmup"
requests = 4
[[workload.phases]]
kind = "steady"
name = "agents"
concurrency = 150
duration_s = 900
[[workload.phases]]
kind = "stress"
rounds = 3
"""


def _kimi_tally(n: int = 24) -> Tally:
    spec = workload_from_dict(tomllib.loads(KIMI_WORKLOAD)["workload"])
    return Tally(n_trials=n, plan=workload_plan(spec))


def test_duration() -> None:
    assert [duration(s) for s in (None, 5, 75, 3725)] == ["?", "5s", "1m15s", "1h02m"]


def test_tally_expected_times_and_eta() -> None:
    tally = Tally(n_trials=10)
    for total in (60.0, 80.0, 70.0):
        tally.add(
            counted=True,
            feasible_capacity=100,
            oom=False,
            phases={"startup": total / 2, "total": total},
        )
    tally.add(
        counted=True, feasible_capacity=None, oom=True, phases={"startup": 10.0, "total": 10.0}
    )
    assert tally.done == 4 and tally.ooms == 1 and tally.best_capacity == 100
    assert tally.expected("startup") == 32.5
    # 6 trials left at a median 65 s each, 5 s into the current one
    assert tally.eta(5.0, None) == (60.0 + 65.0 * 5, True)
    assert tally.eta(5.0, 100.0) == (100.0, True)


def test_status_line_names_everything() -> None:
    tally = Tally(n_trials=12, best_capacity=159277, ooms=2)
    line = status_line(
        tally, k=3, number=4, phase="startup", phase_elapsed=12, trial_elapsed=14, remaining_s=None
    )
    # nothing timed yet: the ETA is the startup so far for every trial left, a lower bound
    assert line == (
        "trial 3/12 (#4) startup 12s (expected ?) | best feasible 159,277 tok | OOMs 2"
        " | ETA ≥ 2m12s"
    )


def test_finished_line() -> None:
    line = finished_line(
        k=2, n=9, number=5, outcome="startup_oom", reason="startup_oom: CUDA out of memory",
        capacity=None, throughput=None, headroom=None, feasible=False, seconds=9.0,
    )  # fmt: skip
    assert line == (
        "trial 2/9 (#5) startup_oom [infeasible]: no KV pool, 9s — startup_oom: CUDA out of memory"
    )
    line = finished_line(
        k=1, n=9, number=0, outcome="interrupted", reason="stopped by the operator",
        capacity=159_312, throughput=None, headroom=None, feasible=None, seconds=300.0,
    )  # fmt: skip
    assert line == (
        "trial 1/9 (#0) interrupted [failed]: capacity 159,312 tok, 5m00s — stopped by the operator"
    )
    line = finished_line(
        k=4, n=9, number=4, outcome="skipped", reason="not launched: search done",
        capacity=None, throughput=None, headroom=None, feasible=None, seconds=0.0,
    )  # fmt: skip
    assert line == "trial 4/9 (#4) skipped [not launched] — not launched: search done"


def test_plain_mode_writes_one_line_per_event() -> None:
    out = io.StringIO()
    now = [0.0]
    p = Progress(out, Tally(n_trials=3), live=False, clock=lambda: now[0])
    p.trial_started(1, 0, {"mem_fraction_static": 0.88})
    now[0] = 4.0
    p.phase("startup")
    p.trial_finished("done line")
    p.close()
    lines = out.getvalue().splitlines()
    assert lines[0] == "trial 1/3 (#0) mem_fraction_static=0.88"
    assert lines[1].startswith("trial 1/3 (#0) startup 0s")
    assert lines[2] == "done line"
    assert "\r" not in out.getvalue()


def test_live_mode_redraws_the_status_line() -> None:
    out = io.StringIO()
    p = Progress(out, Tally(n_trials=3), live=True, clock=lambda: 0.0, refresh_s=60)
    p.trial_started(1, 0, {"mem_fraction_static": 0.88})
    p.phase("workload")
    p.trial_finished("done line")
    p.close()
    text = out.getvalue()
    assert "\r\x1b[Ktrial 1/3 (#0) workload 0s" in text
    assert text.endswith("done line\n")


def test_the_first_trial_has_an_eta_from_the_workload_plan() -> None:
    """A Kimi rehearsal's first trial: nothing timed yet, but the study file says 15 minutes of
    steady load per trial, so the ETA is at least 24 × (startup so far + 15 min)."""
    tally = _kimi_tally()
    assert [p.name for p in tally.plan] == ["warmup-0", "agents", "stress-2"]
    line = status_line(tally, k=1, number=0, phase="startup", phase_elapsed=60,
                       trial_elapsed=61, remaining_s=None)  # fmt: skip
    assert line.endswith(f"| ETA ≥ {duration(24 * 960 - 61)}")
    line = status_line(tally, k=1, number=0, phase="workload", phase_elapsed=30,
                       trial_elapsed=400, remaining_s=None)  # fmt: skip
    assert "workload 30s (expected ≥ 15m00s: warmup-0 → agents 15m00s → stress-2)" in line
    assert "ETA ≥ " in line
    # a deadline caps it, and a capped ETA is not a lower bound any more
    assert status_line(tally, k=1, number=0, phase="startup", phase_elapsed=60,
                       trial_elapsed=61, remaining_s=3600).endswith("| ETA 1h00m")  # fmt: skip


def test_once_a_trial_timed_the_workload_the_line_names_its_phase() -> None:
    tally = _kimi_tally()
    tally.add(counted=True, feasible_capacity=159_312, oom=False,
              phases={"launch": 1, "startup": 600, "workload": 1100, "teardown": 20,
                      "total": 1721},
              workload_phases={"warmup-0": 120, "agents": 900, "stress-2": 80})  # fmt: skip
    at = {
        50: "warmup-0 (warmup, 1m10s left)",
        420: "agents (steady, 10m00s left)",
        1050: "stress-2 (stress, 50s left)",
        1200: "stress-2 (stress, running over)",
    }
    for elapsed, name in at.items():
        line = status_line(tally, k=2, number=1, phase="workload", phase_elapsed=elapsed,
                           trial_elapsed=600 + elapsed, remaining_s=None)  # fmt: skip
        assert f"(#1) workload: {name}, {duration(elapsed)} (expected 18m20s)" in line
        assert "ETA ≥" not in line and "| ETA " in line


def test_after_ctrl_c_the_teardown_says_it_waits_for_the_server_to_drain() -> None:
    out = io.StringIO()
    now = [0.0]
    p = Progress(out, Tally(n_trials=3), live=False, clock=lambda: now[0])
    p.trial_started(1, 0, {"mem_fraction_static": 0.88})
    p.phase("workload")
    p.stopping(60)  # what the signal handler does: only set a value
    now[0] = 30.0
    p.phase("teardown")
    p.close()
    last = out.getvalue().splitlines()[-1]
    assert last.startswith(
        "trial 1/3 (#0) teardown: waiting for the server to drain (up to 60 s), 0s"
    )
    # a teardown the operator did not ask for is just a teardown
    quiet = io.StringIO()
    q = Progress(quiet, Tally(n_trials=3), live=False, clock=lambda: 0.0)
    q.trial_started(1, 0, {})
    q.phase("teardown")
    assert "drain" not in quiet.getvalue()


def test_finished_line_of_a_trial_that_served_and_broke_a_constraint_says_what() -> None:
    line = finished_line(
        k=3, n=9, number=2, outcome="ok",
        reason="broke error_rate: 30 of 100 requests failed: HTTP 500: Internal Server Error",
        capacity=159_312, throughput=240.0, headroom=1.5, feasible=False, seconds=60.0,
    )  # fmt: skip
    assert line == (
        "trial 3/9 (#2) ok [infeasible]: capacity 159,312 tok, 240 tok/s, 1.50 GiB free at the "
        "worst moment, 1m00s — broke error_rate: 30 of 100 requests failed: HTTP 500: Internal "
        "Server Error"
    )
