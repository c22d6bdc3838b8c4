"""A confirmation verdict is one type: what `confirm` stores is what the review reads back."""

from __future__ import annotations

import json

from autotune.review.verdict import Verdict


def test_a_verdict_reads_back_as_it_was_stored() -> None:
    v = Verdict(
        params={"mem_fraction_static": 0.88, "max_running_requests": 48},
        passed=False,
        outcome="ok",
        reason="broke headroom_gib",
        trial=3,
        violated=("headroom_gib",),
        capacity_tokens=159_277,
        throughput_tok_s=812.5,
        headroom_gib=0.31,
        folder="/r/kimi/confirm/0000",
        soak_factor=3.0,
    )
    stored = json.loads(json.dumps(v.to_attr()))
    assert Verdict.from_attr(stored) == v
    assert stored["violated"] == ["headroom_gib"] and stored["passed"] is False


def test_an_older_verdict_reads_with_what_it_has_and_keeps_the_rest() -> None:
    old = {"params": {"mem_fraction_static": 0.9}, "passed": True, "outcome": "ok", "note": "x"}
    v = Verdict.from_attr(old)
    assert v is not None and v.passed and v.capacity_tokens is None and v.trial is None
    assert v.to_attr()["note"] == "x"
    assert Verdict.from_attr({"passed": True}) is None


def test_the_printed_verdict_names_its_figures_only_when_it_served() -> None:
    ok = Verdict(params={}, passed=True, outcome="ok", capacity_tokens=1000, headroom_gib=1.5)
    assert ok.describe().splitlines()[0] == (
        "confirmation PASSED: ok, 1,000 tokens, 1.50 GiB free at the worst moment"
    )
    oom = Verdict(params={}, passed=False, outcome="runtime_oom", headroom_gib=0.0)
    assert oom.describe().splitlines()[0] == "confirmation FAILED: runtime_oom"
