"""Driving load with `python -m sglang.bench_serving` instead, for users who trust its numbers.

One closed-loop or Poisson phase maps onto one bench_serving run with `--dataset-name random-ids`
(random token ids, so no ShareGPT download and no prompt text; a tokenizer is still needed, from
`--tokenizer` or the model path). Its JSONL output (reference §6) is read into the same `Summary`
the built-in driver produces. Metrics bench_serving does not write (p90 of TTFT/TPOT/ITL, maxima,
error classes, client lag) come back as None or empty. The built-in driver remains the default:
it watches the server while loading; bench_serving only runs to its end or its timeout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from autotune.config.workload import Api, LengthDist, Poisson, Steady, WorkloadSpec
from autotune.errors import ConfigError, HarnessError
from autotune.loadgen.driver import Target
from autotune.loadgen.metrics import Stats, Summary

BACKENDS = {Api.GENERATE: "sglang", Api.COMPLETIONS: "sglang-oai", Api.CHAT: "sglang-oai-chat"}


def _random_len(dist: LengthDist, key: str) -> tuple[int, float]:
    """bench_serving draws uniform integers in [max(int(L*ratio), 1), L]."""
    if dist.kind == "fixed":
        return dist.high, 1.0
    if dist.kind == "uniform":
        return dist.high, dist.low / dist.high
    raise ConfigError(key, f"bench_serving only draws fixed or uniform lengths, not {dist.kind}")


def bench_serving_argv(
    spec: WorkloadSpec,
    phase: Steady | Poisson,
    target: Target,
    output_file: Path,
    *,
    tokenizer: str | None = None,
    num_prompts: int | None = None,
) -> list[str]:
    """The command line for one phase; `num_prompts` defaults to what the phase would send."""
    in_len, in_ratio = _random_len(spec.input_len, "workload.input_len")
    out_len, out_ratio = _random_len(spec.output_len, "workload.output_len")
    if in_ratio != out_ratio:
        raise ConfigError(
            "workload.output_len", "bench_serving uses one range ratio; give both the same min/max"
        )
    argv = [
        sys.executable,
        "-m",
        "sglang.bench_serving",
        "--backend",
        BACKENDS[spec.api],
        "--base-url",
        target.base_url,
        "--dataset-name",
        "random-ids",
        "--random-input-len",
        str(in_len),
        "--random-output-len",
        str(out_len),
        "--random-range-ratio",
        repr(in_ratio),
        "--seed",
        str(spec.seed),
        "--output-file",
        str(output_file),
    ]
    if isinstance(phase, Poisson):
        argv += ["--request-rate", repr(phase.rate), "--max-concurrency", str(phase.max_in_flight)]
        n = num_prompts or max(1, round(phase.rate * phase.duration_s))
    else:
        argv += ["--max-concurrency", str(phase.concurrency)]
        n = num_prompts or phase.max_requests or phase.concurrency * 10
    argv += ["--num-prompts", str(n)]
    if target.model is not None:
        argv += ["--model", target.model]
    if tokenizer is not None:
        argv += ["--tokenizer", tokenizer]
    if not spec.stream:
        argv.append("--disable-stream")
    if not spec.ignore_eos:
        argv.append("--disable-ignore-eos")
    return argv


def summary_from_bench_serving(row: Mapping[str, object]) -> Summary:
    """One line of bench_serving's JSONL output as a `Summary`."""

    def num(key: str) -> float:
        value = row.get(key)
        return float(value) if isinstance(value, int | float) else 0.0

    def opt(key: str) -> float | None:
        value = row.get(key)
        return float(value) if isinstance(value, int | float) else None

    completed = int(num("completed"))

    def stats(name: str, p90: str | None = None) -> Stats | None:
        mean, p50, p99 = opt(f"mean_{name}_ms"), opt(f"median_{name}_ms"), opt(f"p99_{name}_ms")
        if mean is None or p50 is None or p99 is None or completed == 0:
            return None
        return Stats(mean, p50, opt(p90) if p90 else None, p99, None, completed)

    duration = num("duration")
    return Summary(
        duration_s=duration,
        requests=completed,
        completed=completed,
        failed=0,
        unfinished=0,
        error_rate=None,
        errors={},
        total_input_tokens=int(num("total_input_tokens")),
        total_output_tokens=int(num("total_output_tokens")),
        request_throughput=num("request_throughput"),
        input_throughput=num("input_throughput"),
        output_throughput=num("output_throughput"),
        total_throughput=num("total_throughput"),
        ttft_ms=stats("ttft"),
        itl_ms=stats("itl"),
        tpot_ms=stats("tpot"),
        e2e_ms=stats("e2e_latency", "p90_e2e_latency_ms"),
        concurrency=num("concurrency"),
        peak_concurrency=int(num("max_concurrent_requests")),
        max_output_tokens_per_s=int(num("max_output_tokens_per_s")),
        goodput=None,
        good_fraction=None,
        lag_ms=None,
        lagged_fraction=None,
        capped_arrivals=0,
        coordinated_omission=False,
    )


def run_bench_serving(
    argv: list[str], output_file: Path, timeout_s: float, api_key: str | None
) -> Summary:
    """Run bench_serving and read the last line it appended; raises HarnessError if it fails."""
    env = dict(os.environ)
    if api_key:
        env["OPENAI_API_KEY"] = api_key
    try:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        raise HarnessError(f"bench_serving ran past {timeout_s:g} s") from exc
    if proc.returncode != 0 or not output_file.is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise HarnessError(f"bench_serving failed ({tail[0][:200]}); is sglang installed here?")
    lines = [x for x in output_file.read_text().splitlines() if x.strip()]
    return summary_from_bench_serving(json.loads(lines[-1]))
