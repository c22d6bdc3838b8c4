"""A valid study file to vary (`VALID`), for the study's and the study file's tests; the writer
of such files is the `study_file` fixture (tests/conftest.py). The shipped demo study, loaded
(`demo`)."""

from __future__ import annotations

from autotune.config.schema import StudyConfig
from autotune.config.studyfile import SHIPPED_STUDIES, load_study
from tests.simstudy import small_steady

VALID = (
    """
description = "test study"

[server]
backend = "sim"
sim_profile = "kimi-k2.5-tp8-96g"
sim_time_scale = 0.05

[server.flags]
model-path = "/models/kimi"
tp-size = 8
trust_remote_code = true

[search]
mem_fraction_static = { low = 0.80, high = 0.94, step = 0.02 }
max_running_requests = { choices = [32, 48, 64] }
hicache_size = { choices = [0, 48] }

[baseline]
mem_fraction_static = 0.88
max_running_requests = 48
hicache_size = 48

"""
    + small_steady()
    + """[constraints]
max_error_rate = 0.05
min_headroom_gib = 1.0

[budget]
n_trials = 5

[sampler]
name = "tpe"
seed = 3
"""
)


def demo() -> StudyConfig:
    """The demo study that ships in the package, loaded."""
    return load_study(SHIPPED_STUDIES / "demo.toml")
