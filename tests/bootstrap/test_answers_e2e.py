"""`autotune init` reads the answers' length from a simulator log whose answers are much shorter
than its prompts: the tokens the Decode lines' forwards made over the requests the Prefill lines
admitted, not twice the small difference between the running requests' context and the prompts
(which reads about ten times the answers here: 4,060 tokens for 400)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.bootstrap.conftest import simulator_log
from tests.simstudy import assert_none_left

pytestmark = pytest.mark.e2e

ANSWER = 400


def test_short_answers_to_long_prompts_are_read_from_the_forwards(tmp_path: Path) -> None:
    folder = tmp_path / "sim"
    try:
        # prompts of 2,000 to 21,000 tokens, skewed: a few long ones pull their mean past the
        # running requests' median context
        log = simulator_log(
            folder, requests=24, prompt=lambda i: 2000 + (i * i * 35), answer=ANSWER
        )
    finally:
        assert_none_left(folder)
    out = tmp_path / "s.toml"
    done = subprocess.run(
        [sys.executable, "-m", "autotune", "init", "s", "--from-log", str(log), "--out", str(out)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    mean = tomllib.loads(text)["workload"]["output_len"]["mean"]
    assert 0.85 * ANSWER <= mean <= 1.15 * ANSWER, mean
    assert "tokens the decode forwards of" in text.replace("\n# ", " ")
