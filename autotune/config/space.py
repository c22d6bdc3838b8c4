"""The search space, defined once: a trial ⇄ parameters ⇄ SGLang flags, and a point's identity.

`settings_for(trial, search)` is the only place that asks a trial for values, so a live
`optuna.trial.Trial` (during the search) and an `optuna.trial.FixedTrial` (export, confirmation)
always give the same flags; `settings_of(params, search)` is the one constructor of `Settings`
(the export, the confirmation soak and the host check build theirs with it). Special meanings
live here too: `hicache_size = 0` means the hierarchical cache is off, any other value turns it
on with that many GB per rank.

A point (one assignment of parameter values) has one identity, `point_key`: each value in its
canonical form (`canonical`: a float snapped to its parameter's step in the space, `snap`; without
a step only its float noise goes), a bool kept apart from the number Python makes it equal to.
The search (what is taken, what is running, what to retry), the workers (a point queued twice, a
twin of a running trial), the rebuild (a point still owed), the loop (the baseline's trial) and
the review (the trial that ran the exported point, the soak of it) all compare, deduplicate and
queue points by it. The step comes from the space: the study file's (`SearchConfig`) or the
distributions Optuna holds (what a sampler sees, and what a study stores with its trials);
`fraction_step` is the one lattice `mem_fraction_static` is walked and backed off on.
"""

from __future__ import annotations

import sys
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeAlias

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from autotune.config.schema import (
    FRACTION,
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
    return settings_of(params, search)


def settings_of(params: Mapping[str, Scalar], search: SearchConfig) -> Settings:
    """The one constructor of `Settings`: `params` in their canonical form (`canonical`) and the
    flags they become (`tuned_flags`)."""
    point = canonical(params, search)
    return Settings(params=point, flags=tuned_flags(point, search))


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
    return snap(value, p.step)


# ---------------------------------------------------------------------------------------------
# A point's identity


Space: TypeAlias = SearchConfig | Mapping[str, BaseDistribution]
"""A search space: the study file's, or Optuna's distributions of it (what a sampler is given,
what a study stores with each trial)."""

CONTINUOUS_FRACTION_STEP = 0.005
"""The lattice of a `mem_fraction_static` range without a step (a baseline SGLang computed
itself, `bootstrap.sizing`): the capacity search's candidates and the review's margin both move
by it."""


def snap(value: float, step: float | None = None) -> float:
    """Remove float noise (0.8800000000000001) so flags and records read like the study file: to
    two decimals more than `step` has. Without a step only the noise goes (15 significant
    digits): an enqueued point keeps every digit it was given (a baseline SGLang computed itself,
    0.8260405859375)."""
    return float(f"{value:.15g}") if not step else round(value, _decimals(step) + 2)


def _decimals(step: float) -> int:
    text = f"{step:.10f}".rstrip("0")
    return len(text.split(".")[1]) if "." in text else 0


def step_of(space: Space | None, name: str) -> float | None:
    """The step of parameter `name` in `space`: a range's own; None for a range without one, a
    log range, a choice, a fixed value, or a name the space does not hold."""
    if space is None:
        return None
    if isinstance(space, SearchConfig):
        p = next((p for p in space.params if p.name == name), None)
        return p.step if isinstance(p, FloatRange | IntRange) and not p.log else None
    d = space.get(name)
    if isinstance(d, FloatDistribution | IntDistribution) and not d.log:
        return d.step
    return None


FIXED_FRACTION_STEP = 0.01
"""The step of a `mem_fraction_static` the study never moves (a fixed value, or no space at
hand): the hundredths an operator writes it in, and what the export backs off by from it.
`autotune ledger`'s what-if table (one log, no space) steps by it too."""


def fraction_step(space: Space | None) -> float:
    """The step `mem_fraction_static` moves by: its range's own; `CONTINUOUS_FRACTION_STEP` for a
    range without one (the capacity search's lattice); `FIXED_FRACTION_STEP` when the space does
    not search it."""
    step = step_of(space, FRACTION)
    if step:
        return float(step)
    return CONTINUOUS_FRACTION_STEP if _searched(space, FRACTION) else FIXED_FRACTION_STEP


def _searched(space: Space | None, name: str) -> bool:
    if space is None:
        return False
    if isinstance(space, SearchConfig):
        return any(p.name == name and isinstance(p, FloatRange | IntRange) for p in space.params)
    return isinstance(space.get(name), FloatDistribution | IntDistribution)


def canonical_value(value: Scalar, step: float | None = None) -> Scalar:
    """One parameter's value as a point holds it: a float snapped to `step` (`snap`), any other
    value (an int, a bool, a string) as it is."""
    return snap(value, step) if isinstance(value, float) else value


def canonical(params: Mapping[str, Scalar], space: Space | None = None) -> dict[str, Scalar]:
    """`params` with each value in its canonical form, snapped to its parameter's step in
    `space` (`canonical_value`); without a space only the float noise goes."""
    return {k: canonical_value(v, step_of(space, k)) for k, v in params.items()}


_Value: TypeAlias = tuple[bool, object]
"""A canonical value and whether it is a bool (True is not the number 1 of another point)."""


def _value(value: object, step: float | None) -> _Value:
    if isinstance(value, float):
        return (False, snap(value, step))
    if isinstance(value, list | tuple):  # a value read back from JSON: compared element-wise
        return (False, tuple(_value(v, step) for v in value))
    if isinstance(value, Mapping):
        return (False, tuple(sorted((str(k), _value(v, step)) for k, v in value.items())))
    return (isinstance(value, bool), value)


@dataclass(frozen=True)
class PointKey:
    """A point's identity: its parameter names with their canonical values. Equal keys are the
    same point; a key hashes, so points are deduplicated and queued in sets and dicts. Numbers
    compare as numbers (8 is 8.0), a bool only with a bool."""

    items: frozenset[tuple[str, _Value]]

    @property
    def names(self) -> frozenset[str]:
        """The parameter names the point assigns, to tell points of different spaces apart."""
        return frozenset(name for name, _ in self.items)

    def only(self, names: Iterable[str]) -> PointKey:
        """The point on `names` alone (a name it lacks stays absent)."""
        keep = set(names)
        return PointKey(frozenset(i for i in self.items if i[0] in keep))

    def without(self, names: Iterable[str]) -> PointKey:
        """The point less `names`."""
        drop = set(names)
        return PointKey(frozenset(i for i in self.items if i[0] not in drop))

    def within(self, other: PointKey) -> bool:
        """Every value of this point is `other`'s (a partial point, such as the baseline's
        searched parameters, that a full one runs)."""
        return self.items <= other.items


def point_key(params: Mapping[str, object], space: Space | None = None) -> PointKey:
    """The identity of the point `params` in `space` (`PointKey`); `params` may be read back
    from storage (an enqueued point, a stored record), so any value is taken."""
    return PointKey(frozenset((k, _value(v, step_of(space, k))) for k, v in params.items()))


def same_point(
    a: Mapping[str, object], b: Mapping[str, object], space: Space | None = None
) -> bool:
    """Whether `a` and `b` are the same point of `space` (the same names, `PointKey`)."""
    return point_key(a, space) == point_key(b, space)


def same_value(a: object, b: object, step: float | None = None) -> bool:
    """Whether `a` and `b` are the same value of one parameter, by the rule of `PointKey` (None
    for a value a point lacks)."""
    return _value(a, step) == _value(b, step)


def stored_space(trials: Iterable[optuna.trial.FrozenTrial]) -> dict[str, BaseDistribution]:
    """The space a study's trials were sampled from, as Optuna stored it with each (for a review
    without the study file); a later trial's distribution of a name replaces an earlier's."""
    out: dict[str, BaseDistribution] = {}
    for t in sorted(trials, key=lambda t: t.number):
        out.update(t.distributions)
    return out


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
            axes.append((p.name, [snap(p.low + i * p.step, p.step) for i in range(n + 1)]))
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
    """`value` as a flag's argument: lowercase booleans, floats at full precision without a trailing
    `.0`, so a flag reads as the operator would write it and parses back to the same value."""
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
    """`--host`/`--port`: the address autotune binds each trial's server to, never the study's
    flags."""
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
_DP = ("dp", "dp_size", "data_parallel_size")
_DP_ATTENTION = "enable_dp_attention"


def gpus_needed(flags: Sequence[tuple[str, object]]) -> int:
    """GPUs one server takes, from its fixed flags: tensor × pipeline parallel size for each
    data-parallel replica (`--dp-size`). SGLang launches each replica on tp × pp GPUs of its own
    (`DataParallelController.launch_dp_schedulers`); with the older `--enable-dp-attention`,
    `--dp-size` counts attention groups inside the one TP group instead, and there is one
    replica."""
    given = {name: value for name, value in flags}

    def size(names: tuple[str, ...]) -> int:
        for n in names:
            v = given.get(n)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
        return 1

    replicas = 1 if given.get(_DP_ATTENTION) is True else size(_DP)
    return size(_TP) * size(_PP) * replicas
