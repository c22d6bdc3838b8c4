"""Shapes of SGLang logs as they were pasted in public reports, read as SGLang means them.

Each test quotes the report's own lines (hostnames and people's paths left out) and names where
they come from; the semantics of each line are SGLang's source of the release that printed it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.logparse.accounting import build_ledger
from autotune.logparse.events import FAILURE_KINDS, Event, Kind
from autotune.logparse.lines import parse_line, parse_text
from autotune.logparse.outcome import Outcome, Verdict, classify
from autotune.logparse.prefix import split_prefix
from autotune.logparse.serving import summarize
from autotune.review.ledgerview import as_text
from autotune.review.whatif import what_if

LOGS = Path(__file__).parent.parent / "fixtures" / "logs"


def _ledger_json(path: Path) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-m", "autotune", "ledger", "--json", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert isinstance(doc, dict)
    return doc


def _verdict(text: str) -> Verdict:
    """How a log held in one string is read after the fact (no harness facts)."""
    parsed = parse_text(text)
    return classify(parsed.events, None, parsed.batches)


# -- A log collector's prefix before every line ---------------------------------------------------


# `docker logs -t` and `kubectl logs --timestamps` put the time alone before every line
# (sgl-project/sglang#13016, 0.5.5): `2025-11-10T09:50:25.136422568Z Fatal Python error: Aborted`
DOCKER_T = "2025-11-10T09:50:25.136422568Z "


@pytest.mark.parametrize(
    ("line", "timed", "message"),
    [
        # sgl-project/sglang#12827 (0.5.4): a collector's `[ISO time] ` before SGLang's prefix
        (
            "[2025-11-06T02:08:27.716Z] [2025-11-06 02:08:27] Load weight begin. avail "
            "mem=15.12 GB",
            True,
            "Load weight begin. avail mem=15.12 GB",
        ),
        # ... and before a traceback's frame, which has no prefix of SGLang's
        (
            '[2025-11-06T02:08:28.503Z]   File "/sgl/srt/managers/scheduler.py", line 325, in '
            "__init__",
            False,
            '  File "/sgl/srt/managers/scheduler.py", line 325, in __init__',
        ),
        # docker compose's service column (sgl-project/sglang#8186) before a frame and a warning
        (
            'llm0-1  |   File "/sgl/srt/managers/scheduler.py", line 2109, in event_loop_overlap',
            False,
            '  File "/sgl/srt/managers/scheduler.py", line 2109, in event_loop_overlap',
        ),
        (
            "llm0-1  | [W1203 10:00:00.123 CUDAGuardImpl.h:119] Warning: CUDA warning: out of "
            "memory",
            False,
            "[W1203 10:00:00.123 CUDAGuardImpl.h:119] Warning: CUDA warning: out of memory",
        ),
        # the container runtime's line under Kubernetes (sgl-project/sglang#8336) before a frame
        (
            "2025-07-25T07:53:08.217496327+08:00 stdout F   File "
            '"/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 772, in '
            "event_loop_normal",
            False,
            '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 772, in '
            "event_loop_normal",
        ),
        # `docker logs -t`'s time alone (sgl-project/sglang#13016) before a faulthandler line
        (
            DOCKER_T + "Fatal Python error: Segmentation fault",
            False,
            "Fatal Python error: Segmentation fault",
        ),
        # journald before a traceback's exception line
        (
            "Feb 24 12:03:11 gpu-box python3[48300]: ValueError: Out of memory even after "
            "retracting all other requests in the decode batch.",
            False,
            "ValueError: Out of memory even after retracting all other requests in the decode "
            "batch.",
        ),
    ],
)
def test_a_collector_prefix_is_cut_off(line: str, timed: bool, message: str) -> None:
    """SGLang's time is read where it prints one; a line without its prefix has no time (the
    collector's is not SGLang's: a traceback ends at the next line that has one)."""
    time, rank, got_message = split_prefix(line)
    assert (time is not None, rank, got_message) == (timed, "", message)


def test_the_iso_collector_log_of_a_failed_start_reads() -> None:
    """sgl-project/sglang#12827 (DeepSeek-OCR on 0.5.4): every line behind `[ISO time] `; the
    log was refused as not SGLang's."""
    doc = _ledger_json(LOGS / "v0_5_4_collector_iso_prefix.log")
    assert (doc["outcome"], doc["cause"]) == ("startup_error", "scheduler_exception")
    assert doc["p_gib"] == 15.12
    evidence = doc["evidence"]
    assert isinstance(evidence, list)
    assert any("Received sigquit from a child process" in e for e in evidence)


COMPOSE = "llm0-1  | "
COMPOSE_CRASH = [
    # compose's column as in sgl-project/sglang#8186 (0.4.9, Gemma-3), before a serving-loop
    # traceback in the shape 0.4.x prints it (sgl-project/sglang#7547)
    "[2025-07-19 23:29:33] KV Cache is allocated. #tokens: 22095, K size: 5.23 GB, V size: 5.23 GB",
    "[2025-07-19 23:29:33] Memory pool end. avail mem=10.63 GB",
    "[2025-07-19 23:41:02] Scheduler hit an exception: Traceback (most recent call last):",
    '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 2336, in '
    "run_scheduler_process",
    "    scheduler.event_loop_overlap()",
    '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 772, in '
    "event_loop_overlap",
    "    result = self.run_batch(batch)",
    "RuntimeError: CUDA error: an illegal memory access was encountered",
]


@pytest.mark.parametrize("prefix", [COMPOSE, DOCKER_T], ids=["compose", "docker-t"])
def test_a_collector_s_log_keeps_its_traceback(prefix: str) -> None:
    """The frames and the exception line behind compose's column or the runtime's time: the
    crash came from the serving loop, so it is a runtime crash; without them it read as a
    failed start."""
    log = parse_text("\n".join(prefix + line for line in COMPOSE_CRASH))
    assert {e.kind for e in log.events} >= {Kind.SERVING_FRAME, Kind.ERROR}
    verdict = classify(log.events, batches=log.batches)
    assert verdict.outcome is Outcome.CRASH
    torch_warning = parse_line(
        prefix + "[W1203 10:00:00.123 CUDAGuardImpl.h:119] Warning: CUDA warning: out of memory"
    )
    assert isinstance(torch_warning, Event) and torch_warning.kind is Kind.OOM_HANDLED


# -- A hybrid linear-attention model's state pool ----------------------------------------------


def test_the_state_pool_is_not_the_request_table() -> None:
    """Qwen3.5-9B TP2 (public notes of a start on SGLang main, 2026-04): `Mamba Cache is
    allocated` comes between the weights and `Memory pool end`, inside the request table's pool
    (`HybridReqToTokenPool`); the request table read 4.59 GiB, the state pool's 4.48 with it."""
    ledger = build_ledger(parse_text((LOGS / "v0_5_10_qwen35_mamba_tp2.log").read_text()).events)
    assert (ledger.mamba_gib, ledger.req_to_token_gib, ledger.kv_gib) == (4.48, 0.11, 5.00)
    text = as_text(ledger, classify(()), summarize(()))
    assert "Mamba state pool                       4.48 GiB" in text
    table = what_if(ledger)  # the launch's fraction, from a pool that counts the state pool
    assert table is not None and table.fraction == pytest.approx(0.8, abs=0.002)
    assert table.words[0].startswith("The KV pool and the Mamba state pool share what is free")


def test_every_part_of_the_state_pool_counts() -> None:
    """With speculative decoding the line adds the intermediate caches (`mem_cache/memory_pool.py`
    `MambaPool`, 0.5.4–0.5.23); the conv window's was left out. The line of a Qwen3.8-Flash-Next
    start with NEXTN (an issue digest of SGLang 0.5.20.dev, 2026-09)."""
    event = parse_line(
        "[2026-09-15 10:00:00] Mamba Cache is allocated. max_mamba_cache_size: 48, conv_state "
        "size: 0.10GB, ssm_state size: 2.58GB intermediate_ssm_state_cache size: 1.05GB "
        "intermediate_conv_window_cache size: 0.02GB "
    )
    assert isinstance(event, Event) and event.kind is Kind.MAMBA_ALLOCATED
    assert event.values["gib"] == pytest.approx(3.75)


# -- SGLANG_LOGGING_CONFIG_PATH with the format of SGLang's own example ---------------------------


def test_the_example_logging_config_s_lines_read_with_their_process_as_the_rank() -> None:
    """fastrl's SGLang (mit-han-lab/fastrl#4, 2025-12) logs through the config SGLang's
    sgl-project/sglang#4592 gives as the example for SGLANG_LOGGING_CONFIG_PATH; such a log was
    refused as not SGLang's."""
    log = parse_text(
        "2025-12-04 20:34:02 INFO 147907 [scheduler_metrics_mixin.py:287] Decode batch. "
        "#running-req: 48, #token: 3894, token usage: 0.00, accept len: 1.00, accept rate: 0.11, "
        "cuda graph: True, gen throughput (token/s): 6138.60, #queue-req: 0, \n"
    )
    (batch,) = log.batches
    assert (batch.rank, batch.running, batch.accept_len, batch.cuda_graph) == (
        "PID147907",
        48,
        1.0,
        True,
    )
    assert batch.time is not None


def test_the_ranks_of_a_custom_logging_config_stay_apart() -> None:
    """`configure_logger` applies the config and returns before it adds the rank prefix, so a
    TP2 start's two `Load weight end` lines differ only in their process: read as one rank they
    would be the target's weights and a draft's. The lines are kt-sglang's TP2 DeepSeek start
    (kvcache-ai/ktransformers#1804) in the example config's format."""
    head = "2026-01-23 09:10:36 INFO {pid} [model_runner.py:712] "
    lines = [
        (1201, "Load weight begin. avail mem=46.86 GB"),
        (1202, "Load weight begin. avail mem=46.86 GB"),
        (
            1201,
            "Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, avail mem=33.80 "
            "GB, mem usage=13.06 GB.",
        ),
        (
            1202,
            "Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, avail mem=33.80 "
            "GB, mem usage=13.06 GB.",
        ),
        (1201, "KV Cache is allocated. #tokens: 10000, KV size: 0.65 GB"),
        (1201, "Memory pool end. avail mem=33.08 GB"),
        (1202, "KV Cache is allocated. #tokens: 10000, KV size: 0.65 GB"),
        (1202, "Memory pool end. avail mem=30.11 GB"),
    ]
    log = parse_text("\n".join(head.format(pid=pid) + text for pid, text in lines))
    ledger = build_ledger(log.events)
    assert (ledger.ranks, ledger.weights_gib, ledger.draft_weights_gib) == (2, 13.06, None)
    assert (ledger.kv_gib, ledger.avail_after_pool_gib) == (0.65, 30.11)


# -- A draft that captures through the target's decode path ------------------------------------


def test_a_draft_s_verify_graph_is_the_draft_s() -> None:
    """DeepSeek-V4-Flash with a DSpark draft (a public run log, SGLang main 2026-09): the draft
    worker captures through `capture_decode_graph` (`model_executor/model_runner_components/
    cuda_graph_setup.py`), which names it `draft verify` and books its memory as draft_decode, as
    the startup timings' `draft_decode=4.26` shows; it was counted as the target's decode graph."""
    log = parse_text(
        "[2026-09-11 23:46:30 TP0 EP0] Capture target verify CUDA graph begin. backend=full, "
        "num_tokens_per_req=6, bs=[1, 2, 3, 4], avail mem=8.20 GB\n"
        "[2026-09-11 23:46:44 TP0 EP0] Capture target verify CUDA graph end. elapsed=13.48 s, "
        "mem usage=0.58 GB, avail mem=7.62 GB.\n"
        "[2026-09-11 23:46:44 TP0 EP0] Capture draft verify CUDA graph begin. backend=full, "
        "num_tokens_per_req=5, bs=[1, 2, 3, 4], avail mem=7.67 GB\n"
        "[2026-09-11 23:46:49 TP0 EP0] Capture draft verify CUDA graph end. elapsed=4.26 s, "
        "mem usage=-0.01 GB, avail mem=7.68 GB.\n"
    )
    ledger = build_ledger(log.events)
    assert ledger.graph_phases == {"target_verify": 0.58, "draft_decode": -0.01}
    assert (ledger.graph_gib, ledger.draft_graph_gib, ledger.graph_max_bs) == (0.58, -0.01, 4)


CRI_CRASH = [
    # kubelet's pod log of a TP rank (sgl-project/sglang#8336, MTP on 0.4.9): the container
    # runtime's time, stream and tag before every line, SGLang's prefix after it where it has one
    "2025-07-25T07:53:08.21748708+08:00 stdout F [2025-07-25 07:53:08 TP2] Scheduler hit an "
    "exception: Traceback (most recent call last):",
    "2025-07-25T07:53:08.217488644+08:00 stdout F   File "
    '"/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 2769, in '
    "run_scheduler_process",
    "2025-07-25T07:53:08.217491295+08:00 stdout F     scheduler.event_loop_normal()",
    "2025-07-25T07:53:08.217496327+08:00 stdout F   File "
    '"/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 772, in '
    "event_loop_normal",
    "2025-07-25T07:53:08.217497393+08:00 stdout F     result = self.run_batch(batch)",
]


def test_a_kubernetes_pod_log_keeps_its_traceback() -> None:
    """The frames behind the container runtime's prefix show the serving loop, so the
    exception is a crash while serving; without them it read as a failed start."""
    log = parse_text("\n".join(CRI_CRASH))
    assert Kind.SERVING_FRAME in {e.kind for e in log.events}
    verdict = classify(log.events, batches=log.batches)
    assert verdict.outcome is Outcome.CRASH


# -- A speculative draft's own memory profile ------------------------------------------------------

# SGLang's docs notebook `speculative_decoding` (EAGLE, `--max-total-tokens` unset, run
# 2026-02-11, output committed with the docs; log level warning): after the target's graphs the
# draft profiles the memory again, finds nothing left and says so; the release then sizes the
# draft's pool from the target's (`model_runner_kv_cache_mixin.py` `init_memory`:
# `max_total_num_tokens = draft_runner_cache_size`) and the server answered its request.
_DRAFT_PROFILE = """\
Capturing batches (bs=1 avail_mem=47.13 GB): 100%|██████████| 4/4 [00:41<00:00, 10.46s/it]
[2026-02-11 06:44:58] SPECULATIVE_MOE_RUNNER_BACKEND is not initialized, using auto backend
Loading pt checkpoint shards: 100% Completed | 1/1 [00:01<00:00,  1.39s/it]
[2026-02-11 06:45:01] max_total_tokens=20480 is larger than the profiled value -89624. Use the \
profiled value instead.
Capturing batches (bs=4 avail_mem=1.85 GB):  25%|██▌       | 1/4 [00:05<00:16,  5.51s/it]
Capturing batches (bs=1 avail_mem=53.94 GB): 100%|██████████| 4/4 [00:11<00:00,  2.88s/it]
"""


def test_a_draft_s_negative_profile_after_the_target_s_graphs_is_not_a_failure() -> None:
    parsed = parse_text(_DRAFT_PROFILE)
    kinds = [e.kind for e in parsed.events]
    assert Kind.NO_KV_ROOM not in kinds
    assert Kind.KV_CAP_IGNORED in kinds
    verdict = classify(parsed.events, None, parsed.batches)
    assert verdict.outcome is Outcome.UNKNOWN


def test_the_target_s_negative_profile_still_ends_the_start() -> None:
    # sgl-project/sglang#7691 (0.4.8.post1, ROCm, DP attention): the target's own profile, before
    # any pool; 0.4.8's `init_memory_pool` raises `Not enough memory` right after it
    text = (
        "[2025-07-02 07:41:58 DP0 TP0] Load weight end. type=DeepseekV3ForCausalLM, "
        "dtype=torch.bfloat16, avail mem=21.73 GB, mem usage=166.59 GB.\n"
        "[2025-07-02 07:41:59 DP0 TP0] max_total_tokens=131072 is larger than the profiled "
        "value -561981. Use the profiled value instead.\n"
    )
    verdict = _verdict(text)
    assert (verdict.outcome, verdict.cause) == (Outcome.STARTUP_OOM, "no_kv_room")


# -- The barrier after the weights load ----------------------------------------------------------

# sgl-project/sglang#5602 (0.4.5.post1, TP4): Gloo's monitored barrier names the rank it waited
# on; kvcache-ai/ktransformers#1666 (SGLang inside, TP4): SGLang's own ValueError from
# `ModelRunner.load_model` (0.5.23: `load_model_utils.dist_barrier_after_load`, 480 s)
_LOAD_BARRIER = """\
[2025-04-21 04:13:43] Received sigquit from a child process. It usually means the child failed.
[rank3]:[E421 04:13:43.426633564 ProcessGroupGloo.cpp:143] Rank 3 successfully reached \
monitoredBarrier, but received errors while waiting for send/recv from rank 0. Please check rank \
0 logs for faulty rank.
[2025-12-04 07:44:24 TP2] Scheduler hit an exception: Traceback (most recent call last):
  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/model_executor/model_runner.py", \
line 849, in load_model
    raise ValueError(
ValueError: TP rank 1 could finish the model loading, but there are other ranks that didn't \
finish loading. It is likely due to unexpected failures (e.g., OOM) or a slow node.
"""


def test_a_rank_that_loaded_and_timed_out_at_the_barrier_waited_on_a_peer() -> None:
    """The rank that prints it loaded its weights; a slow or vanished peer is no setting's
    result (it read as `startup_error`, a parameter result, before)."""
    for text in (_LOAD_BARRIER, "\n".join(_LOAD_BARRIER.splitlines()[2:])):
        verdict = _verdict(text)
        assert (verdict.outcome, verdict.cause) == (Outcome.HANG, "load_barrier")
        assert not verdict.outcome.is_parameter_result


def test_a_peer_s_own_oom_explains_the_barrier() -> None:
    text = _LOAD_BARRIER + (
        "[2025-12-04 07:44:20 TP0] Scheduler hit an exception: Traceback (most recent call "
        "last):\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB.\n"
    )
    verdict = _verdict(text)
    assert verdict.outcome is Outcome.STARTUP_OOM


# -- The pools' leak check -------------------------------------------------------------------------


def test_the_pools_leak_check_is_a_crash_while_serving() -> None:
    """sgl-project/sglang#6888 (0.4.6): the check runs only in the event loop, once requests have
    freed their slots (0.5.23: `InvariantChecker._report_leak` through `raise_error_or_warn`, a
    ValueError by default); it read as a failed start."""
    text = (
        "ValueError: token_to_kv_pool_allocator memory leak detected! available_size=3189424, "
        "protected_size=0, self.max_total_num_tokens=3185200\n"
        "self.token_to_kv_pool_allocator.available_size()=2864304\n"
        "[2025-06-06 01:56:27] Received sigquit from a child process. It usually means the child "
        "failed.\n"
    )
    verdict = _verdict(text)
    assert (verdict.outcome, verdict.cause) == (Outcome.CRASH, "memory_leak_check")
    # with the strict check off it is a warning, and the server serves on
    warned = parse_line(
        "[2025-06-06 01:56:27 TP0] token_to_kv_pool_allocator memory leak detected! "
        "available_size=3189424, protected_size=0, self.max_total_num_tokens=3185200"
    )
    assert warned is None or warned.kind not in FAILURE_KINDS


def test_a_log_pasted_without_its_times_keeps_its_ranks_and_frames() -> None:
    """sgl-project/sglang#26265: `[TP0] Scheduler hit an exception: …` with the time cut from
    SGLang's prefix; the serving loop's frames (`event_loop_overlap` down to the pool's
    `alloc_paged_token_slots_extend`) went unread and the log read as no ready line. The excerpt
    ends at the allocator's frame, whose only raise is `Prefill out of memory` (what the report
    says happened): the frame names the pool that ran out."""
    frames = [
        '  File ".../sglang/srt/managers/scheduler.py", line 1702, in event_loop_overlap',
        "    batch = self.get_next_batch_to_run()",
        '  File ".../sglang/srt/mem_cache/common.py", line 412, in alloc_paged_token_slots_extend',
    ]
    text = "[TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
    text += "\n".join(frames) + "\n"
    assert split_prefix("[DP0 TP0 EP0] Load weight end.") == (
        None,
        "DP0 TP0 EP0",
        "Load weight end.",
    )
    assert split_prefix("[TP] x")[1] == ""
    verdict = _verdict(text)
    assert (verdict.outcome, verdict.cause) == (Outcome.RUNTIME_OOM, "prefill_oom")
    assert verdict.evidence[0] == frames[-1].strip()
    assert "Scheduler hit an exception" in verdict.evidence[1]


@pytest.mark.parametrize(
    ("message", "outcome", "cause"),
    [
        ("", Outcome.RUNTIME_OOM, "prefill_oom"),
        (
            "RuntimeError: Prefill out of memory. Try to lower your batch size.",
            Outcome.RUNTIME_OOM,
            "prefill_oom",
        ),
        # a message of its own, raised below the allocator's frame: the message decides
        (
            "RuntimeError: CUDA error: an illegal memory access was encountered",
            Outcome.CRASH,
            "error",
        ),
    ],
)
def test_an_allocator_frame_names_the_pool_only_where_the_message_is_cut(
    message: str, outcome: Outcome, cause: str
) -> None:
    text = (
        "[2026-01-02 10:00:00 TP0] Scheduler hit an exception: Traceback (most recent call "
        "last):\n"
        '  File ".../sglang/srt/managers/scheduler.py", line 1702, in event_loop_overlap\n'
        '  File ".../sglang/srt/mem_cache/allocation.py", line 238, in '
        "alloc_paged_token_slots_decode\n"
        + (message.replace("Prefill", "Decode") + "\n" if message else "")
    )
    verdict = _verdict(text)
    want = cause.replace("prefill", "decode")
    assert (verdict.outcome, verdict.cause) == (outcome, want)


# -- Google Cloud Logging's export, a Ray actor's prefix -------------------------------------------

# sgl-project/sglang#28702 (TP8): every line behind the severity and the receive time, the frames'
# indentation gone; the traceback's frames (TP7's) show the serving loop
_CLOUD_LOGGING = """\
ERROR 2026-06-15T14:10:59.392125190Z AssertionError: Committed KV cache already freed \
(self.kv_committed_len=1)
ERROR 2026-06-15T14:10:59.392128409Z [2026-06-15 14:10:59 TP7] Scheduler hit an exception: \
Traceback (most recent call last):
ERROR 2026-06-15T14:10:59.392130317Z File "/sgl-workspace/sglang/python/sglang/srt/managers/\
scheduler.py", line 2704, in run_scheduler_process
ERROR 2026-06-15T14:10:59.392132236Z scheduler.event_loop_overlap()
ERROR 2026-06-15T14:10:59.392141727Z File "/sgl-workspace/sglang/python/sglang/srt/managers/\
scheduler.py", line 1024, in event_loop_overlap
ERROR 2026-06-15T14:10:59.392143362Z batch = self.get_next_batch_to_run()
"""


def test_a_cloud_logging_export_keeps_its_traceback() -> None:
    """It read as a failed start with only the generic scheduler line as evidence."""
    assert Kind.SERVING_FRAME in {e.kind for e in parse_text(_CLOUD_LOGGING).events}
    verdict = _verdict(_CLOUD_LOGGING)
    assert verdict.outcome is Outcome.CRASH
    assert "AssertionError: Committed KV cache already freed" in verdict.evidence[0]
    oom = _CLOUD_LOGGING.replace(
        "AssertionError: Committed KV cache already freed (self.kv_committed_len=1)",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
    )
    assert _verdict(oom).outcome is Outcome.RUNTIME_OOM


@pytest.mark.parametrize(
    "prefix", ["(SGLangEngine pid=206831) ", "(WorkerDict pid=1834, ip=10.0.0.12) "]
)
def test_a_ray_actor_s_prefix_is_cut_off(prefix: str) -> None:
    """A LoRA launch under Ray (public notes, gpt-oss-20b, 2026-02): the exception line behind
    the actor's prefix is the evidence, not the generic scheduler line."""
    frame = '  File "/root/sglang/python/sglang/srt/managers/scheduler.py", line 3116, in x'
    assert split_prefix(prefix + frame) == (None, "", frame)
    text = (
        f"{prefix}[2026-02-26 12:02:18] Scheduler hit an exception: Traceback (most recent call "
        f"last):\n{prefix}{frame}\n"
        f"{prefix}AttributeError: 'FusedMoE' object has no attribute 'w13_weight'\n"
    )
    verdict = _verdict(text)
    assert verdict.outcome is Outcome.STARTUP_ERROR
    assert "AttributeError" in verdict.evidence[0]


# -- An excerpt that begins at the draft's load ----------------------------------------------------

# sgl-project/sglang#40558 (GLM-5 FP8 with its MTP layer, TP4, 2026): the excerpt begins after the
# target's load; the first `Load weight end` of each rank is the NextN draft's
_DRAFT_FIRST = """\
[2026-09-21 13:38:18 TP3] Load weight end. elapsed=3.86 s, \
type=Glm5NextForConditionalGenerationNextN, quant=fp8, fmt=e4m3, avail mem=16.18 GB, \
mem usage=2.39 GB.
[2026-09-21 13:38:18 TP1] Load weight end. elapsed=3.96 s, \
type=Glm5NextForConditionalGenerationNextN, quant=fp8, fmt=e4m3, avail mem=16.20 GB, \
mem usage=2.39 GB.
"""


def test_a_draft_s_load_is_the_draft_s_where_the_excerpt_begins_with_it() -> None:
    """It was read as the model's weights (2.39 GiB) and the model class as the draft's."""
    ledger = build_ledger(parse_text(_DRAFT_FIRST).events)
    assert (ledger.weights_gib, ledger.draft_weights_gib) == (None, 2.39)
    assert ledger.model_type is None


@pytest.mark.parametrize(
    "line",
    [
        # sgl-project/sglang PR #29853 (Grok-2, TP16, 2026): `cuda_graph_setup.py`
        "[2026-07-01 15:19:55 TP5] Disable prefill CUDA graph because cuda_graph_config resolved "
        "prefill.backend='disabled' (e.g. via --cuda-graph-backend-prefill=disabled or "
        "auto-disable rules).",
        # the same: `mem_cache/registry.py`
        "[2026-07-01 15:19:55 TP5] Tree cache initialized: source=default impl=ChunkCache "
        "hybrid_swa=False hybrid_ssm=False hierarchical=False streaming_wrapped=False",
        # sgl-project/sglang#40558: `mem_cache/kv_cache_configurator.py`
        "[2026-09-21 13:38:19 TP0] Reserving 0.10 GB of the KV budget for post-sizing multimodal "
        "allocations (feature-transport pools + embedding cache).",
    ],
)
def test_a_line_0_5_9_never_prints_reads_the_later_rules(line: str) -> None:
    """An excerpt without a version line was read with 0.5.9's rules (the draft out of the
    reserve) though it holds a line 0.5.9 does not print; its rank counts too."""
    kv = (
        "[2026-07-01 15:19:55 TP10] KV Cache is allocated. #tokens: 387968, K size: 5.92 GB, "
        "V size: 5.92 GB"
    )
    ledger = build_ledger(parse_text(line + "\n" + kv).events)
    assert ledger.semantics == "0.5.18"
    assert ledger.ranks == 2
    assert build_ledger(parse_text(kv).events).semantics == "0.5.9"


# -- Tracebacks through the steps that build a batch, the overlap worker's thread ------------------


def test_a_traceback_through_0_5_18_s_event_loop_is_a_crash_while_serving() -> None:
    """sgl-project/sglang#40797 (0.5.17, docker compose): a multimodal request's token mismatch
    ends the scheduler inside `run_event_loop` → `dispatch_event_loop`, which 0.5.23's
    `run_scheduler_process` calls only after the scheduler sent its init info; it read as a
    failed start."""
    text = (
        "sglang_service-1  | [2026-09-15 13:53:07 TP0] Scheduler hit an exception: Traceback "
        "(most recent call last):\n"
        'sglang_service-1  |   File "/sgl-workspace/sglang/python/sglang/srt/managers/'
        'scheduler.py", line 4947, in run_scheduler_process\n'
        "sglang_service-1  |     scheduler.run_event_loop()\n"
        'sglang_service-1  |   File "/sgl-workspace/sglang/python/sglang/srt/managers/'
        'scheduler.py", line 1662, in run_event_loop\n'
        "sglang_service-1  |     dispatch_event_loop(self)\n"
    )
    verdict = _verdict(text)
    assert verdict.outcome is Outcome.CRASH, verdict


def test_a_grammar_queue_s_index_error_is_a_crash_while_serving() -> None:
    """sgl-project/sglang#6229 (0.4.x): the frame pasted without its indentation; the grammar
    queue is read when a prefill batch is built from the requests received (0.5.23:
    `grammar_manager.get_ready_grammar_requests` from `_get_new_batch_prefill_raw`)."""
    text = (
        "[TP1] Scheduler hit an exception:\n"
        "IndexError: list index out of range\n"
        'File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 1761, in '
        "move_ready_grammar_requests\n"
        "self.grammar_queue[i].grammar = self.grammar_queue[i].grammar.result()\n"
    )
    assert _verdict(text).outcome is Outcome.CRASH


def test_the_overlap_worker_s_exception_is_a_failure_line() -> None:
    """sgl-project/sglang#6027 (0.4.x, DP attention): the overlap worker's thread logs
    `TpModelWorkerClient hit an exception` and signals its scheduler (`tp_worker_overlap_thread.py`
    `forward_thread_func`); the line read as nothing, and the log as a start without its ready
    line."""
    text = (
        "[2025-07-07 19:00:30 DP4 TP4] TpModelWorkerClient hit an exception: Traceback (most "
        "recent call last):\n"
        '  File "/sgl-workspace/sglang/python/sglang/srt/managers/tp_worker_overlap_thread.py", '
        "line 127, in forward_thread_func\n"
        "    self.forward_thread_func_()\n"
        '  File "/sgl-workspace/sglang/python/sglang/srt/managers/tp_worker.py", line 212, in '
        "forward_batch_generation\n"
        "    logits_output, can_run_cuda_graph = self.model_runner.forward(\n"
    )
    verdict = _verdict(text)
    assert (verdict.outcome, verdict.cause) == (Outcome.CRASH, "scheduler_exception"), verdict


# -- An excerpt that begins after `Load weight begin` ----------------------------------------------


def test_the_free_memory_before_the_weights_is_their_usage_and_what_they_left() -> None:
    """SemiAnalysisAI/InferenceX#2128 (DeepSeek-V4, 0.5.x): the excerpt starts at `Load weight
    end`, whose `mem usage=` is the free memory before the load less after it (`model_runner.py`
    `load_model`), so P is the sum: 12.25 + 125.65."""
    text = (
        "[2026-07-01 10:00:00 TP0] Load weight end. quant=fp8, fmt=e4m3, avail mem=12.25 GB, "
        "mem usage=125.65 GB.\n"
        "ValueError: Loaded weights leave no GPU memory for the KV cache under "
        "--mem-fraction-static=0.88.\n"
    )
    parsed = parse_text(text)
    ledger = build_ledger(parsed.events, parsed.batches)
    assert (ledger.p_gib, ledger.weights_gib, ledger.avail_after_weights_gib) == (
        137.9,
        125.65,
        12.25,
    )
    verdict = _verdict(text)
    assert (verdict.outcome, verdict.cause) == (Outcome.STARTUP_OOM, "no_kv_room")


# -- 0.2.x-0.3.x process loops, a Ray worker's prefix, a capture that failed without OOM --------


def test_an_exception_in_run_tp_server_is_the_scheduler_s() -> None:
    """sgl-project/sglang#1479 (0.3.x, DeepSeek-V2.5 TP8): `tp_worker.run_tp_server` logs
    `Exception in run_tp_server:` and the traceback, then raises; here inside graph capture
    (before: unknown, the line matched nothing and the bare `…Error:` counts for no signal)."""
    text = (
        "[23:17:01 TP0] Capture cuda graph begin. This can take up to several minutes.\n"
        "[23:17:08 TP4] Exception in run_tp_server:\n"
        "Traceback (most recent call last):\n"
        '  File "/sgl-workspace/sglang/python/sglang/srt/model_executor/cuda_graph_runner.py", '
        "line 147, in __init__\n"
        "    self.capture()\n"
    )
    verdict = _verdict(text)
    assert (verdict.outcome, verdict.cause) == (Outcome.STARTUP_ERROR, "scheduler_exception")
    assert verdict.evidence[0] == "[23:17:08 TP4] Exception in run_tp_server:"


def test_a_failure_inside_get_model_worker_batch_is_while_serving() -> None:
    """verl-project/verl#1611 (0.4.6 under Ray, each line behind `(WorkerDict pid=N) `): an
    illegal memory access in `ScheduleBatch.get_model_worker_batch`, which only `run_batch`
    calls, so the server was serving: a crash, not a start that failed."""
    ray = "(WorkerDict pid=859188) "
    text = (
        f"{ray}    model_worker_batch = batch.get_model_worker_batch()\n"
        f'{ray}  File "/opt/ac2/lib/python3.12/site-packages/sglang/srt/managers/'
        'schedule_batch.py", line 1602, in get_model_worker_batch\n'
        f"{ray}    seq_lens_cpu = self.seq_lens.cpu()\n"
        f"{ray}RuntimeError: CUDA error: an illegal memory access was encountered\n"
        f"{ray}[2025-05-23 18:02:42] Received sigquit from a child process. It usually means the "
        "child failed.\n"
    )
    assert _verdict(text).outcome is Outcome.CRASH


# -- What an allocator's out-of-memory message says on its next lines ----------------------------


def test_a_hybrid_prefill_oom_keeps_the_pools_it_found_empty_in_its_evidence() -> None:
    """sgl-project/sglang#34676 (0.5.16, Kimi-K3, hybrid Mamba with radix cache): the allocator's
    message goes on for lines without a prefix (`mem_cache/allocation.py`: `Try to allocate N
    tokens.`, then `available_and_evictable_str`: the full pool's `Available full tokens: …` and
    a line for each other component, `Available mamba: …`); they show which pool had no room and
    were left out of the evidence."""
    text = (
        "RuntimeError: Prefill out of memory. Try to lower your batch size.\n"
        "Try to allocate 8192 tokens.\n"
        "Available full tokens: 8070656 (full_available_size=7936 + full_evictable_size_=8062720)\n"
        "Available mamba: 760 (available_size=57 + component_evictable_size_=703)\n"
        "[2026-08-13 10:00:00] SIGQUIT received. signum=None, frame=None. It usually means one "
        "child failed.\n"
    )
    verdict = _verdict(text)
    assert (verdict.outcome, verdict.cause) == (Outcome.RUNTIME_OOM, "prefill_oom"), verdict
    assert verdict.evidence[:4] == tuple(text.splitlines()[:4])
    assert verdict.evidence[4].endswith("It usually means one child failed.")


@pytest.mark.parametrize(
    "detail",
    [
        "Available tokens: 4210 (available_size=4210 + evictable_size=0)",
        "SWA available tokens: 512 (swa_available=0 + swa_evictable=512)",
    ],
)
def test_the_logged_oom_message_s_lines_follow_its_first(detail: str) -> None:
    """The same message as the scheduler logs it before raising (`logger.error(error_msg)`): the
    prefix on its first line only; the base pool's and a pure-SWA cache's shapes of the pool
    line (`BasePrefixCache` and `PureSWARadixCache.available_and_evictable_str`, 0.5.23)."""
    text = (
        "[2026-11-20 15:23:22 TP0] Decode out of memory. Try to lower your batch size.\n"
        "Try to allocate 192 tokens.\n"
        f"{detail}\n"
        "[2026-11-20 15:23:22 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
    )
    verdict = _verdict(text)
    assert (verdict.outcome, verdict.cause) == (Outcome.RUNTIME_OOM, "decode_oom"), verdict
    assert verdict.evidence[:3] == tuple(text.splitlines()[:3])


def test_the_allocator_s_lines_alone_are_no_failure() -> None:
    """Without the out-of-memory line above them they decide nothing."""
    text = "Try to allocate 64 tokens.\nAvailable tokens: 0 (available_size=0 + evictable_size=0)\n"
    assert not [e for e in parse_text(text).events if e.kind in FAILURE_KINDS]
    assert _verdict(text).outcome is Outcome.UNKNOWN


# -- 0.3.x-0.4.0's subprocesses log their fatal traceback bare -------------------------------------


def test_a_traceback_logged_with_sglang_s_prefix_is_the_scheduler_s_death() -> None:
    """sgl-project/sglang#2102 (0.3.x, November 2024): `run_scheduler_process` (and the
    detokenizer's and the data-parallel controller's) caught the exception, logged
    `get_exception_traceback()` alone with `logger.error` and killed its parent; the prefixed
    `Traceback (most recent call last):` is that line (0.4.1 put `Scheduler hit an exception: `
    before it). Read as nothing, the bare `RuntimeError:` decided nothing and the log was
    `unknown`. FlashInfer's fixed workspace ran out, not the GPU: a crash, no OOM."""
    text = (
        "[2024-11-20 16:40:55 TP0] Traceback (most recent call last):\n"
        '  File "/root/miniconda3/envs/sglang-backend/lib/python3.10/site-packages/sglang/srt/'
        'managers/scheduler.py", line 1196, in run_scheduler_process\n'
        "    scheduler.event_loop_normal()\n"
        '  File "/root/miniconda3/envs/sglang-backend/lib/python3.10/site-packages/sglang/srt/'
        'managers/scheduler.py", line 325, in event_loop_normal\n'
        "RuntimeError: Failed to allocate memory for batch_prefill_tmp_v with size 435814400 and "
        "alignment 16 in AlignedAllocator\n"
    )
    verdict = _verdict(text)
    assert verdict.outcome is Outcome.CRASH, verdict
    assert "[2024-11-20 16:40:55 TP0] Traceback (most recent call last):" in verdict.evidence


def test_python_s_own_traceback_header_is_no_failure() -> None:
    """Python prints the header without SGLang's prefix (an uncaught exception, a handled one's
    `logging.exception`): it decides nothing by itself."""
    assert parse_line("Traceback (most recent call last):") is None
