"""Samplers by name: the study file's `sampler.name` → an Optuna sampler, seeded, and what the
study does around it (`SamplerKind`). One entry per sampler here is all a new one takes: the run
reads its flags from `SAMPLER_KINDS` instead of listing names again. The study file's own list of
names (`config.schema.SAMPLERS`, which cannot import this package) is checked against it by the
tests."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import optuna
from optuna.samplers import BaseSampler

from autotune.config.schema import SamplerConfig
from autotune.errors import UsageError
from autotune.search import CapacityAwareSampler, WalkDownSampler


def make_sampler(cfg: SamplerConfig) -> BaseSampler:
    """An Optuna sampler by name; `grid` is a seeded random sampler behind an enqueued grid."""
    kind = SAMPLER_KINDS.get(cfg.name)
    if kind is None:
        raise UsageError(f"--sampler {cfg.name}: unknown; use one of {', '.join(SAMPLER_KINDS)}")
    return kind.make(cfg)


def is_memory_sampler(name: str) -> bool:
    """Whether the sampler `name` plans from the memory model (`SamplerKind.memory_model`)."""
    kind = SAMPLER_KINDS.get(name)
    return kind is not None and kind.memory_model


def reads_seed_logs(name: str) -> bool:
    """Whether the sampler `name` learns from seed logs (`SamplerKind.reads_seeds`)."""
    kind = SAMPLER_KINDS.get(name)
    return kind is not None and kind.reads_seeds


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


@dataclass(frozen=True)
class SamplerKind:
    """One sampler the study file can name: how it is made, and what the run does around it."""

    make: Callable[[SamplerConfig], BaseSampler]
    memory_model: bool = False
    """Plans from the memory model (a `search.MemorySampler`): it reads the trials running
    elsewhere, so a proposal that repeats one is not followed by a random point."""
    reads_seeds: bool = False
    """Learns from seed logs (`record.seeds`), so a seed of the baseline's setting stands for
    the baseline's launch."""


SAMPLER_KINDS: dict[str, SamplerKind] = {
    "capacity": SamplerKind(_capacity, memory_model=True, reads_seeds=True),
    "walkdown": SamplerKind(_walkdown, memory_model=True),
    "grid": SamplerKind(lambda c: optuna.samplers.RandomSampler(seed=c.seed)),
    "tpe": SamplerKind(lambda c: optuna.samplers.TPESampler(seed=c.seed, n_startup_trials=4)),
    "random": SamplerKind(lambda c: optuna.samplers.RandomSampler(seed=c.seed)),
    "gp": SamplerKind(_gp),
    "nsga2": SamplerKind(lambda c: optuna.samplers.NSGAIISampler(seed=c.seed)),
}
"""Every sampler by its `sampler.name`, in the order `config.schema.SAMPLERS` lists them."""
