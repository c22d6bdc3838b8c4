"""SGLang's command line for a chosen release, and the simulator's own `--sim-*` flags.

The parser for a release is built from that release's flag table (`versions.SglangVersion.flags`,
written from SGLang's own `ServerArgs.add_cli_args`): every flag SGLang declares, its option
strings in SGLang's order, value type, nargs and choices. It is a stock `argparse.ArgumentParser`
with abbreviations allowed, as SGLang's is, so an unknown or ambiguous flag or a bad value exits
with code 2 and argparse's own message (`--tp` abbreviates `--tp-size`; `--cuda-graph-max-bs` is
ambiguous in 0.5.23; `--hicache-size 24.5` is an invalid int). Flags that shape memory,
scheduling, logs or HTTP behaviour become fields of `ServerSettings`; every other flag given is
kept in `noted` and listed where SGLang lists it.

The release is `--sim-version`, else the profile's `sglang_version` (`__main__` passes it as
`default_version`), else 0.5.9.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from decimal import Decimal
from typing import Any

from autotune.sim.flagspec import Flag
from autotune.sim.versions import DEFAULT, VERSIONS, SglangVersion, get_version, parse_version

Version = tuple[int, ...]
VersionLike = str | tuple[int, ...] | SglangVersion

DEFAULT_VERSION: Version = DEFAULT.number
SPEC_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")

SIM_FAULTS = (
    "hang-weight-load",
    "health-empty",
    "health-fail",
    "crash-mid-load",
    "hold-gpu",
    "ignore-sigterm",
    "slow-startup",
    "oom-kill-startup",
    "oom-kill",
    "rank-dies",
    "orphan-scheduler",
    "bad-server-info",
    "refuse-generate",
    "reword-log",
)

__all__ = [
    "DEFAULT_VERSION",
    "NEWER_SETTINGS",
    "SIM_FAULTS",
    "SPEC_ALGORITHMS",
    "CommandLine",
    "Fault",
    "Flag",
    "ServerSettings",
    "SimOptions",
    "build_parser",
    "flags_for",
    "parse_command_line",
    "parse_version",
    "resolve_version",
]


def resolve_version(version: VersionLike | None) -> SglangVersion:
    """The simulated release for a name, a version tuple or a release (None: 0.5.9)."""
    if version is None:
        return DEFAULT
    if isinstance(version, SglangVersion):
        return version
    if isinstance(version, str):
        return get_version(version)
    for known in VERSIONS.values():
        if known.number == tuple(version):
            return known
    raise KeyError(
        f"SGLang {'.'.join(map(str, version))} is not simulated; choose one of "
        f"{', '.join(VERSIONS)}"
    )


def flags_for(version: VersionLike | None = None) -> tuple[Flag, ...]:
    """The flags SGLang `version` declares, as its parser declares them."""
    return resolve_version(version).flags


@dataclass(frozen=True)
class Fault:
    """One `--sim-fault KIND[=ARG]`."""

    kind: str
    arg: float | None = None


@dataclass(frozen=True)
class SimOptions:
    """The simulator's own flags (all spelled `--sim-*`)."""

    profile: str = "kimi-k2.5-tp8-96g"
    seed: int = 0
    time_scale: float = 300.0
    gpu_dir: str | None = None
    faults: tuple[Fault, ...] = ()
    version: str = DEFAULT.name

    def fault(self, kind: str) -> Fault | None:
        """The `--sim-fault` of `kind`, None when it was not given."""
        for item in self.faults:
            if item.kind == kind:
                return item
        return None


@dataclass(frozen=True)
class ServerSettings:
    """The SGLang arguments the simulator models, as given (None = SGLang's automatic choice)."""

    model_path: str = "default"
    tokenizer_path: str | None = None
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = 30000
    api_key: str | None = None
    skip_server_warmup: bool = False
    context_length: int | None = None
    kv_cache_dtype: str = "auto"
    mem_fraction_static: float | None = None
    max_running_requests: int | None = None
    max_queued_requests: int | None = None
    max_total_tokens: int | None = None
    chunked_prefill_size: int | None = None
    max_prefill_tokens: int = 16384
    schedule_conservativeness: float = 1.0
    page_size: int | None = None
    tp_size: int = 1
    pp_size: int = 1
    dp_size: int = 1
    cuda_graph_max_bs: int | None = None
    cuda_graph_bs: tuple[int, ...] | None = None
    disable_cuda_graph: bool = False
    disable_radix_cache: bool = False
    enable_hierarchical_cache: bool = False
    hicache_ratio: float | None = 2.0
    hicache_size: float = 0  # GB per rank; SGLang declares it int (0.5.9 and 0.5.23)
    hicache_write_policy: str = "write_through"
    speculative_algorithm: str | None = None
    speculative_draft_model_path: str | None = None
    speculative_num_steps: int | None = None
    speculative_eagle_topk: int | None = None
    speculative_num_draft_tokens: int | None = None
    enable_metrics: bool = False
    decode_log_interval: int = 40
    stream_output: bool = False
    watchdog_timeout: float = 300.0
    enable_dp_attention: bool = False
    allow_auto_truncate: bool = False
    # 0.5.14+ spellings without an older counterpart (None: not given)
    cuda_graph_max_bs_prefill: int | None = None
    cuda_graph_bs_prefill: tuple[int, ...] | None = None
    cuda_graph_backend_decode: str | None = None
    cuda_graph_backend_prefill: str | None = None
    hicache_host_memory_mode: str = "cache"
    hicache_host_memory_fraction: float | None = None
    noted: Mapping[str, object] = field(default_factory=dict)

    @property
    def spec(self) -> bool:
        """Whether speculative decoding is on (`--speculative-algorithm` given): a draft model
        loads."""
        return self.speculative_algorithm is not None

    @property
    def decode_graph_disabled(self) -> bool:
        """Whether decode runs without CUDA graphs (`--disable-cuda-graph`, or 0.5.23's
        `--cuda-graph-backend-decode disabled`): no decode graphs are captured or their memory
        taken."""
        return self.disable_cuda_graph or self.cuda_graph_backend_decode == "disabled"

    @property
    def prefill_graph_disabled(self) -> bool:
        """Whether prefill CUDA graphs are off (`--disable-cuda-graph`, or 0.5.23's
        `--cuda-graph-backend-prefill disabled`)."""
        return self.disable_cuda_graph or self.cuda_graph_backend_prefill == "disabled"


@dataclass(frozen=True)
class CommandLine:
    """A parsed simulator command line; `argv` is its SGLang part (the `--sim-*` flags out)."""

    settings: ServerSettings
    sim: SimOptions
    argv: tuple[str, ...] = ()


# ---- value converters, named like SGLang's (argparse names them in its messages) -------------


def human_readable_int(value: str) -> int:
    """SGLang 0.5.23's `human_readable_int`: SI (k, M, G, T) and IEC (Ki, Mi, Gi, Ti) suffixes."""
    value = value.strip()
    si = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    iec = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
    if match:
        number, suffix = match.groups()
        if suffix in iec:
            if "." in number:
                raise argparse.ArgumentTypeError(
                    f"Decimals are not allowed with IEC suffixes like '{suffix}'. "
                    f"Use an integer IEC value such as '{int(Decimal(number))}{suffix}', "
                    f"or an SI value such as '{number}{suffix[0]}'."
                )
            return int(number) * iec[suffix]
        return int(Decimal(number) * si[suffix])
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"Invalid integer value: '{value}'. "
            "Use a plain integer, SI suffixes (1k, 1M), or IEC suffixes (1Ki, 1Mi). "
            "Suffixes are case-sensitive."
        ) from None


def json_list_type(value: str) -> Any:
    """SGLang's `json_list_type` (`utils/common.py`): a flag value as JSON, its error message on a
    bad one."""
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(
            f"Invalid JSON list: {value}. Please provide a valid JSON list."
        ) from None


def nullable_str(val: str) -> str | None:
    """SGLang's `nullable_str` (`utils/common.py`): "" and "None" mean no value."""
    if not val or val == "None":
        return None
    return val


def parse_cuda_graph_backend_arg(raw: str) -> str:
    """SGLang 0.5.23's check of a CUDA-graph backend name (`model_executor/cuda_graph_config.py`):
    the removed `tc_piecewise` is refused with its message."""
    if raw == "tc_piecewise":
        raise argparse.ArgumentTypeError(
            "tc_piecewise was removed; select breakable, full, or disabled"
        )
    return raw


_GRAPH_PHASES = ("decode", "prefill")


def parse_cuda_graph_config_arg(raw: str) -> dict[str, dict[str, Any]]:
    """--cuda-graph-config: a JSON object of phase → settings (keys are not checked here)."""
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"--cuda-graph-config must be JSON: {e}") from None
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError(
            f"--cuda-graph-config must be a JSON object, got {type(parsed).__name__}"
        )
    result: dict[str, dict[str, Any]] = {}
    for phase, settings in parsed.items():
        if str(phase) not in _GRAPH_PHASES:
            raise argparse.ArgumentTypeError(
                f"--cuda-graph-config: unknown phase '{phase}', expected one of {_GRAPH_PHASES}"
            )
        if not isinstance(settings, dict):
            raise argparse.ArgumentTypeError(
                f"--cuda-graph-config['{phase}'] must be a JSON object, got "
                f"{type(settings).__name__}"
            )
        if "backend" in settings:
            parse_cuda_graph_backend_arg(settings["backend"])
        result[str(phase)] = dict(settings)
    return result


CONVERTERS: Mapping[str, Any] = {
    "str": str,
    "int": int,
    "float": float,
    "loads": json.loads,
    "human_readable_int": human_readable_int,
    "json_list_type": json_list_type,
    "nullable_str": nullable_str,
    "parse_cuda_graph_backend_arg": parse_cuda_graph_backend_arg,
    "parse_cuda_graph_config_arg": parse_cuda_graph_config_arg,
}


# ---- SGLang's custom actions --------------------------------------------------------------------


def _deprecated_warning(message: str, stamped: bool) -> None:
    """SGLang's print_deprecated_warning while parsing: on stderr, with the `[time]` prefix where
    the release has configured logging by then, else the bare text."""
    prefix = f"[{datetime.datetime.now():%Y-%m-%d %H:%M:%S}] " if stamped else ""
    sys.stderr.write(f"{prefix}\033[1;33m{message}\033[0m\n")
    sys.stderr.flush()


class _LoRAPaths(argparse.Action):
    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        paths: list[object] = []
        for item in values or []:
            text = str(item).strip()
            paths.append(json.loads(text) if text.startswith("{") and text.endswith("}") else text)
        setattr(namespace, self.dest, paths)


class _Deprecated(argparse.Action):
    """A retired flag: stops with its error message, or warns and changes nothing."""

    def __init__(
        self, *args: Any, error_message: str | None = None, stamped: bool = False, **kw: Any
    ) -> None:
        self.error_message = error_message
        self.stamped = stamped
        super().__init__(*args, **kw)

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        if self.error_message is not None:
            parser.error(self.error_message)
        _deprecated_warning(
            f"The command line argument '{option_string}' is deprecated and will be removed in "
            "future versions.",
            self.stamped,
        )


class _DeprecatedStore(argparse.Action):
    """A retired flag that still sets its field (True, a fixed value, or the value given)."""

    def __init__(
        self,
        *args: Any,
        new_flag: str | None = None,
        mode: str = "",
        stamped: bool = False,
        **kw: Any,
    ) -> None:
        self.new_flag = new_flag
        self.mode = mode
        self.stamped = stamped
        super().__init__(*args, **kw)

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        replacement = f" Use '{self.new_flag}' instead." if self.new_flag else ""
        message = f"'{option_string}' is deprecated and will be removed in a future release."
        _deprecated_warning(message + replacement, self.stamped)
        value = {"deprecated_true": True, "deprecated_const": self.const}.get(self.mode, values)
        setattr(namespace, self.dest, value)


def _add(parser: argparse.ArgumentParser, flag: Flag, stamped: bool) -> None:
    kw: dict[str, Any] = {"dest": flag.dest, "default": flag.default}
    names = list(flag.names)
    act = flag.action
    if act in ("store", "lora_paths", "deprecated_alias"):
        if flag.type is not None:
            kw["type"] = CONVERTERS[flag.type]
        if flag.nargs is not None:
            kw["nargs"] = flag.nargs
        if flag.choices is not None:
            kw["choices"] = flag.choices
        if flag.const is not None:
            kw["const"] = flag.const
        if act == "lora_paths":
            kw["action"] = _LoRAPaths
        elif act == "deprecated_alias":
            kw.update(action=_DeprecatedStore, new_flag=flag.new_flag, mode=act, stamped=stamped)
    elif act in ("store_true", "store_false"):
        kw["action"] = act
    elif act == "store_const":
        kw.update(action="store_const", const=flag.const)
    elif act == "bool_optional":
        kw["action"] = argparse.BooleanOptionalAction
        names = [n for n in names if not (n.startswith("--no-") and f"--{n[5:]}" in names)]
    elif act == "deprecated":
        kw.update(
            action=_Deprecated, nargs=flag.nargs, error_message=flag.error_message, stamped=stamped
        )
    elif act in ("deprecated_true", "deprecated_const"):
        kw.update(
            action=_DeprecatedStore,
            new_flag=flag.new_flag,
            mode=act,
            const=flag.const,
            stamped=stamped,
        )
        kw["nargs"] = 0 if flag.nargs is None and act == "deprecated_true" else flag.nargs
        if flag.choices is not None:
            kw["choices"] = flag.choices
    else:
        raise ValueError(f"flag table: unknown action {act!r} for {flag.name}")
    parser.add_argument(*names, **kw)


def _fault(text: str) -> Fault:
    kind, _, arg = text.partition("=")
    if kind not in SIM_FAULTS:
        raise argparse.ArgumentTypeError(
            f"unknown fault {kind!r}; choose from {', '.join(SIM_FAULTS)}"
        )
    if kind in ("hold-gpu", "slow-startup", "oom-kill", "rank-dies"):
        try:
            value = float(arg)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{kind} needs a number, e.g. {kind}=5") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{kind} needs a positive number, got {arg}")
        return Fault(kind, value)
    if arg:
        raise argparse.ArgumentTypeError(f"fault {kind} takes no argument")
    return Fault(kind)


def _add_sim_flags(parser: argparse.ArgumentParser) -> None:
    sim = parser.add_argument_group(
        "simulator", "what the simulator adds to SGLang's flags (docs/sim-profiles.md)"
    )
    sim.add_argument(
        "--sim-profile",
        default=SimOptions.profile,
        help="the box and model to simulate: a shipped profile's name or a TOML file "
        f"(default {SimOptions.profile})",
    )
    sim.add_argument(
        "--sim-version",
        default=None,
        choices=tuple(VERSIONS),
        help="the SGLang release whose flags, memory rules and log lines to speak "
        "(default: the profile's)",
    )
    sim.add_argument(
        "--sim-seed", type=int, default=0, help="seeds the launch's jitter and the peaks' draws"
    )
    sim.add_argument(
        "--sim-time-scale",
        type=float,
        default=SimOptions.time_scale,
        help="how many times faster than the real box the startup runs "
        f"(default {SimOptions.time_scale:g}; serving runs in real time)",
    )
    sim.add_argument(
        "--sim-gpu-dir",
        default=None,
        help="the folder of simulated GPU memory that autotune reads as NVML (default: none)",
    )
    sim.add_argument(
        "--sim-fault",
        type=_fault,
        action="append",
        default=[],
        metavar="KIND[=N]",
        help=f"inject a fault, repeatable: {', '.join(SIM_FAULTS)}",
    )


def build_parser(version: VersionLike | None = None) -> argparse.ArgumentParser:
    """SGLang's parser for `version` (default 0.5.9) plus the `--sim-*` flags."""
    release = resolve_version(version)
    parser = argparse.ArgumentParser(
        prog="python -m autotune.sim",
        description="A simulated SGLang server: SGLang's flags, log lines and HTTP API, and "
        "the memory of the profile's box.",
    )
    for flag in release.flags:
        _add(parser, flag, release.parse_warnings_stamped)
    _add_sim_flags(parser)
    return parser


def preparse(argv: Sequence[str]) -> tuple[str, str | None]:
    """(--sim-profile, --sim-version or None) before the release's parser exists."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--sim-profile", default=SimOptions.profile)
    pre.add_argument("--sim-version", default=None)
    ns, _ = pre.parse_known_args(list(argv))
    return str(ns.sim_profile), ns.sim_version


_SETTINGS_FIELDS = {f.name for f in fields(ServerSettings)} - {"noted"}
NEWER_SETTINGS = frozenset(
    {
        "cuda_graph_max_bs_prefill",
        "cuda_graph_bs_prefill",
        "cuda_graph_backend_decode",
        "cuda_graph_backend_prefill",
        "hicache_host_memory_mode",
        "hicache_host_memory_fraction",
    }
)
"""ServerSettings fields 0.5.9 has no flag for (its `ServerArgs(...)` line and /server_info
leave them out)."""
_COMMON_DESTS = {
    "tensor_parallel_size": "tp_size",
    "pipeline_parallel_size": "pp_size",
    "data_parallel_size": "dp_size",
}


BUNDLED_DRAFT_ARCHITECTURES = frozenset(
    {
        "DeepseekV32ForCausalLM",
        "DeepseekV3ForCausalLM",
        "DeepseekV4ForCausalLM",
        "Glm4MoeForCausalLM",
        "Glm4MoeLiteForCausalLM",
        "GlmMoeDsaForCausalLM",
        "BailingMoeForCausalLM",
        "BailingMoeV2ForCausalLM",
        "BailingMoeV2_5ForCausalLM",
        "MistralLarge3ForCausalLM",
        "PixtralForConditionalGeneration",
        "HYV3ForCausalLM",
        "HYV4ForCausalLM",
        "Qwen4ExpForConditionalGeneration",
    }
)
"""Targets whose checkpoint carries its own draft layers (MTP): with an EAGLE-family algorithm
and no `--speculative-draft-model-path`, SGLang takes the model path as the draft's
(0.5.23 `arg_groups/speculative_hook.py`, `_handle_eagle_family`)."""


def parse_command_line(
    argv: Sequence[str],
    version: VersionLike | None = None,
    env: Mapping[str, str] | None = None,
    *,
    default_version: VersionLike | None = None,
    architecture: str | None = None,
) -> CommandLine:
    """Parse like SGLang: bad flags print argparse's message and raise SystemExit(2).

    The release is `version` if given, else `--sim-version`, else `default_version` (the
    profile's), else 0.5.9. `architecture` is the served model's (the profile's): an EAGLE-family
    draft of a target that carries its own draft layers needs no draft path.
    """
    if version is None:
        _, named = preparse(argv)
        if named is not None and named not in VERSIONS:
            build_parser(default_version).parse_args(list(argv))  # argparse's invalid choice
        version = named if named is not None else default_version
    release = resolve_version(version)
    parser = build_parser(release)
    values = vars(parser.parse_args(list(argv)))
    if values["model_path"] is None:
        parser.error("the following arguments are required: --model-path")
    if values["sim_time_scale"] <= 0:
        parser.error("argument --sim-time-scale: must be positive")
    kwargs, noted = _settings_values(values, release)
    algo = kwargs.get("speculative_algorithm")
    if algo and algo not in ("NGRAM", "NEXTN") and not kwargs.get("speculative_draft_model_path"):
        if architecture not in BUNDLED_DRAFT_ARCHITECTURES:
            parser.error("--speculative-draft-model-path is required with --speculative-algorithm")
        kwargs["speculative_draft_model_path"] = values["model_path"]
    settings = ServerSettings(**kwargs, noted=noted)
    environ = env if env is not None else {}
    gpu_dir = values["sim_gpu_dir"] or environ.get("AUTOTUNE_SIM_GPU_DIR") or None
    sim = SimOptions(
        profile=values["sim_profile"],
        seed=values["sim_seed"],
        time_scale=values["sim_time_scale"],
        gpu_dir=gpu_dir,
        faults=tuple(values["sim_fault"]),
        version=release.name,
    )
    return CommandLine(settings, sim, sglang_argv(argv))


def sglang_argv(argv: Sequence[str]) -> tuple[str, ...]:
    """`argv` without the simulator's own flags (each `--sim-*` flag takes one value)."""
    out: list[str] = []
    skip = False
    for token in argv:
        if skip:
            skip = False
            continue
        if token.startswith("--sim-"):
            skip = "=" not in token
            continue
        out.append(token)
    return tuple(out)


def _settings_values(
    values: Mapping[str, object], release: SglangVersion
) -> tuple[dict[str, Any], dict[str, object]]:
    """The parsed values split into ServerSettings fields and the rest that differs from SGLang's
    defaults (`noted`)."""
    defaults = {flag.dest: flag.default for flag in release.flags}
    renamed = {**_COMMON_DESTS, **{str(k): str(v) for k, v in release.setting_dests.items()}}
    kwargs: dict[str, Any] = {}
    noted: dict[str, object] = {}
    for dest, value in values.items():
        if dest.startswith("sim_"):
            continue
        name = renamed.get(dest, dest)
        if name in _SETTINGS_FIELDS:
            if value is not None or dest not in ("hicache_host_memory_mode",):
                kwargs[name] = tuple(value) if isinstance(value, list) else value
        elif value != defaults.get(dest):
            noted[dest] = value
    if kwargs.get("hicache_host_memory_mode") is None:
        kwargs.pop("hicache_host_memory_mode", None)
    return kwargs, noted
