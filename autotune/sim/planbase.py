"""The plan's base: every size one SGLang launch settles before its first startup stage.

`base_plan` resolves what the flags leave automatic and what the box gives, per rank: P (the
free memory before weights, each rank's and the MIN over them, with the CUDA context's launch
jitter and what other processes hold), the chunked-prefill size and the decode graphs' max
batch, the prefill graphs' token counts (0.5.23), whether post-capture KV sizing is planned,
--mem-fraction-static (SGLang's automatic choice when not given), the speculative shape and the
bytes per token the pool is sized with. None of it depends on a stage having fitted, so it is
kept apart from `memplan`, which walks the stages in the release's order and owns their
failures; the TP balance check both need (`unbalanced_ranks`, `imbalance_message`) and SGLang's
EnvBool (`env_flag`) live here with the per-rank P they read.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from autotune.sim.flags import ServerSettings
from autotune.sim.profiles import Profile
from autotune.sim.sizing import (
    auto_mem_fraction,
    cell_bytes,
    draft_fold_bytes,
    gpu_class_defaults,
    gpu_total_gib,
    kv_dtype_for,
    prefill_capture_tokens,
)
from autotune.sim.startupplan import StartupPlan
from autotune.sim.versions import SglangVersion

SPEC_DEFAULTS = (3, 1, 4)  # (num_steps, topk, num_draft_tokens) for DeepseekV3-style targets
POST_CAPTURE_ENV = "SGLANG_ENABLE_POST_CAPTURE_KV_SIZING"
IMBALANCE_ENV = "SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK"
FOLDED_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE")


def env_flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    """SGLang's EnvBool: true/1/yes/y or false/0/no/n (anything else: the default)."""
    raw = env.get(name)
    if raw is None:
        return default
    value = raw.lower()
    if value in ("true", "1", "yes", "y"):
        return True
    if value in ("false", "0", "no", "n"):
        return False
    return default


def _jitter(profile: Profile, seed: int) -> float:
    sigma = profile.variation.startup_mib
    if sigma <= 0:
        return 0.0
    return random.Random(seed * 7919 + 17).gauss(0.0, sigma) / 1024.0


def base_plan(
    profile: Profile,
    settings: ServerSettings,
    release: SglangVersion,
    environ: Mapping[str, str],
    *,
    foreign_gib: Sequence[float],
    seed: int,
) -> StartupPlan:
    """The plan before any stage has run, for `release` and the server's environment
    `environ`: P on each rank (less `foreign_gib`, with the launch's jitter for `seed`) and every
    size the flags leave to SGLang's automatic choice."""
    tp = settings.tp_size
    total = gpu_total_gib(profile)
    overhead = profile.hardware.cuda_context_gib + _jitter(profile, seed)
    p_ranks = _free_per_rank(total, overhead, tp, _with_imbalance(profile, tp, foreign_gib))
    chunk, max_bs = _chunk_and_graph_bs(profile, settings, release)
    dtype_name, elem = kv_dtype_for(settings, profile)
    steps, topk, draft_tokens = _spec_shape(profile, settings)
    cell = cell_bytes(profile.attention, tp, elem)
    fold = 0
    if release.fold_draft_cell and settings.speculative_algorithm in FOLDED_ALGORITHMS:
        fold = draft_fold_bytes(
            cell, profile.attention, profile.draft.attention if profile.draft else None
        )
    prefill_tokens = _prefill_tokens(profile, settings, release, chunk)
    post = _post_capture_planned(profile, settings, release, environ, chunk, prefill_tokens)
    base = StartupPlan(
        tp=tp,
        gpu_total_gib=total,
        p_gib=min(p_ranks),
        p_per_rank=p_ranks,
        init_mem_usage_gib=overhead,
        mem_fraction_static=_mem_fraction(
            profile, settings, release, chunk, max_bs, len(prefill_tokens), post
        ),
        mem_fraction_auto=settings.mem_fraction_static is None,
        weights_gib=profile.model.weights_gib * profile.model.weights_tp / tp,
        chunked_prefill_size=chunk,
        max_prefill_tokens=settings.max_prefill_tokens,
        cuda_graph_max_bs=max_bs,
        context_len=settings.context_length or profile.model.context_length,
        page_size=settings.page_size or 1,
        kv_dtype=dtype_name,
        cell_bytes=cell,
        spec=settings.spec,
        version=release.name,
        sizing_cell_bytes=cell + fold,
        post_capture=post,
        prefill_capture_tokens=prefill_tokens,
        spec_steps=steps,
        spec_topk=topk,
        spec_draft_tokens=draft_tokens,
        warnings=() if release.imbalance_raises else _balance_warnings(p_ranks),
    )
    return base


def _with_imbalance(profile: Profile, tp: int, foreign_gib: Sequence[float]) -> list[float]:
    """What other holders take on each rank, the profile's `mismatch.rank_imbalance_gib` on the
    last rank added (TP > 1)."""
    foreign = [foreign_gib[i] if i < len(foreign_gib) else 0.0 for i in range(tp)]
    short = profile.mismatch.rank_imbalance_gib
    if tp > 1 and short > 0:
        foreign[-1] += short
    return foreign


def _free_per_rank(
    total: float, overhead: float, tp: int, foreign_gib: Sequence[float]
) -> tuple[float, ...]:
    """P on each rank: the GPU less the CUDA context and what foreign processes hold there."""
    return tuple(
        total - overhead - (foreign_gib[i] if i < len(foreign_gib) else 0.0) for i in range(tp)
    )


def _balance_warnings(p_ranks: tuple[float, ...]) -> tuple[str, ...]:
    """SGLang's warning when one rank has under 90% of another's free memory."""
    p = min(p_ranks)
    if not any(p < 0.9 * local for local in p_ranks):
        return ()
    worst = max(p_ranks)
    return (
        "The memory capacity is unbalanced. Some GPUs may be occupied by other processes. "
        f"min_per_gpu_memory={p}, local_gpu_memory={worst}, "
        f"local_gpu_memory * 0.9={worst * 0.9}",
    )


def unbalanced_ranks(p_ranks: Sequence[float]) -> tuple[int, ...]:
    """The ranks whose own free memory × 0.9 exceeds the MIN over ranks (0.5.23 raises there)."""
    p = min(p_ranks)
    return tuple(r for r, local in enumerate(p_ranks) if p < local * 0.9)


def imbalance_message(p: float, local: float) -> str:
    """0.5.23 `_check_tp_memory_balance`'s text for one rank."""
    return (
        "The memory capacity is unbalanced. Some GPUs may be occupied by other processes. "
        f"pre_model_load_memory={p}, local_gpu_memory={local}, "
        f"local_gpu_memory * 0.9={local * 0.9}"
    )


def _chunk_and_graph_bs(
    profile: Profile, settings: ServerSettings, release: SglangVersion
) -> tuple[int, int]:
    """(chunked_prefill_size, decode graph max_bs): the flags, else the GPU-class defaults."""
    chunk_default, max_bs_default = gpu_class_defaults(
        profile.hardware.gpu_memory_mib, settings.tp_size, release
    )
    chunk = (
        settings.chunked_prefill_size
        if settings.chunked_prefill_size is not None
        else chunk_default
    )
    if settings.cuda_graph_bs:
        max_bs = max(settings.cuda_graph_bs)
    elif settings.cuda_graph_max_bs is not None:
        max_bs = settings.cuda_graph_max_bs
    else:
        max_bs = max_bs_default
        running = settings.max_running_requests
        if release.cap_graph_bs_by_running and running is not None and max_bs > running:
            max_bs = running
    return chunk, max_bs


def _prefill_tokens(
    profile: Profile, settings: ServerSettings, release: SglangVersion, chunk: int
) -> tuple[int, ...]:
    """The token counts 0.5.23 captures prefill graphs for (empty when none are captured)."""
    if not release.prefill_graphs or settings.prefill_graph_disabled:
        return ()
    if settings.cuda_graph_bs_prefill:
        return tuple(sorted(set(settings.cuda_graph_bs_prefill)))
    max_bs = settings.cuda_graph_max_bs_prefill
    if max_bs is None:
        max_bs = chunk if profile.attention.kind != "mla" else min(8192, chunk)
        if settings.max_total_tokens is not None:
            max_bs = min(max_bs, settings.max_total_tokens)
        if "llama-2" in settings.model_path.lower():
            max_bs = min(max_bs, 4096)
    return prefill_capture_tokens(max_bs)


def _post_capture_planned(
    profile: Profile,
    settings: ServerSettings,
    release: SglangVersion,
    env: Mapping[str, str],
    chunk: int,
    prefill_tokens: Sequence[int],
) -> bool:
    """0.5.23 `post_capture_kv_sizing_planned` for what the simulator models."""
    return (
        release.post_capture_kv_sizing
        and env_flag(env, POST_CAPTURE_ENV, False)
        and profile.attention.kind != "mla"
        and not settings.decode_graph_disabled
        and bool(prefill_tokens)
        and chunk > 0
        and chunk <= max(prefill_tokens)
    )


def _mem_fraction(
    profile: Profile,
    settings: ServerSettings,
    release: SglangVersion,
    chunk: int,
    max_bs: int,
    prefill_sizes: int,
    post_capture: bool,
) -> float:
    """--mem-fraction-static as given, else SGLang's automatic choice."""
    if settings.mem_fraction_static is not None:
        return settings.mem_fraction_static
    return auto_mem_fraction(
        profile.hardware.gpu_memory_mib,
        chunk,
        settings.max_prefill_tokens,
        max_bs,
        settings.tp_size,
        settings.pp_size,
        settings.speculative_algorithm,
        version=release,
        prefill_graph_sizes=prefill_sizes,
        mla=profile.attention.kind == "mla",
        decode_graph=not settings.decode_graph_disabled,
        post_capture=post_capture,
    )


def _spec_shape(profile: Profile, settings: ServerSettings) -> tuple[int, int, int]:
    """(num_steps, eagle_topk, num_draft_tokens) for speculative decoding; zeros without it."""
    if not settings.spec:
        return 0, 0, 0
    steps, topk, draft_tokens = SPEC_DEFAULTS
    if profile.draft is not None:
        d = profile.draft
        steps, topk, draft_tokens = d.num_steps, d.topk, d.draft_tokens
    steps = settings.speculative_num_steps or steps
    topk = settings.speculative_eagle_topk or topk
    if settings.speculative_num_steps or settings.speculative_eagle_topk:
        draft_tokens = steps * topk + 1
    draft_tokens = settings.speculative_num_draft_tokens or draft_tokens
    return steps, topk, draft_tokens
