"""SGLang's flags as data, and a log's `server_args=` values turned back into the flags given.

The table comes from SGLang's own parser in the study's Python (`server.flagprobe` run there)
when SGLang imports there, else from the simulator's table of the release the log's format names
(`server.flagcheck.sim_parser`: 0.5.23's `server_args={…}`, 0.5.9's `ServerArgs(…)`). Either
gives each flag's canonical spelling, its default and its arity.

A log prints every argument, and after SGLang has resolved them: besides what the operator gave
it shows defaults and values SGLang worked out itself (the prefill chunk, the page size, the
attention backend, the CUDA-graph batch sizes, a random seed …). `split_args` keeps a value as a
flag when it differs from the parser's default and is not one SGLang resolves by itself
(`RESOLVED`); the resolved ones are listed in a comment, not pinned, because pinning some changes
what SGLang does (an explicit `--hicache-ratio` turns 0.5.23's auto-sizing off) and others
belong to the box the log came from. Secrets and the address are never kept.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from autotune.bootstrap import tomltext
from autotune.config.schema import FlagValue
from autotune.server import flagcheck, flagprobe

OWNED = frozenset({"host", "port", "api_key", "admin_api_key"})
"""Set by autotune (the address, per trial) or secrets: never written to a study."""

RESOLVED = frozenset(
    {
        # filled from another argument (`tokenizer_path` and `served_model_name` are filled with
        # the model path, and kept as flags where the operator named another)
        "speculative_draft_model_revision",
        # chosen for the box and the model (0.5.9 `ServerArgs._handle_*`, 0.5.23's resolution)
        "random_seed",
        "device",
        "attention_backend",
        "prefill_attention_backend",
        "decode_attention_backend",
        "mm_attention_backend",
        "sampling_backend",
        "grammar_backend",
        "page_size",
        "chunked_prefill_size",
        "cuda_graph_config",
        "cuda_graph_bs",
        "cuda_graph_max_bs",
        "cuda_graph_bs_decode",
        "cuda_graph_max_bs_decode",
        "cuda_graph_bs_prefill",
        "cuda_graph_max_bs_prefill",
        "cuda_graph_backend_decode",
        "cuda_graph_backend_prefill",
        "piecewise_cuda_graph_tokens",
        "piecewise_cuda_graph_max_tokens",
        "piecewise_cuda_graph_compiler",
        "hicache_ratio",
        "hicache_host_memory_fraction",
        "hicache_io_backend",
        "hicache_mem_layout",
        "swa_full_tokens_ratio",
        "load_balance_method",
        "dcp_comm_backend",
        "enable_tf32_matmul",
        "enable_tp_lm_head_all_to_all",
        "prefill_decode_interval",
        "boundary_reduction",
        "speculative_moe_runner_backend",
        "speculative_moe_a2a_backend",
        "speculative_draft_model_quantization",
        "moe_runner_backend",
        "moe_a2a_backend",
        "expert_distribution_recorder_buffer_size",
        "expert_distribution_recorder_mode",
        "mamba_full_memory_ratio",
        "mamba_scheduler_strategy",
        "mm_enable_dp_encoder",
        "mm_process_config",
        "mm_feature_transport",
        "encoder_transfer_backend",
        "custom_weight_loader",
        "watermark_config",
        "deepep_mode",
        "ep_dispatch_algorithm",
        "eplb_algorithm",
        "nsa_prefill_backend",
        "nsa_decode_backend",
        "triton_attention_num_kv_splits",
        "tokenizer_worker_num",
        "disaggregation_decode_tp",
        "disaggregation_decode_dp",
        "disaggregation_prefill_pp",
        "disaggregation_ib_device",
        "mooncake_ib_device",
        "soft_watchdog_timeout",
        "prefill_delayer_max_delay_passes",
        "prefill_delayer_token_usage_low_watermark",
        "preferred_sampling_params",
        "limit_mm_data_per_request",
        "lora_target_modules",
    }
)
"""Arguments SGLang fills in when they are not given; a log shows them resolved."""


@dataclass(frozen=True)
class FlagInfo:
    """One SGLang flag as its parser defines it: destination, spellings, default and arity (from
    `server.flagprobe.describe`), enough to write a `server_args` value back as the flag given."""

    dest: str
    option: str
    """The spelling written to a study: SGLang's canonical one (its parser's first), or with the
    simulator's table the one named like the argument (`server_args`' `tp_size` → `--tp-size`,
    the spelling the operator most likely gave)."""
    options: tuple[str, ...] = ()
    default: Any = None
    nargs: int | str = 1
    const: Any = None
    negatable: bool = False

    @property
    def name(self) -> str:
        """The flag's name as a study's `[server.flags]` key: `option` without its leading `--`."""
        return self.option[2:]

    @property
    def takes_value(self) -> bool:
        """Whether the flag is followed by a value (`nargs` ≠ 0); a store-true flag is written
        bare."""
        return self.nargs != 0

    @property
    def many(self) -> bool:
        """Whether the flag takes several values (`nargs` `+`, `*` or above 1), written as a TOML
        list."""
        return self.nargs in ("+", "*") or (isinstance(self.nargs, int) and self.nargs > 1)


def _field(option: str) -> str:
    return option.lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class FlagTable:
    """Every flag of one SGLang parser (SGLang's own or the simulator's table), looked up by
    `server_args` field; `sglang` says the spellings are SGLang's canonical ones."""

    flags: tuple[FlagInfo, ...] = ()
    source: str = ""
    """Whose parser: `SGLang 0.5.23 (/opt/venv/bin/python)` or `the simulator's flag table`."""
    sglang: bool = False
    _index: dict[str, FlagInfo] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for info in self.flags:
            self._index.setdefault(info.dest, info)
        for info in self.flags:
            for option in info.options:
                self._index.setdefault(_field(option), info)

    def get(self, name: str) -> FlagInfo | None:
        """The flag behind a `server_args` field: the field is the parser's destination, or
        (0.5.9's `tp_size` for `--tensor-parallel-size, --tp-size`) one of its spellings."""
        info = self._index.get(_field(name))
        if info is None or self.sglang:
            return info
        named = next((o for o in info.options if _field(o) == _field(name)), info.option)
        return replace(info, option=named)


def _table(entries: Sequence[Mapping[str, Any]], source: str, sglang: bool) -> FlagTable:
    flags: list[FlagInfo] = []
    seen: set[str] = set()
    for e in entries:
        dest = str(e.get("dest", ""))
        options = tuple(str(o) for o in e.get("options", []))
        if not dest or not options or dest.startswith("sim_") or dest in seen:
            continue
        seen.add(dest)
        nargs = e.get("nargs", 1)
        flags.append(
            FlagInfo(
                dest=dest,
                option=options[0],
                options=options,
                default=e.get("default"),
                nargs=nargs if isinstance(nargs, int | str) else 1,
                const=e.get("const"),
                negatable=bool(e.get("negatable", False)),
            )
        )
    return FlagTable(flags=tuple(flags), source=source, sglang=sglang)


def sim_table(release: str | None = None) -> FlagTable:
    """The simulator's table of SGLang `release`'s flags (its default release when None)."""
    parser = flagcheck.sim_parser(["--sim-version", release] if release else [])
    source = (
        f"the simulator's table of SGLang {release}'s flags"
        if release
        else ("the simulator's flag table")
    )
    return _table(flagprobe.describe(parser or argparse.ArgumentParser()), source, sglang=False)


def probe_sglang(python: str) -> FlagTable | None:
    """SGLang's own table in `python`; None when SGLang does not import there."""
    raw = flagprobe.run_in(python, {"describe": True})
    if raw is None or not isinstance(raw.get("flags"), list):
        return None
    return _table(raw["flags"], f"SGLang {raw.get('version', '?')} ({python})", sglang=True)


def flag_table(python: str, release: str | None = None) -> FlagTable:
    """SGLang's table when it imports in `python`, else the simulator's of `release`."""
    return probe_sglang(python) or sim_table(release)


# ------------------------------------------------------------------------------------------------
# server_args values → flags
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SplitArgs:
    """A log's arguments sorted into what a study file does with them."""

    flags: tuple[tuple[str, FlagValue], ...]
    """Given flags (canonical names, no dashes), in the log's order."""
    resolved: tuple[str, ...]
    """`name = value` (TOML, ready to uncomment) for values SGLang resolved by itself, or
    `name: value (…)` where a flag cannot say the value."""
    unexpressible: tuple[str, ...]
    """`name: value` for given values a study's flags cannot say (a nested dict, a None)."""


def _equal(value: Any, default: Any) -> bool:
    """Whether a given flag value is SGLang's `default` (or `const`): a flag value, not a point."""
    if isinstance(value, list | tuple) and isinstance(default, list | tuple):
        return list(value) == list(default)
    if isinstance(value, bool) or isinstance(default, bool):
        return value is default
    return bool(value == default)


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def as_flag_value(info: FlagInfo, value: Any) -> FlagValue | None:
    """What a study's `[server.flags]` holds for `value` of this flag; None when it cannot."""
    if not info.takes_value:
        return True if value is True or (value is not False and _equal(value, info.const)) else None
    if isinstance(value, bool) or value is None or isinstance(value, dict):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, int | float | str):
        return value
    if isinstance(value, list | tuple) and info.many and value:
        items = tuple(value)
        if all(isinstance(v, int | float | str) and not isinstance(v, bool) for v in items):
            return items
    return None


def _flag(info: FlagInfo, value: Any) -> tuple[str, FlagValue] | None:
    if info.negatable and isinstance(value, bool):
        return (info.name if value else f"no-{info.name}", True)
    converted = as_flag_value(info, value)
    return None if converted is None else (info.name, converted)


GATED = (
    ("speculative_", ("speculative_algorithm",)),
    ("hicache_", ("enable_hierarchical_cache",)),
    ("lora_", ("enable_lora", "lora_paths")),
)
"""Families of arguments that do nothing while the argument that turns their feature on is off
(prefix, the arguments that turn it on): a log prints their values anyway, and an older release
printed its own defaults for them (`speculative_num_steps=5` without a draft), which the table's
release may not share."""
UNBOUNDED = 2**62
"""An integer this large is a limit left open (`max_queued_requests=sys.maxsize`, an older
release's default for no limit)."""


def _inert(args: Mapping[str, Any]) -> set[str]:
    """The arguments of `args` whose feature is off (`GATED`)."""
    out: set[str] = set()
    for prefix, gates in GATED:
        if not any(args.get(g) for g in gates):
            out.update(d for d in args if d.startswith(prefix) and d not in gates)
    return out


def split_args(
    args: Mapping[str, Any], table: FlagTable, *, skip: frozenset[str] = frozenset()
) -> SplitArgs:
    """Flags from a `server_args=` mapping; `skip` names arguments handled elsewhere. Arguments
    of a feature that is off (`GATED`) and open limits (`UNBOUNDED`) are left out."""
    flags: list[tuple[str, FlagValue]] = []
    resolved: list[str] = []
    unexpressible: list[str] = []
    model = args.get("model_path")
    inert = _inert(args)
    for dest, value in args.items():
        info = table.get(dest)
        if info is None or dest in OWNED or dest in skip or _equal(value, info.default):
            continue
        if dest in inert:
            continue
        if info.default is None and isinstance(value, int) and value >= UNBOUNDED:
            continue
        if dest in ("tokenizer_path", "served_model_name") and value == model:
            continue
        pair = _flag(info, value)
        if dest in RESOLVED or (value is None and info.default is not None):
            if value is None or value == "<redacted>":
                continue
            if pair is not None:
                resolved.append(f"{pair[0]} = {tomltext.value(pair[1])}")
            else:
                resolved.append(f"{info.name}: {tomltext.clipped(_text(value))} (no flag form)")
            continue
        if pair is None:
            if info.takes_value or value not in (False, None):
                unexpressible.append(f"{info.name}: {tomltext.clipped(_text(value))}")
            continue
        flags.append(pair)
    return SplitArgs(tuple(flags), tuple(resolved), tuple(unexpressible))
