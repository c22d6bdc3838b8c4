"""The study file (`configs/NAME.toml`): strict loading into a frozen `StudyConfig`
(`autotune.config.schema`).

Validation happens once, here, at the edge: every unknown key, wrong type or out-of-range value
raises `ConfigError` naming the dotted key and the fix, so the rest of autotune works on values
that are known to be sane. The `[workload]` table belongs to the workload driver and is validated
by `autotune.loadgen.workload_from_dict`.

A flag key may be spelled with `_` or `-` (`mem_fraction_static`, `mem-fraction-static`); both
name the same flag (`schema.param_name`), and a study that gives one flag twice is refused.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from autotune.config.command import starts_one_process
from autotune.config.schema import (
    BACKENDS,
    HICACHE,
    OBJECTIVES,
    SAMPLERS,
    Backend,
    Budget,
    Choices,
    Constraints,
    Fixed,
    FlagValue,
    FloatRange,
    Heartbeat,
    IntRange,
    Limits,
    Param,
    SamplerConfig,
    Scalar,
    SearchConfig,
    ServerConfig,
    StudyConfig,
    flag_of,
    param_name,
)
from autotune.config.table import Table
from autotune.config.workload import WorkloadSpec, workload_from_dict
from autotune.errors import ConfigError, UsageError
from autotune.sim.profiles import ProfileError, load_profile
from autotune.sim.versions import VERSIONS as SIM_VERSIONS

SHIPPED_STUDIES = Path(__file__).resolve().parents[1] / "studies"
"""The example studies that ship inside the package (`autotune/studies/NAME.toml`); a study of
the same name in the working folder's `configs/` is found first."""

DEFAULT_SIM_PROFILE = "kimi-k2.5-tp8-96g"
_FLAG_NAME = re.compile(r"^[a-z][a-z0-9]*([_-][a-z0-9]+)*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def is_env_name(name: str) -> bool:
    """An environment variable name: ASCII letters, digits and `_`, not starting with a digit
    (what POSIX shells and systemd's `Environment=` accept)."""
    return _ENV_NAME.fullmatch(name) is not None


# ------------------------------------------------------------------------------------------------
# Loading
# ------------------------------------------------------------------------------------------------


def check_study_name(study: str) -> str:
    """A study name doubles as a folder name: letters, digits, '-', '_' and inner dots only."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", study) or ".." in study:
        file = "/" in study or study.endswith(".toml")
        raise UsageError(
            f"--study {study!r}: use letters, digits, '-', '_' and '.' only"
            + ("; for a study file, pass --config PATH" if file else "")
        )
    return study


def find_study_file(study: str, search_dirs: Sequence[Path]) -> Path:
    """`configs/STUDY.toml` in the first of `search_dirs` that has it."""
    check_study_name(study)
    for directory in search_dirs:
        candidate = directory / f"{study}.toml"
        if candidate.is_file():
            return candidate
    where = ", ".join(str(d) for d in search_dirs)
    raise UsageError(f"--study {study}: no {study}.toml in {where}; pass --config PATH")


def load_study(path: Path, name: str | None = None) -> StudyConfig:
    """Read and validate a study file; `name` defaults to the file's stem."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read study file {path}: {exc.strerror}") from exc
    return read_study(text, name=check_study_name(name or path.stem), path=path)


def read_study(text: str, *, name: str, path: Path) -> StudyConfig:
    """A study file's text (at `path`, for its messages and relative paths), parsed and
    validated; text that is not TOML is a UsageError too."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: not valid TOML ({exc}); fix the syntax") from exc
    return parse_study(raw, name=name, path=path)


def parse_study(raw: Mapping[str, object], *, name: str, path: Path) -> StudyConfig:
    """Validate an already parsed study file."""
    _refuse_control(raw, "")
    top = Table(raw, "")
    top.only(
        "description",
        "server",
        "search",
        "baseline",
        "workload",
        "objectives",
        "constraints",
        "budget",
        "sampler",
        "storage",
    )
    description = top.string("description", default="")
    server = _server(top.table("server", required=True))
    search = _search(top.table("search", required=True), top.table("baseline"), server, path.parent)
    workload = _workload(raw.get("workload"), path.parent)
    objectives = _objectives(top.table("objectives"))
    constraints = _constraints(top.table("constraints"))
    budget = _budget(top.table("budget"))
    sampler = _sampler(top.table("sampler"))
    storage_table = top.table("storage")
    storage_table.only("url", "heartbeat_s", "grace_s")
    storage = storage_table.string("url", default="") or None
    heartbeat = _heartbeat(storage_table)
    return StudyConfig(
        name=name,
        path=path,
        description=description,
        server=server,
        search=search,
        workload=workload,
        objectives=objectives,
        constraints=constraints,
        budget=budget,
        sampler=sampler,
        storage=storage,
        heartbeat=heartbeat,
    )


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _refuse_control(data: object, dotted: str) -> None:
    """No string in the study file holds a NUL byte, and no key a control character.

    A command line and an environment are C strings (execve(2)), so a NUL in a value cannot reach
    the server, nor any export: refused here, at load, naming the key, instead of failing when a
    trial launches. Other control characters in values are carried: the launch passes them as
    they are, and each export format escapes them or refuses them itself
    (`autotune.review.exportformats`). A key holds none (TOML allows them in quoted keys): a flag or
    variable name with a newline would otherwise end the flag or the line it is written on."""
    if isinstance(data, str):
        if "\x00" in data:
            raise ConfigError(
                dotted, "holds a NUL byte (\\u0000), which no command line, environment or "
                "export can carry; remove it"
            )  # fmt: skip
    elif isinstance(data, dict):
        for key, value in data.items():
            here = f"{dotted}.{key}" if dotted else str(key)
            if _CONTROL.search(str(key)):
                shown = _CONTROL.sub(lambda m: ascii(m.group())[1:-1], here)
                raise ConfigError(shown, "the key holds a control character; remove it")
            _refuse_control(value, here)
    elif isinstance(data, list):
        for i, value in enumerate(data):
            _refuse_control(value, f"{dotted}[{i}]")


# ------------------------------------------------------------------------------------------------
# Sections
# ------------------------------------------------------------------------------------------------


def _server(t: Table) -> ServerConfig:
    t.only(
        "backend",
        "command",
        "flags",
        "env",
        "host",
        "port",
        "sim_profile",
        "sim_time_scale",
        "sim_seed",
        "sim_version",
        "limits",
        "export_host",
        "export_port",
    )
    backend: Backend = (
        "sim" if t.choice("backend", BACKENDS, default="sglang") == "sim" else "sglang"
    )
    command = tuple(t.string_list("command", default=["python", "-m", "sglang.launch_server"]))
    if not command or not all(command):
        raise ConfigError(t.key("command"), "must be a non-empty list of non-empty strings")
    flags = _fixed_flags(t.table("flags"))
    env_table = t.table("env")
    env: dict[str, str] = {}
    for key in env_table.keys():  # noqa: SIM118
        if not is_env_name(key):
            raise ConfigError(env_table.key(key), "is not a valid environment variable name")
        env[key] = env_table.string(key, required=True)
    host = _host_name(t, "host", "127.0.0.1")
    port = t.integer("port", default=0, low=0, high=65535)
    export_host = _host_name(t, "export_host", "0.0.0.0") if "export_host" in t else None
    export_port = t.integer("export_port", low=1, high=65535) if "export_port" in t else None
    for reserved in ("host", "port", "api_key"):
        if any(name == reserved for name, _ in flags):
            raise ConfigError(
                t.key(f"flags.{reserved}"),
                "is set by autotune; use "
                + ("workload.api_key_env" if reserved == "api_key" else f"server.{reserved}"),
            )
    refusal = nodes_refusal(flags, command)
    if refusal is not None:
        raise ConfigError(t.key("flags.nnodes"), refusal)
    lt = t.table("limits")
    lt.only(
        "startup_s", "stall_s", "workload_s", "stop_grace_s", "release_s", "foreign_wait_s",
        "pause_s",
    )  # fmt: skip
    d = Limits()
    limits = Limits(
        startup_s=lt.positive("startup_s", default=d.startup_s),
        stall_s=lt.positive("stall_s", default=d.stall_s),
        workload_s=lt.positive("workload_s", default=d.workload_s),
        stop_grace_s=lt.positive("stop_grace_s", default=d.stop_grace_s),
        release_s=lt.positive("release_s", default=d.release_s),
        foreign_wait_s=_non_negative(lt, "foreign_wait_s", default=d.foreign_wait_s),
        pause_s=lt.positive("pause_s", default=d.pause_s),
    )
    return ServerConfig(
        backend=backend,
        command=command,
        flags=flags,
        env=env,
        host=host,
        port=port,
        sim_profile=_sim_profile(t),
        sim_time_scale=t.positive("sim_time_scale") if "sim_time_scale" in t else None,
        sim_seed=t.integer("sim_seed", default=0, low=0),
        sim_version=_sim_version(t),
        limits=limits,
        export_host=export_host,
        export_port=export_port,
    )


def _host_name(t: Table, key: str, example: str) -> str:
    """`key`'s host name (`example` when absent): not empty, no whitespace."""
    host = t.string(key, default=example)
    if not host or any(c.isspace() for c in host):
        raise ConfigError(t.key(key), f"{host!r} is not a host name; use e.g. {example}")
    return host


def node_count(flags: Iterable[tuple[str, FlagValue]]) -> int:
    """The nodes a server of these flags spans (`--nnodes`, as SGLang reads its value): 1 where
    the flag is absent or not a positive whole number."""
    nodes = {param_name(name): value for name, value in flags}.get("nnodes")
    if nodes is None or isinstance(nodes, bool):
        return 1
    try:
        return max(1, int(str(nodes)))
    except ValueError:
        return 1


def nodes_refusal(flags: Iterable[tuple[str, FlagValue]], command: Sequence[str]) -> str | None:
    """Why a server of these flags and this program cannot be a study, else None: where it spans
    several nodes (`--nnodes`) and the program is SGLang's own entry point, which starts one
    process on this box. Each trial needs a launch on every node; the first would wait for the
    others until the startup stall limit, which a trial would store as the parameters' hang. A
    launcher that starts every node (`srun`, a script) is the operator's to give."""
    count = node_count(flags)
    if count <= 1 or not starts_one_process(command):
        return None
    return (
        f"{count}: server.command starts one server process on this box, and a server across "
        f"{count} nodes needs a launch on every node for each trial; tune a one-node server "
        "(without nnodes, node_rank and dist_init_addr), or give a command that launches every "
        "node (srun, a script)"
    )


def _sim_version(t: Table) -> str | None:
    if "sim_version" not in t:
        return None
    version = t.string("sim_version")
    if version not in SIM_VERSIONS:
        raise ConfigError(
            t.key("sim_version"), f"{version!r}: use one of {', '.join(SIM_VERSIONS)}"
        )
    return version


def _non_negative(t: Table, k: str, *, default: float) -> float:
    v = t.number(k, default=default)
    if v < 0:
        raise ConfigError(t.key(k), f"must be ≥ 0 (0 refuses a launch at once); got {v}")
    return float(v)


def _sim_profile(t: Table) -> str:
    """The simulator profile, checked now so that a rehearsal does not fail at every launch."""
    name = t.string("sim_profile", default=DEFAULT_SIM_PROFILE)
    try:
        load_profile(name)
    except ProfileError as exc:
        raise ConfigError(t.key("sim_profile"), str(exc)) from None
    return name


def _fixed_flags(t: Table) -> tuple[tuple[str, FlagValue], ...]:
    out: list[tuple[str, FlagValue]] = []
    seen: dict[str, str] = {}
    for key in t.keys():  # noqa: SIM118
        name = _checked_name(t, key, seen)
        value = t.raw(key)
        if isinstance(value, list):
            if not all(isinstance(v, bool | int | float | str) for v in value):
                raise ConfigError(t.key(key), "a list flag holds only strings or numbers")
            out.append((name, tuple(_finite(t.key(key), v) for v in value)))
        elif isinstance(value, bool | int | float | str):
            out.append((name, _finite(t.key(key), value)))
        else:
            raise ConfigError(
                t.key(key), "must be a string, number, boolean (a bare flag) or list of those"
            )
    return tuple(out)


SEED_LOGS = "seed_logs"
"""The one key of `[search]` that is not a flag: logs that seed the memory model."""


def _search(t: Table, bt: Table, server: ServerConfig, base_dir: Path) -> SearchConfig:
    params: list[Param] = []
    seen: dict[str, str] = {}
    seeds = _seed_logs(t, base_dir)
    for key in t.keys():  # noqa: SIM118
        if key == SEED_LOGS:
            continue
        name = _checked_name(t, key, seen)
        params.append(_param(t, key, name))
    if not any(not isinstance(p, Fixed) for p in params):
        raise ConfigError(t.key("") or "search", "needs at least one parameter to search")
    fixed_names = {name for name, _ in server.flags}
    for p in params:
        if p.name in fixed_names:
            raise ConfigError(
                f"server.flags.{p.name}",
                f"is also in search.{p.name}; keep it in one place",
            )
    if any(p.name == HICACHE for p in params):
        for owned in ("enable_hierarchical_cache", "enable_hicache"):
            if owned in fixed_names:
                raise ConfigError(
                    f"server.flags.{owned}",
                    "is set from search.hicache_size (0 = off); remove it from server.flags",
                )
    by_name = {p.name: p for p in params}
    baseline: dict[str, Scalar] = {}
    for key in bt.keys():  # noqa: SIM118
        name = param_name(key)
        if name not in by_name:
            raise ConfigError(
                bt.key(key), f"is not a search parameter; known: {', '.join(by_name)}"
            )
        value = bt.raw(key)
        if not isinstance(value, bool | int | float | str):
            raise ConfigError(bt.key(key), "must be a single value")
        baseline[name] = _in_space(bt.key(key), by_name[name], value)
    return SearchConfig(params=tuple(params), baseline=baseline, seed_logs=seeds)


def _seed_logs(t: Table, base_dir: Path) -> tuple[Path, ...]:
    """Each path relative to the study file's folder, an existing readable file, listed once.
    What the log says (a ledger, the same model and flags) is checked when a run starts
    (`autotune.record.seeds`), by the log parser this layer sits below."""
    dotted = t.key(SEED_LOGS)
    given = t.string_list(SEED_LOGS, default=[])
    out: list[Path] = []
    for raw in given:
        if not raw.strip():
            raise ConfigError(dotted, "holds an empty path; give the path of an SGLang server log")
        path = Path(raw).expanduser()
        path = path if path.is_absolute() else base_dir / path
        if not path.is_file():
            raise ConfigError(
                dotted,
                f"{raw}: no such file (paths are relative to the study file's folder); "
                "give the path of an SGLang server log, or remove it",
            )
        try:
            with open(path, "rb") as fh:
                fh.read(1)
        except OSError as exc:
            raise ConfigError(
                dotted, f"{raw}: cannot read it ({exc.strerror}); fix its permissions or remove it"
            ) from None
        if path.resolve() in {p.resolve() for p in out}:
            raise ConfigError(dotted, f"{raw}: listed twice; keep it once")
        out.append(path)
    return tuple(out)


def _param(t: Table, key: str, name: str) -> Param:
    dotted = t.key(key)
    value = t.raw(key)
    if isinstance(value, bool | int | float | str):
        fixed = Fixed(name, _finite(dotted, value))
        _check_known(dotted, name, [fixed.value])
        return fixed
    if not isinstance(value, dict):
        raise ConfigError(dotted, "must be a value, {low, high[, step, log]} or {choices = [...]}")
    pt = Table(value, dotted)
    if "choices" in value:
        pt.only("choices")
        choices = pt.raw("choices")
        if not isinstance(choices, list) or not choices:
            raise ConfigError(pt.key("choices"), "must be a non-empty list")
        if not all(isinstance(c, bool | int | float | str) for c in choices):
            raise ConfigError(pt.key("choices"), "holds only strings, numbers or booleans")
        values = tuple(_finite(pt.key("choices"), c) for c in choices)
        if len(set(values)) != len(values):
            raise ConfigError(pt.key("choices"), "has duplicate values; list each once")
        _check_known(dotted, name, values)
        return Choices(name, values)
    pt.only("low", "high", "step", "log")
    low, high = pt.number("low", required=True), pt.number("high", required=True)
    step = pt.number("step") if "step" in value else None
    log = pt.boolean("log", default=False)
    if not low < high:
        raise ConfigError(f"{dotted}.high", f"must be greater than low ({low}); got {high}")
    if step is not None and step <= 0:
        raise ConfigError(f"{dotted}.step", f"must be > 0; got {step}")
    if log and low <= 0:
        raise ConfigError(f"{dotted}.low", "must be > 0 with log = true")
    if log and step is not None:
        raise ConfigError(f"{dotted}.log", "cannot be combined with step; drop one")
    if step is not None and not _on_grid(high - low, step):
        raise ConfigError(f"{dotted}.step", f"({step}) must divide high - low ({high - low:g})")
    integral = name in _INTEGER_PARAMS or all(
        isinstance(v, int) for v in (low, high, step if step is not None else 1)
    )
    if name in _FLOAT_PARAMS:
        integral = False
    param = (
        IntRange(name, int(low), int(high), int(step or 1), log)
        if integral
        else FloatRange(name, float(low), float(high), step, log)
    )
    if integral and not all(float(v).is_integer() for v in (low, high, step or 1)):
        raise ConfigError(dotted, f"{flag_of(name)} takes whole numbers; use integer low/high/step")
    _check_known(dotted, name, [low, high])
    return param


_INTEGER_PARAMS = {"max_running_requests", "chunked_prefill_size", "max_prefill_tokens"}
_FLOAT_PARAMS = {"mem_fraction_static", "hicache_ratio", "schedule_conservativeness"}


def _check_known(dotted: str, name: str, values: Sequence[Scalar]) -> None:
    """Range checks for the parameters whose meaning autotune knows."""
    for v in values:
        if name == "mem_fraction_static":
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < 1:
                raise ConfigError(dotted, f"is a fraction of free GPU memory in (0, 1); got {v!r}")
        elif name in ("max_running_requests", "chunked_prefill_size", "max_prefill_tokens"):
            ok = isinstance(v, int) and not isinstance(v, bool) and v >= 1
            if name == "chunked_prefill_size" and v == -1:
                ok = True
            if not ok:
                raise ConfigError(dotted, f"is a whole number ≥ 1; got {v!r}")
        elif name == HICACHE and (isinstance(v, bool) or not isinstance(v, int | float) or v < 0):
            raise ConfigError(dotted, f"is host GB per rank, ≥ 0 (0 = off); got {v!r}")


def _in_space(dotted: str, p: Param, value: Scalar) -> Scalar:
    ok: bool
    if isinstance(p, Fixed):
        ok = value == p.value
    elif isinstance(p, Choices):
        ok = value in p.values
    elif isinstance(value, bool) or not isinstance(value, int | float):
        ok = False
    elif isinstance(p, IntRange):
        ok = (
            float(value).is_integer()
            and p.low <= value <= p.high
            and (int(value) - p.low) % p.step == 0
        )
        value = int(value)
    else:
        ok = p.low <= value <= p.high and (p.step is None or _on_grid(value - p.low, p.step))
        value = float(value)
    if not ok:
        raise ConfigError(
            dotted, f"{value!r} is outside search.{p.name}; widen the space or fix it"
        )
    return value


def _on_grid(span: float, step: float) -> bool:
    k = span / step
    return abs(k - round(k)) < 1e-6


def _workload(raw: object, base_dir: Path) -> WorkloadSpec:
    if raw is None:
        raise ConfigError("workload", "is missing; add a [workload] table with [[workload.phases]]")
    if not isinstance(raw, dict):
        raise ConfigError("workload", "must be a table")
    return workload_from_dict(raw, "workload", base_dir=base_dir)


def _objectives(t: Table) -> tuple[str, ...]:
    t.only("maximize")
    names = t.string_list("maximize", default=list(OBJECTIVES))
    if not names:
        raise ConfigError(t.key("maximize"), f"needs at least one of {', '.join(OBJECTIVES)}")
    for n in names:
        if n not in OBJECTIVES:
            raise ConfigError(t.key("maximize"), f"{n!r} is unknown; use {', '.join(OBJECTIVES)}")
    if len(set(names)) != len(names):
        raise ConfigError(t.key("maximize"), "lists an objective twice")
    return tuple(names)


def _constraints(t: Table) -> Constraints:
    t.only("no_oom", "max_error_rate", "min_headroom_gib", "max_p99_ttft_ms", "max_p99_itl_ms")
    d = Constraints()
    rate = t.number("max_error_rate", default=d.max_error_rate)
    if not 0 <= rate < 1:
        raise ConfigError(t.key("max_error_rate"), f"is a fraction in [0, 1); got {rate}")
    headroom = t.number("min_headroom_gib", default=d.min_headroom_gib)
    if headroom < 0:
        raise ConfigError(t.key("min_headroom_gib"), f"must be ≥ 0 GiB; got {headroom}")
    return Constraints(
        no_oom=t.boolean("no_oom", default=True),
        max_error_rate=float(rate),
        min_headroom_gib=float(headroom),
        max_p99_ttft_ms=t.positive("max_p99_ttft_ms") if "max_p99_ttft_ms" in t else None,
        max_p99_itl_ms=t.positive("max_p99_itl_ms") if "max_p99_itl_ms" in t else None,
    )


def _budget(t: Table) -> Budget:
    t.only("n_trials", "timeout_s")
    return Budget(
        n_trials=t.integer("n_trials", default=Budget.n_trials, low=1),
        timeout_s=t.positive("timeout_s") if "timeout_s" in t else None,
    )


def _heartbeat(t: Table) -> Heartbeat:
    d = Heartbeat()
    interval = t.integer("heartbeat_s", default=d.interval_s, low=1)
    grace = t.integer("grace_s", default=max(d.grace_s, 2 * interval), low=1)
    if grace < 2 * interval:
        raise ConfigError(
            t.key("grace_s"),
            f"must be at least twice storage.heartbeat_s ({2 * interval}); got {grace}",
        )
    return Heartbeat(interval_s=interval, grace_s=grace)


def _sampler(t: Table) -> SamplerConfig:
    t.only("name", "seed")
    return SamplerConfig(
        name=t.choice("name", SAMPLERS, default="capacity"),
        seed=t.integer("seed", default=0, low=0),
    )


def _checked_name(t: Table, key: str, seen: dict[str, str]) -> str:
    if not _FLAG_NAME.match(key):
        raise ConfigError(t.key(key), "is not an SGLang flag name (e.g. mem_fraction_static)")
    name = param_name(key)
    if name in seen:
        raise ConfigError(t.key(key), f"is the same flag as {t.key(seen[name])}; keep one")
    seen[name] = key
    return name


def _finite(dotted: str, v: Scalar) -> Scalar:
    if isinstance(v, float) and not math.isfinite(v):
        raise ConfigError(dotted, f"must be a finite number; got {v}")
    return v
