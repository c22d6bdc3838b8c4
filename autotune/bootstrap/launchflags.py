"""The launch's flags made ready for a study: read off a log when no command is given, spelled
as SGLang's parser names them, and sorted into the memory settings and the flags kept.

The command (from `--from-cmd` or `--from-unit`) is authoritative for the program and the flags;
a log alone gives the flags its `server_args=` line shows (see `flagtable`). The memory settings
(`mem_fraction_static`, `max_running_requests`, the host cache) leave the flags for `[search]`
and `[baseline]`: from the command when it sets them, else from what the log's start used.
`host`, `port` and the API keys are never copied: autotune binds each trial itself, and a key
belongs in an environment variable (`workload.api_key_env`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from autotune.bootstrap.flagtable import FlagTable, SplitArgs, split_args
from autotune.bootstrap.fromlog import LogFacts
from autotune.bootstrap.sizing import Current
from autotune.bootstrap.sources import Launch
from autotune.config.schema import FlagValue, param_name
from autotune.config.space import flag_tokens
from autotune.errors import UsageError
from autotune.server import flagcheck
from autotune.server.flagcheck import FlagReport

DEFAULT_COMMAND = ("python", "-m", "sglang.launch_server")
FLAG_NAME = re.compile(r"^[a-z][a-z0-9]*([_-][a-z0-9]+)*$")
"""What `server.flags` accepts as a key (config.studyfile)."""
ADDRESS = ("host", "port")
SECRETS = ("api_key", "admin_api_key")
HICACHE_SWITCHES = ("enable_hierarchical_cache", "enable_hicache")

Inspect = Callable[[Sequence[str]], FlagReport]


def launch_from_log(facts: LogFacts, table: FlagTable) -> tuple[Launch, SplitArgs]:
    """The flags a log's `server_args=` line shows, and what else it showed."""
    split = split_args(facts.args, table)
    launch = Launch(
        command=DEFAULT_COMMAND,
        flags=split.flags,
        origin=f"{facts.path.name} (server_args)",
        notes=(
            f"the log does not name the program: {' '.join(DEFAULT_COMMAND)} is a guess; set "
            "server.command to the Python that has SGLang, or give --from-cmd/--from-unit with "
            "the log",
        ),
    )
    return launch, split


def canonical(launch: Launch, inspect: Inspect) -> tuple[Launch, list[str], list[str]]:
    """The flags spelled as SGLang's parser names them, when SGLang imports for the command's
    Python; (launch, comment lines, warnings)."""
    argv = list(launch.command)
    for name, value in launch.flags:
        argv += flag_tokens(name, value) if value is not False else [f"--{name}"]
    report = inspect(argv)
    notes: list[str] = []
    if not report.checked_by:
        python = flagcheck.study_python(argv)
        notes.append(
            f"SGLang does not import in {python}: flags kept as spelled"
            if python is not None
            else "SGLang runs in the container, whose parser autotune cannot ask here: flags "
            "kept as spelled"
        )
        return launch, notes, []
    renamed = {given[2:]: name[2:] for given, name in report.canonical.items()}
    flags = tuple((renamed.get(n, n), v) for n, v in launch.flags)
    note = f"flags checked by {report.checked_by}"
    if renamed:
        note += (
            "; spelled as it names them ("
            + ", ".join(f"--{a} → --{b}" for a, b in renamed.items())
            + ")"
        )
    notes.append(note)
    warnings = [f"SGLang's parser: {p}" for p in report.problems]
    return replace(launch, flags=flags), [*notes, *warnings], warnings


def _number(name: str, value: FlagValue, integer: bool) -> float | int:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or (integer and not float(value).is_integer()):  # type: ignore[arg-type]
        kind = "a whole number" if integer else "a number"
        raise UsageError(f"--{name.replace('_', '-')} {value!r}: expected {kind}")
    return int(value) if integer else float(value)  # type: ignore[arg-type]


@dataclass
class _Taken:
    """The memory settings read off the flags so far, the flags kept, and notes."""

    fraction: float | None = None
    mrr: int | None = None
    size: float | int | None = None
    on: bool = False
    kept: list[tuple[str, FlagValue]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _take_flag(taken: _Taken, name: str, value: FlagValue) -> None:
    """Sort one flag: a memory setting, a dropped address or secret, or a flag kept."""
    p = param_name(name)
    if p == "mem_fraction_static":
        taken.fraction = float(_number(p, value, integer=False))
    elif p == "max_running_requests":
        taken.mrr = int(_number(p, value, integer=True))
    elif p == "hicache_size":
        taken.size = _number(p, value, integer=False)
    elif p in HICACHE_SWITCHES and value is True:
        taken.on = True
        taken.kept.append((name, value))
    elif p in ADDRESS:
        taken.notes.append(
            f"the command sets --{name} {value}; autotune binds each trial's server to "
            f"server.host and a free port itself, and the export serves on server.export_{name}"
        )
    elif p in SECRETS:
        taken.notes.append(
            f"the command has --{name}: its value is not copied; keep the key in an "
            "environment variable and name it in workload.api_key_env"
        )
    elif p == "max_total_tokens":
        taken.kept.append((name, value))
        taken.notes.append(
            f"--{name} {value} caps the KV pool at {value} tokens whatever the fraction: the "
            "search cannot grow the pool past it; remove it from server.flags by hand to let "
            "the search size the pool"
        )
    elif not FLAG_NAME.match(name):
        taken.notes.append(f"--{name} cannot be a server.flags key; add it by hand")
    else:
        taken.kept.append((name, value))


def _take_flags(flags: Sequence[tuple[str, FlagValue]]) -> _Taken:
    """Sort every flag, keeping the first of a flag given twice."""
    taken = _Taken()
    seen: set[str] = set()
    for name, value in flags:
        p = param_name(name)
        if p in seen:
            taken.notes.append(f"--{name} is given twice (as {name}); the first is kept")
            continue
        seen.add(p)
        _take_flag(taken, name, value)
    return taken


def _fill_from_log(
    taken: _Taken, facts: LogFacts, fraction_from: str, mrr_from: str
) -> tuple[str, str]:
    """Fill the fraction and MRR the flags leave unset from the log; where each came from."""
    logged = facts.fraction
    if taken.fraction is None and logged is not None:
        taken.fraction, fraction_from = logged, "what SGLang chose at the log's start"
        if facts.shown_fraction is None:
            fraction_from = (
                "what the log's pool implies (1 − (A − pool)/P, the pool being its KV and "
                "state lines); its server_args line does not show the value"
            )
    if taken.mrr is None:
        logged_mrr = facts.args.get("max_running_requests")
        if isinstance(logged_mrr, int) and not isinstance(logged_mrr, bool) and logged_mrr > 0:
            taken.mrr, mrr_from = logged_mrr, "what SGLang chose at the log's start (server_args)"
        elif facts.ledger.max_running_requests:
            taken.mrr = facts.ledger.max_running_requests
            mrr_from = "what the log's start ran with (its summary line)"
    return fraction_from, mrr_from


def _settle_hicache(taken: _Taken) -> bool:
    """Whether the host cache is searched; drops its switch, or keeps a lone size, as a flag."""
    searched_host = taken.on and bool(taken.size)
    if searched_host:
        taken.kept = [(n, v) for n, v in taken.kept if param_name(n) not in HICACHE_SWITCHES]
    elif taken.size is not None:
        taken.kept.append(("hicache-size", taken.size))
    if taken.on and not taken.size:
        taken.notes.append(
            "the hierarchical cache is on and sized by --hicache-ratio: hicache_size is not "
            "searched (search it to size the cache in GB instead)"
        )
    return searched_host


def take_settings(
    launch: Launch, facts: LogFacts | None
) -> tuple[Current, tuple[tuple[str, FlagValue], ...], list[str]]:
    """The memory settings out of the flags: (current settings, the other flags, notes)."""
    from_log = launch.origin.endswith("(server_args)")

    def given(flag: str) -> str:
        return f"{flag} on the log's server_args line" if from_log else f"the command's --{flag}"

    taken = _take_flags(launch.flags)
    fraction_from = given("mem-fraction-static") if taken.fraction is not None else ""
    mrr_from = given("max-running-requests") if taken.mrr is not None else ""
    mrr_by_command = taken.mrr is not None and not from_log
    if facts is not None:
        fraction_from, mrr_from = _fill_from_log(taken, facts, fraction_from, mrr_from)
    if taken.fraction is None:
        fraction_from = ""
    hicache_from = given("hicache-size") if taken.size is not None else ""
    searched_host = _settle_hicache(taken)
    current = Current(
        fraction=taken.fraction,
        fraction_from=fraction_from,
        max_running_requests=taken.mrr,
        mrr_from=mrr_from,
        mrr_by_command=mrr_by_command,
        hicache_on=searched_host,
        hicache_size=taken.size if searched_host else None,
        hicache_from=hicache_from,
    )
    return current, tuple(taken.kept), taken.notes
