"""A confirmation soak's verdict: one typed record, written by `confirm` and read by the review.

`autotune confirm` writes the verdict twice: beside the soak's log (`verdict.json`) and on the
study as the user attribute `confirmation` (with a short history in `confirmations`), which
`report`, `explain`, `export` and `status` read back to label a winner CONFIRMED or UNCONFIRMED.
Both sides use this one type, so a field is named once; `to_attr` is the stored JSON form and
`from_attr` reads it back (older verdicts lack some fields: they read as None, and a verdict
from before the worst cases has no `cases`). A verdict also holds each worst case the confirm ran
after the soak (`CaseResult`: what it sent, its peak, the least free memory, how it ended, and
the launch it ran on: the soak's own, or a fresh one after a case that ended the server).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import PurePath

from autotune.config.schema import Scalar
from autotune.config.space import Space, point_key


@dataclass(frozen=True)
class CaseResult:
    """One worst case of a confirmation (`autotune.review.worstcase`): what it sent, the stress
    peak and the least free memory it met, and how it ended."""

    name: str
    sent: str
    """What it sent, in words: `48 × 8,192+64 tokens at once`."""
    passed: bool
    outcome: str
    peak_gib: float | None = None
    least_free_gib: float | None = None
    reason: str = ""
    folder: str | None = None
    """The case's own folder (its `trial.json`)."""
    launch: str | None = None
    """The folder of the launch it ran on (where that launch's `server.log` lies): the soak's
    own folder when it shared the soak's launch; None in a verdict from before cases shared
    launches (each had its own)."""

    @property
    def verdict(self) -> str:
        """`ok`, or how the case failed (`runtime_oom`, `broke min_headroom_gib`)."""
        if self.passed:
            return "ok"
        return self.reason if self.outcome == "ok" and self.reason else self.outcome or "failed"

    def to_attr(self) -> dict[str, object]:
        """The JSON-safe form stored inside the verdict."""
        return asdict(self)

    @staticmethod
    def from_attr(value: object) -> CaseResult | None:
        """The case stored as `value`, or None when it is not one (no name)."""
        if not isinstance(value, Mapping) or not isinstance(value.get("name"), str):
            return None
        return CaseResult(
            name=str(value["name"]),
            sent=str(value.get("sent") or ""),
            passed=bool(value.get("passed")),
            outcome=str(value.get("outcome") or ""),
            peak_gib=_num(value.get("peak_gib")),
            least_free_gib=_num(value.get("least_free_gib")),
            reason=str(value.get("reason") or ""),
            folder=_text(value.get("folder")),
            launch=_text(value.get("launch")),
        )


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
    cases: tuple[CaseResult, ...] = ()
    """The worst cases run after the soak (older verdicts have none)."""
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
        out["cases"] = [c.to_attr() for c in self.cases]
        return {**self.extra, **out}

    @property
    def failed_cases(self) -> tuple[CaseResult, ...]:
        """The worst cases that did not pass."""
        return tuple(c for c in self.cases if not c.passed)

    @property
    def worst_case(self) -> CaseResult | None:
        """The case that hurt most: the first that failed, else the one with the highest peak."""
        if self.failed_cases:
            return self.failed_cases[0]
        measured = [c for c in self.cases if c.peak_gib is not None]
        return max(measured, key=lambda c: c.peak_gib or 0.0) if measured else None

    def worst_line(self) -> str:
        """The worst case in one phrase, "" without cases: `worst case longest-context: peak
        2.61 GiB, 1.20 GiB free (ok)`."""
        w = self.worst_case
        if w is None:
            return ""
        peak = f"peak {w.peak_gib:.2f} GiB" if w.peak_gib is not None else "peak not measured"
        free = f", {w.least_free_gib:.2f} GiB free" if w.least_free_gib is not None else ""
        return f"worst case {w.name}: {peak}{free} ({w.verdict})"

    def launch_of(self, case: CaseResult) -> str:
        """Which launch `case` ran on, in words: `soak` (the soak's own), the launch folder's
        name (`0003`: a fresh one), or `-` (not recorded: an older verdict)."""
        if case.launch is None:
            return "-"
        if self.folder is not None and case.launch == self.folder:
            return "soak"
        return PurePath(case.launch).name

    @property
    def launches(self) -> tuple[str, ...]:
        """The launches the cases ran on, in the order first used (empty for an older verdict)."""
        return tuple(dict.fromkeys(c.launch for c in self.cases if c.launch is not None))

    def case_table(self) -> str:
        """The worst cases as `autotune confirm` prints them, in the order they ran: case, what
        it sent, peak, least free, verdict, the launch it ran on ("" without cases)."""
        if not self.cases:
            return ""
        rows = [("case", "sent", "peak GiB", "least free GiB", "verdict", "launch")]
        for c in self.cases:
            rows.append((
                c.name,
                c.sent,
                f"{c.peak_gib:.2f}" if c.peak_gib is not None else "-",
                f"{c.least_free_gib:.2f}" if c.least_free_gib is not None else "-",
                c.verdict,
                self.launch_of(c),
            ))  # fmt: skip
        widths = [max(len(r[i]) for r in rows) for i in range(6)]
        return "".join(
            "  " + "  ".join(v.ljust(widths[i]) for i, v in enumerate(r)).rstrip() + "\n"
            for r in rows
        )

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
            cases=tuple(
                c for c in map(CaseResult.from_attr, _items(value.get("cases"))) if c is not None
            ),
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
        table = self.case_table()
        if table:
            lines.append(f"worst cases ({len(self.cases) - len(self.failed_cases)} of "
                         f"{len(self.cases)} passed{self._launch_words()}; "
                         f"{self.worst_line()}):")  # fmt: skip
            lines.append(table.rstrip("\n"))
        return "\n".join(lines) + "\n"

    def _launch_words(self) -> str:
        """`, on the soak's launch` / `, on 2 launches` ("" for an older verdict)."""
        launches = self.launches
        if not launches:
            return ""
        if launches == (self.folder,):
            return ", on the soak's launch"
        if len(launches) == 1:
            return ", on 1 launch"
        return f", on {len(launches)} launches"


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _int(v: object) -> int | None:
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else None


def _text(v: object) -> str | None:
    return str(v) if v is not None else None


def _items(v: object) -> list[object]:
    return list(v) if isinstance(v, list | tuple) else []
