"""A confirmation soak's verdict: one typed record, written by `confirm` and read by the review.

`autotune confirm` writes the verdict twice: beside the soak's log (`verdict.json`) and on the
study as the user attribute `confirmation` (with a short history in `confirmations`), which
`report`, `explain`, `export` and `status` read back to label a winner CONFIRMED or UNCONFIRMED.
Both sides use this one type, so a field is named once; `to_attr` is the stored JSON form and
`from_attr` reads it back (older verdicts lack some fields: they read as None).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from autotune.config.space import Space, point_key
from autotune.config.studyfile import Scalar


@dataclass(frozen=True)
class Verdict:
    """One soak of one point: whether it passed, how it ended, and what it measured."""

    params: Mapping[str, Scalar]
    passed: bool
    outcome: str
    reason: str = ""
    trial: int | None = None
    """The study trial whose setting was soaked."""
    violated: tuple[str, ...] = ()
    capacity_tokens: int | None = None
    throughput_tok_s: float | None = None
    headroom_gib: float | None = None
    stress_peak_gib: float | None = None
    error_rate: float | None = None
    seconds: float | None = None
    log_path: str | None = None
    folder: str | None = None
    """The soak's own folder (`results/NAME/confirm/NNNN/`), where `verdict.json` lies."""
    sglang_version: str | None = None
    at: str = ""
    soak_factor: float | None = None
    extra: Mapping[str, object] = field(default_factory=dict)
    """Stored fields this version does not name, kept so a rewrite loses nothing."""

    def covers(self, params: Mapping[str, Scalar], space: Space | None = None) -> bool:
        """True when this soak ran the point `params` of `space`."""
        return point_key(self.params, space) == point_key(params, space)

    def to_attr(self) -> dict[str, object]:
        """The JSON-safe form stored on the study and in `verdict.json`."""
        out = {k: v for k, v in asdict(self).items() if k != "extra"}
        out["params"] = dict(self.params)
        out["violated"] = list(self.violated)
        return {**self.extra, **out}

    @staticmethod
    def from_attr(value: object) -> Verdict | None:
        """The verdict stored as `value`, or None when it is not one (no params)."""
        if not isinstance(value, Mapping) or not isinstance(value.get("params"), Mapping):
            return None
        known = {f for f in Verdict.__dataclass_fields__ if f != "extra"}
        return Verdict(
            params={
                str(k): v
                for k, v in value["params"].items()
                if isinstance(v, bool | int | float | str)
            },
            passed=bool(value.get("passed")),
            outcome=str(value.get("outcome", "")),
            reason=str(value.get("reason") or ""),
            trial=_int(value.get("trial")),
            violated=tuple(str(v) for v in value.get("violated") or ()),
            capacity_tokens=_int(value.get("capacity_tokens")),
            throughput_tok_s=_num(value.get("throughput_tok_s")),
            headroom_gib=_num(value.get("headroom_gib")),
            stress_peak_gib=_num(value.get("stress_peak_gib")),
            error_rate=_num(value.get("error_rate")),
            seconds=_num(value.get("seconds")),
            log_path=_text(value.get("log_path")),
            folder=_text(value.get("folder")),
            sglang_version=_text(value.get("sglang_version")),
            at=str(value.get("at") or ""),
            soak_factor=_num(value.get("soak_factor")),
            extra={str(k): v for k, v in value.items() if k not in known},
        )

    def describe(self) -> str:
        """The verdict in a few lines, as `autotune confirm` prints it."""
        head = "PASSED" if self.passed else "FAILED"
        figures = []
        if self.capacity_tokens:
            figures.append(f"{self.capacity_tokens:,} tokens")
        if self.throughput_tok_s is not None and self.outcome == "ok":
            figures.append(f"{self.throughput_tok_s:,.1f} tok/s")
        if self.headroom_gib is not None and self.outcome == "ok":
            figures.append(f"{self.headroom_gib:.2f} GiB free at the worst moment")
        lines = [
            f"confirmation {head}: {self.outcome}" + (f", {', '.join(figures)}" if figures else "")
        ]
        if self.reason:
            lines.append(f"  {self.reason}")
        lines.append(f"  log: {self.log_path}")
        return "\n".join(lines) + "\n"


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _int(v: object) -> int | None:
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else None


def _text(v: object) -> str | None:
    return str(v) if v is not None else None
