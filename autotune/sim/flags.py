"""SGLang's command-line flags as data, and the simulator's parser built from them.

Every flag carries the release it appeared in (and, where it applies, the release that removed it),
so the parser for a given SGLang version accepts exactly the flags that version knows. The parser is
a stock `argparse.ArgumentParser` with abbreviations allowed, as SGLang's is, so an unknown or
ambiguous flag exits with code 2 and argparse's own message. Flags that shape memory or scheduling
become fields of `ServerSettings`; every other real flag is accepted and kept in `noted`.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Literal

Kind = Literal["bool", "int", "float", "str", "ints", "strs", "json"]
Version = tuple[int, ...]

DEFAULT_VERSION: Version = (0, 5, 9)
SPEC_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")


@dataclass(frozen=True)
class FlagSpec:
    """One SGLang flag: primary name, aliases, value kind, default, and life span by release."""

    name: str
    kind: Kind = "str"
    default: object = None
    since: str = "0.4.0"
    removed: str | None = None
    aliases: tuple[str, ...] = ()
    choices: tuple[str, ...] | None = None

    @property
    def dest(self) -> str:
        return self.name.lstrip("-").replace("-", "_")


def _f(
    name: str,
    kind: Kind = "str",
    default: object = None,
    since: str = "0.4.0",
    *,
    removed: str | None = None,
    aliases: tuple[str, ...] = (),
    choices: tuple[str, ...] | None = None,
) -> FlagSpec:
    return FlagSpec(name, kind, default, since, removed, aliases, choices)


_HICACHE_LAYOUTS = ("layer_first", "page_first", "page_first_direct")
_HICACHE_STORAGE = ("file", "mooncake", "hf3fs", "nixl", "aibrix", "dynamic", "eic")

# The flags that shape memory, scheduling, logs or HTTP behaviour (those named like a
# ServerSettings field are modelled; the rest of this group is recorded like NOTED).
MODELLED: tuple[FlagSpec, ...] = (
    _f("--model-path", "str", None, aliases=("--model",)),
    _f("--tokenizer-path"),
    _f("--served-model-name"),
    _f("--host", "str", "127.0.0.1"),
    _f("--port", "int", 30000),
    _f("--api-key"),
    _f("--skip-server-warmup", "bool", False),
    _f("--context-length", "int"),
    _f(
        "--kv-cache-dtype",
        "str",
        "auto",
        choices=("auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16", "fp4_e2m1"),
    ),
    _f("--mem-fraction-static", "float"),
    _f("--max-running-requests", "int"),
    _f("--max-queued-requests", "int", since="0.4.10"),
    _f("--max-total-tokens", "int"),
    _f("--chunked-prefill-size", "int"),
    _f("--max-prefill-tokens", "int", 16384),
    _f("--schedule-conservativeness", "float", 1.0),
    _f("--page-size", "int"),
    _f("--tensor-parallel-size", "int", 1, aliases=("--tp-size", "--tp")),
    _f("--pipeline-parallel-size", "int", 1, aliases=("--pp-size",)),
    _f("--data-parallel-size", "int", 1, aliases=("--dp-size", "--dp")),
    _f("--cuda-graph-max-bs", "int", removed="0.5.16"),
    _f("--cuda-graph-bs", "ints"),
    _f("--cuda-graph-max-bs-decode", "int", since="0.5.14"),
    _f("--cuda-graph-max-bs-prefill", "int", since="0.5.14"),
    _f("--cuda-graph-bs-decode", "ints", since="0.5.14"),
    _f("--cuda-graph-bs-prefill", "ints", since="0.5.14"),
    _f("--cuda-graph-config", "json", since="0.5.14"),
    _f("--disable-cuda-graph", "bool", False),
    _f("--disable-radix-cache", "bool", False),
    _f("--enable-hierarchical-cache", "bool", False),
    _f("--hicache-ratio", "float", 2.0),
    _f("--hicache-size", "float", 0.0),
    _f(
        "--hicache-write-policy",
        "str",
        "write_through",
        choices=("write_back", "write_through", "write_through_selective"),
    ),
    _f("--hicache-io-backend", "str", "kernel", choices=("direct", "kernel")),
    _f("--hicache-mem-layout", "str", "layer_first", choices=_HICACHE_LAYOUTS),
    _f("--hicache-storage-backend", "str", None, since="0.4.10", choices=_HICACHE_STORAGE),
    _f(
        "--hicache-storage-prefetch-policy",
        "str",
        "best_effort",
        since="0.5.0",
        choices=("best_effort", "wait_complete", "timeout"),
    ),
    _f("--hicache-storage-backend-extra-config", since="0.5.0"),
    _f("--speculative-algorithm", "str", None, choices=SPEC_ALGORITHMS),
    _f("--speculative-draft-model-path", aliases=("--speculative-draft-model",)),
    _f("--speculative-num-steps", "int"),
    _f("--speculative-eagle-topk", "int"),
    _f("--speculative-num-draft-tokens", "int"),
    _f("--enable-metrics", "bool", False),
    _f("--decode-log-interval", "int", 40),
    _f("--stream-output", "bool", False),
    _f("--log-level", "str", "info"),
    _f("--log-level-http"),
    _f("--watchdog-timeout", "float", 300.0),
    _f("--enable-dp-attention", "bool", False),
    _f("--random-seed", "int"),
    _f("--allow-auto-truncate", "bool", False),
    _f("--disable-overlap-schedule", "bool", False),
    _f("--enable-piecewise-cuda-graph", "bool", False, since="0.5.4", removed="0.5.10"),
    _f("--disable-piecewise-cuda-graph", "bool", False, since="0.5.10"),
)

# Real SGLang flags the simulator accepts and records without modelling.
_NOTED_BOOL = (
    "--trust-remote-code",
    "--skip-tokenizer-init",
    "--is-embedding",
    "--enable-multimodal",
    "--log-requests",
    "--show-time-cost",
    "--enable-metrics-for-all-schedulers",
    "--enable-cache-report",
    "--disable-cuda-graph-padding",
    "--enable-profile-cuda-graph",
    "--enable-nccl-nvls",
    "--disable-outlines-disk-cache",
    "--disable-custom-all-reduce",
    "--enable-mixed-chunk",
    "--enable-dp-lm-head",
    "--enable-two-batch-overlap",
    "--enable-torch-compile",
    "--enable-nan-detection",
    "--enable-p2p-check",
    "--triton-attention-reduce-in-fp32",
    "--delete-ckpt-after-loading",
    "--enable-memory-saver",
    "--enable-custom-logit-processor",
    "--disable-shared-experts-fusion",
    "--disable-chunked-prefix-cache",
    "--disable-fast-image-processor",
    "--enable-return-hidden-states",
    "--enable-lora",
    "--enable-eplb",
    "--enable-expert-distribution-metrics",
    "--enable-tokenizer-batch-encode",
    "--flashinfer-mla-disable-ragged",
    "--enable-priority-scheduling",
    "--sleep-on-idle",
    "--enable-deterministic-inference",
    "--enable-request-time-stats-logging",
    "--crash-on-warmup-failure",
    "--enable-symm-mem",
    "--enable-dynamic-batch-tokenizer",
    "--collect-tokens-histogram",
    "--enable-cudagraph-gc",
    "--enable-flashinfer-allreduce-fusion",
    "--disable-hybrid-swa-memory",
    "--enable-lmcache",
    "--keep-mm-feature-on-device",
    "--enable-trace",
    "--stream-interval-disable",
    "--enable-fp32-lm-head",
)
_NOTED_VALUE = (
    "--tokenizer-mode",
    "--tokenizer-worker-num",
    "--load-format",
    "--model-loader-extra-config",
    "--revision",
    "--model-impl",
    "--dtype",
    "--quantization",
    "--quantization-param-path",
    "--device",
    "--stream-interval",
    "--constrained-json-whitespace-pattern",
    "--dist-timeout",
    "--download-dir",
    "--base-gpu-id",
    "--gpu-id-step",
    "--crash-dump-folder",
    "--log-requests-level",
    "--bucket-time-to-first-token",
    "--bucket-inter-token-latency",
    "--bucket-e2e-request-latency",
    "--gc-warning-threshold-secs",
    "--weight-version",
    "--chat-template",
    "--completion-template",
    "--file-storage-path",
    "--reasoning-parser",
    "--tool-call-parser",
    "--tool-server",
    "--load-balance-method",
    "--dist-init-addr",
    "--nnodes",
    "--node-rank",
    "--json-model-override-args",
    "--preferred-sampling-params",
    "--max-lora-rank",
    "--lora-target-modules",
    "--lora-paths",
    "--max-loras-per-batch",
    "--max-loaded-loras",
    "--lora-backend",
    "--attention-backend",
    "--prefill-attention-backend",
    "--decode-attention-backend",
    "--sampling-backend",
    "--grammar-backend",
    "--mm-attention-backend",
    "--speculative-draft-model-revision",
    "--speculative-accept-threshold-single",
    "--speculative-accept-threshold-acc",
    "--speculative-token-map",
    "--speculative-attention-mode",
    "--expert-parallel-size",
    "--moe-a2a-backend",
    "--moe-runner-backend",
    "--deepep-mode",
    "--ep-num-redundant-experts",
    "--ep-dispatch-algorithm",
    "--init-expert-location",
    "--eplb-algorithm",
    "--eplb-rebalance-num-iterations",
    "--expert-distribution-recorder-mode",
    "--moe-dense-tp-size",
    "--torch-compile-max-bs",
    "--torchao-config",
    "--triton-attention-num-kv-splits",
    "--num-continuous-decode-steps",
    "--scheduler-recv-interval",
    "--numa-node",
    "--disaggregation-mode",
    "--disaggregation-transfer-backend",
    "--disaggregation-bootstrap-port",
    "--disaggregation-ib-device",
    "--schedule-policy",
    "--swa-full-tokens-ratio",
    "--hybrid-kvcache-ratio",
    "--radix-eviction-policy",
    "--nccl-port",
    "--warmups",
    "--sampling-defaults",
    "--tool-call-parser-extra",
    "--pp-max-micro-batch-size",
    "--piecewise-cuda-graph-max-tokens",
    "--piecewise-cuda-graph-compiler",
    "--kv-events-config",
    "--otlp-traces-endpoint",
    "--config",
    "--soft-watchdog-timeout",
    "--tbo-token-distribution-threshold",
    "--mm-process-config",
    "--modelopt-quant",
    "--speculative-draft-load-format",
    "--speculative-moe-runner-backend",
)
_NOTED_SINCE = {
    "--enable-dynamic-batch-tokenizer": "0.5.4",
    "--sampling-defaults": "0.5.4",
    "--mm-process-config": "0.5.4",
    "--soft-watchdog-timeout": "0.5.4",
    "--enable-deterministic-inference": "0.5.4",
    "--speculative-moe-runner-backend": "0.5.4",
    "--cuda-graph-backend-decode": "0.5.14",
    "--cuda-graph-backend-prefill": "0.5.14",
}
NOTED: tuple[FlagSpec, ...] = (
    tuple(_f(n, "bool", False, _NOTED_SINCE.get(n, "0.4.0")) for n in _NOTED_BOOL)
    + tuple(_f(n, "str", None, _NOTED_SINCE.get(n, "0.4.0")) for n in _NOTED_VALUE)
    + (
        _f("--enable-hicache", "bool", False, "0.5.23"),
        _f("--hicache-host-memory-mode", "str", None, "0.5.23"),
        _f("--hicache-host-memory-fraction", "float", None, "0.5.23"),
        _f("--cuda-graph-backend-decode", "str", None, "0.5.14"),
        _f("--cuda-graph-backend-prefill", "str", None, "0.5.14"),
    )
)

SIM_FAULTS = (
    "hang-weight-load",
    "health-empty",
    "health-fail",
    "crash-mid-load",
    "hold-gpu",
    "ignore-sigterm",
    "slow-startup",
)


def parse_version(text: str) -> Version:
    """'0.5.9' -> (0, 5, 9); post/rc suffixes are ignored."""
    parts: list[int] = []
    for piece in text.split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def flags_for(version: Version = DEFAULT_VERSION) -> tuple[FlagSpec, ...]:
    """The flags SGLang `version` accepts."""
    out = []
    for spec in MODELLED + NOTED:
        if parse_version(spec.since) > version:
            continue
        if spec.removed is not None and parse_version(spec.removed) <= version:
            continue
        out.append(spec)
    return tuple(out)


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

    def fault(self, kind: str) -> Fault | None:
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
    hicache_ratio: float = 2.0
    hicache_size: float = 0.0
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
    noted: Mapping[str, object] = field(default_factory=dict)

    @property
    def spec(self) -> bool:
        return self.speculative_algorithm is not None


@dataclass(frozen=True)
class CommandLine:
    """A parsed simulator command line."""

    settings: ServerSettings
    sim: SimOptions


def _ints(text: str) -> int:
    return int(text)


def _add(parser: argparse.ArgumentParser, spec: FlagSpec) -> None:
    names = [spec.name, *spec.aliases]
    dest = spec.dest
    if spec.kind == "bool":
        parser.add_argument(*names, dest=dest, action="store_true", default=spec.default)
    elif spec.kind == "int":
        parser.add_argument(*names, dest=dest, type=int, default=spec.default)
    elif spec.kind == "float":
        parser.add_argument(*names, dest=dest, type=float, default=spec.default)
    elif spec.kind == "ints":
        parser.add_argument(*names, dest=dest, type=_ints, nargs="+", default=spec.default)
    elif spec.kind == "strs":
        parser.add_argument(*names, dest=dest, nargs="+", default=spec.default)
    else:
        parser.add_argument(*names, dest=dest, type=str, default=spec.default, choices=spec.choices)


def _fault(text: str) -> Fault:
    kind, _, arg = text.partition("=")
    if kind not in SIM_FAULTS:
        raise argparse.ArgumentTypeError(
            f"unknown fault {kind!r}; choose from {', '.join(SIM_FAULTS)}"
        )
    if kind in ("hold-gpu", "slow-startup"):
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


def build_parser(version: Version = DEFAULT_VERSION) -> argparse.ArgumentParser:
    """SGLang's parser for `version` plus the `--sim-*` flags."""
    parser = argparse.ArgumentParser(prog="python -m autotune.sim")
    for spec in flags_for(version):
        _add(parser, spec)
    parser.add_argument("--sim-profile", default=SimOptions.profile)
    parser.add_argument("--sim-seed", type=int, default=0)
    parser.add_argument("--sim-time-scale", type=float, default=SimOptions.time_scale)
    parser.add_argument("--sim-gpu-dir", default=None)
    parser.add_argument("--sim-fault", type=_fault, action="append", default=[])
    return parser


_SETTINGS_FIELDS = {f.name for f in fields(ServerSettings)} - {"noted"}
_NEW_SPELLINGS = (
    ("cuda_graph_max_bs_decode", "cuda_graph_max_bs"),
    ("cuda_graph_bs_decode", "cuda_graph_bs"),
)
_RENAMED = {
    "tensor_parallel_size": "tp_size",
    "pipeline_parallel_size": "pp_size",
    "data_parallel_size": "dp_size",
}


def parse_command_line(
    argv: Sequence[str], version: Version = DEFAULT_VERSION, env: Mapping[str, str] | None = None
) -> CommandLine:
    """Parse like SGLang: bad flags print argparse's message and raise SystemExit(2)."""
    parser = build_parser(version)
    ns = parser.parse_args(list(argv))
    values = vars(ns)
    if values["model_path"] is None:
        parser.error("the following arguments are required: --model-path")
    if values["sim_time_scale"] <= 0:
        parser.error("argument --sim-time-scale: must be positive")
    kwargs: dict[str, object] = {}
    noted: dict[str, object] = {}
    defaults = {spec.dest: spec.default for spec in flags_for(version)}
    # 0.5.14+ spellings fill the old fields when those are not given.
    for new, old in _NEW_SPELLINGS:
        if values.get(new) is not None and values.get(old) is None:
            values[old] = values[new]
    for dest, value in values.items():
        if dest.startswith("sim_"):
            continue
        name = _RENAMED.get(dest, dest)
        if name in _SETTINGS_FIELDS:
            kwargs[name] = value
        elif value != defaults.get(dest):
            noted[dest] = value
    if isinstance(kwargs.get("cuda_graph_bs"), list):
        kwargs["cuda_graph_bs"] = tuple(kwargs["cuda_graph_bs"])  # type: ignore[arg-type]
    if values.get("cuda_graph_config"):
        try:
            json.loads(str(values["cuda_graph_config"]))
        except json.JSONDecodeError:
            parser.error("argument --cuda-graph-config: invalid JSON")
    algo = kwargs.get("speculative_algorithm")
    if algo and algo not in ("NGRAM", "NEXTN") and not kwargs.get("speculative_draft_model_path"):
        parser.error("--speculative-draft-model-path is required with --speculative-algorithm")
    settings = ServerSettings(**kwargs, noted=noted)  # type: ignore[arg-type]
    environ = env if env is not None else {}
    gpu_dir = values["sim_gpu_dir"] or environ.get("AUTOTUNE_SIM_GPU_DIR") or None
    sim = SimOptions(
        profile=values["sim_profile"],
        seed=values["sim_seed"],
        time_scale=values["sim_time_scale"],
        gpu_dir=gpu_dir,
        faults=tuple(values["sim_fault"]),
    )
    return CommandLine(settings, sim)
