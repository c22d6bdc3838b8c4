"""A study file from the operator's command, unit and log: composed, written as commented TOML,
validated, then written.

The launch's flags come sorted from `launchflags`: the memory settings for `[search]` and
`[baseline]`, the other flags for `[server.flags]`. The log's ledger sizes the space (`sizing`),
its serving lines sketch the workload (`traffic`).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from autotune.bootstrap import tomltext as t
from autotune.bootstrap.flagtable import FlagTable, SplitArgs, flag_table
from autotune.bootstrap.fromlog import LogFacts, log_facts
from autotune.bootstrap.launchflags import (
    DEFAULT_COMMAND,
    Inspect,
    canonical,
    launch_from_log,
    take_settings,
)
from autotune.bootstrap.sizing import (
    Current,
    Failure,
    Knob,
    fraction_knob,
    hicache_knob,
    memory_notes,
    mrr_knob,
    pool_holds,
)
from autotune.bootstrap.sources import Launch, launch_from_command, launch_from_unit
from autotune.bootstrap.traffic import DECODE_LOG_INTERVAL, lengths, sketch
from autotune.config.schema import FlagValue, StudyConfig, param_name
from autotune.config.studyfile import check_study_name, load_study, nodes_refusal, read_study
from autotune.errors import AutotuneError, ConfigError, HarnessError, UsageError
from autotune.logparse.outcome import Outcome, reason_line
from autotune.memory.arithmetic import Arithmetic, arithmetic, free_after_capture_gib
from autotune.record.direction import Push, push_of
from autotune.record.seeds import read_seed
from autotune.server import flagcheck
from autotune.server.flagcheck import FlagReport

STEADY_S = 900.0

TableFor = Callable[[str, str | None], FlagTable]


def _inspect(argv: Sequence[str]) -> FlagReport:
    return flagcheck.inspect_argv(argv, backend="sglang")


@dataclass(frozen=True)
class Sources:
    """What `autotune init` was given: the study's name, the log, unit or command to read, and the
    steady-phase length and simulator profile to write."""

    name: str
    from_log: Path | None = None
    from_unit: Path | None = None
    from_cmd: str | None = None
    steady_s: float = STEADY_S
    sim_profile: str | None = None


@dataclass(frozen=True)
class Draft:
    """A composed study before validation: its TOML text, the warnings for the operator, a one-line
    summary, and the flags it carries."""

    text: str
    warnings: tuple[str, ...] = ()
    summary: str = ""
    flags: tuple[tuple[str, FlagValue], ...] = field(default_factory=tuple)


# ------------------------------------------------------------------------------------------------
# Composing the text
# ------------------------------------------------------------------------------------------------


def _limits(facts: LogFacts | None, steady_s: float) -> list[str]:
    startup = 1800
    why = "a big model's start from a cold disk can take longer: raise it then"
    if facts is not None and facts.startup_s and facts.startup_s > 60:
        startup = max(1800, math.ceil(3 * facts.startup_s / 60) * 60)
        why = f"3× the log's start ({facts.startup_s:.0f} s), at least 30 minutes"
    workload = max(3600, int(2 * steady_s + 900))
    return [
        "[server.limits]",
        *t.comment(f"startup_s: launch to ready; {why}"),
        f"startup_s = {startup}",
        "# stall_s: no new log line for this long during startup = hung",
        f"stall_s = {max(600, startup // 3)}",
        f"workload_s = {workload}",
        "# a big model's server takes a while to exit and give its memory back",
        "stop_grace_s = 60",
        "release_s = 300",
    ]


def _knob_lines(knobs: Sequence[Knob]) -> tuple[list[str], list[str]]:
    search: list[str] = ["[search]"]
    baseline: list[str] = ["[baseline]"]
    for knob in knobs:
        search += t.comments(knob.comments)
        search.append(f"{knob.name} = {knob.value}")
        if knob.baseline is not None:
            if knob.baseline_note:
                baseline += t.comment(knob.baseline_note)
            baseline.append(f"{knob.name} = {t.value(knob.baseline)}")
        else:
            baseline += t.comment(f"{knob.name}: no current value known; the sampler picks it")
    return search, baseline


def _workload(
    facts: LogFacts | None,
    current: Current,
    steady_s: float,
    most_slots: int = 0,
    holds: int | None = None,
) -> list[str]:
    ledger = facts.ledger if facts is not None else None
    traffic = sketch(
        facts.batches if facts is not None else (),
        peak_running=facts.serving.max_running if facts is not None else None,
        slots=current.max_running_requests,
        chunk=ledger.chunked_prefill_size if ledger is not None else None,
        context_len=ledger.context_len if ledger is not None else None,
        most_slots=most_slots,
        holds=holds,
        log_interval=facts.decode_log_interval if facts is not None else DECODE_LOG_INTERVAL,
    )
    where = (
        f"sketched from {facts.path.name}'s serving lines"
        if facts is not None and facts.batches
        else "a generic load (no serving lines to sketch it from)"
    )
    return [
        "[workload]",
        *t.comment(
            f"{where}: replace it with your own traffic where you know it better "
            "(docs/study-file.md, [workload])"
        ),
        *t.comments(traffic.comments),
        'api = "generate"',
        "stream = true",
        "ignore_eos = true",
        "seed = 1",
        f"input_len = {traffic.input_len.toml()}",
        f"output_len = {traffic.output_len.toml()}",
        "request_timeout_s = 1800",
        "drain_timeout_s = 600",
        "",
        "[[workload.phases]]",
        'kind = "warmup"',
        "requests = 4",
        "concurrency = 2",
        "",
        "[[workload.phases]]",
        'kind = "steady"',
        'name = "traffic"',
        f"concurrency = {traffic.concurrency}",
        f"duration_s = {steady_s:g}",
        "",
        "[[workload.phases]]",
        "# the transient peak: a full batch of full prefill chunks at once (docs/sglang-memory.md)",
        'kind = "stress"',
        "rounds = 3",
    ]


def _header(src: Sources, launch: Launch, facts: LogFacts | None) -> list[str]:
    used = [launch.origin]
    if facts is not None and facts.path.name not in launch.origin:
        used.append(f"{facts.path.name} (memory ledger, serving lines)")
    lines = t.comment(f"Written by `autotune init {src.name}` from {' and '.join(used)}.")
    lines += t.comment(
        "Each value says where it came from; check the workload above all, it is a sketch. "
        "The keys: docs/study-file.md; the memory arithmetic: docs/sglang-memory.md."
    )
    lines += [
        "#",
        f"#   autotune run --study {src.name}                 # on the box, with real SGLang",
        f"#   autotune run --study {src.name} --backend sim   # a rehearsal on the simulator",
    ]
    return lines


def _description(flags: Sequence[tuple[str, FlagValue]], origin: str) -> str:
    origin = origin.split(" (")[0]
    by = {param_name(n): v for n, v in flags}
    model = by.get("model_path") or by.get("model") or "the model"
    tp = by.get("tp_size") or by.get("tp") or by.get("tensor_parallel_size")
    where = f" TP{tp}" if tp else ""
    return f"{model}{where}: the most KV capacity that survives the load (from {origin})"


def _check_sources(src: Sources) -> None:
    """Refuse a study name or a choice of sources that cannot make a study."""
    check_study_name(src.name)
    if src.from_unit is not None and src.from_cmd is not None:
        raise UsageError("give --from-unit or --from-cmd, not both")
    if src.from_unit is None and src.from_cmd is None and src.from_log is None:
        raise UsageError(
            "name what to start from: --from-log LOG, --from-unit UNIT or --from-cmd CMD"
        )


def _launch_of(
    src: Sources, facts: LogFacts | None, inspect: Inspect, table_for: TableFor
) -> tuple[Launch, list[str], list[str], SplitArgs | None]:
    """The launch to study: (launch, flag notes, warnings, the log's split arguments)."""
    if src.from_unit is not None or src.from_cmd is not None:
        launch = (
            launch_from_unit(src.from_unit)
            if src.from_unit is not None
            else launch_from_command(src.from_cmd or "")
        )
        launch, flag_notes, warnings = canonical(launch, inspect)
        return launch, flag_notes, warnings, None
    assert facts is not None
    if not facts.args:
        raise UsageError(
            f"--from-log {src.from_log}: the log has no server_args line to read the flags "
            "from; add --from-cmd or --from-unit"
        )
    table = table_for(DEFAULT_COMMAND[0], facts.release)
    launch, split = launch_from_log(facts, table)
    return launch, [f"read from the log's server_args line with {table.source}"], [], split


def _per_request(facts: LogFacts | None) -> int:
    """The tokens one request holds at its end: the sketched workload's mean prompt + answer
    (`traffic.lengths`, the same lengths `[workload]` gets)."""
    ledger = facts.ledger if facts is not None else None
    inputs, outputs, _ = lengths(
        facts.batches if facts is not None else (),
        chunk=ledger.chunked_prefill_size if ledger is not None else None,
        context_len=ledger.context_len if ledger is not None else None,
        log_interval=facts.decode_log_interval if facts is not None else DECODE_LOG_INTERVAL,
    )
    return inputs.mean + outputs.mean


def _knobs_for(
    current: Current, facts: LogFacts | None
) -> tuple[list[Knob], Arithmetic | None, int | None]:
    """The searched knobs, the memory arithmetic the log's ledger gives, and the requests the
    baseline's pool holds at the sketched length (None without a pool to size it from)."""
    ledger = facts.ledger if facts is not None else None
    log_f = facts.fraction if facts is not None else None
    arith = arithmetic(ledger, log_f) if ledger is not None and log_f is not None else None
    f_knob = fraction_knob(current, ledger, log_f, _failure(facts))
    high = _high_of(f_knob)
    pool = _pool_at(arith, current.fraction)
    per_request = _per_request(facts) if pool else None
    knobs = [
        f_knob,
        mrr_knob(
            current,
            facts.serving.max_running if facts is not None else None,
            pool,
            per_request,
        ),
    ]
    host = hicache_knob(current, ledger, high, arith, _host_failure(facts))
    if host is not None:
        knobs.append(host)
    return knobs, arith, pool_holds(pool, per_request)


def operator_address(launch: Launch, facts: LogFacts | None) -> tuple[str | None, int | None]:
    """The `--host` and `--port` the operator's command gives, else its log's `server_args=`
    shows: what the exported command serves on."""
    given = dict(launch.flags)
    args = facts.args if facts is not None else {}
    host = given.get("host", args.get("host"))
    port = given.get("port", args.get("port"))
    number = int(port) if isinstance(port, str) and port.isdigit() else port
    ok_host = isinstance(host, str) and bool(host) and not any(c.isspace() for c in host)
    ok = isinstance(number, int) and not isinstance(number, bool) and 0 < number < 65536
    return (str(host) if ok_host else None, number if ok and isinstance(number, int) else None)


def _server_lines(
    src: Sources, launch: Launch, facts: LogFacts | None, notes_all: Sequence[str]
) -> list[str]:
    """The `[server]` table."""
    lines = ["", "[server]", 'backend = "sglang"']
    lines += t.comment(f"the program part of {launch.origin}")
    lines.append(f"command = {t.value(list(launch.command))}")
    lines += t.comments(n for n in notes_all if "program" in n)
    lines += [
        "# autotune binds each trial's server here, on a free port",
        'host = "127.0.0.1"',
        "port = 0",
    ]
    host, port = operator_address(launch, facts)
    if host is not None or port is not None:
        lines += t.comment(
            f"the address {launch.origin} serves on: the exported command keeps it (the trials "
            "bind their own)"
        )
        lines += [f"export_host = {t.string(host)}"] if host is not None else []
        lines += [f"export_port = {port}"] if port is not None else []
    lines += t.comment(
        "the simulator's profile for a rehearsal (--backend sim); docs/sim-profiles.md lists them"
    )
    lines.append(
        f"sim_profile = {t.string(src.sim_profile)}"
        if src.sim_profile
        else '# sim_profile = "kimi-k2.5-tp8-96g"'
    )
    if facts is not None and facts.release:
        lines += t.comment("the release the log's format shows, for the simulator to speak")
        lines.append(f"sim_version = {t.string(facts.release)}")
    return lines


def _flag_lines(
    launch: Launch,
    flags: Sequence[tuple[str, FlagValue]],
    flag_notes: Sequence[str],
    notes_all: Sequence[str],
    split: SplitArgs | None,
) -> list[str]:
    """The `[server.flags]` table, with what the log resolved or could not express."""
    lines = ["", "[server.flags]"]
    lines += t.comment(
        f"every flag of {launch.origin} except the searched ones ([search]) and the address"
    )
    lines += t.comments(flag_notes)
    lines += t.comments(n for n in notes_all if "program" not in n)
    for name, value in flags:
        lines.append(f"{t.key(name)} = {t.value(value)}")
    if split is not None and split.resolved:
        lines += t.comment(
            "resolved by SGLang itself at the log's start (defaults it worked out for that box "
            "and model), not pinned; uncomment one to pin it:"
        )
        lines += [f"# {line}" for line in split.resolved]
    if split is not None and split.unexpressible:
        lines += t.comment("in the log but not expressible as a flag here; add by hand if needed:")
        lines += [f"# {line}" for line in split.unexpressible]
    return lines


def _env_lines(launch: Launch) -> list[str]:
    """The `[server.env]` table, when the launch sets any environment."""
    if not (launch.env or launch.secret_env):
        return []
    lines = ["", "[server.env]", *t.comment(f"from {launch.origin}")]
    for k, v in launch.env:
        lines.append(f"{t.key(k)} = {t.string(v)}")
    for k in launch.secret_env:
        lines += t.comment(
            f"{k}: set there but not copied (a secret); export it before autotune run, "
            "the server inherits autotune's environment"
        )
    return lines


def _memory_lines(facts: LogFacts | None, arith: Arithmetic | None) -> list[str]:
    """Comments on the memory the log shows and how its start ended."""
    ledger = facts.ledger if facts is not None else None
    if ledger is None:
        return []
    lines: list[str] = []
    notes = memory_notes(ledger, arith)
    if notes:
        lines += t.comment(f"the memory {facts.path.name if facts else 'log'} shows:")
        lines += t.comments(notes)
    if facts is not None and facts.verdict.outcome not in (Outcome.READY, Outcome.STOPPED):
        lines += t.comment(
            f"the log's start ended as {facts.verdict.outcome}"
            + (f" ({facts.verdict.cause})" if facts.verdict.cause else "")
        )
    return lines


MIN_HEADROOM_GIB = 1.0
"""The `constraints.min_headroom_gib` every composed study starts with."""


def infeasible_baseline(facts: LogFacts | None, current: Current) -> list[str]:
    """What makes the baseline infeasible under the composed constraints before anything ran,
    from the log of its own start: each names the constraint and the value that would hold it."""
    if facts is None or facts.fraction is None or current.fraction != facts.fraction:
        return []
    out: list[str] = []
    ledger = facts.ledger
    free = free_after_capture_gib(ledger)
    served = facts.verdict.outcome in (Outcome.READY, Outcome.STOPPED)
    if free is not None and free < MIN_HEADROOM_GIB and served:
        holds = max(math.floor(free * 10) / 10, 0.0)
        out.append(
            f"the baseline is infeasible before anything runs: {facts.path.name} shows "
            f"{free:.2f} GiB free after startup, below constraints.min_headroom_gib = "
            f"{MIN_HEADROOM_GIB} (the load's peak comes on top); min_headroom_gib = {holds:g} "
            "would hold it, or keep it to look for a setting with more room"
        )
    if facts.verdict.outcome is Outcome.RUNTIME_OOM:
        out.append(
            f"the baseline is infeasible before anything runs: {facts.path.name} shows it out "
            "of GPU memory under load, and constraints.no_oom = true; no_oom = false would "
            "hold it, or keep it to look for a setting that survives the load"
        )
    return out


def _tail_lines(infeasible: Sequence[str]) -> list[str]:
    """The `[constraints]`, `[budget]` and `[sampler]` tables every composed study ends with,
    saying what already rules the baseline out."""
    lines = ["", "[constraints]", "no_oom = true", "max_error_rate = 0.01"]
    lines += t.comments(infeasible)
    lines += [
        "# keep this much GPU memory free at the worst moment of the load",
        f"min_headroom_gib = {MIN_HEADROOM_GIB}",
        *TAIL_LINES,
    ]
    return lines


TAIL_LINES = (
    "",
    "[budget]",
    "# every restart of a big model costs minutes: about a night",
    "n_trials = 20",
    "timeout_s = 36000",
    "",
    "[sampler]",
    "# capacity-aware: fits SGLang's memory arithmetic to the ledgers seen so far",
    "# (docs/search.md)",
    'name = "capacity"',
    "seed = 0",
    "",
)
"""The `[budget]` and `[sampler]` tables every composed study ends with."""


def compose(
    src: Sources,
    *,
    inspect: Inspect = _inspect,
    table_for: TableFor = flag_table,
) -> Draft:
    """The study text for `src` (not yet validated)."""
    _check_sources(src)
    facts = log_facts(src.from_log) if src.from_log is not None else None
    launch, flag_notes, warnings, split = _launch_of(src, facts, inspect, table_for)
    refusal = nodes_refusal(launch.flags, launch.command)
    if refusal is not None:
        raise UsageError(f"{launch.origin}: --nnodes {refusal}")
    current, flags, setting_notes = take_settings(launch, facts)
    notes_all = [*launch.notes, *setting_notes]
    warnings += [n for n in notes_all if "by hand" in n or "not copied" in n]
    knobs, arith, holds = _knobs_for(current, facts)
    search, baseline = _knob_lines(knobs)
    infeasible = infeasible_baseline(facts, current)
    warnings += infeasible

    lines = _header(src, launch, facts)
    lines.append(f"description = {t.string(_description(flags, launch.origin))}")
    lines += _server_lines(src, launch, facts, notes_all)
    lines += _flag_lines(launch, flags, flag_notes, notes_all, split)
    lines += _env_lines(launch)
    lines += ["", *_limits(facts, src.steady_s), ""]
    lines += _memory_lines(facts, arith)
    at = len(lines) + len(search)
    lines += [*search, "", *baseline, ""]
    slots = max((k.top for k in knobs if k.name == "max_running_requests" and k.top), default=0)
    lines += _workload(facts, current, src.steady_s, slots, holds)
    lines += _tail_lines(infeasible)
    if src.from_log is not None:
        lines[at:at] = _seed_lines(src.from_log, lines, at)
    summary = _summary(flags, knobs, launch)
    return Draft(
        text="\n".join(lines), warnings=tuple(dict.fromkeys(warnings)), summary=summary, flags=flags
    )


def _seed_lines(log: Path, lines: Sequence[str], at: int) -> list[str]:
    """`seed_logs` naming the log the study came from, so the memory model starts from its
    ledger (`record.seeds`); commented out, with why, when the log cannot seed it."""
    path = str(log.resolve())
    entry = f"seed_logs = [{t.string(path)}]"
    note = t.comment(
        f"the memory model starts from the log this study was written from (autotune init "
        f"--from-log {log}); the baseline is not launched again when that log ran it"
    )
    text = "\n".join([*lines[:at], entry, *lines[at:]])
    try:
        cfg = read_study(text, name="draft", path=Path.cwd() / "draft.toml")
    except AutotuneError:
        return [*note, entry]  # the draft's own fault: write_study says so
    try:
        read_seed(cfg.search.seed_logs[0], cfg)
    except ConfigError as exc:
        why = str(exc).split(": ", 2)[-1]
        return [*t.comment(f"not a seed of the memory model: {why}"), f"# {entry}"]
    return [*note, entry]


def _failure(facts: LogFacts | None) -> Failure | None:
    """The log's run failing for its fraction, and which way that pushes: the one reading of a
    failure's direction (`record.direction.push_of`), at startup or under load."""
    if facts is None or facts.fraction is None:
        return None
    v = facts.verdict
    push = push_of(str(v.outcome), reason_line(str(v.outcome), v.cause, v.evidence))
    under_load = v.outcome is Outcome.RUNTIME_OOM
    if push is Push.RAISE:
        return facts.fraction, "at_least" if under_load else "raise"
    if push is Push.LOWER:
        return facts.fraction, "at_most" if under_load else "lower"
    return None


def _host_failure(facts: LogFacts | None) -> str | None:
    """Which way the log's failed start pushes its host cache ("shrink", "grow" or None), read
    by the search's own rule (`record.direction.push_of`), as `_failure` reads the fraction."""
    if facts is None:
        return None
    v = facts.verdict
    push = push_of(str(v.outcome), reason_line(str(v.outcome), v.cause, v.evidence))
    return {Push.SHRINK_HOST: "shrink", Push.GROW_HOST: "grow"}.get(push)


def _pool_at(arith: Arithmetic | None, fraction: float | None) -> int | None:
    """The pool's tokens at `fraction`: the log's own count at its fraction, else predicted."""
    if arith is None or fraction is None:
        return None
    if fraction == arith.fraction and arith.tokens:
        return arith.tokens
    return arith.at(fraction).tokens


def _high_of(knob: Knob) -> float | None:
    m = re.search(r"high = ([0-9.]+)", knob.value)
    return float(m.group(1)) if m else None


def _summary(flags: Sequence[tuple[str, FlagValue]], knobs: Sequence[Knob], launch: Launch) -> str:
    parts = [f"{len(flags)} flags from {launch.origin}"]
    for k in knobs:
        parts.append(f"{k.name} {k.value.strip('{} ')}")
    return "; ".join(parts)


# ------------------------------------------------------------------------------------------------
# Validating and writing
# ------------------------------------------------------------------------------------------------


def default_out(name: str) -> Path:
    """Where `autotune init NAME` writes without `--out`: `configs/NAME.toml`, where `run --config`
    looks by convention."""
    return Path("configs") / f"{name}.toml"


def write_study(draft: Draft, out: Path, *, name: str, force: bool = False) -> StudyConfig:
    """Validate `draft` with `load_study` and write it to `out`; nothing is written when it does
    not validate (a bug: `HarnessError`) or `out` exists without `force` (`UsageError`)."""
    if out.exists() and not force:
        raise UsageError(f"{out} exists; pass --force to overwrite it, or --out PATH")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out {out}: cannot create its folder ({exc.strerror})") from None
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(draft.text, encoding="utf-8")
        try:
            cfg = load_study(tmp, name)
        except AutotuneError as exc:
            raise HarnessError(
                f"autotune init wrote a study that does not validate ({exc}); this is a bug, "
                "please report it with the command you ran"
            ) from None
        os.replace(tmp, out)
    except OSError as exc:
        raise UsageError(f"--out {out}: cannot write it ({exc.strerror})") from None
    finally:
        if tmp.exists():
            tmp.unlink()
    return cfg
