"""Flags checked with the server's own parser before a launch."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import textwrap
from pathlib import Path

import pytest
from server_helpers import install_fake_sglang

from autotune.server.flagcheck import canonical_argv, check_argv, inspect_argv, sglang_python


def _parser_0523() -> argparse.ArgumentParser:
    """A stand-in for SGLang 0.5.23's parser: no --cuda-graph-max-bs any more (only its
    -decode and -prefill forms, so the old name is ambiguous), --tp-size with its alias."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--model-path")
    p.add_argument("--mem-fraction-static", type=float)
    p.add_argument("--cuda-graph-max-bs-decode", type=int)
    p.add_argument("--cuda-graph-max-bs-prefill", type=int)
    p.add_argument("--tp-size", "--tensor-parallel-size", type=int)
    p.add_argument("--hicache-size", type=int)
    return p


def test_renamed_and_unknown_flags_are_named() -> None:
    argv = ["python", "-m", "sglang.launch_server", "--model-path", "m",
            "--cuda-graph-max-bs", "64", "--no-such-flag"]  # fmt: skip
    problems = check_argv(argv, backend="sglang", parser_factory=_parser_0523)
    assert problems == [
        "--cuda-graph-max-bs is not a flag of this SGLang; use --cuda-graph-max-bs-decode "
        "(SGLang 0.5.14+; the old flag is gone in 0.5.23)",
        "--no-such-flag is not a flag of this SGLang's launch_server",
    ]


def test_a_bad_value_is_reported_not_exited() -> None:
    argv = ["x", "--mem-fraction-static", "lots"]
    [problem] = check_argv(argv, backend="sglang", parser_factory=_parser_0523)
    assert "rejects" in problem and "--mem-fraction-static" in problem


def test_the_simulator_checks_with_its_own_flag_table() -> None:
    good = ["python", "-m", "autotune.sim", "--sim-profile", "kimi-k2.5-tp8-96g",
            "--model-path", "m", "--tp", "8", "--mem-fraction-static", "0.88"]  # fmt: skip
    assert check_argv(good, backend="sim") == []
    assert check_argv([*good, "--mem-fraction"], backend="sim") != []


def test_abbreviations_and_aliases_pass_under_their_canonical_name() -> None:
    argv = ["python", "-m", "sglang.launch_server", "--model-path", "m", "--tp", "8",
            "--tensor-parallel-size=8", "--mem-frac", "0.9"]  # fmt: skip
    report = inspect_argv(argv, backend="sglang", parser_factory=_parser_0523)
    assert report.problems == ()
    assert report.canonical == {
        "--tp": "--tp-size",
        "--tensor-parallel-size": "--tp-size",
        "--mem-frac": "--mem-fraction-static",
    }
    assert canonical_argv(argv, report.canonical)[3:] == (
        "--model-path", "m", "--tp-size", "8", "--tp-size=8", "--mem-fraction-static", "0.9",
    )  # fmt: skip


def test_every_problem_is_found_at_once() -> None:
    argv = ["x", "--model-path", "m", "--hicache-size", "24.5", "--cuda-graph-max-bs", "8",
            "--bogus", "1"]  # fmt: skip
    problems = check_argv(argv, backend="sglang", parser_factory=_parser_0523)
    assert len(problems) == 3
    assert "invalid int value: '24.5'" in problems[0]
    assert problems[1].startswith("--cuda-graph-max-bs is not a flag of this SGLang; use")
    assert problems[2] == "--bogus is not a flag of this SGLang's launch_server"


_FAKE_SGLANG = """
    import argparse

    class ServerArgs:
        @staticmethod
        def add_cli_args(parser: argparse.ArgumentParser) -> None:
            parser.add_argument("--model-path")
            parser.add_argument("--tp-size", "--tensor-parallel-size", type=int, default=1)
"""


@pytest.fixture
def fake_sglang(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in SGLang package on PYTHONPATH, importable by any Python this test starts."""
    install_fake_sglang(tmp_path, textwrap.dedent(_FAKE_SGLANG), monkeypatch)


@pytest.mark.usefixtures("fake_sglang")
def test_the_study_pythons_sglang_is_asked() -> None:
    argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", "m", "--tp", "2",
            "--nope"]  # fmt: skip
    report = inspect_argv(argv, backend="sglang")
    assert report.canonical == {"--tp": "--tp-size"}
    assert report.problems == ("--nope is not a flag of this SGLang's launch_server",)
    assert report.checked_by.startswith("SGLang ") and sys.executable in report.checked_by


@pytest.mark.usefixtures("fake_sglang")
def test_a_wrappers_flags_are_not_the_servers() -> None:
    argv = ["numactl", "--interleave=all", sys.executable, "-m", "sglang.launch_server",
            "--model-path", "m", "--tp", "2"]  # fmt: skip
    report = inspect_argv(argv, backend="sglang")
    assert report.problems == () and sys.executable in report.checked_by
    assert canonical_argv(argv, report.canonical) == (
        "numactl", "--interleave=all", sys.executable, "-m", "sglang.launch_server",
        "--model-path", "m", "--tp-size", "2",
    )  # fmt: skip


def test_a_server_in_a_container_is_not_checked_with_this_hosts_python() -> None:
    argv = ["docker", "run", "--gpus", "all", "img", sys.executable, "-m",
            "sglang.launch_server", "--nope"]  # fmt: skip
    report = inspect_argv(argv, backend="sglang")
    assert report.problems == () and report.checked_by == ""


def test_nothing_to_check_without_sglang() -> None:
    if importlib.util.find_spec("sglang") is not None:
        pytest.skip("SGLang is installed for this Python")
    report = inspect_argv(["python", "--anything"], backend="sglang")
    assert report.problems == () and report.checked_by == ""


@pytest.mark.parametrize(
    "head",
    [f"#!{sys.executable}\n", f"#!/bin/sh\n'''exec' \"{sys.executable}\" \"$0\" \"$@\"\n' '''\n"],
    ids=["shebang", "pip-sh-launcher"],
)
@pytest.mark.usefixtures("fake_sglang")
def test_sglang_serve_is_checked_by_the_python_its_script_starts(
    head: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "sglang"
    script.write_text(head + "import sys\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    argv = ["sglang", "serve", "--model-path", "m", "--tp", "2", "--nope"]
    assert sglang_python(argv) == sys.executable
    report = inspect_argv(argv, backend="sglang")
    assert report.canonical == {"--tp": "--tp-size"} and sys.executable in report.checked_by
    assert report.problems == ("--nope is not a flag of this SGLang's launch_server",)
