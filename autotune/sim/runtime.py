"""The served server's runtime: one forward's transient memory peak, the OOM rule, step times.

Pure functions of a Profile and the StartupPlan a launch made: the activation peak of one forward
with its run-to-run variation (normal or Student-t, rare spikes, the `[mismatch]` live-context
term) and the exact distribution it draws from, the allocator's growth while serving, whether a
forward OOMs in the memory startup left free, prefill/decode step times and the decode rate;
`predict` puts them next to `memplan.plan_startup` for in-process evaluation. It stands apart
from the startup plan because the scheduler consults it on every forward, long after startup's
arithmetic is done, and the oracle reads it as the serving ground truth. No I/O, no clocks.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from autotune.sim.flags import ServerSettings
from autotune.sim.memplan import plan_startup
from autotune.sim.profiles import Profile
from autotune.sim.startupplan import StartupPlan
from autotune.sim.versions import SglangVersion

CLIP_MAX_NEW_TOKENS = 4096
EAGER_DECODE_FACTOR = 1.25


def transient_peak_gib(
    profile: Profile,
    prefill_tokens: int,
    decode_seqs: int,
    rng: random.Random | None = None,
    live_tokens: int = 0,
) -> float:
    """Activation peak of one forward (GiB per GPU), with run-to-run variation when rng is given.

    With the profile's `[mismatch]`: the peak grows with the batch's live context
    (`live_tokens`, the KV tokens the running requests hold), its variation is Student-t
    (heavy-tailed), and one forward in 1/spike_probability spikes."""
    act = profile.activation
    w = profile.mismatch
    peak = forward_mean_gib(profile, prefill_tokens, decode_seqs, live_tokens)
    if rng is not None and act.variation > 0:
        x = rng.gauss(0.0, 1.0)
        if w.peak_tail_dof > 0:
            dof = w.peak_tail_dof
            x *= math.sqrt((dof - 2.0) / rng.gammavariate(dof / 2.0, 2.0))
        peak *= max(0.0, 1.0 + act.variation * x)
    if rng is not None and w.spike_probability > 0 and rng.random() < w.spike_probability:
        peak *= 1.0 + w.spike_factor
    return peak


def forward_mean_gib(
    profile: Profile, prefill_tokens: int, decode_seqs: int, live_tokens: int = 0
) -> float:
    """The mean peak of one forward (GiB per GPU), the live-context term included."""
    act = profile.activation
    return (
        act.base_gib
        + prefill_tokens * act.prefill_mib_per_token / 1024.0
        + decode_seqs * act.decode_mib_per_seq / 1024.0
        + profile.mismatch.context_mib_per_1k_tokens * live_tokens / 1000.0 / 1024.0
    )


def forward_cdf(
    profile: Profile, prefill_tokens: int, decode_seqs: int, limit_gib: float, live_tokens: int = 0
) -> float:
    """P(one forward's peak ≤ limit_gib): the distribution `transient_peak_gib` draws from
    (normal or Student-t variation, rare spikes)."""
    mean = forward_mean_gib(profile, prefill_tokens, decode_seqs, live_tokens)
    w = profile.mismatch
    p = _multiplier_cdf(profile, limit_gib / mean if mean > 0 else math.inf)
    if w.spike_probability <= 0:
        return p
    spiked = _multiplier_cdf(profile, limit_gib / (mean * (1.0 + w.spike_factor)))
    return (1.0 - w.spike_probability) * p + w.spike_probability * spiked


def _multiplier_cdf(profile: Profile, ratio: float) -> float:
    sigma = profile.activation.variation
    if sigma <= 0 or math.isinf(ratio):
        return 1.0 if ratio >= 1.0 else 0.0
    z = (ratio - 1.0) / sigma
    dof = profile.mismatch.peak_tail_dof
    if dof <= 0:
        return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))
    return student_cdf(z / math.sqrt((dof - 2.0) / dof), dof)


def student_cdf(t: float, dof: int) -> float:
    """Student's t CDF for an integer number of degrees of freedom (Abramowitz & Stegun
    26.7.3–4, closed form)."""
    theta = math.atan(abs(t) / math.sqrt(dof))
    c2 = math.cos(theta) ** 2
    if dof % 2 == 1:
        term = math.cos(theta)
        total = term if dof > 1 else 0.0
        for k in range(1, (dof - 3) // 2 + 1):
            term *= c2 * (2 * k) / (2 * k + 1)
            total += term
        a = 2.0 / math.pi * (theta + math.sin(theta) * total)
    else:
        term, total = 1.0, 1.0
        for k in range(1, (dof - 2) // 2 + 1):
            term *= c2 * (2 * k - 1) / (2 * k)
            total += term
        a = math.sin(theta) * total
    return 0.5 + math.copysign(0.5 * a, t)


def growth_gib(profile: Profile, requests: int) -> float:
    """What the allocator's footprint grew by after serving `requests` requests."""
    return profile.mismatch.growth_mib_per_request * requests / 1024.0


def forward_ooms(plan: StartupPlan, peak_gib: float) -> bool:
    """SGLang OOMs when static memory + this forward's transient peak exceeds the GPU."""
    free = plan.avail_final_gib if plan.avail_final_gib is not None else 0.0
    return peak_gib > free


def prefill_time_s(profile: Profile, extend_tokens: int) -> float:
    """One prefill forward's time for `extend_tokens` new tokens: the profile's base plus a cost per
    token."""
    t = profile.timing
    return (t.prefill_base_ms + extend_tokens * t.prefill_ms_per_token) / 1000.0


def decode_time_s(
    profile: Profile, batch: int, kv_tokens: int = 0, cuda_graph: bool = True
) -> float:
    """One decode step's time for `batch` requests holding `kv_tokens`: base, per sequence and per
    KV token, slower by `EAGER_DECODE_FACTOR` without CUDA graphs."""
    t = profile.timing
    ms = (
        t.decode_base_ms
        + batch * t.decode_ms_per_seq
        + kv_tokens * t.decode_us_per_kv_token / 1000.0
    )
    return ms * (1.0 if cuda_graph else EAGER_DECODE_FACTOR) / 1000.0


def accept_length(profile: Profile, spec: bool) -> float:
    """Tokens a decode step yields per request: the draft's mean accept length with speculative
    decoding, else 1."""
    if not spec or profile.draft is None:
        return 1.0
    return profile.draft.accept_length


def decode_throughput(profile: Profile, batch: int, spec: bool, kv_tokens: int = 0) -> float:
    """Steady decode tokens/s for `batch` running sequences (no prefill interleaved)."""
    return batch * accept_length(profile, spec) / decode_time_s(profile, batch, kv_tokens)


@dataclass(frozen=True)
class Prediction:
    """In-process evaluation of one setting: sizes, the worst transient, and whether it OOMs."""

    plan: StartupPlan
    peak_gib: float
    runtime_oom: bool
    decode_tok_s: float


def predict(
    profile: Profile,
    settings: ServerSettings,
    *,
    prefill_tokens: int | None = None,
    decode_batch: int | None = None,
    seed: int = 0,
    version: SglangVersion | str | None = None,
) -> Prediction:
    """Startup sizes plus the mean worst-case transient for a prefill chunk and a decode batch."""
    plan = plan_startup(profile, settings, seed=seed, version=version)
    chunk = plan.chunked_prefill_size if plan.chunked_prefill_size > 0 else plan.max_prefill_tokens
    tokens = prefill_tokens if prefill_tokens is not None else chunk
    bs = decode_batch if decode_batch is not None else (plan.max_running_requests or 1)
    peak = max(transient_peak_gib(profile, tokens, 0), transient_peak_gib(profile, 0, bs))
    oom = (not plan.ok) or forward_ooms(plan, peak)
    tput = decode_throughput(profile, max(1, bs), plan.spec) if plan.ok else 0.0
    return Prediction(plan, peak, oom, tput)
