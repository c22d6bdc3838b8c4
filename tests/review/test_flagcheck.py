"""Flags checked with the server's own parser before a launch."""

from __future__ import annotations

import argparse

from autotune.server.flagcheck import check_argv, sglang_parser


def _parser_0523() -> argparse.ArgumentParser:
    """A stand-in for SGLang 0.5.23's parser: no --cuda-graph-max-bs any more."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--model-path")
    p.add_argument("--mem-fraction-static", type=float)
    p.add_argument("--cuda-graph-max-bs-decode", type=int)
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


def test_nothing_to_check_without_sglang() -> None:
    if sglang_parser() is None:
        assert check_argv(["python", "--anything"], backend="sglang") == []
