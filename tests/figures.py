"""The figures of one trial as every surface prints them (`autotune.review.figures`): what the
tests that compare status, explain, the export and the report hold each surface to."""

from __future__ import annotations

from autotune.record.view import TrialView
from autotune.review import figures as fig


def printed(t: TrialView) -> dict[str, str]:
    """The trial's capacity, reserve, free after startup, stress peak and free at the worst moment,
    each as printed."""
    return {
        "capacity": fig.tokens(t.capacity_tokens),
        "reserve": fig.gib(t.reserve_gib),
        "free": fig.gib(t.static_free_gib),
        "peak": fig.gib(t.stress_peak_gib),
        "worst": fig.gib(t.free_at_peak_gib),
    }
