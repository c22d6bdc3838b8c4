"""A study file like the operator's (SGLang backend) for the export and page tests."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from autotune.config.schema import StudyConfig
from autotune.config.studyfile import parse_study
from tests.simstudy import small_steady

STUDY = (
    """
[server]
backend = "sglang"
command = ["python3", "-m", "sglang.launch_server"]
port = 30000
env = { SGLANG_ENABLE_SPEC_V2 = "1" }

[server.flags]
model-path = "/models/Kimi K2.5"
tp-size = 8
trust-remote-code = true
speculative-algorithm = "EAGLE3"
tool-call-parser = "kimi_k2"

[search]
mem_fraction_static = { low = 0.86, high = 0.94, step = 0.01 }
max_running_requests = { choices = [32, 48, 64] }

"""
    + small_steady(api_key_env="AUTOTUNE_TEST_KEY")
    + """[constraints]
min_headroom_gib = 0.5
"""
)


@pytest.fixture
def cfg(tmp_path: Path) -> StudyConfig:
    return parse_study(tomllib.loads(STUDY), name="t", path=tmp_path / "t.toml")
