"""What each reading of `autotune check` says: the rows of its table, go or no-go with the fix.

Pure over what the check read (`study.check`): the baseline launch's ending, the SGLang version
and log format, every ledger field the search and the memory arithmetic need (`SEARCH_FIELDS`)
on every rank, the HTTP routes and the workload's API, GPU memory before, after startup and after
the teardown, and the disk the night's logs need. Kept apart from the launch that gathers them,
so each rule is tested on values and `review.checktable` prints them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from autotune.config.schema import StudyConfig
from autotune.config.workload import Poisson, Steady, WorkloadSpec
from autotune.logparse.accounting import RANK_FIELDS
from autotune.logparse.ledger import Ledger
from autotune.logparse.outcome import Outcome
from autotune.memory.arithmetic import free_after_capture_gib
from autotune.record.stored import CheckTimings
from autotune.record.view import TrialView
from autotune.server.endpoints import Endpoint
from autotune.server.gpu import GiB, GpuMemory
from autotune.server.hostcheck import MIN_RESULTS_FREE_BYTES
from autotune.trial.seam import Startup, Stop

DiskFree = Callable[[Path], int]
"""Free bytes of the file system holding a folder (`study.check.disk_free_bytes`)."""

SEARCH_FIELDS: tuple[tuple[str, str, bool], ...] = (
    ("p_gib", "P, free memory before the weights", True),
    ("weights_gib", "the weights", False),
    ("avail_after_weights_gib", "A, free after the weights", True),
    ("kv_gib", "the KV pool", True),
    ("max_total_num_tokens", "the KV pool's tokens", True),
    ("req_to_token_gib", "the request table", False),
    ("avail_after_pool_gib", "free after the pool", False),
    ("graph_gib", "CUDA graphs", False),
    ("avail_after_graphs_gib", "free after the graphs", True),
    ("semantics", "the memory rules the log follows", True),
)
"""The ledger fields the memory arithmetic (`memory.arithmetic.arithmetic`, `_headroom`,
`free_after_capture_gib`) and the search (`search.planner` through `memory.model`) read: name,
what it is, and whether the search cannot go without it (the others narrow the headroom model)."""


@dataclass(frozen=True)
class Row:
    """One reading of the check: what was read, its value, go or no-go, and the fix when no-go."""

    reading: str
    value: str
    go: bool = True
    fix: str = ""


@dataclass
class CheckReport:
    """The check's readings (`rows`) and what the night's plan is made from: the timed phases of
    the launch, the seconds each workload phase of the check took, the stored trial and the
    study's finished trials (for the soak)."""

    rows: list[Row] = field(default_factory=list)
    timings: CheckTimings | None = None
    workload_phases: Mapping[str, float] = field(default_factory=dict)
    trial: TrialView | None = None
    trials: Sequence[TrialView] = ()
    wall_s: float = 0.0

    @property
    def go(self) -> bool:
        """Whether every reading is go."""
        return all(r.go for r in self.rows)


def gpu_text(snapshot: Sequence[GpuMemory] | None, devices: tuple[int, ...] | None) -> str:
    """A snapshot of the study's GPUs in one phrase: how many, the free memory of all, the least."""
    if snapshot is None:
        return "unreadable"
    gpus = [g for g in snapshot if devices is None or g.index in devices]
    if not gpus:
        return "no GPU state yet (nothing holds a GPU)"
    free = sum(g.free for g in gpus) / GiB
    total = sum(g.total for g in gpus) / GiB
    least = min(g.free for g in gpus) / GiB
    return f"{len(gpus)} GPUs, {free:.2f} of {total:.2f} GiB free (least {least:.2f} GiB)"


def launch_rows(
    rows: list[Row], state: str, outcome: str, reason: str, v: TrialView, number: int
) -> None:
    """The baseline launch's row: stored as a trial (its capacity), a failure the parameters
    caused (the search starts below it), or one outside them (no-go: its point runs again)."""
    ending = Outcome.of(outcome)
    if state == "complete":
        cap = f", capacity {v.capacity_tokens:,} tokens" if v.capacity_tokens else ""
        rows.append(Row("baseline launch", f"{outcome}{cap}; stored as trial {number}"))
    elif ending.machine_suspect or ending.requeued:
        rows.append(
            Row(
                "baseline launch",
                f"{outcome}: {reason}",
                False,
                "see the trial's server.log; its point runs again",
            )
        )
    else:
        rows.append(
            Row(
                "baseline launch",
                f"{outcome}: {reason}; stored as trial {number} (the search starts below it)",
            )
        )


def version_rows(
    rows: list[Row], version: str | None, ledger: Ledger, startup: Startup | None
) -> None:
    """The SGLang version the server answered (or logged) and the memory rules its log follows;
    no-go where neither is known or no memory line of a known format came."""
    shown = version or ledger.sglang_version
    rows.append(
        Row(
            "SGLang version",
            shown or "not shown",
            bool(shown),
            "" if shown else "the server answered no version and logged none",
        )
    )
    if startup is None or (startup.outcome != "ready" and not ledger.semantics):
        rows.append(
            Row("log format", "the server did not start", False, "see the trial's server.log")
        )
        return
    if not ledger.semantics:
        rows.append(
            Row(
                "log format",
                "no memory line autotune reads (an unknown format)",
                False,
                f"run an SGLang release whose log autotune reads (0.5.9 to 0.5.23; "
                f"this one is {shown or 'unknown'})",
            )
        )
        return
    rows.append(Row("log format", f"SGLang {ledger.semantics} rules ({ledger.semantics_from})"))


def ledger_rows(
    rows: list[Row], ledger: Ledger, ranks: Mapping[str, Ledger], cfg: StudyConfig
) -> None:
    """One row per ledger field the search and the arithmetic read (`SEARCH_FIELDS`), with the
    ranks that showed it; no-go where a field the search cannot go without is missing."""
    tags = list(ranks)
    for name, what, needed in SEARCH_FIELDS:
        value = getattr(ledger, name)
        if name == "avail_after_graphs_gib":
            value = free_after_capture_gib(ledger)
        per_rank = name in RANK_FIELDS and bool(tags)
        missing = [t or "main" for t, r in ranks.items() if getattr(r, name) is None]
        missing = missing if per_rank else []
        shown = "not shown" if value is None else _fmt(value)
        where = f" on {len(tags) - len(missing)}/{len(tags)} ranks" if per_rank else ""
        if missing:
            where += f" (missing on {', '.join(missing)})"
        ok = value is not None and not missing
        go = ok or not needed
        fix = ""
        if not go:
            fix = (
                "the log does not show it: run an SGLang release whose log autotune reads "
                "(0.5.9 to 0.5.23), with its INFO lines on every rank"
            )
        note = "" if ok or needed else "; the headroom model goes without it"
        rows.append(Row(f"ledger {name} ({what})", f"{shown}{where}{note}", go, fix))


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.2f} GiB" if value >= 0 else f"{value:g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def endpoint_rows(
    rows: list[Row], endpoints: Sequence[Endpoint], v: TrialView, cfg: StudyConfig
) -> None:
    """One row per HTTP route autotune uses, and the workload API's error rate under the short
    load with the server's first failed answer; an OOM of the baseline is not the API's."""
    if not endpoints:
        rows.append(
            Row(
                "HTTP routes",
                "not asked: the server never became ready",
                False,
                "see the trial's server.log",
            )
        )
    for e in endpoints:
        go = e.ok or not e.needed
        fix = "" if go else "run an SGLang release autotune reads (0.5.9 to 0.5.23)"
        value = e.detail if e.ok or e.needed else f"{e.detail}; not needed"
        rows.append(Row(f"HTTP {e.route}", value, go, fix))
    api = str(cfg.workload.api)
    err = v.error_rate
    ending = Outcome.of(v.outcome or "")
    if err is not None and ending.is_oom and ending.is_parameter_result:
        # the baseline ran out of memory under the load: its failed requests are the server's
        # death, which the search learns from, not the API's answers
        rows.append(
            Row(
                f"workload API ({api})",
                f"answered until the server ran out of memory ({v.outcome}; error rate "
                f"{err:.3f}): the night starts below the baseline",
            )
        )
    elif err is None:
        rows.append(
            Row(
                f"workload API ({api})",
                "no request answered",
                False,
                "see the trial's server.log and trial.json",
            )
        )
    else:
        ok = err <= cfg.constraints.max_error_rate
        answer = f"; {v.evidence[0]}" if v.evidence and not ok else ""
        rows.append(
            Row(
                f"workload API ({api})",
                f"error rate {err:.3f} under the short load{answer}",
                ok,
                "" if ok else "see trial.json's workload summary for the failed requests",
            )
        )


def gpu_rows(
    rows: list[Row],
    before: Sequence[GpuMemory] | None,
    after_startup: Sequence[GpuMemory] | None,
    after_stop: Sequence[GpuMemory] | None,
    stop: Stop | None,
    devices: tuple[int, ...] | None,
) -> None:
    """GPU memory after startup and after the teardown, and whether the teardown gave it back."""
    rows.append(Row("GPU memory after startup", gpu_text(after_startup, devices)))
    if stop is None:
        return
    text = f"{gpu_text(after_stop, devices)}; released in {stop.seconds:.1f} s"
    if stop.clean:
        rows.append(Row("GPU memory after the teardown", text))
    else:
        rows.append(
            Row(
                "GPU memory after the teardown",
                f"{text}: {stop.reason}",
                False,
                "stop what still holds the GPUs or raise server.limits.release_s",
            )
        )


def disk_row(
    rows: list[Row],
    cfg: StudyConfig,
    folder: Path,
    log_bytes: int | None,
    at_ready: int | None,
    workload_phases: Mapping[str, float],
    disk_free: DiskFree,
) -> None:
    """The disk the night's logs need (the check's log scaled to the night's workload, times the
    trial budget, plus a reserve) against what is free under the results folder."""
    if log_bytes is None:
        rows.append(
            Row(
                "disk for the logs", "the check's log cannot be read", False, "see the trial folder"
            )
        )
        return
    per_trial = trial_log_bytes(log_bytes, at_ready, workload_phases, cfg.workload)
    need = per_trial * cfg.budget.n_trials + MIN_RESULTS_FREE_BYTES
    try:
        free = disk_free(folder)
    except OSError as exc:
        rows.append(Row("disk for the logs", f"unreadable: {exc}", False, "fix the results folder"))
        return
    value = (
        f"{free / 2**30:.2f} GiB free; {cfg.budget.n_trials} trials × "
        f"{per_trial / 2**20:.1f} MiB of log + {MIN_RESULTS_FREE_BYTES / 2**20:.0f} MiB = "
        f"{need / 2**30:.2f} GiB needed"
    )
    ok = free >= need
    rows.append(
        Row(
            "disk for the logs",
            value,
            ok,
            ""
            if ok
            else f"free {(need - free) / 2**30:.2f} GiB under {folder} or use "
            "another --results-dir",
        )
    )


def trial_log_bytes(
    log_bytes: int,
    at_ready: int | None,
    check_phases: Mapping[str, float],
    workload: WorkloadSpec,
) -> int:
    """One night trial's server log, estimated from the check's: its startup part as it was,
    its serving part scaled by the night's steady seconds over the check's (at least once)."""
    start = at_ready if at_ready is not None and at_ready <= log_bytes else 0
    serving = log_bytes - start
    night = sum(p.duration_s for p in workload.phases if isinstance(p, Steady | Poisson))
    checked = sum(check_phases.values()) or 1.0
    return int(start + serving * max(1.0, night / checked))
