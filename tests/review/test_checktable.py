"""`autotune check`'s table and the night's plan (`review.checktable`), from a check's readings."""

from __future__ import annotations

import pytest

from autotune.config.studyfile import SHIPPED_STUDIES, load_study
from autotune.record.stored import CheckTimings
from autotune.review.checktable import check_text, night_plan, verdict
from autotune.study.readings import CheckReport, Row

TIMINGS = CheckTimings(trial=0, launch_s=1.0, startup_s=600.0, teardown_s=60.0)


def test_the_plan_rests_on_the_checks_timings_the_workload_and_the_launches() -> None:
    cfg = load_study(SHIPPED_STUDIES / "kimi.toml")  # warmup, agents 900 s, stress 3 rounds
    report = CheckReport(timings=TIMINGS, workload_phases={"check": 3.0, "stress-2": 20.0})
    plan = night_plan(cfg, report)
    assert plan is not None
    assert plan.phases == (("warmup-0", None), ("agents", 900.0), ("stress-2", 60.0))
    assert plan.per_trial_s == pytest.approx(1 + 600 + 960 + 60)
    assert (plan.expected_launches, plan.worst_launches) == (8, 24)
    assert plan.soak_factor == 3.0  # no trial held: the default soak
    assert plan.soak_s == pytest.approx(1 + 600 + 3 * 900 + 3 * 60 + 60)
    assert plan.expected_s == pytest.approx(7 * plan.per_trial_s + plan.soak_s)
    assert plan.worst_s == pytest.approx(23 * plan.per_trial_s + plan.soak_s)


def test_go_prints_the_plan_and_no_go_one_line_per_reason_with_its_fix() -> None:
    cfg = load_study(SHIPPED_STUDIES / "kimi.toml")
    good = CheckReport(rows=[Row("server port", "127.0.0.1:30000 free")], timings=TIMINGS)
    text = check_text(cfg, good)
    assert verdict(good) == 0
    assert text.rstrip().splitlines()[-1].startswith("GO:")
    assert "\nnight " in text and "expected ≥ " in text and "launches" in text
    # the steady phase's drain after its duration is named, not passed over as if it were none
    assert "agents ≤ 15m00s + drain ≤ 10m00s" in text
    assert "drains the requests still in flight (up to 10m00s), which this does not count" in text
    bad = CheckReport(
        rows=[Row("server port", "port 30000 is in use", False, "free it or choose another port")],
        timings=TIMINGS,
    )
    text = check_text(cfg, bad)
    assert verdict(bad) == 1
    assert "no-go: server port: port 30000 is in use; fix: free it or choose another port" in text
    assert "\nnight " not in text and text.rstrip().splitlines()[-1].startswith("NO-GO: 1")
