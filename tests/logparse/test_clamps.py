"""Asked vs ran, read from a log: each clamp line SGLang prints (its %-format texts from
`logparse.formats`, which the oracle test finds in SGLang's source) gives the setting as asked,
as run and why."""

from __future__ import annotations

import pytest

from autotune.logparse.accounting import build_ledger
from autotune.logparse.clamps import Clamps, post_capture_asked
from autotune.logparse.formats import RULES
from autotune.logparse.ledger import Ledger
from autotune.logparse.lines import parse_lines

T = "[2026-11-20 14:09:01]"


def _text(rule: str) -> str:
    return next(r for r in RULES if r.name == rule).sources[0].text


def _summary(tokens: int, chunk: int, running: int, context: int) -> str:
    return (
        f"{T} max_total_num_tokens={tokens}, chunked_prefill_size={chunk}, "
        f"max_prefill_tokens=16384, max_running_requests={running}, context_len={context}, "
        "available_gpu_mem=20.50 GB"
    )


def _ledger(*lines: str) -> Ledger:
    return build_ledger(parse_lines(lines).events)


def _clamp(led: Ledger, name: str) -> tuple[object, object, str]:
    c = next(c for c in Clamps.of(led).items if c.name == name)
    return c.asked, c.effective, c.rule if c.clamped else ""


@pytest.mark.parametrize(
    ("args", "rule", "figures", "summary", "name", "clamp", "why"),
    [
        pytest.param(
            "'max_running_requests': 2048, 'chunked_prefill_size': 8192",
            "mrr_reduced",
            (2048, 1024),
            (2048, 8192, 1024, 40960),
            "max_running_requests",
            (2048, 1024, "kv_capacity"),
            "the KV pool of 2048",
            id="the-pool-lowers-the-request-slots-in-0.5.23",
        ),
        pytest.param(
            "'max_running_requests': 128",
            "post_capture_mrr",
            (128, 50),
            (100, 8192, 50, 4096),
            "max_running_requests",
            (128, 50, "post_capture"),
            "post-capture KV sizing",
            id="post-capture-sizing-lowers-the-request-slots",
        ),
        pytest.param(
            "'context_length': 40960",
            "pool_below_context",
            (2048, 40960),
            (2048, 8192, 1024, 40960),
            "context_length",
            (40960, 2048, "pool"),
            "the KV pool holds 2048 tokens",
            id="a-pool-smaller-than-the-context-cuts-a-request",
        ),
    ],
)
def test_a_clamp_line_of_0_5_23_gives_asked_ran_and_why(
    args: str,
    rule: str,
    figures: tuple[int, int],
    summary: tuple[int, int, int, int],
    name: str,
    clamp: tuple[object, object, str],
    why: str,
) -> None:
    """The clamp SGLang printed (its %-format filled with `figures`) after the `server_args` that
    asked for more: the setting as asked and as run, the rule, and the first line shown, which
    says why."""
    led = _ledger(
        f"{T} server_args={{'model_path': 'm', {args}}}",
        f"{T} " + _text(rule) % figures,
        _summary(*summary),
    )
    assert _clamp(led, name) == clamp
    asked, ran, _ = clamp
    assert Clamps.of(led).lines()[0].startswith(f"{name}: asked {asked}, ran {ran} ({why}")


def test_the_request_table_cuts_the_decode_graph_batch_in_0_5_9() -> None:
    led = _ledger(
        f"{T} server_args=ServerArgs(model_path='m', cuda_graph_max_bs=512, "
        "max_running_requests=128)",
        f"{T} Capture cuda graph begin. This can take up to several minutes. avail mem=30.00 GB",
        f"{T} Capture cuda graph bs [1, 2, 4, 8, 12, 16, 24, 32, 64, 96, 120, 128]",
        f"{T} Capture cuda graph end. Time elapsed: 3.00 s. mem usage=1.20 GB. avail mem=28.80 GB.",
        _summary(300000, 8192, 128, 4096),
    )
    assert _clamp(led, "cuda_graph_max_bs") == (512, 128, "request_table")
    assert _clamp(led, "max_running_requests") == (128, 128, "")


def test_a_largest_graph_below_the_asked_one_by_the_list_step_is_no_clamp() -> None:
    led = _ledger(
        f"{T} server_args=ServerArgs(model_path='m', cuda_graph_max_bs=250, "
        "max_running_requests=1024)",
        f"{T} Capture cuda graph bs [1, 2, 4, 240, 248]",
        _summary(300000, 8192, 1024, 4096),
    )
    assert _clamp(led, "cuda_graph_max_bs") == (250, 250, "")


def test_a_resolved_chunk_other_than_asked_is_shown() -> None:
    led = _ledger(
        f"{T} server_args=ServerArgs(model_path='m', chunked_prefill_size=8192)",
        _summary(300000, 4096, 1024, 4096),
    )
    assert _clamp(led, "chunked_prefill_size")[:2] == (8192, 4096)


def test_post_capture_sizing_off_because_the_prefill_graph_is_below_the_chunk() -> None:
    lines = (
        f"{T} KV Cache is allocated. dtype: torch.bfloat16, #tokens: 300000, KV size: 20.00 GB",
        f"{T} Capture target prefill CUDA graph begin. backend=breakable, "
        "num_tokens=[4, 8, 2048], avail mem=30.00 GB",
        _summary(300000, 8192, 1024, 4096),
    )
    led = _ledger(*lines)
    assert led.post_capture_kv_sizing is False
    asked = Ledger.from_dict({**led.to_dict(), "post_capture_requested": True})
    c = next(c for c in Clamps.of(asked).items if c.name == "post_capture_kv_sizing")
    assert (c.asked, c.effective, c.clamped) == (True, False, True)
    assert "largest prefill graph (2048 tokens) is below the chunk (8192)" in c.reason
    on = _ledger(
        f"{T} KV Cache VA upper bound. dtype: torch.bfloat16, #tokens: 300000, KV size: 20.00 GB"
    )
    assert on.post_capture_kv_sizing is True


def test_no_clamp_when_sglang_ran_what_was_asked() -> None:
    led = _ledger(
        f"{T} server_args=ServerArgs(model_path='m', max_running_requests=48, "
        "chunked_prefill_size=8192)",
        _summary(300000, 8192, 48, 4096),
    )
    assert Clamps.of(led).clamped == ()
    assert Clamps.of(Ledger()).clamped == ()


def test_the_environment_is_read_as_sglang_reads_it() -> None:
    assert post_capture_asked({"SGLANG_ENABLE_POST_CAPTURE_KV_SIZING": "True"})
    assert post_capture_asked({"SGLANG_ENABLE_POST_CAPTURE_KV_SIZING": "1"})
    assert not post_capture_asked({"SGLANG_ENABLE_POST_CAPTURE_KV_SIZING": "0"})
    assert not post_capture_asked({})
