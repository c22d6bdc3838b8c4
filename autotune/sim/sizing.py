"""SGLang's startup sizing formulas: one function per quantity a launch derives, per release.

Each function is one of SGLang's own computations of a size from the model's geometry and the
flags: the GPU-class defaults, the automatic mem_fraction_static, the KV cache dtype and bytes
per token (0.5.23's EAGLE draft fold included), the K/V split of a pool, HiCache's host bytes per
token, the CUDA-graph batch sizes and prefill token counts, and what the graphs cost. They stand
apart from `memplan`, which decides in what order a release takes these sizes out of GPU memory
and where it fails, because each is a formula on its own that the oracle, the resolved server
args and the tests call one at a time. No I/O, no clocks. GPU figures are GiB (SGLang's "GB").
"""

from __future__ import annotations

from collections.abc import Sequence

from autotune.sim.flags import ServerSettings
from autotune.sim.profiles import Attention, Profile
from autotune.sim.versions import SglangVersion, get_version

GiB = 1 << 30
MiB = 1 << 20


def gpu_total_gib(profile: Profile) -> float:
    """One GPU's total memory in GiB, from the profile's MiB: the capacity torch reports."""
    return profile.hardware.gpu_memory_mib / 1024.0


def resolve_release(
    version: SglangVersion | str | None, profile: Profile | None = None
) -> SglangVersion:
    """The release `version` names, else the profile's `sglang_version`, else 0.5.9."""
    if isinstance(version, SglangVersion):
        return version
    if version is None:
        return get_version(profile.sglang_version if profile is not None else "0.5.9")
    return get_version(version)


def gpu_class_defaults(
    gpu_mem_mib: int, tp: int, version: SglangVersion | str | None = None
) -> tuple[int, int]:
    """(chunked_prefill_size, decode max_bs) from the release's GPU-class table."""
    release = resolve_release(version)
    gib = gpu_mem_mib / 1024.0
    for limit, chunk, small, large in release.gpu_classes:
        if gib < limit:
            return chunk, (small if tp < 4 else large)
    return release.top_class


def auto_mem_fraction(
    gpu_mem_mib: int,
    chunked_prefill_size: int,
    max_prefill_tokens: int,
    cuda_graph_max_bs: int,
    tp: int,
    pp: int = 1,
    spec_algorithm: str | None = None,
    *,
    version: SglangVersion | str | None = None,
    prefill_graph_sizes: int = 0,
    mla: bool = False,
    decode_graph: bool = True,
    post_capture: bool = False,
) -> float:
    """SGLang's automatic mem_fraction_static (0.5.4–0.5.9 and 0.5.23 `memory_hook`)."""
    release = resolve_release(version)
    if post_capture:
        reserved = 1536 + tp * pp / 8 * 1024
        return round((gpu_mem_mib - reserved) / gpu_mem_mib, 3)
    if chunked_prefill_size > 0:
        reserved = 512 + max(chunked_prefill_size, 2048) * 1.5
    else:
        reserved = 512 + max(max_prefill_tokens, 2048) * 1.5
    reserved += (cuda_graph_max_bs * 2 if decode_graph else 0) + tp * pp / 8 * 1024
    if release.prefill_graph_reserve and prefill_graph_sizes:
        reserved += 1.5 * 1024 if mla else prefill_graph_sizes * 8
    if gpu_mem_mib > 60 * 1024:
        reserved = max(reserved, 10240)
    extra = release.spec_reserve_mib.get(spec_algorithm or "", 0)
    reserved += float(extra) if isinstance(extra, int | float) else 0.0
    return round((gpu_mem_mib - reserved) / gpu_mem_mib, 3)


def kv_dtype_for(settings: ServerSettings, profile: Profile) -> tuple[str, int]:
    """(torch dtype name, bytes per element) for --kv-cache-dtype."""
    choice = settings.kv_cache_dtype
    if choice == "auto":
        if profile.model.kv_fp8_checkpoint:
            return "torch.float8_e4m3fn", 1
        choice = profile.model.dtype
    if choice in ("fp8_e4m3",):
        return "torch.float8_e4m3fn", 1
    if choice == "fp8_e5m2":
        return "torch.float8_e5m2", 1
    if choice in ("fp4_e2m1", "nvfp4", "fp4_mx_block16"):
        return "torch.float4_e2m1fn_x2", 0
    if choice in ("float16", "fp16", "half"):
        return "torch.float16", 2
    return "torch.bfloat16", 2


def cell_bytes(att: Attention, tp: int, elem: int) -> int:
    """Bytes of KV per token per GPU (0.5.9 get_cell_size_per_token). elem 0 means fp4."""
    if att.kind == "mla":
        dim = att.kv_lora_rank + att.qk_rope_head_dim
        if elem == 0:
            return (dim * att.layers * 2) // 2 + (dim // 16) * att.layers
        return dim * att.layers * elem
    heads = max(1, att.kv_heads // tp)
    v_dim = att.v_head_dim or att.head_dim
    if elem == 0:
        return heads * (att.head_dim + v_dim) * att.layers
    return heads * (att.head_dim + v_dim) * att.layers * elem


def draft_fold_bytes(target_cell: int, target: Attention, draft: Attention | None) -> int:
    """0.5.23's EAGLE fold: int(cell · L_draft / L_target) added to the target's cell."""
    if draft is None or target.layers <= 0:
        return 0
    return int(target_cell * draft.layers / target.layers)


def kv_split_gib(att: Attention, tp: int, elem: int, rows: int) -> tuple[float, float | None]:
    """(K GiB, V GiB) of an MHA pool of `rows` token rows; (KV GiB, None) for MLA."""
    if att.kind == "mla":
        return rows * cell_bytes(att, tp, elem) / GiB, None
    heads = max(1, att.kv_heads // tp)
    per = max(elem, 1) if elem else 1
    k = rows * heads * att.head_dim * att.layers * per / GiB
    v = rows * heads * (att.v_head_dim or att.head_dim) * att.layers * per / GiB
    return k, v


def host_bytes_per_token(att: Attention, tp: int, elem: int) -> int:
    """HiCache host pool bytes per token per rank (memory_pool_host.py)."""
    elem = max(elem, 1)
    if att.kind == "mla":
        return (att.kv_lora_rank + att.qk_rope_head_dim) * elem * att.layers
    heads = max(1, att.kv_heads // tp)
    return heads * att.head_dim * att.layers * elem * 2


def capture_batch_sizes(
    max_bs: int, spec: bool, req_pool_size: int, explicit: Sequence[int] | None = None
) -> tuple[int, ...]:
    """CUDA-graph batch sizes SGLang captures (0.5.9 server_args + cuda_graph_runner)."""
    if explicit:
        sizes = sorted(set(explicit))
    elif spec:
        sizes = (
            list(range(1, 9))
            + list(range(10, 33, 2))
            + list(range(40, 65, 4))
            + list(range(72, 257, 8))
            + list(range(272, max(max_bs, 272) + 1, 16))
        )
        sizes = [s for s in sizes if s <= max_bs]
    else:
        sizes = [
            1,
            2,
            4,
            8,
            12,
            *range(16, 257, 8),
            *range(272, 512, 16),
            *range(512, max_bs + 1, 32),
        ]
        sizes = [s for s in sizes if s <= max_bs]
    capped = [s for s in sizes if s <= req_pool_size]
    if sizes and max(sizes) > req_pool_size and req_pool_size not in capped:
        capped.append(req_pool_size)
    return tuple(sorted(capped))


def prefill_capture_tokens(max_bs: int) -> tuple[int, ...]:
    """0.5.23 `generate_prefill_cuda_graph_batch_sizes`: the token counts a prefill graph takes."""
    sizes = (
        list(range(4, 33, 4))
        + list(range(48, 257, 16))
        + list(range(288, 513, 32))
        + list(range(576, 1025, 64))
        + list(range(1280, 4097, 256))
        + list(range(4608, max_bs + 1, 512))
    )
    return tuple(s for s in sizes if s <= max_bs)


def _graph_law_gib(
    base_gib: float, mib_per_size: float, mib_per_token: float, sizes: Sequence[int], per: int
) -> float:
    """The CUDA-graph memory law (`profiles.CudaGraph`): a base, a part per captured size and a
    part per token of the largest, `per` tokens to a size; 0 when nothing is captured."""
    if not sizes:
        return 0.0
    return base_gib + mib_per_size * len(sizes) / 1024.0 + mib_per_token * max(sizes) * per / 1024.0


def graph_memory_gib(profile: Profile, sizes: Sequence[int], tokens_per_bs: int) -> float:
    """What the decode CUDA graphs of batch sizes `sizes` cost: a base, a part per captured size and
    a part per token of the largest batch, `tokens_per_bs` tokens per request (more than one for
    a speculative verify)."""
    g = profile.cuda_graph
    return _graph_law_gib(g.base_gib, g.mib_per_size, g.mib_per_token, sizes, tokens_per_bs)


def prefill_graph_memory_gib(profile: Profile, tokens: Sequence[int]) -> float:
    """What 0.5.23's prefill CUDA graphs of token counts `tokens` cost: a base, a part per captured
    count and a part per token of the largest."""
    g = profile.cuda_graph
    return _graph_law_gib(
        g.prefill_base_gib, g.prefill_mib_per_size, g.prefill_mib_per_token, tokens, 1
    )


def draft_graph_memory_gib(profile: Profile, sizes: Sequence[int], steps: int, topk: int) -> float:
    """What the draft model's CUDA graphs cost: a base plus a part per token of the largest batch
    times the draft steps and top-k; 0 without a draft."""
    draft = profile.draft
    if draft is None or not sizes:
        return 0.0
    return draft.graph_base_gib + draft.graph_mib_per_token * max(sizes) * steps * topk / 1024.0
