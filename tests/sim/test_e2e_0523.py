"""End to end under `--sim-version 0.5.23`: its startup order and text, its deaths, its HTTP shapes
and its graceful stop (exit 0); the same faults under 0.5.9 where the releases differ."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import urllib.error

import pytest

from autotune.sim.gpustate import read_gpu_state
from tests.sim.conftest import KIMI, READY, SMALL, Launcher
from tests.sim.http import get_json, request

pytestmark = pytest.mark.e2e
V23 = ["--sim-version", "0.5.23"]
LLAMA = ["--model-path", "meta-llama/Llama-3.1-70B", "--tp", "8", "--sim-profile",
         "llama-3.1-70b-tp8-h100"]  # fmt: skip


def kimi(fraction: float, *extra: str) -> list[str]:
    return [*KIMI, "--mem-fraction-static", str(fraction), *V23, *extra]


def rank_lines(log: str, rank: int) -> list[str]:
    tag = f" TP{rank}] "
    return [line.split(tag, 1)[1] for line in log.splitlines() if tag in line]


def test_kimi_startup_speaks_0523(launch_sim: Launcher) -> None:
    sim = launch_sim(kimi(0.88), scale=5000)
    sim.wait_ready()
    log = sim.log()
    assert "UserWarning: 'python -m sglang.launch_server' is still supported" in log
    assert "] server_args={'model_path': 'moonshotai/Kimi-K2.5', " in log
    assert "ServerArgs(" not in log and "Init torch distributed" not in log
    tp0 = rank_lines(log, 0)
    order = [
        "Init parallel begin.",
        "Init parallel ends. elapsed=35.00 s",
        "Memory baseline taken. mem usage=0.00 GB",
        "Load weight end. elapsed=420.00 s, type=DeepseekV3ForCausalLM, quant=compressed-tensors, "
        "avail mem=21.71 GB, mem usage=72.33 GB.",
        "Memory baseline taken. mem usage=0.00 GB",
        "Load weight end. elapsed=15.00 s, type=LlamaForCausalLMEagle3, avail mem=21.06 GB, "
        "mem usage=0.65 GB.",
        "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1469",
        "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1469",  # the draft's, MHA
        "Capture target prefill CUDA graph begin. backend=breakable, num_tokens=[4, 8, 12,",
        "Capture target prefill CUDA graph end. elapsed=20.00 s, mem usage=0.08 GB",
        "Capture target verify CUDA graph begin. backend=full, num_tokens_per_req=4,",
        "Capture target verify CUDA graph end. bs=[1, 2, 3, 4, 5, 6, 7, 8, 10,",
        "Capture draft prefill CUDA graph begin. backend=breakable,",
        "Capture draft decode CUDA graph begin. backend=full, num_tokens_per_req=1, bs=[1, 2,",
        "Capture draft extend CUDA graph begin. backend=full, num_tokens_per_req=4, bs=[1, 2,",
        "max_total_num_tokens=1469",
        "Allocating kv hierarchical KV host pool: 683061 tokens, 48.00 GB host memory.",
        "Allocating draft hierarchical KV host pool: 683061 tokens, 0.35 GB host memory.",
    ]
    at = 0
    for want in order:
        at = next(i for i in range(at, len(tp0)) if tp0[i].startswith(want)) + 1
    assert "K size: 0.04 GB, V size: 0.04 GB" in log  # the draft pool in its own geometry
    tp3 = rank_lines(log, 3)
    assert any(line.startswith("Capture draft prefill CUDA graph end.") for line in tp3)
    assert not any("Capture draft decode" in line for line in tp3)  # log_info_on_rank0
    timings = (
        r"\] Engine startup timings \(s\): load_weight=435\.00, kv_cache_allocation=[\d.]+, "
        r"scheduler_e2e=[\d.]+, cuda_graph=\{prefill=20\.00, decode=0\.00, target_verify=95\.00, "
        r"draft_prefill=[\d.]+, draft_decode=[\d.]+, draft_extend=[\d.]+\}, tokenizer_e2e=[\d.]+"
    )
    assert re.search(timings, log) is not None
    assert log.index("Engine startup timings") < log.index("Uvicorn running on")


def test_0523_http_shapes_and_graceful_exit_0(launch_sim: Launcher) -> None:
    sim = launch_sim(kimi(0.88), scale=5000)
    sim.wait_ready()
    info = get_json(f"{sim.base}/server_info")
    assert info["version"] == "0.5.23" and info["frontend"] == "python"
    assert info["launch_command"].startswith("--model-path moonshotai/Kimi-K2.5 --tp 8")
    assert info["cuda_graph_config"]["prefill"]["backend"] == "breakable"
    assert set(info["startup_time"]) == {
        "load_weight", "kv_cache_allocation", "scheduler_e2e", "cuda_graph", "tokenizer_e2e",
    }  # fmt: skip
    [state] = info["internal_states"]
    usage = state["memory_usage"]
    assert set(usage) == {"weight", "kvcache", "startup_available", "token_capacity",
                          "token_capacity_swa", "graph"}  # fmt: skip
    assert list(usage["graph"]) == ["prefill", "decode", "target_verify", "draft_prefill",
                                    "draft_decode", "draft_extend"]  # fmt: skip
    assert usage["graph"]["target_verify"] == pytest.approx(3.699, abs=0.001)
    assert state["world_size"] == 8 and state["disaggregation_mode"] == "null"
    status, raw = request(f"{sim.base}/generate", {"text": "a b c", "sampling_params":
                          {"max_new_tokens": 6}})  # fmt: skip
    assert status == 200
    meta = json.loads(raw)["meta_info"]
    assert list(meta)[:8] == ["id", "finish_reason", "prompt_tokens", "weight_version",
                              "num_retractions", "reasoning_tokens", "completion_tokens",
                              "cached_tokens"]  # fmt: skip
    assert "total_retractions" not in meta and meta["spec_verify_ct"] >= 1
    sim.proc.send_signal(signal.SIGTERM)
    assert sim.wait_exit() == 0
    log = sim.log()
    assert "SIGTERM received. signum=15 frame=None. Draining requests and shutting down..." in log
    assert "Gracefully exiting... Remaining number of requests 0. Remaining requests " \
        "remaining_rids=[]." in log  # fmt: skip
    assert f"kill_process_tree called: parent_pid={sim.proc.pid}, include_parent=False" in log
    assert "Finished server process" in log
    assert all(g.used_bytes == 0 for g in read_gpu_state(sim.gpu_dir))


@pytest.mark.parametrize(
    ("args", "evidence"),
    [
        (kimi(0.5), "ValueError: Loaded weights leave no GPU memory for the KV cache under "
         "--mem-fraction-static=0.5. Raise --mem-fraction-static above 0.777"),
        (kimi(0.88, "--hicache-size", "400"), "ValueError: Not enough host memory available. "
         "Requesting 400.00 GB but only have 261.16 GB free."),
        (kimi(0.97), "Exception: Capture cuda graph failed: CUDA out of memory."),
    ],
    ids=["weights-leave-no-kv", "host-budget-per-rank", "capture-oom"],
)  # fmt: skip
def test_0523_startup_failures(launch_sim: Launcher, args: list[str], evidence: str) -> None:
    sim = launch_sim(args, scale=5000)
    assert sim.wait_exit() == -signal.SIGKILL
    log = sim.log()
    assert evidence in log
    assert "Received sigquit from a child process. It usually means the child failed." in log
    assert f"kill_process_tree called: parent_pid={sim.proc.pid}, include_parent=True" in log
    assert READY not in log


@pytest.mark.parametrize(
    ("version", "code", "evidence"),
    [
        ("0.5.23", 1, "RuntimeError: Rank 0 scheduler died during initialization (exit code: -9). "
         "If exit code is -9 (SIGKILL), a common cause is the OS OOM killer. Run `dmesg -T | "
         "grep -i oom` to check."),
        ("0.5.9", 1, "Rank 0 scheduler is dead. Please check if there are relevant logs."),
    ],
)  # fmt: skip
def test_oom_killer_during_startup(
    launch_sim: Launcher, version: str, code: int, evidence: str
) -> None:
    sim = launch_sim([*SMALL, "--sim-version", version, "--sim-fault", "oom-kill-startup"])
    assert sim.wait_exit() == code
    assert evidence in sim.log()
    assert "Load weight end" not in sim.log()


def test_oom_killer_after_startup_0523_watchdog(launch_sim: Launcher) -> None:
    sim = launch_sim([*SMALL, *V23, "--sim-fault", "oom-kill=0.3"])
    sim.wait_ready()
    assert sim.wait_exit(10) == -signal.SIGKILL
    log = sim.log()
    assert re.search(r"\] Subprocess scheduler_0 \(pid=\d+\) crashed with exit code -9\. "
                     r"Triggering SIGQUIT for cleanup\.\.\.", log)  # fmt: skip
    assert "SIGQUIT received. signum=None, frame=None. It usually means one child failed." in log
    assert all(g.used_bytes == 0 for g in read_gpu_state(sim.gpu_dir))


def test_oom_killer_after_startup_059_stays_up(launch_sim: Launcher) -> None:
    sim = launch_sim([*SMALL, "--sim-fault", "oom-kill=0.2"])
    sim.wait_ready()
    time.sleep(1.0)
    assert sim.proc.poll() is None
    with pytest.raises((TimeoutError, urllib.error.URLError)):
        request(f"{sim.base}/generate", {"text": "a", "sampling_params": {"max_new_tokens": 2}},
                timeout=1.5)  # fmt: skip
    assert "Subprocess scheduler_0" not in sim.log()


def test_post_capture_kv_sizing_on_an_mha_model(launch_sim: Launcher) -> None:
    env = {"SGLANG_ENABLE_POST_CAPTURE_KV_SIZING": "1"}
    sim = launch_sim([*LLAMA, *V23], scale=5000, env=env)
    sim.wait_ready()
    tp0 = rank_lines(sim.log(), 0)
    va = next(line for line in tp0 if line.startswith("KV Cache VA upper bound. dtype: "))
    va_tokens = int(re.findall(r"#tokens: (\d+)", va)[0])
    start = "Post-capture KV sizing: KV cache allocated. dtype: torch.bfloat16"
    final = next(line for line in tp0 if line.startswith(start))
    tokens = int(re.findall(r"#tokens: (\d+)", final)[0])
    assert 0 < tokens <= va_tokens
    assert f"Post-capture KV sizing: full_layer_tokens={tokens}, swa_layer_tokens=0" in tp0
    assert any(line.startswith(f"max_total_num_tokens={tokens},") for line in tp0)
    assert tp0.index(final) > max(i for i, x in enumerate(tp0) if x.startswith("Capture target"))
    sim.kill()
    plain = launch_sim([*LLAMA, *V23], scale=5000)
    plain.wait_ready()
    assert "VA upper bound" not in plain.log() and "Post-capture" not in plain.log()


def test_bad_sim_version_exits_2() -> None:
    proc = subprocess.run([sys.executable, "-m", "autotune.sim", "--model-path", "m",
                           "--sim-version", "0.5.14"], capture_output=True, timeout=30,
                          check=False)  # fmt: skip
    assert proc.returncode == 2
    assert b"argument --sim-version: invalid choice: '0.5.14'" in proc.stderr
