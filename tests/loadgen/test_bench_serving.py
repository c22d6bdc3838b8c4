"""bench_serving as an alternative driver: its command line and its JSONL read into a Summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.config.workload import Poisson, Steady
from autotune.errors import ConfigError
from autotune.loadgen import Target, workload_from_dict
from autotune.loadgen.bench_serving import bench_serving_argv, summary_from_bench_serving

ROW = {
    "backend": "sglang",
    "duration": 10.0,
    "completed": 100,
    "total_input_tokens": 51200,
    "total_output_tokens": 12800,
    "request_throughput": 10.0,
    "input_throughput": 5120.0,
    "output_throughput": 1280.0,
    "total_throughput": 6400.0,
    "mean_e2e_latency_ms": 900.0,
    "median_e2e_latency_ms": 850.0,
    "std_e2e_latency_ms": 1.0,
    "p90_e2e_latency_ms": 1200.0,
    "p99_e2e_latency_ms": 1500.0,
    "mean_ttft_ms": 50.0,
    "median_ttft_ms": 40.0,
    "std_ttft_ms": 1.0,
    "p99_ttft_ms": 200.0,
    "mean_tpot_ms": 7.0,
    "median_tpot_ms": 6.5,
    "std_tpot_ms": 1.0,
    "p99_tpot_ms": 12.0,
    "mean_itl_ms": 7.0,
    "median_itl_ms": 6.0,
    "std_itl_ms": 1.0,
    "p95_itl_ms": 10.0,
    "p99_itl_ms": 20.0,
    "concurrency": 9.0,
    "max_output_tokens_per_s": 1500.0,
    "max_concurrent_requests": 16,
    "accept_length": None,
}


def test_jsonl_row_becomes_a_summary() -> None:
    s = summary_from_bench_serving(json.loads(json.dumps(ROW)))
    assert (s.completed, s.total_input_tokens, s.total_output_tokens) == (100, 51200, 12800)
    assert s.output_throughput == 1280.0 and s.peak_concurrency == 16
    assert s.ttft_ms is not None and (s.ttft_ms.mean, s.ttft_ms.p50, s.ttft_ms.p99) == (50, 40, 200)
    assert s.ttft_ms.p90 is None
    assert s.e2e_ms is not None and s.e2e_ms.p90 == 1200.0
    json.dumps(s.to_dict(), allow_nan=False)


def test_argv_for_each_phase_kind(tmp_path: Path) -> None:
    spec = workload_from_dict(
        {
            "api": "completions",
            "seed": 9,
            "stream": False,
            "input_len": {"dist": "uniform", "min": 256, "max": 1024},
            "output_len": {"dist": "uniform", "min": 32, "max": 128},
            "phases": [
                {"kind": "steady", "concurrency": 8, "duration_s": 10},
                {"kind": "poisson", "rate": 2.5, "duration_s": 40},
            ],
        }
    )
    steady, poisson = spec.phases
    assert isinstance(steady, Steady) and isinstance(poisson, Poisson)
    out = tmp_path / "o.jsonl"
    argv = bench_serving_argv(spec, steady, Target("http://127.0.0.1:5"), out, tokenizer="t")
    joined = " ".join(argv)
    assert "-m sglang.bench_serving --backend sglang-oai" in joined
    assert "--random-input-len 1024 --random-output-len 128 --random-range-ratio 0.25" in joined
    assert "--max-concurrency 8" in joined and "--disable-stream" in joined
    assert argv[argv.index("--output-file") + 1] == str(out)
    argv = bench_serving_argv(spec, poisson, Target("http://127.0.0.1:5"), out)
    assert argv[argv.index("--request-rate") + 1] == "2.5"
    assert argv[argv.index("--num-prompts") + 1] == "100"


def test_lengths_bench_serving_cannot_draw_are_config_errors(tmp_path: Path) -> None:
    spec = workload_from_dict(
        {
            "input_len": {"dist": "normal", "mean": 100, "std": 10},
            "phases": [{"kind": "steady", "concurrency": 1, "duration_s": 1}],
        }
    )
    phase = spec.phases[0]
    assert isinstance(phase, Steady)
    with pytest.raises(ConfigError, match="fixed or uniform"):
        bench_serving_argv(spec, phase, Target("http://h:1"), tmp_path / "o")
