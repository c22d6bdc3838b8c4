"""Samplers that find the memory edge: the capacity-aware search and the walk-down baseline.

`CapacityAwareSampler` (the default, `--sampler capacity`) fits SGLang's memory arithmetic to the
ledgers the trials recorded and proposes the highest-capacity setting it expects to be stable
with a margin; `WalkDownSampler` (`--sampler walkdown`) steps mem_fraction_static down from the
top like vLLM's auto_tune. See docs/search.md.
"""

from autotune.search.capacity import CapacityAwareSampler, search_done
from autotune.search.walkdown import WalkDownSampler

__all__ = ["CapacityAwareSampler", "WalkDownSampler", "search_done"]
