"""What one trial tells the study: its state, what it measured and its attributes (pure values)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from autotune.record import keys


@dataclass(frozen=True)
class Measured:
    """What a complete trial measured; None where the trial never got that far."""

    capacity_tokens: int
    throughput_tok_s: float
    oom: bool
    crashed: bool
    error_rate: float | None
    headroom_gib: float | None
    p99_ttft_ms: float | None
    p99_itl_ms: float | None


State = str  # "complete" | "fail" | "interrupted"


@dataclass(frozen=True)
class Result:
    """What one trial tells the study: its state, measurements and JSON-safe attributes."""

    state: State
    outcome: str
    reason: str
    measured: Measured | None
    attrs: Mapping[str, object]
    fatal: str = ""
    """Non-empty when the run must stop after this trial: `interrupted`, or why the machine is
    no longer fit for the next launch (a server that would not go away)."""

    @property
    def attrs_to_store(self) -> dict[str, object]:
        """What the study stores as the trial's user attributes: `attrs` (the nested `record`
        that autotune's readers take), and each figure of the record flat, one key each, so
        Optuna Dashboard and any Optuna reader show them as columns (`keys.flat_attrs`)."""
        return {**keys.flat_attrs(self.attrs.get(keys.RECORD)), **self.attrs}
