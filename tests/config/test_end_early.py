"""`[workload] end_early`: on by default, `false` turns it off, a table sets the rule's figures,
and a bad value names the key and the fix."""

from __future__ import annotations

import pytest

from autotune.config.workload import EarlyEnd, workload_from_dict
from autotune.errors import ConfigError

PHASES = {"phases": [{"kind": "steady", "concurrency": 8, "duration_s": 900}]}


def test_on_by_default_with_the_documented_rule() -> None:
    rule = workload_from_dict(PHASES).end_early
    assert rule == EarlyEnd()
    assert (rule.enabled, rule.window_s, rule.windows, rule.tolerance) == (True, 30.0, 3, 0.02)
    assert (rule.min_s, rule.min_requests, rule.headroom_tol_gib) == (120.0, 0, 0.1)


def test_false_turns_it_off_and_a_table_sets_the_figures() -> None:
    assert not workload_from_dict({**PHASES, "end_early": False}).end_early.enabled
    rule = workload_from_dict({**PHASES, "end_early": {"tolerance": 0.05, "windows": 4}})
    assert rule.end_early == EarlyEnd(tolerance=0.05, windows=4)


@pytest.mark.parametrize(
    ("value", "key"),
    [
        ("yes", "workload.end_early"),
        ({"tolerance": 2.0}, "workload.end_early.tolerance"),
        ({"windows": 1}, "workload.end_early.windows"),
        ({"window": 30}, "workload.end_early"),
    ],
)
def test_a_bad_value_names_its_key(value: object, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        workload_from_dict({**PHASES, "end_early": value})
    assert key in str(err.value)
