"""What a trial's ending means, decided once from what the seam reported (`trial.seam`):

* the parameters broke the server (OOM at startup or under load, a crash): a COMPLETE trial with
  violated constraints and the capacity it measured (0 if none), so samplers learn the edge;
* the harness or the machine failed (hang, phase timeout, a launch error), or the server was
  ended from outside (`killed`) or by its host (`machine_error`: a full disk, its port taken): a
  FAILED trial with its reason, the exit status and who sent the signal (`exit_code`,
  `exit_signal`, `sender`, from `autotune.server.deaths`);
* the operator pressed Ctrl-C (or sent SIGTERM, or the terminal hung up: `trial.signals`): the
  trial is recorded as interrupted, with the ledger it measured;
* the server lived through the workload but answered most requests with an error of its own
  (`refusal`): a FAILED trial `refused`, with the server's answers as evidence;
* autotune itself was paused (SIGSTOP, a suspend) through the trial: what it measured is not
  the server's, and the trial is `disturbed` (`autotune.trial.clockwatch`).

Kept apart from the control flow (`trial.run`): these are pure decisions over values (the plan,
`Startup`, `Load`, what the clock watch saw), tested without launching anything.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from autotune import __version__
from autotune.config.space import address_flags
from autotune.loadgen.metrics import Summary, refused
from autotune.logparse.accounting import build_ledger
from autotune.logparse.clamps import post_capture_asked
from autotune.logparse.lines import parse_lines
from autotune.logparse.outcome import Outcome, reason_line
from autotune.trial.clockwatch import MEASURED_PHASES, ClockWatch
from autotune.trial.plan import TrialPlan
from autotune.trial.seam import Load, Startup
from autotune.trial.trialfile import TrialRecord

BY_OPERATOR = "stopped by the operator"
"""The reason of a trial the operator interrupted."""
REFUSED_SHARE = 0.5
"""More than this share of a workload's requests refused by a server that stayed up and logged
no failure makes the trial `refused`: a server that fits its requests fails some under memory
pressure (and logs why: an OOM abort is a death), never most of them in silence."""


_INPUT_REFUSALS = frozenset({"HTTP 400", "server error", "aborted"})
"""How SGLang refuses a prompt longer than it accepts: a 400 (an error object in a stream) or
the scheduler's abort."""


def refusal(
    overall: Summary, *, pool_limits_input: bool = False
) -> tuple[str, tuple[str, ...]] | None:
    """The cause and evidence of a `refused` trial, from the whole workload's summary of a
    server that stayed up with a silent log (None when it is not one): more than
    `REFUSED_SHARE` of its requests failed with the server's own answer
    (`loadgen.metrics.refused`). The cause names the commonest kind (`http_500`,
    `server_error`, …); the evidence gives each refused kind's count and first answer.

    Where the KV pool caps the prompt (`pool_limits_input`: `ServerFacts.pool_limits_input`), a
    prompt refused as too long is the pool's size, a parameter result, so those kinds
    (`_INPUT_REFUSALS`) do not count."""
    kinds = {
        k: n
        for k, n in overall.errors.items()
        if refused(k) and not (pool_limits_input and k in _INPUT_REFUSALS)
    }
    if not overall.requests or sum(kinds.values()) <= REFUSED_SHARE * overall.requests:
        return None
    top = max(kinds, key=lambda k: kinds[k])
    return top.lower().replace(" ", "_"), request_errors(overall, kinds)


def request_errors(overall: Summary, kinds: Mapping[str, int] | None = None) -> tuple[str, ...]:
    """One line per kind of failed request (`kinds`, default every kind the summary counted):
    how many of the workload's requests and the first message of the kind, the evidence a
    trial's error rate stands on."""
    kinds = overall.errors if kinds is None else kinds
    return tuple(
        f"{n} of {overall.requests} requests failed: {overall.error_examples.get(k, k)}"
        for k, n in kinds.items()
    )


def disturbed(
    record: TrialRecord,
    watch: ClockWatch,
    limit_s: float,
    phases: tuple[str, ...] = MEASURED_PHASES,
) -> TrialRecord:
    """A trial during whose launch, startup or workload (`phases`) autotune was paused more than
    `limit_s` in all is a FAIL `disturbed`, whatever the server or the watchdogs said (a stall or
    a phase limit run out while autotune was stopped is not the server's): its point runs again,
    and its reason gives the pause and what was measured. An interrupted trial stays
    interrupted."""
    why = watch.disturbance(limit_s, phases)
    if not why or record.state == "interrupted":
        return record
    measured = record.reason or record.outcome  # a reason starts with its outcome
    if record.outcome == "ok":
        measured = f"ok, {record.throughput_tok_s:,.0f} tok/s"
    reason = f"{why}; the measurement is not the server's (it measured {measured})"
    return replace(record, state="fail", outcome=str(Outcome.DISTURBED), reason=reason)


def judge(
    plan: TrialPlan,
    startup: Startup | None,
    load: Load | None,
    interrupted: bool,
    harness_error: str,
    phases: dict[str, float],
) -> TrialRecord:
    """The record of a trial that was launched: interrupted, a harness error, or what the
    server's start (`startup`) and workload (`load`) showed, with the ledger and the figures
    measured; the teardown's facts are added by the caller."""
    base = blank_record(plan, "fail", "", "", phases=phases)
    if startup is not None:
        base = replace(
            base, ledger=_asked(plan, startup.ledger), sglang_version=startup.sglang_version
        )
    if interrupted:  # the trial keeps the ledger it measured: its pool was real
        ledger = (
            _asked(plan, startup.ledger) if startup is not None else _ledger_so_far(plan.log_path)
        )
        return replace(
            base,
            state="interrupted",
            outcome="interrupted",
            reason=BY_OPERATOR,
            ledger=ledger,
            capacity_tokens=_int(ledger.get("max_total_num_tokens")),
        )
    if harness_error:
        return replace(base, outcome="harness_error", reason=harness_error)
    assert startup is not None
    capacity = _int(startup.ledger.get("max_total_num_tokens"))
    if startup.outcome != "ready":
        state = "complete" if Outcome.of(startup.outcome).is_parameter_result else "fail"
        return replace(
            base,
            state=state,
            outcome=startup.outcome,
            reason=reason_line(startup.outcome, startup.cause, startup.evidence),
            capacity_tokens=capacity,
            evidence=startup.evidence,
        )
    assert load is not None
    headroom = load.min_free_gib
    if headroom is None:
        headroom = _float(startup.ledger.get("avail_after_graphs_gib"))
    # Only a server that lived through the workload survived it: autotune never stops one while
    # it serves, so a `stopped` here (a SIGTERM it did not send) is no survival.
    survived = load.outcome == "ready"
    return replace(
        base,
        state="complete" if survived or Outcome.of(load.outcome).is_parameter_result else "fail",
        outcome="ok" if survived else load.outcome,
        reason="" if survived else reason_line(load.outcome, load.cause, load.evidence),
        capacity_tokens=capacity,
        workload=dict(load.summary),
        throughput_tok_s=load.throughput_tok_s,
        headroom_gib=headroom,
        error_rate=load.error_rate,
        p99_ttft_ms=load.p99_ttft_ms,
        p99_itl_ms=load.p99_itl_ms,
        evidence=load.evidence,
        stress_peak_gib=load.stress_peak_gib,
        growth_gib=load.growth_gib,
    )


def blank_record(
    plan: TrialPlan, state: str, outcome: str, reason: str, *, phases: Mapping[str, float]
) -> TrialRecord:
    """A record of `plan` that measured nothing yet (a launch that failed, or the base that
    `judge` fills in)."""
    return TrialRecord(
        number=plan.number,
        state=state,
        outcome=outcome,
        reason=reason,
        params=dict(plan.params),
        argv=(*plan.argv, *address_flags(plan.host, plan.port)),
        ledger={},
        workload={},
        capacity_tokens=0,
        throughput_tok_s=0.0,
        headroom_gib=None,
        error_rate=None,
        p99_ttft_ms=None,
        p99_itl_ms=None,
        evidence=(),
        phases=dict(phases),
        log_path=str(plan.log_path),
        autotune_version=__version__,
        sglang_version=None,
        host=socket.gethostname(),
        backend=plan.backend,
    )


def _asked(plan: TrialPlan, ledger: Mapping[str, object]) -> dict[str, object]:
    """The ledger with what the trial asked that the log cannot show: post-capture KV sizing,
    which SGLang reads from the environment and never prints (`logparse.clamps`)."""
    if not ledger:
        return {}
    env = {**os.environ, **plan.env}  # the server inherits autotune's environment
    return {**ledger, "post_capture_requested": post_capture_asked(env)}


def _ledger_so_far(log_path: Path) -> dict[str, object]:
    """What the log of a start cut short showed of the ledger ({} when it cannot be read)."""
    try:
        with open(log_path, encoding="utf-8", errors="replace", newline="\n") as fh:
            return build_ledger(parse_lines(fh).events).to_dict()
    except OSError:
        return {}


def _int(v: object) -> int:
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0


def _float(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None
