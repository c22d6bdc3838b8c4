"""What load to drive: the study file's `[workload]` table as frozen values, validated once.

`workload_from_dict` is strict: an unknown key, a wrong type or an out-of-range value raises
`ConfigError` naming the dotted key (`workload.phases[2].rate`) and the fix. Everything the driver
needs later is decided here, so a trial never fails halfway through on a bad study file.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path

from autotune.config.table import Table
from autotune.errors import ConfigError

LENGTH_KINDS = ("fixed", "uniform", "normal", "lognormal")
MAX_TOKENS = 4_194_304  # no context is longer; catches unit slips like 128e6
MAX_DURATION_S = 7 * 24 * 3600.0


DEFAULT_API = "generate"
"""The HTTP API requests go to when `workload.api` is not given.

Which names `workload.api` accepts is the load driver's registry (`autotune.loadgen.apis.APIS`):
config sits below loadgen, so the study file keeps the name as written and the launcher refuses an
unknown one before anything is launched or written (`autotune.loadgen.apis.api_named`)."""


@dataclass(frozen=True)
class LengthDist:
    """A token-length distribution; samples are rounded and clipped to [low, high].

    fixed: always `low` (== high). uniform: integers in [low, high]. normal and lognormal:
    `mean` and `std` of the lengths themselves (lognormal's mu/sigma are derived from them).
    """

    kind: str
    low: int
    high: int
    mean: float = 0.0
    std: float = 0.0

    @staticmethod
    def fixed(n: int) -> LengthDist:
        """A distribution that always gives `n` tokens."""
        return LengthDist("fixed", n, n, float(n), 0.0)

    def to_dict(self) -> dict[str, object]:
        """The distribution as the study file's `{ dist = … }` table, which `workload_from_dict`
        reads back."""
        if self.kind == "fixed":
            return {"dist": "fixed", "value": self.low}
        if self.kind == "uniform":
            return {"dist": "uniform", "min": self.low, "max": self.high}
        return {
            "dist": self.kind,
            "mean": self.mean,
            "std": self.std,
            "min": self.low,
            "max": self.high,
        }


@dataclass(frozen=True)
class Sessions:
    """Multi-turn sessions: each turn resends the conversation so far, so turns share prefixes.

    Every session starts with one of `system_prompts` shared system prompts of
    `system_prompt_len` tokens, so sessions also share prefixes with each other.
    """

    turns: int
    system_prompt_len: int = 0
    system_prompts: int = 1


@dataclass(frozen=True)
class Warmup:
    """A few requests before measuring; reported but left out of the overall summary."""

    name: str
    requests: int = 4
    concurrency: int = 1
    timeout_s: float = 300.0
    input_len: LengthDist | None = None
    output_len: LengthDist | None = None


@dataclass(frozen=True)
class Steady:
    """Closed loop: `concurrency` clients each send the next request when the last one ends."""

    name: str
    concurrency: int
    duration_s: float
    max_requests: int | None = None
    input_len: LengthDist | None = None
    output_len: LengthDist | None = None


@dataclass(frozen=True)
class Poisson:
    """Open loop: arrivals at `rate` per second with exponential gaps, whatever the server does.

    `max_in_flight` bounds sockets; arrivals that find it full wait and count as lag.
    """

    name: str
    rate: float
    duration_s: float
    max_in_flight: int = 1024
    input_len: LengthDist | None = None
    output_len: LengthDist | None = None


class BurstOrder(StrEnum):
    """The order a stress burst sends its prompts in. A study file's stress phase sends prompts
    of one length (`same`); `autotune confirm`'s worst cases mix the longest prompt the workload
    can send with its shortest, to meet the server's FCFS waiting queue in each order."""

    SAME = "same"
    """Every prompt `input_len` tokens, all at once (the study file's stress phase)."""
    LONGEST_FIRST = "longest-first"
    """The long prompts, then the short ones, all at once."""
    SHORTEST_FIRST = "shortest-first"
    """The short prompts, then, once they run (`ORDER_GAP_S` later), the long ones."""
    RANDOM = "random"
    """Long and short prompts shuffled by `order_seed`, all at once."""


@dataclass(frozen=True)
class Stress:
    """Bursts that provoke the transient peak: `requests` prompts at once (default: the server's
    effective max running requests), each `input_len` tokens (default: one full prefill chunk).

    `order`, `short_len` and `order_seed` are set only by `autotune confirm`'s worst cases (a
    study file cannot name them): with an order other than `same`, half the prompts (rounded
    down, at least one) are `input_len` tokens and the rest `short_len`, sent in that order."""

    name: str
    rounds: int = 2
    requests: int | None = None
    input_len: int | None = None
    output_len: int = 64
    timeout_s: float = 600.0
    order: BurstOrder = BurstOrder.SAME
    short_len: int | None = None
    order_seed: int = 0


Phase = Warmup | Steady | Poisson | Stress


@dataclass(frozen=True)
class EarlyEnd:
    """When a phase may end before its duration or its rounds (`[workload] end_early`), the rule
    `autotune.loadgen.earlyend` applies to the phase's own samples.

    A steady or Poisson phase ends once, after `min_s` seconds and `min_requests` completed
    requests (0: the phase's clients), the output throughput of its last `windows`
    windows of `window_s` seconds spans at most `tolerance` of their mean and the least free GPU
    memory under load did not fall by more than `headroom_tol_gib` over those windows. A stress
    phase skips its remaining rounds once two rounds in a row ended alike and their least free
    memory at the burst agrees within `headroom_tol_gib`. `enabled = False` runs every phase to its
    end (the confirm soak always does: a soak exists to run long)."""

    enabled: bool = True
    window_s: float = 30.0
    windows: int = 3
    tolerance: float = 0.02
    min_s: float = 120.0
    min_requests: int = 0
    headroom_tol_gib: float = 0.1


DEFAULT_INPUT_LEN = LengthDist.fixed(1024)
DEFAULT_OUTPUT_LEN = LengthDist.fixed(128)


@dataclass(frozen=True)
class WorkloadSpec:
    """The whole `[workload]` table."""

    phases: tuple[Phase, ...]
    api: str = DEFAULT_API
    stream: bool = True
    ignore_eos: bool = True
    temperature: float = 0.0
    seed: int = 0
    input_len: LengthDist = DEFAULT_INPUT_LEN
    output_len: LengthDist = DEFAULT_OUTPUT_LEN
    dataset: Path | None = None
    dataset_rows: tuple[DatasetRow, ...] = ()
    sessions: Sessions | None = None
    api_key_env: str | None = None
    request_timeout_s: float = 600.0
    drain_timeout_s: float = 60.0
    end_early: EarlyEnd = EarlyEnd()

    def api_key(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The API key from the environment variable the spec names (None when none is named)."""
        if self.api_key_env is None:
            return None
        env = os.environ if environ is None else environ
        value = env.get(self.api_key_env)
        if not value:
            raise ConfigError(
                "workload.api_key_env",
                f"environment variable {self.api_key_env} is not set; export it or remove the key",
            )
        return value

    def with_stress_repeats(self, times: int) -> WorkloadSpec:
        """The workload with each stress phase run `times` times in a row (the copies named
        `NAME #2`, `NAME #3`, …): what a launch runs where the search asks a setting to hold
        again (`keys.STRESS_REPEATS`); each pass has its own rounds and its own early end."""
        if times <= 1:
            return self
        phases: list[Phase] = []
        for ph in self.phases:
            phases.append(ph)
            if isinstance(ph, Stress):
                phases += [replace(ph, name=f"{ph.name} #{k}") for k in range(2, times + 1)]
        return replace(self, phases=tuple(phases))

    def stress_passes(self, workload_s: float, times: int) -> tuple[WorkloadSpec, float]:
        """What a launch asked for `times` stress passes drives, and its time limit: the
        workload `with_stress_repeats(times)`, within `workload_s` for each pass."""
        return self.with_stress_repeats(times), workload_s * max(1, times)

    def max_wall_s(self) -> float:
        """An upper bound on how long `run_workload` can take, from the phase limits."""
        total = 0.0
        for phase in self.phases:
            if isinstance(phase, Steady | Poisson):
                total += phase.duration_s + self.drain_timeout_s
            else:
                total += phase.timeout_s
        return total


def length_from_value(raw: object, key: str) -> LengthDist:
    """`512` (fixed) or `{dist = "uniform"|"normal"|"lognormal"|"fixed", ...}`."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        if not 1 <= raw <= MAX_TOKENS:
            raise ConfigError(key, f"must be in [1, {MAX_TOKENS}] tokens, got {raw}")
        return LengthDist.fixed(raw)
    if not isinstance(raw, Mapping):
        raise ConfigError(
            key,
            "expected a token count or a table like "
            f'{{dist = "uniform", min = 1, max = 512}}, got {raw!r}',
        )
    t = Table.of(raw, key)
    kind = t.maybe_string("dist", choices=LENGTH_KINDS)
    if kind is None:
        raise ConfigError(t.key("dist"), f"is required: one of {', '.join(LENGTH_KINDS)}")
    if kind == "fixed":
        n = t.integer("value", required=True, low=1, high=MAX_TOKENS)
        t.finish()
        return LengthDist.fixed(n)
    if kind == "uniform":
        lo, hi = (
            t.integer("min", required=True, low=1, high=MAX_TOKENS),
            t.integer("max", required=True, low=1, high=MAX_TOKENS),
        )
        t.finish()
        if hi < lo:
            raise ConfigError(t.key("max"), f"must be >= min ({lo}), got {hi}")
        return LengthDist("uniform", lo, hi, (lo + hi) / 2, 0.0)
    mean = float(t.number("mean", required=True, low=1.0, high=float(MAX_TOKENS)))
    std = float(t.number("std", required=True, low=0.0, high=float(MAX_TOKENS)))
    lo = t.integer("min", default=1, low=1, high=MAX_TOKENS)
    hi = t.integer("max", default=MAX_TOKENS, low=1, high=MAX_TOKENS)
    t.finish()
    if hi < lo:
        raise ConfigError(t.key("max"), f"must be >= min ({lo}), got {hi}")
    return LengthDist(kind, lo, hi, mean, std)


def _opt_length(t: Table, name: str) -> LengthDist | None:
    raw = t.raw(name)
    return None if raw is None else length_from_value(raw, t.key(name))


def _phase_from_dict(raw: object, key: str, index: int) -> Phase:
    t = Table.of(raw, key)
    kinds = ("warmup", "steady", "poisson", "stress")
    kind = t.maybe_string("kind", choices=kinds)
    if kind is None:
        raise ConfigError(t.key("kind"), f"is required: one of {', '.join(kinds)}")
    name = t.maybe_string("name") or f"{kind}-{index}"
    phase: Phase
    if kind == "warmup":
        phase = Warmup(
            name=name,
            requests=t.integer("requests", default=4, low=1, high=100_000),
            concurrency=t.integer("concurrency", default=1, low=1, high=4096),
            timeout_s=float(t.number("timeout_s", default=300.0, low=1.0, high=MAX_DURATION_S)),
            input_len=_opt_length(t, "input_len"),
            output_len=_opt_length(t, "output_len"),
        )
    elif kind == "steady":
        phase = Steady(
            name=name,
            concurrency=t.integer("concurrency", required=True, low=1, high=4096),
            duration_s=float(t.number("duration_s", required=True, low=0.1, high=MAX_DURATION_S)),
            max_requests=t.maybe_integer("max_requests", low=1, high=100_000_000),
            input_len=_opt_length(t, "input_len"),
            output_len=_opt_length(t, "output_len"),
        )
    elif kind == "poisson":
        phase = Poisson(
            name=name,
            rate=float(t.number("rate", required=True, low=0.001, high=100_000.0)),
            duration_s=float(t.number("duration_s", required=True, low=0.1, high=MAX_DURATION_S)),
            max_in_flight=t.integer("max_in_flight", default=1024, low=1, high=16384),
            input_len=_opt_length(t, "input_len"),
            output_len=_opt_length(t, "output_len"),
        )
    else:
        phase = Stress(
            name=name,
            rounds=t.integer("rounds", default=2, low=1, high=1000),
            requests=t.maybe_integer("requests", low=1, high=16384),
            input_len=t.maybe_integer("input_len", low=1, high=MAX_TOKENS),
            output_len=t.integer("output_len", default=64, low=1, high=MAX_TOKENS),
            timeout_s=float(t.number("timeout_s", default=600.0, low=1.0, high=MAX_DURATION_S)),
        )
    t.finish()
    return phase


def _end_early_from(raw: object, key: str) -> EarlyEnd:
    """`end_early = true | false`, or a table of the rule's figures (`EarlyEnd`'s fields)."""
    if raw is None:
        return EarlyEnd()
    if isinstance(raw, bool):
        return EarlyEnd(enabled=raw)
    if not isinstance(raw, Mapping):
        raise ConfigError(
            key, f"expected true, false or a table like {{tolerance = 0.02}}, got {raw!r}"
        )
    t = Table.of(raw, key)
    rule = EarlyEnd(
        enabled=t.boolean("enabled", default=True),
        window_s=float(t.number("window_s", default=30.0, low=0.1, high=MAX_DURATION_S)),
        windows=t.integer("windows", default=3, low=2, high=1000),
        tolerance=float(t.number("tolerance", default=0.02, low=0.0, high=1.0)),
        min_s=float(t.number("min_s", default=120.0, low=0.0, high=MAX_DURATION_S)),
        min_requests=t.integer("min_requests", default=0, low=0, high=100_000_000),
        headroom_tol_gib=float(t.number("headroom_tol_gib", default=0.1, low=0.0, high=1024.0)),
    )
    t.finish()
    return rule


def _sessions_from_dict(raw: object, key: str) -> Sessions:
    t = Table.of(raw, key)
    sessions = Sessions(
        turns=t.integer("turns", required=True, low=1, high=1000),
        system_prompt_len=t.integer("system_prompt_len", default=0, low=0, high=MAX_TOKENS),
        system_prompts=t.integer("system_prompts", default=1, low=1, high=100_000),
    )
    t.finish()
    return sessions


def workload_from_dict(
    d: Mapping[str, object], key: str = "workload", *, base_dir: Path | None = None
) -> WorkloadSpec:
    """Validate the study file's `[workload]` table; raises ConfigError naming the bad key.

    A relative `dataset` path is taken relative to `base_dir` (the study file's folder) when given.
    """
    t = Table.of(d, key)
    raw_phases = t.raw("phases")
    if raw_phases is None:
        raise ConfigError(
            t.key("phases"), 'is required: add [[workload.phases]] tables with kind = "steady", ...'
        )
    if not isinstance(raw_phases, Sequence) or isinstance(raw_phases, str) or not raw_phases:
        raise ConfigError(
            t.key("phases"), "expected a non-empty array of [[workload.phases]] tables"
        )
    phases = tuple(_phase_from_dict(p, f"{key}.phases[{i}]", i) for i, p in enumerate(raw_phases))
    names = [p.name for p in phases]
    for i, name in enumerate(names):
        if names.index(name) != i:
            raise ConfigError(
                f"{key}.phases[{i}].name", f"duplicate phase name {name!r}; rename it"
            )
    if len(phases) > 64:
        raise ConfigError(t.key("phases"), f"at most 64 phases, got {len(phases)}")
    api = t.maybe_string("api") or DEFAULT_API
    dataset = t.maybe_string("dataset")
    if dataset is not None and ("input_len" in t or "output_len" in t):
        raise ConfigError(
            t.key("dataset"), "takes lengths from the file; remove input_len/output_len or dataset"
        )
    raw_sessions = t.raw("sessions")
    api_key_env = t.maybe_string("api_key_env")
    if api_key_env is not None and not api_key_env.replace("_", "").isalnum():
        raise ConfigError(
            t.key("api_key_env"), f"is an environment variable name, got {api_key_env!r}"
        )
    spec = WorkloadSpec(
        phases=phases,
        api=api,
        stream=t.boolean("stream", default=True),
        ignore_eos=t.boolean("ignore_eos", default=True),
        temperature=float(t.number("temperature", default=0.0, low=0.0, high=2.0)),
        seed=t.integer("seed", default=0, low=0, high=2**63 - 1),
        input_len=_opt_length(t, "input_len") or DEFAULT_INPUT_LEN,
        output_len=_opt_length(t, "output_len") or DEFAULT_OUTPUT_LEN,
        dataset=_resolve(dataset, base_dir),
        sessions=None
        if raw_sessions is None
        else _sessions_from_dict(raw_sessions, t.key("sessions")),
        api_key_env=api_key_env,
        request_timeout_s=float(
            t.number("request_timeout_s", default=600.0, low=0.1, high=MAX_DURATION_S)
        ),
        drain_timeout_s=float(
            t.number("drain_timeout_s", default=60.0, low=0.0, high=MAX_DURATION_S)
        ),
        end_early=_end_early_from(t.raw("end_early"), t.key("end_early")),
    )
    t.finish()
    if spec.dataset is not None:
        rows = load_dataset(spec.dataset, t.key("dataset"))
        spec = dataclasses.replace(spec, dataset_rows=rows)
    return spec


def _resolve(path: str | None, base_dir: Path | None) -> Path | None:
    if path is None:
        return None
    p = Path(path).expanduser()
    return p if p.is_absolute() or base_dir is None else base_dir / p


@dataclass(frozen=True)
class DatasetRow:
    """One line of a JSONL dataset: lengths, or a literal prompt with its output length."""

    output_len: int
    input_len: int | None = None
    prompt: str | None = None


def load_dataset(path: Path, key: str, max_rows: int = 1_000_000) -> tuple[DatasetRow, ...]:
    """Read `{"input_len": N, "output_len": M}` or `{"prompt": "...", "output_len": M}` lines."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(key, f"cannot read {path} ({exc.strerror}); fix the path") from exc
    rows: list[DatasetRow] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{key} ({path}:{lineno})"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(where, f"not JSON ({exc.msg}); one object per line") from exc
        t = Table.of(obj, where)
        prompt = t.maybe_string("prompt")
        input_len = t.maybe_integer("input_len", low=1, high=MAX_TOKENS)
        output_len = t.integer("output_len", required=True, low=1, high=MAX_TOKENS)
        t.finish()
        if prompt is None and input_len is None:
            raise ConfigError(where, "needs input_len or prompt")
        rows.append(DatasetRow(output_len, input_len, prompt))
        if len(rows) > max_rows:
            raise ConfigError(key, f"more than {max_rows} rows in {path}; use a smaller file")
    if not rows:
        raise ConfigError(
            key, f'{path} has no rows; add lines like {{"input_len": 512, "output_len": 128}}'
        )
    return tuple(rows)
