"""One registry of samplers: the study file's names (`config.schema.SAMPLERS`, which cannot
import `autotune.study`) are the registry's (`study.samplers.SAMPLER_KINDS`), in the same order,
and each entry's flags say what its sampler is, so the run reads them instead of listing names."""

from __future__ import annotations

import pytest

from autotune.config.schema import SAMPLERS, SamplerConfig
from autotune.errors import UsageError
from autotune.search.base import MemorySampler
from autotune.study.samplers import SAMPLER_KINDS, is_memory_sampler, make_sampler


def test_the_study_files_names_are_the_registrys() -> None:
    assert tuple(SAMPLER_KINDS) == SAMPLERS


@pytest.mark.parametrize("name", SAMPLERS)
def test_a_memory_sampler_is_flagged_as_one(name: str) -> None:
    try:
        sampler = make_sampler(SamplerConfig(name=name))
    except UsageError:  # gp without torch and scipy
        pytest.skip(f"{name} cannot be made here")
    assert is_memory_sampler(name) == isinstance(sampler, MemorySampler)


def test_an_unknown_name_has_no_flags() -> None:
    assert not is_memory_sampler("nope")
