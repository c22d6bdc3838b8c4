"""The one runner of SGLang's parser (`server.flagprobe.run_in`): both requests, describe and
examine, are answered from one run, and what SGLang prints to stdout on import is skipped."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from server_helpers import install_fake_sglang

from autotune.server import flagprobe

NOISY_SGLANG = """
print("import-time noise {not json", flush=True)
import os
os.write(1, b"a C library writes too\\n")


class ServerArgs:
    @staticmethod
    def add_cli_args(parser):
        parser.add_argument("--model-path", "--model", required=True)
        parser.add_argument("--tp-size", type=int, default=1)
        parser.add_argument("--enable-thing", action="store_true")
"""


@pytest.fixture
def noisy_sglang(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in `sglang` package on PYTHONPATH that prints to stdout when imported."""
    return install_fake_sglang(tmp_path, NOISY_SGLANG, monkeypatch)


def test_describe_and_examine_read_past_import_time_prints(noisy_sglang: Path) -> None:
    raw = flagprobe.run_in(sys.executable, {"describe": True, "examine": [["--tp", "2", "--x"]]})
    assert raw is not None
    assert [f["dest"] for f in raw["flags"]] == ["model_path", "tp_size", "enable_thing"]
    [report] = raw["reports"]
    assert report["unknown"] == ["--x"] and report["canonical"] == {"--tp": "--tp-size"}


def test_a_python_without_sglang_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # no sglang there
    raw = flagprobe.run_in(sys.executable, {"describe": True})
    assert raw is not None and "sglang" in raw["missing"]


def test_no_such_python_is_none(tmp_path: Path) -> None:
    assert flagprobe.run_in(str(tmp_path / "no-python"), {"describe": True}) is None
