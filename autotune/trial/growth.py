"""How far the server's GPU memory footprint grew while it served one trial's workload.

PyTorch's caching allocator keeps every block it ever reserved, so the device-level "used" after a
stress burst stays at the burst's high-water mark and hides what grew for good (a slow leak, the
allocator's fragmentation). SGLang's `/flush_cache` calls `torch.cuda.empty_cache()` once the
scheduler is idle, which hands the cached blocks back to the driver: right after a flush, "used"
is the static allocations plus whatever live memory the server kept. The harness flushes and reads
the probe right before the workload and again once it drained; this module owns the arithmetic
over those readings, nothing that talks to a server or a GPU.

A flush leaves the footprint, and nothing can go below it while the server runs; a forward that
slips in between a flush and the reading (the harness's own health check) only adds its transient.
So each side is read after more than one flush and the least reading per GPU is the footprint.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from autotune.server.gpu import GiB


def footprint_growth_gib(
    before: Mapping[int, int] | None, after: Mapping[int, int] | None
) -> float | None:
    """The most any of the server's GPUs grew between two flushed readings (GPU index -> bytes
    in use), GiB to 3 decimals. The server's GPUs are those in use at the first reading (all of
    them when none is); None when either reading is missing (a flush refused, the probe could not
    be read) or they share no GPU."""
    if before is None or after is None:
        return None
    common = [i for i in before if i in after]
    ours = [i for i in common if before[i] > 0] or common
    if not ours:
        return None
    return round(max(after[i] - before[i] for i in ours) / GiB, 3)


def least_used(readings: Sequence[Mapping[int, int]]) -> dict[int, int] | None:
    """The least bytes in use per GPU over several flushed readings (GPUs every reading shows);
    None for no readings."""
    if not readings:
        return None
    first, *rest = readings
    return {i: min(r[i] for r in readings) for i in first if all(i in r for r in rest)}
