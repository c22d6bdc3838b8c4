"""Prometheus text for `/metrics` with SGLang's metric names (reference §5).

This module owns only the text format: it takes the plain values it renders (the model name,
the pool size, the scheduler's Stats and the host-cache counters) and knows nothing of the HTTP
server, so the HTTP side depends on it and never the other way round. Gauges reflect the
scheduler's state as of its last Prefill/Decode log line, as SGLang's do; counters and
histograms are cumulative.
"""

from __future__ import annotations

from collections.abc import Mapping

from autotune.sim.scheduler import Histogram, Stats


def render_metrics(
    *,
    model_name: str,
    max_total_num_tokens: int,
    stats: Stats,
    loaded_back_tokens: int,
    backed_up_tokens: int,
) -> str:
    """Prometheus text with SGLang's metric names (gauges as of the last log line)."""
    labels = (
        f'model_name="{model_name}",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"'
    )
    st = stats
    gauges: dict[str, float] = {
        "sglang:num_running_reqs": st.running,
        "sglang:num_used_tokens": st.used_tokens,
        "sglang:token_usage": st.token_usage,
        "sglang:gen_throughput": st.gen_throughput,
        "sglang:num_queue_reqs": st.queued,
        "sglang:cache_hit_rate": st.cache_hit_rate,
        "sglang:max_total_num_tokens": max_total_num_tokens,
        "sglang:new_token_ratio": st.new_token_ratio,
        "sglang:num_retracted_reqs": st.retracted,
        "sglang:spec_accept_length": st.spec_accept_length,
        "sglang:utilization": 1.0 if st.running else 0.0,
        "sglang:is_cuda_graph": 1.0 if st.cuda_graph else 0.0,
    }
    counters: dict[str, float] = {
        "sglang:prompt_tokens_total": st.prompt_tokens,
        "sglang:generation_tokens_total": st.generation_tokens,
        "sglang:num_requests_total": st.requests,
        "sglang:cached_tokens_total": st.cached_tokens,
        "sglang:num_aborted_requests_total": st.aborted,
        "sglang:load_back_tokens_total": loaded_back_tokens,
        "sglang:backuped_tokens_total": backed_up_tokens,
    }
    lines = _scalars("Gauge", "gauge", labels, gauges)
    lines += _scalars("Counter", "counter", labels, counters)
    lines += _hist("sglang:time_to_first_token_seconds", labels, st.ttft)
    lines += _hist("sglang:e2e_request_latency_seconds", labels, st.e2e)
    lines += _hist("sglang:queue_time_seconds", labels, st.queue_time)
    return "\n".join(lines) + "\n"


def _scalars(help_text: str, kind: str, labels: str, values: Mapping[str, float]) -> list[str]:
    lines: list[str] = []
    for name, value in values.items():
        lines += [
            f"# HELP {name} {help_text}.",
            f"# TYPE {name} {kind}",
            f"{name}{{{labels}}} {value}",
        ]
    return lines


def _hist(name: str, labels: str, h: Histogram) -> list[str]:
    lines = [f"# HELP {name} Histogram.", f"# TYPE {name} histogram"]
    for edge, count in zip(h.buckets, h.counts, strict=True):
        lines.append(f'{name}_bucket{{{labels},le="{edge}"}} {count}')
    lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {h.n}')
    lines.append(f"{name}_sum{{{labels}}} {h.total}")
    lines.append(f"{name}_count{{{labels}}} {h.n}")
    return lines
