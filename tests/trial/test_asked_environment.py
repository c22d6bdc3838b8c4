"""What a trial asked that SGLang's log cannot show (post-capture KV sizing, read from the
environment) is put beside the ledger the log gave, so every surface compares it with what ran."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.config.schema import Limits
from autotune.logparse.clamps import Clamps
from autotune.logparse.ledger import Ledger
from autotune.trial.judge import judge
from autotune.trial.plan import TrialPlan
from autotune.trial.seam import Startup


@pytest.mark.parametrize(("value", "asked"), [("1", True), ("false", False)])
def test_the_environment_says_whether_post_capture_sizing_was_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str, asked: bool
) -> None:
    monkeypatch.delenv("SGLANG_ENABLE_POST_CAPTURE_KV_SIZING", raising=False)
    env = {"SGLANG_ENABLE_POST_CAPTURE_KV_SIZING": value}
    plan = TrialPlan(0, {}, ("x",), env, "127.0.0.1", 1, tmp_path, Limits(), "sim")
    ran = {
        "max_total_num_tokens": 1000,
        "post_capture_kv_sizing": False,
        "sglang_version": "0.5.23",
    }
    record = judge(plan, Startup("startup_oom", ledger=ran), None, False, "", {})
    led = Ledger.from_dict(record.ledger)
    assert led.post_capture_requested is asked
    clamped = [c.name for c in Clamps.of(led).clamped]
    assert clamped == (["post_capture_kv_sizing"] if asked else [])
