"""The plan of one trial: what is launched (the command line, the environment), where (host,
port) and into which folder, fixed before anything runs.

Kept apart from the run (`trial.run`) because a plan is a pure value built from the study file
and one point: the confirm command, the benchmark and the tests build plans without running them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from autotune.config.schema import Limits, Scalar, StudyConfig
from autotune.config.space import Settings, server_argv
from autotune.server.preflight import free_port


@dataclass(frozen=True)
class TrialPlan:
    """Everything needed to run one trial; paths are inside the study's results folder."""

    number: int
    params: Mapping[str, Scalar]
    argv: tuple[str, ...]
    env: Mapping[str, str]
    host: str
    port: int
    trial_dir: Path
    limits: Limits
    backend: str
    stress_repeats: int = 1
    """How many times the workload's stress phases run on this launch (`keys.STRESS_REPEATS`)."""

    @property
    def log_path(self) -> Path:
        """The server's log, `server.log` in the trial folder."""
        return self.trial_dir / "server.log"


def plan_trial(
    cfg: StudyConfig,
    settings: Settings,
    *,
    number: int,
    trial_dir: Path,
    extra: Sequence[str] = (),
    stress_repeats: int = 1,
) -> TrialPlan:
    """The plan for one launch of `settings` under the study `cfg`: the command line (with the
    launcher's `extra` arguments), the environment, a port (the fixed one, or one free now), and
    how many times its stress phases run (`stress_repeats`, what the search asked)."""
    argv = server_argv(cfg.server, settings, backend=cfg.server.backend, extra=extra)
    return TrialPlan(
        number=number,
        params=settings.params,
        argv=tuple(argv),
        env=dict(cfg.server.env),
        host=cfg.server.host,
        port=cfg.server.port or free_port(cfg.server.host),
        trial_dir=trial_dir,
        limits=cfg.server.limits,
        backend=cfg.server.backend,
        stress_repeats=stress_repeats,
    )
