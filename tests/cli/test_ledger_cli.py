"""`autotune ledger` says when a file is not an SGLang log (exit 2, one line) and never prints
"None", not even for a log whose serving lines are cut or corrupted."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

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
        (Path(__file__).read_bytes(), "not an SGLang log"),
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
