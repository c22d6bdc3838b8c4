"""Samplers by name: the study file's `sampler.name` → an Optuna sampler, seeded."""

from __future__ import annotations

from collections.abc import Callable

import optuna
from optuna.samplers import BaseSampler

from autotune.config.schema import SamplerConfig
from autotune.errors import UsageError
from autotune.search import CapacityAwareSampler, WalkDownSampler


def make_sampler(cfg: SamplerConfig) -> BaseSampler:
    """An Optuna sampler by name; `grid` is a seeded random sampler behind an enqueued grid."""
    factory = SAMPLER_FACTORIES.get(cfg.name)
    if factory is None:
        raise UsageError(
            f"--sampler {cfg.name}: unknown; use one of {', '.join(SAMPLER_FACTORIES)}"
        )
    return factory(cfg)


def _gp(cfg: SamplerConfig) -> BaseSampler:
    try:
        import scipy  # noqa: F401
        import torch  # noqa: F401
    except ImportError as exc:
        raise UsageError("--sampler gp needs torch and scipy installed; use tpe") from exc
    return optuna.samplers.GPSampler(seed=cfg.seed)


def _capacity(cfg: SamplerConfig) -> BaseSampler:

    return CapacityAwareSampler(seed=cfg.seed)


def _walkdown(cfg: SamplerConfig) -> BaseSampler:

    return WalkDownSampler(seed=cfg.seed)


SAMPLER_FACTORIES: dict[str, Callable[[SamplerConfig], BaseSampler]] = {
    "capacity": _capacity,
    "walkdown": _walkdown,
    "grid": lambda c: optuna.samplers.RandomSampler(seed=c.seed),
    "tpe": lambda c: optuna.samplers.TPESampler(seed=c.seed, n_startup_trials=4),
    "random": lambda c: optuna.samplers.RandomSampler(seed=c.seed),
    "gp": _gp,
    "nsga2": lambda c: optuna.samplers.NSGAIISampler(seed=c.seed),
}
