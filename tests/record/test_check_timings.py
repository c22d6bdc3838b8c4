"""What `autotune check` stores on the study (`keys.CHECK`), read back by the one reader."""

from __future__ import annotations

from autotune.record import keys
from autotune.record.stored import CheckTimings, StudyRecord


def test_the_checks_timings_read_back_as_written() -> None:
    timings = CheckTimings(trial=0, launch_s=0.5, startup_s=612.0, teardown_s=41.0, log_bytes=9)
    back = StudyRecord.of({keys.CHECK: timings.to_dict()}).check
    assert back == timings
    assert back.phases == {"launch": 0.5, "startup": 612.0, "teardown": 41.0}


def test_a_check_without_its_timings_is_not_read() -> None:
    assert StudyRecord.of({}).check is None
    assert StudyRecord.of({keys.CHECK: {"trial": 0, "startup_s": 1.0}}).check is None
    odd = StudyRecord.of({keys.CHECK: {"trial": True, "launch_s": 0, "startup_s": 1,
                                       "teardown_s": 2}}).check  # fmt: skip
    assert odd is not None and odd.trial is None and odd.log_bytes is None
