"""What the operator sees: plain lines off a terminal, a redrawn status line on one."""

from __future__ import annotations

import io

from autotune.study.progress import Progress, Tally, duration, finished_line, status_line


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
    assert tally.eta(5.0, None) == 60.0 + 65.0 * 5
    assert tally.eta(5.0, 100.0) == 100.0


def test_status_line_names_everything() -> None:
    tally = Tally(n_trials=12, best_capacity=159277, ooms=2)
    line = status_line(
        tally, k=3, number=4, phase="startup", phase_elapsed=12, trial_elapsed=14, remaining_s=None
    )
    assert line == (
        "trial 3/12 (#4) startup 12s (expected ?) | best feasible 159,277 tok | OOMs 2 | ETA ?"
    )


def test_finished_line() -> None:
    line = finished_line(
        k=2, n=9, number=5, outcome="startup_oom", reason="startup_oom: CUDA out of memory",
        capacity=0, throughput=0.0, headroom=None, feasible=False, seconds=9.0,
    )  # fmt: skip
    assert line == (
        "trial 2/9 (#5) startup_oom [infeasible]: capacity 0 tok, 0 tok/s, 9s"
        " — startup_oom: CUDA out of memory"
    )


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
