"""`autotune ledger` says when a file is not an SGLang log (exit 2, one line) and never prints
"None", not even for a log whose serving lines are cut or corrupted."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from autotune.cli import ledger
from autotune.cli.main import main

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"


def _ledger(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["ledger", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (random.Random(1).randbytes(4096), "binary data"),
        (bytes(b | 0x80 for b in random.Random(2).randbytes(4096)), "binary data"),
        (b"", "the file is empty"),
        (b"\n\n  \n", "the file is empty"),
        (b"hello\nValueError: not a server\nexit code 1\n" * 20, "not an SGLang log"),
        (Path(ledger.__file__).read_bytes(), "not an SGLang log"),
        (
            b"INFO 09-17 16:23:13 [api_server.py:1880] Starting vLLM API server on :8000\n"
            b"Process 3438121: python3 -m vllm.entrypoints.openai.api_server\n"
            b"    send (torch/distributed/distributed_c10d.py:2487)\n"
            b"[2025-01-01 10:00:00 PID123] a custom logger's line\n",
            "not an SGLang log",
        ),
    ],
)
def test_what_is_not_an_sglang_log_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, says: str
) -> None:
    path = tmp_path / "server.log"
    path.write_bytes(content)
    for extra in ((), ("--json",)):
        code, out, err = _ledger(capsys, str(path), *extra)
        assert code == 2 and out == ""
        assert err.count("\n") == 1 and says in err and str(path) in err


@pytest.mark.parametrize(
    "excerpt",
    [
        "[2025-09-17 16:23:13 TP1] Decode transfer failed for request rank=1 with exception "
        "KVTransferError(bootstrap_room=1655955501905217457): Failed due to an unknown reason\n"
        '[2025-09-17 16:23:13] INFO:     10.0.0.1:41698 - "POST /generate HTTP/1.1" 200 OK\n',
        "[2026-01-29 13:12:36 PP1 TP0] Scheduler debug info:\nscheduler.cur_batch.batch_size()=1\n",
        "Traceback (most recent call last):\n"
        '  File "/opt/conda/lib/python3.10/site-packages/sglang/srt/model_executor/'
        'cuda_graph_runner.py", line 436, in capture\n'
        "    ) = self.capture_one_batch_size(bs, forward)\n",
    ],
    ids=["a disaggregation transfer error", "a watchdog's debug dump", "a cut traceback"],
)
def test_an_excerpt_in_sglang_s_own_shape_is_read_not_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], excerpt: str
) -> None:
    """Lines SGLang's logger prefixed with a time and a rank tag, or a traceback through its
    server code, make a log SGLang's even when no line is one the reader has a reading for: the
    excerpt reads, with nothing decided, instead of being refused as some other program's."""
    path = tmp_path / "excerpt.log"
    path.write_text(excerpt)
    code, out, err = _ledger(capsys, str(path))
    assert code == 0 and err == "" and out.startswith("outcome: unknown"), err


def _figures(out: str) -> str:
    """The output without the quoted log lines (a log may say `signum=None` itself)."""
    return "\n".join(line for line in out.splitlines() if not line.startswith("  | "))


def test_a_real_log_still_reads(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _ledger(capsys, str(LOGS / "v0_5_9_kimi_tp8_eagle3.log"))
    assert code == 0 and "KV pool" in out and "None" not in _figures(out)


def test_a_corrupted_log_never_prints_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Serving lines with their figures cut off, garbage spliced in: no field reads "None"."""
    good = (LOGS / "runtime_torch_oom.log").read_text().splitlines()
    cut = [
        line.split("#running-req")[0] + "#running-req" if "Decode batch" in line else line
        for line in good
    ]
    cut.insert(len(cut) // 2, "\x00\x01garbage\xff" * 3)
    cut += ["[2026-02-24 22:00:00 TP0] Decode batch, #running-req: 3",
            "[2026-02-24 22:00:01 TP0] Prefill batch, #new-seq: 1"]  # fmt: skip
    path = tmp_path / "corrupt.log"
    path.write_text("\n".join(cut), errors="replace")
    code, out, _ = _ledger(capsys, str(path))
    assert code == 0 and "None" not in _figures(out) and "serving: " in out
    for name in sorted(os.listdir(LOGS)):
        code, out, _ = _ledger(capsys, str(LOGS / name))
        assert "None" not in _figures(out), name
