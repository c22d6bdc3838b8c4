"""The ServerArgs a simulated server reports: 0.5.9's repr and 0.5.23's resolved dict.

SGLang prints its resolved ServerArgs once at startup (0.5.9: `server_args=ServerArgs(...)`,
0.5.23: `server_args={...}`, the `resolved_dict()` of every field in order) and 0.5.23 answers
`/server_info` with the same dict. Both are pure functions of the release, the settings and the
StartupPlan, kept apart from `startup`, which times and prints the stages, because the HTTP side
reports the same view long after startup is done.
"""

from __future__ import annotations

import random

from autotune.sim.flags import NEWER_SETTINGS, ServerSettings
from autotune.sim.sizing import capture_batch_sizes
from autotune.sim.startupplan import StartupPlan
from autotune.sim.versions import SglangVersion


def args_repr(s: ServerSettings) -> str:
    """0.5.9's `ServerArgs(...)` body: each field as `name=value!r`, the noted values last."""
    parts = []
    for k, v in s.__dict__.items():
        if k == "noted" or k in NEWER_SETTINGS:
            continue
        parts.append(f"{k}={v!r}")
    parts.extend(f"{k}={v!r}" for k, v in s.noted.items())
    return ", ".join(parts)


_SETTING_TO_DEST = {
    "cuda_graph_max_bs": "cuda_graph_max_bs_decode",
    "cuda_graph_bs": "cuda_graph_bs_decode",
}


def resolved_args(
    release: SglangVersion, s: ServerSettings, plan: StartupPlan, seed: int
) -> dict[str, object]:
    """0.5.23's `server_args.resolved_dict()`: every ServerArgs field in order, the flags as
    given, and the values resolution picks that the simulator models."""
    out: dict[str, object] = dict(release.fields)
    for key, value in s.__dict__.items():
        if key == "noted":
            continue
        dest = _SETTING_TO_DEST.get(key, key)
        if dest in out:
            out[dest] = list(value) if isinstance(value, tuple) else value
    for key, value in s.noted.items():
        out[key] = value
    decode_bs = list(plan.capture_bs) if s.max_running_requests is not None else None
    if not decode_bs and not s.decode_graph_disabled:
        decode_bs = list(
            capture_batch_sizes(plan.cuda_graph_max_bs, plan.spec, 1 << 30, s.cuda_graph_bs)
        )
    graph_keys = {
        "tc_compiler": "eager",
        "max_context_size": None,
        "full_prefill_max_req": None,
        "full_prefill_prefix_chunk_tokens": None,
        "max_seq_len": None,
    }
    out.update(
        {
            "tokenizer_path": s.tokenizer_path or s.model_path,
            "served_model_name": s.served_model_name or s.model_path,
            "mem_fraction_static": plan.mem_fraction_static,
            "chunked_prefill_size": plan.chunked_prefill_size,
            "page_size": plan.page_size,
            "device": "cuda",
            "random_seed": random.Random(seed).randrange(1 << 30),
            "enable_dp_attention": False,
            "cuda_graph_config": {
                "decode": {
                    "backend": "disabled" if s.decode_graph_disabled else "full",
                    "max_bs": plan.cuda_graph_max_bs,
                    "bs": decode_bs,
                    **graph_keys,
                },
                "prefill": {
                    "backend": "breakable" if plan.prefill_capture_tokens else "disabled",
                    "max_bs": max(plan.prefill_capture_tokens, default=None),
                    "bs": list(plan.prefill_capture_tokens) or None,
                    **graph_keys,
                },
            },
        }
    )
    if s.spec:
        out.update(
            {
                "max_running_requests": s.max_running_requests or 48,
                "speculative_num_steps": plan.spec_steps,
                "speculative_eagle_topk": plan.spec_topk,
                "speculative_num_draft_tokens": plan.spec_draft_tokens,
            }
        )
    if s.enable_hierarchical_cache or "hicache_ratio" in out:
        explicit = s.hicache_ratio is not None or s.hicache_size > 0
        if out.get("hicache_ratio") is None:
            out["hicache_ratio"] = 1.2 if s.hicache_host_memory_mode == "buffer_only" else 2.0
        if explicit:
            out["hicache_host_memory_fraction"] = None
    return out
