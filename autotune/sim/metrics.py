"""Prometheus text for `/metrics` with SGLang's metric names (reference §5).

Gauges reflect the scheduler's state as of its last Prefill/Decode log line, as SGLang's do;
counters and histograms are cumulative.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.sim.scheduler import Histogram

if TYPE_CHECKING:
    from autotune.sim.httpapi import ServerState


def _hist(name: str, labels: str, h: Histogram) -> list[str]:
    lines = [f"# HELP {name} Histogram.", f"# TYPE {name} histogram"]
    for edge, count in zip(h.buckets, h.counts, strict=True):
        lines.append(f'{name}_bucket{{{labels},le="{edge}"}} {count}')
    lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {h.n}')
    lines.append(f"{name}_sum{{{labels}}} {h.total}")
    lines.append(f"{name}_count{{{labels}}} {h.n}")
    return lines


def render_metrics(state: ServerState) -> str:
    """Prometheus text with SGLang's metric names (gauges as of the last log line)."""
    st = state.scheduler.stats
    labels = (
        f'model_name="{state.model_name}",engine_type="unified",tp_rank="0",pp_rank="0",'
        'moe_ep_rank="0"'
    )
    gauges = {
        "sglang:num_running_reqs": st.running,
        "sglang:num_used_tokens": st.used_tokens,
        "sglang:token_usage": st.token_usage,
        "sglang:gen_throughput": st.gen_throughput,
        "sglang:num_queue_reqs": st.queued,
        "sglang:cache_hit_rate": st.cache_hit_rate,
        "sglang:max_total_num_tokens": state.plan.max_total_num_tokens or 0,
        "sglang:new_token_ratio": st.new_token_ratio,
        "sglang:num_retracted_reqs": st.retracted,
        "sglang:spec_accept_length": st.spec_accept_length,
        "sglang:utilization": 1.0 if st.running else 0.0,
        "sglang:is_cuda_graph": 1.0 if st.cuda_graph else 0.0,
    }
    lines: list[str] = []
    for name, value in gauges.items():
        lines += [f"# HELP {name} Gauge.", f"# TYPE {name} gauge", f"{name}{{{labels}}} {value}"]
    counters = {
        "sglang:prompt_tokens_total": st.prompt_tokens,
        "sglang:generation_tokens_total": st.generation_tokens,
        "sglang:num_requests_total": st.requests,
        "sglang:cached_tokens_total": st.cached_tokens,
        "sglang:num_aborted_requests_total": st.aborted,
        "sglang:load_back_tokens_total": state.scheduler.cache.loaded_back_total,
        "sglang:backuped_tokens_total": state.scheduler.cache.backed_up_total,
    }
    for name, value in counters.items():
        lines += [
            f"# HELP {name} Counter.",
            f"# TYPE {name} counter",
            f"{name}{{{labels}}} {value}",
        ]
    lines += _hist("sglang:time_to_first_token_seconds", labels, st.ttft)
    lines += _hist("sglang:e2e_request_latency_seconds", labels, st.e2e)
    lines += _hist("sglang:queue_time_seconds", labels, st.queue_time)
    return "\n".join(lines) + "\n"
