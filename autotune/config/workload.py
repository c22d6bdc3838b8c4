"""What load to drive: the study file's `[workload]` table as frozen values, validated once.

`workload_from_dict` is strict: an unknown key, a wrong type or an out-of-range value raises
`ConfigError` naming the dotted key (`workload.phases[2].rate`) and the fix. Everything the driver
needs later is decided here, so a trial never fails halfway through on a bad study file.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from autotune.errors import ConfigError

LENGTH_KINDS = ("fixed", "uniform", "normal", "lognormal")
MAX_TOKENS = 4_194_304  # no context is longer; catches unit slips like 128e6
MAX_DURATION_S = 7 * 24 * 3600.0


class Api(StrEnum):
    """Which HTTP API requests go to (reference §5)."""

    GENERATE = "generate"  # SGLang native /generate with input_ids
    COMPLETIONS = "completions"  # OpenAI /v1/completions
    CHAT = "chat"  # OpenAI /v1/chat/completions


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
        return LengthDist("fixed", n, n, float(n), 0.0)

    def to_dict(self) -> dict[str, object]:
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


@dataclass(frozen=True)
class Stress:
    """Bursts that provoke the transient peak: `requests` prompts at once (default: the server's
    effective max running requests), each `input_len` tokens (default: one full prefill chunk)."""

    name: str
    rounds: int = 2
    requests: int | None = None
    input_len: int | None = None
    output_len: int = 64
    timeout_s: float = 600.0


Phase = Warmup | Steady | Poisson | Stress
DEFAULT_INPUT_LEN = LengthDist.fixed(1024)
DEFAULT_OUTPUT_LEN = LengthDist.fixed(128)


@dataclass(frozen=True)
class WorkloadSpec:
    """The whole `[workload]` table."""

    phases: tuple[Phase, ...]
    api: Api = Api.GENERATE
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

    def max_wall_s(self) -> float:
        """An upper bound on how long `run_workload` can take, from the phase limits."""
        total = 0.0
        for phase in self.phases:
            if isinstance(phase, Steady | Poisson):
                total += phase.duration_s + self.drain_timeout_s
            else:
                total += phase.timeout_s
        return total


class _Table:
    """Reads one TOML table, remembering which keys were used so leftovers are reported."""

    def __init__(self, raw: object, key: str) -> None:
        if not isinstance(raw, Mapping):
            raise ConfigError(key, f"expected a table, got {type(raw).__name__}")
        self.raw: Mapping[str, object] = raw
        self.key = key
        self.used: set[str] = set()

    def sub(self, name: str) -> str:
        return f"{self.key}.{name}"

    def get(self, name: str) -> object:
        self.used.add(name)
        return self.raw.get(name)

    def has(self, name: str) -> bool:
        return name in self.raw

    def get_int(self, name: str, default: int | None, lo: int, hi: int = MAX_TOKENS) -> int | None:
        value = self.get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(self.sub(name), f"expected an integer in [{lo}, {hi}], got {value!r}")
        if not lo <= value <= hi:
            raise ConfigError(self.sub(name), f"must be in [{lo}, {hi}], got {value}")
        return value

    def req_int(self, name: str, lo: int, hi: int = MAX_TOKENS) -> int:
        value = self.get_int(name, None, lo, hi)
        if value is None:
            self._misspelt(name)
            raise ConfigError(self.sub(name), f"is required: an integer in [{lo}, {hi}]")
        return value

    def get_float(self, name: str, default: float | None, lo: float, hi: float) -> float | None:
        value = self.get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
            raise ConfigError(self.sub(name), f"expected a number in [{lo}, {hi}], got {value!r}")
        if not lo <= value <= hi:
            raise ConfigError(self.sub(name), f"must be in [{lo}, {hi}], got {value}")
        return float(value)

    def req_float(self, name: str, lo: float, hi: float) -> float:
        value = self.get_float(name, None, lo, hi)
        if value is None:
            self._misspelt(name)
            raise ConfigError(self.sub(name), f"is required: a number in [{lo}, {hi}]")
        return value

    def _misspelt(self, name: str) -> None:
        """A missing required key next to an unknown one that looks like it: name the typo."""
        unknown = [k for k in self.raw if k not in self.used and k != name]
        close = difflib.get_close_matches(name, unknown, n=1, cutoff=0.75)
        if close:
            raise ConfigError(self.sub(close[0]), f"unknown key; did you mean {name}?")

    def get_bool(self, name: str, default: bool) -> bool:
        value = self.get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ConfigError(self.sub(name), f"expected true or false, got {value!r}")
        return value

    def get_str(self, name: str, default: str | None, choices: Sequence[str] = ()) -> str | None:
        value = self.get(name)
        if value is None:
            return default
        if not isinstance(value, str) or not value:
            raise ConfigError(self.sub(name), f"expected a non-empty string, got {value!r}")
        if choices and value not in choices:
            raise ConfigError(self.sub(name), f"must be one of {', '.join(choices)}; got {value!r}")
        return value

    def finish(self) -> None:
        extra = sorted(set(self.raw) - self.used)
        if extra:
            allowed = ", ".join(sorted(self.used))
            raise ConfigError(self.sub(extra[0]), f"unknown key; allowed here: {allowed}")


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
    t = _Table(raw, key)
    kind = t.get_str("dist", None, LENGTH_KINDS)
    if kind is None:
        raise ConfigError(t.sub("dist"), f"is required: one of {', '.join(LENGTH_KINDS)}")
    if kind == "fixed":
        n = t.req_int("value", 1)
        t.finish()
        return LengthDist.fixed(n)
    if kind == "uniform":
        lo, hi = t.req_int("min", 1), t.req_int("max", 1)
        t.finish()
        if hi < lo:
            raise ConfigError(t.sub("max"), f"must be >= min ({lo}), got {hi}")
        return LengthDist("uniform", lo, hi, (lo + hi) / 2, 0.0)
    mean = t.req_float("mean", 1.0, float(MAX_TOKENS))
    std = t.req_float("std", 0.0, float(MAX_TOKENS))
    lo = t.get_int("min", 1, 1) or 1
    hi = t.get_int("max", MAX_TOKENS, 1) or MAX_TOKENS
    t.finish()
    if hi < lo:
        raise ConfigError(t.sub("max"), f"must be >= min ({lo}), got {hi}")
    return LengthDist(kind, lo, hi, mean, std)


def _opt_length(t: _Table, name: str) -> LengthDist | None:
    raw = t.get(name)
    return None if raw is None else length_from_value(raw, t.sub(name))


def _phase_from_dict(raw: object, key: str, index: int) -> Phase:
    t = _Table(raw, key)
    kinds = ("warmup", "steady", "poisson", "stress")
    kind = t.get_str("kind", None, kinds)
    if kind is None:
        raise ConfigError(t.sub("kind"), f"is required: one of {', '.join(kinds)}")
    name = t.get_str("name", f"{kind}-{index}")
    assert name is not None
    phase: Phase
    if kind == "warmup":
        phase = Warmup(
            name=name,
            requests=t.get_int("requests", 4, 1, 100_000) or 4,
            concurrency=t.get_int("concurrency", 1, 1, 4096) or 1,
            timeout_s=t.get_float("timeout_s", 300.0, 1.0, MAX_DURATION_S) or 300.0,
            input_len=_opt_length(t, "input_len"),
            output_len=_opt_length(t, "output_len"),
        )
    elif kind == "steady":
        phase = Steady(
            name=name,
            concurrency=t.req_int("concurrency", 1, 4096),
            duration_s=t.req_float("duration_s", 0.1, MAX_DURATION_S),
            max_requests=t.get_int("max_requests", None, 1, 100_000_000),
            input_len=_opt_length(t, "input_len"),
            output_len=_opt_length(t, "output_len"),
        )
    elif kind == "poisson":
        phase = Poisson(
            name=name,
            rate=t.req_float("rate", 0.001, 100_000.0),
            duration_s=t.req_float("duration_s", 0.1, MAX_DURATION_S),
            max_in_flight=t.get_int("max_in_flight", 1024, 1, 16384) or 1024,
            input_len=_opt_length(t, "input_len"),
            output_len=_opt_length(t, "output_len"),
        )
    else:
        phase = Stress(
            name=name,
            rounds=t.get_int("rounds", 2, 1, 1000) or 2,
            requests=t.get_int("requests", None, 1, 16384),
            input_len=t.get_int("input_len", None, 1),
            output_len=t.get_int("output_len", 64, 1) or 64,
            timeout_s=t.get_float("timeout_s", 600.0, 1.0, MAX_DURATION_S) or 600.0,
        )
    t.finish()
    return phase


def _sessions_from_dict(raw: object, key: str) -> Sessions:
    t = _Table(raw, key)
    sessions = Sessions(
        turns=t.req_int("turns", 1, 1000),
        system_prompt_len=t.get_int("system_prompt_len", 0, 0) or 0,
        system_prompts=t.get_int("system_prompts", 1, 1, 100_000) or 1,
    )
    t.finish()
    return sessions


def workload_from_dict(
    d: Mapping[str, object], key: str = "workload", *, base_dir: Path | None = None
) -> WorkloadSpec:
    """Validate the study file's `[workload]` table; raises ConfigError naming the bad key.

    A relative `dataset` path is taken relative to `base_dir` (the study file's folder) when given.
    """
    t = _Table(d, key)
    raw_phases = t.get("phases")
    if raw_phases is None:
        raise ConfigError(
            t.sub("phases"), 'is required: add [[workload.phases]] tables with kind = "steady", ...'
        )
    if not isinstance(raw_phases, Sequence) or isinstance(raw_phases, str) or not raw_phases:
        raise ConfigError(
            t.sub("phases"), "expected a non-empty array of [[workload.phases]] tables"
        )
    phases = tuple(_phase_from_dict(p, f"{key}.phases[{i}]", i) for i, p in enumerate(raw_phases))
    names = [p.name for p in phases]
    for i, name in enumerate(names):
        if names.index(name) != i:
            raise ConfigError(
                f"{key}.phases[{i}].name", f"duplicate phase name {name!r}; rename it"
            )
    if len(phases) > 64:
        raise ConfigError(t.sub("phases"), f"at most 64 phases, got {len(phases)}")
    api = t.get_str("api", Api.GENERATE.value, [a.value for a in Api]) or Api.GENERATE.value
    dataset = t.get_str("dataset", None)
    if dataset is not None and (t.has("input_len") or t.has("output_len")):
        raise ConfigError(
            t.sub("dataset"), "takes lengths from the file; remove input_len/output_len or dataset"
        )
    raw_sessions = t.get("sessions")
    api_key_env = t.get_str("api_key_env", None)
    if api_key_env is not None and not api_key_env.replace("_", "").isalnum():
        raise ConfigError(
            t.sub("api_key_env"), f"is an environment variable name, got {api_key_env!r}"
        )
    spec = WorkloadSpec(
        phases=phases,
        api=Api(api),
        stream=t.get_bool("stream", True),
        ignore_eos=t.get_bool("ignore_eos", True),
        temperature=t.get_float("temperature", 0.0, 0.0, 2.0) or 0.0,
        seed=t.get_int("seed", 0, 0, 2**63 - 1) or 0,
        input_len=_opt_length(t, "input_len") or DEFAULT_INPUT_LEN,
        output_len=_opt_length(t, "output_len") or DEFAULT_OUTPUT_LEN,
        dataset=_resolve(dataset, base_dir),
        sessions=None
        if raw_sessions is None
        else _sessions_from_dict(raw_sessions, t.sub("sessions")),
        api_key_env=api_key_env,
        request_timeout_s=t.get_float("request_timeout_s", 600.0, 0.1, MAX_DURATION_S) or 600.0,
        drain_timeout_s=t.get_float("drain_timeout_s", 60.0, 0.0, MAX_DURATION_S) or 0.0,
    )
    t.finish()
    if spec.dataset is not None:
        rows = load_dataset(spec.dataset, t.sub("dataset"))
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
        t = _Table(obj, where)
        prompt = t.get_str("prompt", None)
        input_len = t.get_int("input_len", None, 1)
        output_len = t.req_int("output_len", 1)
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
