"""Hardware/model profiles: strict TOML loading into frozen dataclasses.

A profile describes one box and one model: GPUs, host RAM, the memory CUDA and NCCL take before
weights, weights per GPU, attention geometry (bytes per token follow from it), an optional draft
model, CUDA-graph and activation memory laws, step times, startup phase durations, run-to-run
variation and, off by default, where the box departs from that arithmetic (`[mismatch]`: the
allocator growing while serving, one rank short of memory, heavy-tailed peaks, a peak growing
with the live context, rare spikes). Every key is documented in docs/sim-profiles.md. Profiles
ship in autotune/sim/shipped/*.toml and are chosen by name (file stem) or by path. Unknown keys
and wrong types are errors, so a typo in a profile fails loudly instead of silently simulating
a different machine.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any, TypeVar

from autotune.sim.versions import DEFAULT, VERSIONS

PROFILE_DIR = Path(__file__).resolve().parent / "shipped"


class ProfileError(ValueError):
    """A profile cannot be found or has a bad key; the message names the key and the fix."""


@dataclass(frozen=True)
class Hardware:
    """The box: GPU model, count and memory, what the CUDA context takes, host RAM (total and
    available), the host-to-device bandwidth HiCache loads at, and the memory limit of the
    container the server runs in (its cgroup's `memory.max`, GiB; 0 for none)."""

    gpu_name: str
    gpu_count: int
    gpu_memory_mib: int
    cuda_context_gib: float
    host_ram_gb: float
    host_ram_available_gb: float
    host_to_device_gbps: float = 20.0
    cgroup_memory_max_gib: float = 0.0


@dataclass(frozen=True)
class Attention:
    """KV geometry of one model. kind "mla" uses kv_lora_rank/qk_rope_head_dim; "mha" the heads."""

    kind: str
    layers: int
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    kv_heads: int = 0
    head_dim: int = 0
    v_head_dim: int = 0


@dataclass(frozen=True)
class ModelSpec:
    """The served model: path, architecture and type, dtype, weights per GPU at the tensor
    parallelism they were measured at, context length, quantization."""

    path: str
    architecture: str
    model_type: str
    dtype: str
    weights_gib: float
    weights_tp: int
    context_length: int
    kv_fp8_checkpoint: bool = False
    quant: str = ""


@dataclass(frozen=True)
class Draft:
    """The speculative draft model that ships with the profile (used with --speculative-*)."""

    algorithm: str
    path: str
    weights_gib: float
    weights_tp: int
    attention: Attention
    num_steps: int
    topk: int
    draft_tokens: int
    accept_length: float
    graph_base_gib: float
    graph_mib_per_token: float
    prefill_graph_gib: float = 0.0


@dataclass(frozen=True)
class CudaGraph:
    """graph GiB = base + per_size × (#captured sizes) + per_token × max_bs × tokens_per_bs;
    the prefill graph (SGLang 0.5.23) likewise over its captured token counts."""

    base_gib: float
    mib_per_size: float
    mib_per_token: float
    workspace_gib: float
    prefill_base_gib: float = 0.0
    prefill_mib_per_size: float = 0.0
    prefill_mib_per_token: float = 0.0


@dataclass(frozen=True)
class Activation:
    """Transient peak GiB = base + prefill tokens × per_token + decode seqs × per_seq."""

    base_gib: float
    prefill_mib_per_token: float
    decode_mib_per_seq: float
    variation: float


@dataclass(frozen=True)
class Timing:
    """Step times in ms: prefill = base + tokens × per_token; decode = base + seqs × per_seq."""

    prefill_base_ms: float
    prefill_ms_per_token: float
    decode_base_ms: float
    decode_ms_per_seq: float
    decode_us_per_kv_token: float = 0.0
    variation: float = 0.02


@dataclass(frozen=True)
class Startup:
    """Phase durations in seconds at --sim-time-scale 1 (real-world length)."""

    init_distributed_s: float
    weight_load_s: float
    kv_alloc_s: float
    graph_capture_s: float
    draft_load_s: float
    draft_graph_capture_s: float
    hicache_s_per_gb: float
    server_start_s: float
    warmup_s: float
    prefill_graph_capture_s: float = 0.0


@dataclass(frozen=True)
class Variation:
    """Launch-to-launch jitter: sigma (MiB) of the CUDA-context overhead and of the weights."""

    startup_mib: float


@dataclass(frozen=True)
class Mismatch:
    """Where the box differs from the memory arithmetic a search fits (`[mismatch]`, every key
    off by default; docs/sim-profiles.md).

    growth_mib_per_request: the allocator's footprint grows while serving: free memory shrinks
        by this much per request served, never given back while the server runs.
    rank_imbalance_gib: the last rank has this much less free memory before the weights (a
        foreign holder); the pool is sized by the least rank (TP > 1 only).
    peak_tail_dof: the forward peak's run-to-run variation (`activation.variation`, same sd) is
        Student-t with this many degrees of freedom instead of normal: heavy tails (0: normal;
        otherwise an integer ≥ 3).
    context_mib_per_1k_tokens: every forward's peak grows by this much per 1,000 tokens of live
        context in the batch (the KV tokens the running requests hold).
    spike_probability, spike_factor: one forward in 1/spike_probability peaks at
        (1 + spike_factor) times its draw (rare spikes).
    """

    growth_mib_per_request: float = 0.0
    rank_imbalance_gib: float = 0.0
    peak_tail_dof: int = 0
    context_mib_per_1k_tokens: float = 0.0
    spike_probability: float = 0.0
    spike_factor: float = 0.0

    @property
    def on(self) -> bool:
        """Whether any departure from the arithmetic is switched on."""
        return self != Mismatch()


@dataclass(frozen=True)
class Profile:
    """One box and one model as the simulator plays them: hardware, model and attention geometry,
    the optional draft, memory laws, step and startup times, variation and mismatches, and the
    SGLang release it speaks by default."""

    name: str
    description: str
    hardware: Hardware
    model: ModelSpec
    attention: Attention
    draft: Draft | None
    cuda_graph: CudaGraph
    activation: Activation
    timing: Timing
    startup: Startup
    variation: Variation
    source: str = ""
    sglang_version: str = DEFAULT.name
    mismatch: Mismatch = Mismatch()


T = TypeVar("T")


def _build(cls: type[T], table: Mapping[str, Any], where: str, **extra: Any) -> T:
    known = {f.name: f for f in fields(cls)}  # type: ignore[arg-type]
    for key in table:
        if key not in known or key in extra:
            raise ProfileError(f"{where}.{key}: unknown key; see docs/sim-profiles.md")
    kwargs: dict[str, Any] = dict(extra)
    for name, fld in known.items():
        if name in extra:
            continue
        if name not in table:
            if fld.default is not MISSING:
                continue
            raise ProfileError(f"{where}.{name}: missing; see docs/sim-profiles.md")
        value = table[name]
        want = str(fld.type)
        if want == "int" and (not isinstance(value, int) or isinstance(value, bool)):
            raise ProfileError(f"{where}.{name}: expected an integer, got {value!r}")
        if want == "float":
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise ProfileError(f"{where}.{name}: expected a number, got {value!r}")
            value = float(value)
        if want == "str" and not isinstance(value, str):
            raise ProfileError(f"{where}.{name}: expected a string, got {value!r}")
        if want == "bool" and not isinstance(value, bool):
            raise ProfileError(f"{where}.{name}: expected true or false, got {value!r}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ProfileError(f"{where}.{name}: must be a finite number, got {value!r}")
        if isinstance(value, int | float) and not isinstance(value, bool) and value < 0:
            raise ProfileError(f"{where}.{name}: must not be negative, got {value!r}")
        kwargs[name] = value
    return cls(**kwargs)


def _positive(obj: object, where: str, *names: str, least: float = 0.0) -> None:
    """Fields that divide or count (a TP size, a context length, a draft's steps): zero (or
    below `least`) is not a box, and the simulator would divide by it or serve nothing."""
    for name in names:
        value = getattr(obj, name)
        if value <= least:
            bound = "positive" if least == 0.0 else f"above {least:g}"
            raise ProfileError(f"{where}.{name}: must be {bound}, got {value!r}")


def _table(doc: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = doc.get(key)
    if not isinstance(value, dict):
        raise ProfileError(f"[{key}]: missing table; see docs/sim-profiles.md")
    return value


def _attention(table: Mapping[str, Any], where: str) -> Attention:
    att = _build(Attention, table, where)
    if att.kind == "mla":
        if att.kv_lora_rank <= 0 or att.qk_rope_head_dim <= 0:
            raise ProfileError(f"{where}: mla needs kv_lora_rank and qk_rope_head_dim > 0")
    elif att.kind == "mha":
        if att.kv_heads <= 0 or att.head_dim <= 0:
            raise ProfileError(f"{where}: mha needs kv_heads and head_dim > 0")
    else:
        raise ProfileError(f"{where}.kind: must be 'mla' or 'mha', got {att.kind!r}")
    if att.layers <= 0:
        raise ProfileError(f"{where}.layers: must be positive")
    return att


_TOP = {
    "name",
    "description",
    "hardware",
    "model",
    "attention",
    "draft",
    "cuda_graph",
    "activation",
    "timing",
    "startup",
    "variation",
    "sglang_version",
    "mismatch",
}


def profile_from_dict(doc: Mapping[str, Any], source: str = "") -> Profile:
    """Validate a parsed TOML document into a Profile (raises ProfileError)."""
    for key in doc:
        if key not in _TOP:
            raise ProfileError(f"{key}: unknown key; see docs/sim-profiles.md")
    name = doc.get("name")
    if not isinstance(name, str) or not name:
        raise ProfileError("name: missing; give the profile a name")
    draft = None
    if "draft" in doc:
        dt = dict(_table(doc, "draft"))
        att_table = dt.pop("attention", None)
        if not isinstance(att_table, dict):
            raise ProfileError("[draft.attention]: missing table")
        draft = _build(Draft, dt, "draft", attention=_attention(att_table, "draft.attention"))
        _positive(draft, "draft", "weights_tp", "num_steps", "topk", "draft_tokens")
        _positive(draft, "draft", "accept_length", least=0.999)
    version = doc.get("sglang_version", DEFAULT.name)
    if not isinstance(version, str) or version not in VERSIONS:
        raise ProfileError(
            f"sglang_version: expected one of {', '.join(VERSIONS)}, got {version!r}"
        )
    mismatch = _mismatch(_table(doc, "mismatch")) if "mismatch" in doc else Mismatch()
    hardware = _build(Hardware, _table(doc, "hardware"), "hardware")
    if hardware.gpu_count <= 0 or hardware.gpu_memory_mib <= 0:
        raise ProfileError("hardware.gpu_count/gpu_memory_mib: must be positive")
    model = _build(ModelSpec, _table(doc, "model"), "model")
    _positive(model, "model", "weights_tp", "context_length")
    return Profile(
        name=name,
        description=str(doc.get("description", "")),
        hardware=hardware,
        model=model,
        attention=_attention(_table(doc, "attention"), "attention"),
        draft=draft,
        cuda_graph=_build(CudaGraph, _table(doc, "cuda_graph"), "cuda_graph"),
        activation=_build(Activation, _table(doc, "activation"), "activation"),
        timing=_build(Timing, _table(doc, "timing"), "timing"),
        startup=_build(Startup, _table(doc, "startup"), "startup"),
        variation=_build(Variation, _table(doc, "variation"), "variation"),
        source=source,
        sglang_version=version,
        mismatch=mismatch,
    )


def _mismatch(table: Mapping[str, Any]) -> Mismatch:
    m = _build(Mismatch, table, "mismatch")
    if m.peak_tail_dof in (1, 2):
        raise ProfileError("mismatch.peak_tail_dof: 0 (normal) or at least 3 (finite variance)")
    if m.spike_probability > 1:
        raise ProfileError("mismatch.spike_probability: a probability, at most 1")
    return m


def list_profiles(directory: Path = PROFILE_DIR) -> list[str]:
    """Names of the shipped profiles (file stems under autotune/sim/shipped/)."""
    return sorted(p.stem for p in directory.glob("*.toml"))


def load_profile(name_or_path: str | Path, directory: Path = PROFILE_DIR) -> Profile:
    """Load a profile by name (autotune/sim/shipped/NAME.toml) or by path to a TOML file."""
    text = str(name_or_path)
    path = Path(text)
    if not (text.endswith(".toml") or path.is_file()):
        path = directory / f"{text}.toml"
    if not path.is_file():
        raise ProfileError(
            f"profile {text!r} not found; use one of "
            f"{', '.join(list_profiles(directory))} or a path to a TOML file"
        )
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{path}: not valid TOML ({exc})") from None
    except UnicodeDecodeError as exc:
        raise ProfileError(f"{path}: not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    return profile_from_dict(doc, source=str(path))
