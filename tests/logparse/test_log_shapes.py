"""Every shape of log SGLang has printed reads: its line prefixes from 0.2.x to 0.5.23, logs
that lack rank 0's line of a value every rank shares, and logs that lack the whole start.

The prefixes come from SGLang's own logging setup: 0.2.x `logging.basicConfig(format=
"%(message)s")` with the worker's `[gpu={gpu_id}] ` in the message (`managers/tp_worker.py`,
`model_executor/model_runner.py`); 0.3.0–0.3.3 `configure_logger` (`srt/utils.py`) with
`datefmt="%H:%M:%S"`; 0.3.4 onwards the same with `datefmt="%Y-%m-%d %H:%M:%S"` and, from 0.5.x,
`SGLANG_LOG_MS`'s `.%(msecs)03d`. The fixtures under tests/fixtures/logs are read through the
real `autotune ledger` command in a subprocess, in text and with `--json`.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from autotune.logparse.accounting import build_ledger
from autotune.logparse.events import Batch, Event, Kind
from autotune.logparse.lines import parse_line, parse_text
from autotune.logparse.prefix import split_prefix
from autotune.review.ledgerview import (
    STARTUP_MISSING,
    as_text,
    read_log,
    startup_missing,
    summarize_log,
)

LOGS = Path(__file__).parent.parent / "fixtures" / "logs"


def _utc(stamp: str) -> float:
    """Epoch seconds of a UTC `YYYY-MM-DD HH:MM:SS[.mmm]`."""
    fmt = "%Y-%m-%d %H:%M:%S.%f" if "." in stamp else "%Y-%m-%d %H:%M:%S"
    return datetime.strptime(stamp, fmt).replace(tzinfo=UTC).timestamp()


PARTIAL = "partial_tp8_kv_odd_ranks.log"
TIME_ONLY = "v0_3_0_time_only_serving.log"
GPU_TAGGED = "v0_2_13_gpu_tagged_tp2.log"
SERVING_ONLY = "v0_5_9_serving_only_dp2.log"


@pytest.mark.parametrize(
    ("line", "at", "rank", "message"),
    [
        # 0.3.4 onwards, with and without milliseconds and parallelism tags.
        (
            "[2024-07-20 04:40:55 TP0] Decode batch.",
            _utc("2024-07-20 04:40:55"),
            "TP0",
            "Decode batch.",
        ),
        ("[2024-07-20 04:40:55] INFO:     x", _utc("2024-07-20 04:40:55"), "", "INFO:     x"),
        (
            "[2026-02-24 11:57:16.123 DP0 TP0 EP0] m",
            _utc("2026-02-24 11:57:16.123"),
            "DP0 TP0 EP0",
            "m",
        ),
        ("[2026-02-24 11:57:16 PP1 TP0] m", _utc("2026-02-24 11:57:16"), "PP1 TP0", "m"),
        # 0.3.0-0.3.3: the time only.
        ("[04:40:55 TP0] Decode batch.", 16855.0, "TP0", "Decode batch."),
        ("[04:40:55 DP1 TP0] Prefill batch.", 16855.0, "DP1 TP0", "Prefill batch."),
        ("[04:40:55 TP0 EP0] m", 16855.0, "TP0 EP0", "m"),
        ("[04:40:55 PP0 TP1] m", 16855.0, "PP0 TP1", "m"),
        ("[04:40:55] The server is fired up", 16855.0, "", "The server is fired up"),
        # 0.2.x: no time, the GPU in the message.
        ("[gpu=3] Load weight begin. avail mem=7.00 GB", None, "TP3", "Load weight begin. av"),
        # journald and container prefixes before SGLang's own, even one with a `[20…` in it.
        ("Jul 20 04:40:55 h python[12]: [04:40:55 TP3] m", 16855.0, "TP3", "m"),
        (
            "Jul 20 04:40:55 h python[2034]: [2024-07-20 04:40:55 TP1] m",
            _utc("2024-07-20 04:40:55"),
            "TP1",
            "m",
        ),
        ("Jul 20 04:40:55 h python[9]: [gpu=2] m", None, "TP2", "m"),
    ],
)
def test_every_prefix_sglang_printed(line: str, at: float | None, rank: str, message: str) -> None:
    got_time, got_rank, got_message = split_prefix(line)
    assert (got_time, got_rank) == (pytest.approx(at, abs=1e-3) if at else None, rank)
    assert got_message.startswith(message)


@pytest.mark.parametrize(
    "line",
    [
        "  0%|          | 0/23 [01:02<00:00,  2.71s/it]",  # tqdm
        "[W1203 10:00:00.123 ProcessGroupNCCL.cpp:119] Warning: something",  # torch's C++ log
        "Traceback (most recent call last):",
        '  File "/x/scheduler.py", line 4008, in run_scheduler_process',
        "[12:00 TP0] not a time",
        "[04:40:55 tp0] lower-case tags are not SGLang's",
    ],
)
def test_lines_without_a_prefix_keep_their_text(line: str) -> None:
    assert split_prefix(line) == (None, "", line)


def test_the_time_only_decode_line_of_0_3_reads() -> None:
    line = (
        "[04:40:55 TP0] Decode batch. #running-req: 2, #token: 925, token usage: 0.00, "
        "gen throughput (token/s): 79.84, #queue-req: 0"
    )
    batch = parse_line(line, 5)
    assert isinstance(batch, Batch)
    assert (batch.phase, batch.rank, batch.time) == ("decode", "TP0", 16855.0)
    assert (batch.running, batch.tokens, batch.token_usage) == (2, 925, 0.0)
    assert (batch.gen_throughput, batch.queued) == (79.84, 0)


def test_the_mixed_prefill_line_of_0_3_keeps_its_running_requests() -> None:
    """`tp_worker.py` (0.3.0) `get_new_prefill_batch`: `Prefill batch(mixed #running-req: N). …`."""
    line = (
        "[04:40:56 TP0] Prefill batch(mixed #running-req: 2). #new-seq: 1, #new-token: 412, "
        "#cached-token: 0, cache hit rate: 0.98%, #queue-req: 1"
    )
    batch = parse_line(line)
    assert isinstance(batch, Batch)
    assert (batch.phase, batch.running, batch.new_seq, batch.new_tokens) == ("prefill", 2, 1, 412)
    assert batch.queued == 1


def test_the_prefix_sglang_0_3_0_formats_reads(caplog: pytest.LogCaptureFixture) -> None:
    """The prefix made by Python's logging with 0.3.0's `configure_logger` format and datefmt
    (`f"[%(asctime)s{prefix}] %(message)s"`, `"%H:%M:%S"`, prefix `" TP0"` from
    `tp_worker.py` `run_tp_server`), not typed by hand."""
    formatter = logging.Formatter("[%(asctime)s TP0] %(message)s", datefmt="%H:%M:%S")
    formatter.converter = time.gmtime
    message = "Load weight begin. avail mem=78.85 GB"
    record = logging.LogRecord("sglang", logging.INFO, __file__, 1, message, None, None)
    record.created = 1721450455.0  # 2024-07-20 04:40:55 UTC
    line = formatter.format(record)
    assert line.startswith("[04:40:55 TP0] ")
    event = parse_line(line)
    assert isinstance(event, Event) and event.kind is Kind.WEIGHT_LOAD_BEGIN
    assert (event.rank, event.time, event.values["avail_gib"]) == ("TP0", 16855.0, 78.85)


def test_a_0_3_0_start_with_the_time_only_prefix_gives_its_ledger() -> None:
    """0.3.0's start lines (`model_runner.py` `load_model`, `init_memory_pool`; `tp_worker.py`'s
    summary), each rank with its own tag."""
    text = "\n".join(
        [
            "[04:38:10 TP0] Load weight begin. avail mem=78.85 GB",
            "[04:38:10 TP1] Load weight begin. avail mem=78.80 GB",
            "[04:38:40 TP1] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, "
            "avail mem=70.70 GB",
            "[04:38:40 TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, "
            "avail mem=70.72 GB",
            "[04:38:41 TP0] Memory pool end. avail mem=9.54 GB",
            "[04:38:41 TP1] Memory pool end. avail mem=9.50 GB",
            "[04:38:45 TP0] max_total_num_tokens=954214, max_prefill_tokens=16384, "
            "max_running_requests=4659, context_len=8192",
            "[04:38:47] The server is fired up and ready to roll!",
        ]
    )
    log = parse_text(text)
    assert [e.rank for e in log.of(Kind.WEIGHT_LOAD_END)] == ["TP1", "TP0"]
    ledger = build_ledger(log.events)
    assert (ledger.p_gib, ledger.weights_gib, ledger.avail_after_pool_gib) == (78.80, 8.13, 9.50)
    assert (ledger.max_total_num_tokens, ledger.ranks) == (954214, 2)
    assert not startup_missing(log) and log.first(Kind.READY) is not None


def _kv(rank: str, tokens: int, gib: float, line_no: int) -> Event:
    text = f"[2025-06-01 08:00:41 {rank}] KV Cache is allocated. #tokens: {tokens}, KV size: {gib}"
    event = parse_line(text + " GB", line_no)
    assert isinstance(event, Event) and event.kind is Kind.KV_ALLOCATED
    return event


def _begin(rank: str, avail: float, line_no: int) -> Event:
    event = parse_line(f"[2025-06-01 08:00:07 {rank}] Load weight begin. avail mem={avail} GB")
    assert isinstance(event, Event)
    return event._replace(line_no=line_no)


def test_a_value_every_rank_shares_is_read_from_any_rank_rank_0_first() -> None:
    begins = [_begin("TP0", 78.12, 1), _begin("TP1", 78.10, 2), _begin("TP2", 78.11, 3)]
    with_rank0 = build_ledger([*begins, _kv("TP1", 900, 45.0, 4), _kv("TP0", 1000, 50.0, 5)])
    assert (with_rank0.max_total_num_tokens, with_rank0.kv_gib) == (1000, 50.0)
    without = build_ledger([*begins, _kv("TP2", 900, 45.0, 4), _kv("TP1", 1000, 50.0, 5)])
    assert (without.max_total_num_tokens, without.kv_gib) == (1000, 50.0), "the lowest rank"
    # Free memory is each GPU's own: still the least over the ranks, never one rank's copy.
    assert with_rank0.p_gib == without.p_gib == 78.10


def test_a_pipeline_stage_s_pool_comes_from_its_own_ranks_first() -> None:
    """Stages hold different layers, so their pools differ: PP0's line, whichever rank."""
    ledger = build_ledger([_kv("PP1 TP0", 500, 20.0, 1), _kv("PP0 TP1", 500, 17.2, 2)])
    assert ledger.kv_gib == 17.2


def test_partial_multi_rank_log_shows_the_pool_from_ranks_1_3_5_6() -> None:
    log = read_log(LOGS / PARTIAL)
    assert {e.rank for e in log.of(Kind.KV_ALLOCATED)} == {"TP1", "TP3", "TP5", "TP6"}
    ledger = build_ledger(log.events)
    assert (ledger.max_total_num_tokens, ledger.kv_gib, ledger.ranks) == (1000000, 50.93, 8)
    assert ledger.model_type == "DeepseekV2ForCausalLM"
    assert ledger.avail_after_weights_gib == 62.45, "the tightest GPU's, TP6"
    assert ledger.avail_after_pool_gib == 9.02
    # the excerpt begins after the weight loads began: P is each rank's `mem usage=` and what
    # the load left (`model_runner.py`: the usage is before − after), the least of them
    assert ledger.p_gib == 78.07
    assert not startup_missing(log)


def test_0_2_x_weights_are_what_their_load_took() -> None:
    """0.2.x prints no `mem usage=`: the weights are the rank's begin avail minus its end avail,
    what later releases print as `weight_load_mem_usage`."""
    ledger = build_ledger(read_log(LOGS / GPU_TAGGED).events)
    assert ledger.weights_gib == 8.14  # TP1: 78.84 - 70.70 (TP0: 8.13); the most over ranks
    assert (ledger.p_gib, ledger.avail_after_weights_gib) == (78.84, 70.70)
    assert (ledger.context_len, ledger.max_running_requests) == (8192, 4659)
    assert ledger.model_type == "LlamaForCausalLM"


@pytest.mark.parametrize("name", [TIME_ONLY, SERVING_ONLY])
def test_a_serving_only_log_reads_and_says_its_start_is_missing(name: str) -> None:
    log = read_log(LOGS / name)
    assert log.batches and startup_missing(log)
    assert build_ledger(log.events).max_total_num_tokens is None


def test_a_log_with_its_start_does_not_say_it_is_missing() -> None:
    assert not startup_missing(parse_text((LOGS / "v0_4_6_tp2.log").read_text()))
    assert not startup_missing(read_log(LOGS / GPU_TAGGED))


# ---------------------------------------------------------------------------------------------
# Through the real command
# ---------------------------------------------------------------------------------------------


def _ledger(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "autotune", "ledger", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _json(name: str) -> dict[str, object]:
    done = _ledger(str(LOGS / name), "--json")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    doc = json.loads(done.stdout)
    assert isinstance(doc, dict)
    return doc


def _text(name: str) -> str:
    done = _ledger(str(LOGS / name))
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_command_reads_the_partial_multi_rank_log() -> None:
    doc = _json(PARTIAL)
    assert (doc["max_total_num_tokens"], doc["kv_gib"], doc["ranks"]) == (1000000, 50.93, 8)
    assert (doc["startup_missing"], doc["outcome"]) == (False, "ready")
    text = _text(PARTIAL)
    assert "1,000,000 tokens" in text and "50.93 GiB" in text
    assert STARTUP_MISSING not in text


@pytest.mark.parametrize(
    ("name", "lines", "peaks", "said"),
    [
        (
            TIME_ONLY,
            (3, 4),
            {"max_running": 3, "max_gen_throughput": 95.1},
            "serving: 3 prefill and 4 decode lines; peak running 3",
        ),
        (
            SERVING_ONLY,
            (2, 4),
            {"max_running": 13, "max_token_usage": 0.27},
            "gen throughput 1,610.3 tok/s",
        ),
    ],
    ids=["time-only-0.3", "serving-only-modern"],
)
def test_command_reads_a_serving_log_without_its_start(
    name: str, lines: tuple[int, int], peaks: dict[str, float], said: str
) -> None:
    doc = _json(name)
    assert doc["startup_missing"] is True and doc["kv_gib"] is None
    serving = doc["serving"]
    assert isinstance(serving, dict)
    assert (serving["prefill_lines"], serving["decode_lines"]) == lines
    assert {key: serving[key] for key in peaks} == peaks
    text = _text(name)
    assert text.count(STARTUP_MISSING) == 1
    assert said in text


def test_command_reads_the_gpu_tagged_log_of_0_2() -> None:
    doc = _json(GPU_TAGGED)
    assert (doc["max_total_num_tokens"], doc["weights_gib"], doc["ranks"]) == (954214, 8.14, 2)
    assert (doc["startup_missing"], doc["ready"]) == (False, True)
    text = _text(GPU_TAGGED)
    assert "serving: 2 prefill and 1 decode lines" in text
    assert "954,214 tokens" in text


def test_command_still_refuses_a_file_sglang_did_not_write(tmp_path: Path) -> None:
    path = tmp_path / "notes.log"
    path.write_text("[04:40:55] lunch\n[12:00:00 TP0] nothing SGLang prints\n")
    done = _ledger(str(path), "--json")
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1
    assert "not an SGLang log" in done.stderr


def test_the_text_shows_retractions_of_an_excerpt_without_batch_lines() -> None:
    """0.3–0.4.x's INFO retraction, once per rank of the group: counted once per group."""
    line = "Decode out of memory happened. #retracted_reqs: 1, #new_token_ratio: 0.1474 -> 0.1845"
    log = parse_text("".join(f"[2025-03-07 21:49:33 TP{r}] {line}\n" for r in (13, 12, 10)))
    text = as_text(*summarize_log(log), log)
    assert "serving: 0 prefill and 0 decode lines; no figures on them; 1 request(s) " in text
    assert "retracted in 1 retraction(s)" in text


def test_the_text_shows_the_free_memory_after_the_kv_pool() -> None:
    """`Memory pool end. avail mem=…` (the JSON's `avail_after_pool_gib`) has its own row."""
    log = parse_text(
        "[2026-06-08 07:20:53 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: "
        "1106304, K size: 25.32 GB, V size: 25.32 GB\n"
        "[2026-06-08 07:20:53 TP0] Memory pool end. avail mem=12.05 GB\n"
    )
    text = as_text(*summarize_log(log), log)
    assert "free after the KV pool                12.05 GiB" in text


def test_every_rank_that_printed_a_prefixed_line_is_counted() -> None:
    """TP1 printed only its graph capture's begin (a MUSA TP2 start on 0.5.6); on a DP8 ROCm
    start every rank printed only the cap warning, rank 0 its weights as well."""
    capture = "Capture cuda graph begin. This can take up to several minutes. avail mem=12.07 GB"
    log = parse_text(
        "[2026-06-08 07:20:53 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: "
        "1106304, K size: 25.32 GB, V size: 25.32 GB\n"
        "[2026-06-08 07:20:53 TP0] Memory pool end. avail mem=12.05 GB\n"
        f"[2026-06-08 07:20:54 TP1] {capture}\n[2026-06-08 07:20:54 TP0] {capture}\n"
    )
    assert build_ledger(log.events).ranks == 2
    cap = (
        "max_total_tokens=131072 is larger than the profiled value -561981. "
        "Use the profiled value instead."
    )
    lines = [
        "[2025-07-02 07:41:58 DP0 TP0] Load weight end. type=DeepseekV3ForCausalLM, "
        "dtype=torch.bfloat16, avail mem=21.73 GB, mem usage=166.59 GB.\n"
    ]
    lines += [f"[2025-07-02 07:41:59 DP{r} TP{r}] {cap}\n" for r in (0, 7, 6, 4, 5, 3, 1, 2)]
    assert build_ledger(parse_text("".join(lines)).events).ranks == 8


def test_ranks_that_printed_only_batch_lines_are_counted() -> None:
    """Four pipeline stages' Decode lines and nothing else (an excerpt of a GLM PP4 run): the
    ledger counts four ranks, not none."""
    log = parse_text(
        "".join(
            f"[2026-06-24 15:38:02 PP{r}] Decode batch, #running-req: 1, #token: 998080, token "
            "usage: 0.59, cuda graph: True, gen throughput (token/s): 205.21, #queue-req: 0\n"
            for r in range(4)
        )
    )
    assert build_ledger(log.events).ranks is None
    assert build_ledger(log.events, log.batches).ranks == 4


def test_a_capture_that_printed_no_memory_figure_has_no_size() -> None:
    """0.4.2's `Capture cuda graph end. Time elapsed: 1.79 s` prints no memory: the graphs'
    size is unknown, not 0 GiB; a later release's line still sizes them."""
    old = parse_text(
        "[2025-02-04 05:29:18 TP0] Capture cuda graph begin. This can take up to several "
        "minutes.\n[2025-02-04 05:29:19 TP0] Capture cuda graph end. Time elapsed: 1.79 s\n"
    )
    assert build_ledger(old.events).graph_gib is None
    new = parse_text(
        "[2025-08-11 19:35:24] Capture cuda graph begin. This can take up to several minutes. "
        "avail mem=60.15 GB\n[2025-08-11 19:35:25] Capture cuda graph end. Time elapsed: 1.11 s. "
        "mem usage=0.54 GB. avail mem=59.60 GB.\n"
    )
    assert (
        build_ledger(new.events).graph_gib,
        build_ledger(new.events).avail_after_graphs_gib,
    ) == (
        0.54,
        59.6,
    )
