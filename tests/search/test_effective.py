"""A candidate SGLang would run as a measured trial (`search.effective.duplicate_of`): request
slots at or above the ones the pool lowered a trial to, at the same other settings, are that
trial again; below it, at another fraction, or clamped by post-capture sizing, they are not."""

from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.record.view import TrialView, view
from autotune.search.effective import duplicate_of, effective_point, exact_clamps


def _trial(number: int, f: float, asked: int, ran: int, *, rule: str = "kv_capacity") -> TrialView:
    ledger: dict[str, Any] = {
        "max_total_num_tokens": 2048,
        "max_running_requests": ran,
        "requested_max_running_requests": asked,
        "max_running_requests_rule": rule if ran < asked else None,
        "context_len": 4096,
    }
    record = {
        "params": {"mem_fraction_static": f, "max_running_requests": asked},
        "ledger": ledger,
        "outcome": "ok",
        "capacity_tokens": 2048,
        "phases": {"total": 3.0},
    }
    t: FrozenTrial = optuna.trial.create_trial(
        state=TrialState.COMPLETE,
        value=2048.0,
        user_attrs={"outcome": "ok", "reason": "", "record": record},
    )
    t.number = number
    return view(t)


def test_request_slots_at_or_above_the_clamp_are_the_measured_trial() -> None:
    measured = [_trial(0, 0.85, 4096, 1024)]
    for asked in (1024, 2048, 8192):
        twin = duplicate_of({"mem_fraction_static": 0.85, "max_running_requests": asked}, measured)
        assert twin is not None and twin.trial == 0, asked
        assert "asked 4096, ran 1024" in twin.reason
    assert (
        duplicate_of({"mem_fraction_static": 0.85, "max_running_requests": 512}, measured) is None
    )
    assert (
        duplicate_of({"mem_fraction_static": 0.86, "max_running_requests": 2048}, measured) is None
    )


def test_an_unclamped_trial_and_a_post_capture_clamp_predict_nothing() -> None:
    plain = [_trial(0, 0.85, 512, 512)]
    assert duplicate_of({"mem_fraction_static": 0.85, "max_running_requests": 512}, plain) is None
    post = [_trial(0, 0.85, 128, 50, rule="post_capture")]
    assert exact_clamps(post[0]) == {}
    assert duplicate_of({"mem_fraction_static": 0.85, "max_running_requests": 256}, post) is None


def test_the_effective_point_is_each_clamped_value_at_most_what_ran() -> None:
    clamps = exact_clamps(_trial(0, 0.85, 4096, 1024))
    point = {"mem_fraction_static": 0.85, "max_running_requests": 2048}
    assert effective_point(point, clamps) == {
        "mem_fraction_static": 0.85,
        "max_running_requests": 1024,
    }
    small = {"mem_fraction_static": 0.85, "max_running_requests": 64}
    assert effective_point(small, clamps) == small
