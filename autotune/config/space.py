"""The search space, defined once: a trial ⇄ parameters ⇄ SGLang flags.

`settings_for(trial, search)` is the only place that asks a trial for values, so a live
`optuna.trial.Trial` (during the search) and an `optuna.trial.FixedTrial` (export, confirmation)
always give the same flags. Special meanings live here too: `hicache_size = 0` means the
hierarchical cache is off, any other value turns it on with that many GB per rank.
"""

from __future__ import annotations

import sys
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from autotune.config.studyfile import (
    HICACHE,
    Choices,
    Fixed,
    FlagValue,
    FloatRange,
    IntRange,
    Param,
    Scalar,
    SearchConfig,
    ServerConfig,
    flag_of,
)


@dataclass(frozen=True)
class Settings:
    """The values one trial runs with and the SGLang flags they become."""

    params: Mapping[str, Scalar]
    flags: tuple[str, ...]


def settings_for(trial: optuna.trial.BaseTrial, search: SearchConfig) -> Settings:
    """Ask `trial` for every searched parameter; fixed ones are taken as they are."""
    params: dict[str, Scalar] = {}
    for p in search.params:
        params[p.name] = _suggest(trial, p)
    return Settings(params=params, flags=tuned_flags(params, search))


def _suggest(trial: optuna.trial.BaseTrial, p: Param) -> Scalar:
    if isinstance(p, Fixed):
        return p.value
    if isinstance(p, Choices):
        choice = trial.suggest_categorical(p.name, list(p.values))
        assert choice is not None
        return choice
    if isinstance(p, IntRange):
        return trial.suggest_int(p.name, p.low, p.high, step=p.step, log=p.log)
    value = trial.suggest_float(p.name, p.low, p.high, step=p.step, log=p.log)
    return _snap(value, p.step)


def _snap(value: float, step: float | None) -> float:
    """Remove float noise (0.8800000000000001) so flags and records read like the study file.
    Without a step only the noise goes (15 significant digits): an enqueued point keeps every
    digit it was given (a baseline SGLang computed itself, 0.8260405859375)."""
    return float(f"{value:.15g}") if step is None else round(value, _decimals(step) + 2)


def _decimals(step: float) -> int:
    text = f"{step:.10f}".rstrip("0")
    return len(text.split(".")[1]) if "." in text else 0


def distributions(search: SearchConfig) -> dict[str, BaseDistribution]:
    """Optuna distributions of the searched (non-fixed) parameters."""
    out: dict[str, BaseDistribution] = {}
    for p in search.params:
        if isinstance(p, Choices):
            out[p.name] = CategoricalDistribution(list(p.values))
        elif isinstance(p, IntRange):
            out[p.name] = IntDistribution(p.low, p.high, log=p.log, step=p.step)
        elif isinstance(p, FloatRange):
            out[p.name] = FloatDistribution(p.low, p.high, log=p.log, step=p.step)
    return out


def grid(search: SearchConfig) -> list[dict[str, Scalar]] | None:
    """Every combination of the searched values, or None when a range has no step."""
    axes: list[tuple[str, list[Scalar]]] = []
    for p in search.params:
        if isinstance(p, Choices):
            axes.append((p.name, list(p.values)))
        elif isinstance(p, IntRange) and not p.log:
            axes.append((p.name, list(range(p.low, p.high + 1, p.step))))
        elif isinstance(p, FloatRange) and p.step is not None:
            n = round((p.high - p.low) / p.step)
            axes.append((p.name, [_snap(p.low + i * p.step, p.step) for i in range(n + 1)]))
        elif not isinstance(p, Fixed):
            return None
    points: list[dict[str, Scalar]] = [{}]
    for name, values in axes:
        points = [{**pt, name: v} for v in values for pt in points]
    return points


def tuned_flags(params: Mapping[str, Scalar], search: SearchConfig) -> tuple[str, ...]:
    """The SGLang flags for chosen parameter values, in the study file's order; a value set
    beyond the space (the prefill chunk an export lowers where no fraction that can start
    leaves the soak's margin) follows, and takes the place of a fixed flag of that name
    (`server_argv`)."""
    out: list[str] = []
    for p in search.params:
        value = params[p.name]
        if p.name == HICACHE:
            if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
                out += ["--enable-hierarchical-cache", "--hicache-size", render(value)]
            continue
        out += flag_tokens(p.name, value)
    searched = {p.name for p in search.params}
    for name, value in params.items():
        if name not in searched:
            out += flag_tokens(name, value)
    return tuple(out)


def flag_tokens(name: str, value: FlagValue) -> list[str]:
    """`--name value`; a boolean is a bare flag (true) or nothing (false); a list repeats values."""
    if value is True:
        return [flag_of(name)]
    if value is False:
        return []
    if isinstance(value, tuple):
        return [flag_of(name), *(render(v) for v in value)]
    return [flag_of(name), render(value)]


def render(value: Scalar) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.15g}" if not value.is_integer() else str(int(value))
    return str(value)


def base_command(server: ServerConfig, backend: str) -> tuple[str, ...]:
    """The program to launch: SGLang's from the study file, or the simulator with its profile."""
    if backend == "sim":
        scale = server.sim_time_scale
        return (
            sys.executable,
            "-m",
            "autotune.sim",
            "--sim-profile",
            server.sim_profile,
            "--sim-seed",
            str(server.sim_seed),
            *(("--sim-time-scale", render(scale)) if scale is not None else ()),
            *(("--sim-version", server.sim_version) if server.sim_version else ()),
        )
    return server.command


def fixed_flags(server: ServerConfig, tuned: Collection[str] = ()) -> tuple[str, ...]:
    """The study's fixed flags, less those a tuned value of the same name replaces."""
    out: list[str] = []
    for name, value in server.flags:
        if name not in tuned:
            out += flag_tokens(name, value)
    return tuple(out)


def server_argv(
    server: ServerConfig,
    settings: Settings,
    *,
    backend: str,
    extra: Sequence[str] = (),
) -> list[str]:
    """The launch command: base command, fixed flags, tuned flags (host and port come apart,
    from `address_flags`, because the harness chooses the port per trial)."""
    fixed = fixed_flags(server, tuned=settings.params.keys())
    return [*base_command(server, backend), *fixed, *settings.flags, *extra]


def address_flags(host: str, port: int) -> list[str]:
    return ["--host", host, "--port", str(port)]


def params_from_flags(argv: Sequence[str], search: SearchConfig) -> dict[str, Scalar]:
    """Read searched parameters back out of a command line (the inverse of `tuned_flags`)."""
    out: dict[str, Scalar] = {}
    for p in search.params:
        if p.name == HICACHE:
            on = "--enable-hierarchical-cache" in argv or "--enable-hicache" in argv
            size = _value_after(argv, flag_of(p.name))
            out[p.name] = _typed(p, size) if on and size is not None else 0
            continue
        flag = flag_of(p.name)
        if flag not in argv:
            if _bool_param(p):
                out[p.name] = False
            continue
        raw = _value_after(argv, flag)
        out[p.name] = True if raw is None and _bool_param(p) else _typed(p, raw or "")
    return out


def _bool_param(p: Param) -> bool:
    values = p.values if isinstance(p, Choices) else (p.value,) if isinstance(p, Fixed) else ()
    return any(isinstance(v, bool) for v in values)


def _value_after(argv: Sequence[str], flag: str) -> str | None:
    i = list(argv).index(flag) if flag in argv else -1
    if i < 0 or i + 1 >= len(argv) or argv[i + 1].startswith("--"):
        return None
    return argv[i + 1]


def _typed(p: Param, raw: str) -> Scalar:
    if isinstance(p, IntRange):
        return int(raw)
    if isinstance(p, FloatRange):
        return float(raw)
    candidates = p.values if isinstance(p, Choices) else (p.value,)
    for c in candidates:
        if render(c) == raw:
            return c
    return raw


_TP = ("tp", "tp_size", "tensor_parallel_size")


_PP = ("pp", "pp_size", "pipeline_parallel_size")


def gpus_needed(flags: Sequence[tuple[str, object]]) -> int:
    """GPUs one server takes: tensor × pipeline parallel size from its fixed flags."""
    given = {name: value for name, value in flags}

    def size(names: tuple[str, ...]) -> int:
        for n in names:
            v = given.get(n)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
        return 1

    return size(_TP) * size(_PP)
