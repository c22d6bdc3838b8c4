"""The simulator's 0.5.23 against the real SGLang 0.5.23 (the `sglang_python` fixture's venv).

(b) The flag table is what `ServerArgs.add_cli_args` declares: for every flag, its option strings
    in SGLang's order, dest, value type, nargs (and whether it takes a value), choices, default.
    (Choices SGLang declares as a set have no order of their own: both sides sort them.)
    The same command lines (abbreviations, aliases, bad values, removed flags) parse to the same
    values, or fail with the same argparse message, in both parsers.
(d) `/server_info` and a finished `/generate` reply have the shape SGLang's own response code
    builds from the same numbers (keys, their order where SGLang fixes it, and value types):
    `sglang_shapes_probe.py` runs that code in SGLang's Python. Where that code does not import
    there (a dependency the venv lacks), the check is skipped with the reason.
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from autotune.sim import flagdump
from autotune.sim.flags import build_parser, flags_for
from tests.oracle import run_in_sglang
from tests.sim.conftest import KIMI, Launcher
from tests.sim.http import get_json, request

pytestmark = pytest.mark.sglang

PARSER_DUMP = r"""
import argparse, importlib.metadata, json
from sglang.srt.server_args import ServerArgs

def plain(v):
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    return repr(v)

parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
out = []
for a in parser._actions:
    if isinstance(a, argparse._HelpAction):
        continue
    out.append({
        "names": list(a.option_strings), "dest": a.dest,
        "type": None if a.type is None else getattr(a.type, "__name__", repr(a.type)),
        "nargs": a.nargs, "takes_value": a.nargs != 0,
        "choices": None if a.choices is None else (
            sorted((plain(c) for c in a.choices), key=repr)
            if isinstance(a.choices, (set, frozenset)) else [plain(c) for c in a.choices]
        ),
        "default": plain(a.default),
    })
print(json.dumps({"version": importlib.metadata.version("sglang"), "flags": out}))
"""


def simulator_table() -> list[dict[str, Any]]:
    rows = []
    for f in flags_for("0.5.23"):
        default = f.default
        rows.append(
            {
                "names": list(f.names),
                "dest": f.dest,
                "type": f.type,
                "nargs": f.nargs,
                "takes_value": f.nargs != 0,
                "choices": None if f.choices is None else list(f.choices),
                "default": list(default) if isinstance(default, tuple) else default,
            }
        )
    return rows


def test_flag_table_is_sglangs_parser(sglang_python: Path) -> None:
    real = json.loads(run_in_sglang(sglang_python, PARSER_DUMP))
    assert real["version"] == "0.5.23"
    theirs = {row["dest"]: row for row in real["flags"]}
    ours = {row["dest"]: row for row in simulator_table()}
    assert sorted(ours) == sorted(theirs), "flags the simulator declares differ from SGLang's"
    for dest, row in ours.items():
        assert row == theirs[dest], f"{dest}: simulator {row} != SGLang {theirs[dest]}"
    assert [r["dest"] for r in simulator_table()] == [r["dest"] for r in real["flags"]]


PARSE_ARGV = r"""
import argparse, contextlib, io, json, sys
from sglang.srt.server_args import ServerArgs

parser = argparse.ArgumentParser(prog="sglang")
ServerArgs.add_cli_args(parser)
out = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = parser.parse_args(argv)
        out.append({"ok": {k: v for k, v in vars(ns).items() if v != parser.get_default(k)}})
    except SystemExit as exc:
        out.append({"exit": exc.code, "error": err.getvalue().strip().splitlines()[-1]})
print(json.dumps(out, default=repr))
"""

ARGVS = [
    ["--model-path", "m", "--tp", "8", "--mem-frac", "0.88"],
    [
        "--model",
        "m",
        "--tensor-parallel-size=4",
        "--hicache-size",
        "48",
        "--max-total-tokens",
        "128k",
    ],
    ["--model-path", "m", "--cuda-graph-max-bs", "8"],
    ["--model-path", "m", "--hicache-size", "24.5"],
    ["--model-path", "m", "--kv-cache-dtype", "int3"],
    ["--model-path", "m", "--enable-piecewise-cuda-graph"],
    ["--model-path", "m", "--cuda-graph-backend-prefill", "tc_piecewise"],
    ["--model-path", "m", "--speculative-num", "3"],
]


def test_command_lines_parse_like_sglangs(sglang_python: Path) -> None:
    """Abbreviations, aliases, bad values and unknown flags: what SGLang's parser makes of them."""
    theirs = json.loads(run_in_sglang(sglang_python, PARSE_ARGV, json.dumps(ARGVS)))
    parser = build_parser("0.5.23")
    for argv, real in zip(ARGVS, theirs, strict=True):
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                ns = parser.parse_args(argv)
        except SystemExit as exc:
            mine = {"exit": exc.code, "error": err.getvalue().strip().splitlines()[-1]}
            assert "exit" in real, f"{argv}: SGLang accepts it ({real}), the simulator: {mine}"
            assert mine["exit"] == real["exit"]
            assert mine["error"].split(" error: ", 1)[1] == real["error"].split(" error: ", 1)[1]
            continue
        given = {k: v for k, v in vars(ns).items()
                 if not k.startswith("sim_") and v != parser.get_default(k)}  # fmt: skip
        assert "ok" in real, f"{argv}: SGLang rejects it ({real['error']}), the simulator accepts"
        assert json.loads(json.dumps(given, default=repr)) == real["ok"], argv


def shape(value: Any) -> Any:
    """Keys (in order) and value types; None stands for any type (it depends on the launch)."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    if value is None:
        return None
    return (
        "number"
        if isinstance(value, int | float) and not isinstance(value, bool)
        else (type(value).__name__)
    )


def compare(ours: Any, theirs: Any, where: str = "") -> list[str]:
    """Where the two shapes differ (a None on either side matches any type)."""
    if ours is None or theirs is None:
        return []
    if isinstance(ours, dict) and isinstance(theirs, dict):
        problems = []
        if list(ours) != list(theirs):
            missing = [k for k in theirs if k not in ours]
            extra = [k for k in ours if k not in theirs]
            order = [k for k in ours if k in theirs] != [k for k in theirs if k in ours]
            problems.append(f"{where or '.'}: keys differ (missing {missing}, extra {extra}, "
                            f"order differs: {order})")  # fmt: skip
        for key in ours:
            if key in theirs:
                problems += compare(ours[key], theirs[key], f"{where}.{key}")
        return problems
    if isinstance(ours, list) and isinstance(theirs, list):
        if ours and theirs:
            return compare(ours[0], theirs[0], f"{where}[0]")
        return []
    return [] if ours == theirs else [f"{where}: simulator {ours} != SGLang {theirs}"]


def probe(python: Path, payload: dict[str, Any]) -> dict[str, Any]:
    source = (Path(__file__).parent / "sglang_shapes_probe.py").read_text()
    done = subprocess.run(
        [str(python), "-c", source],
        input=json.dumps({**payload, "flagdump": flagdump.__file__}),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if "skip" in out:
        pytest.skip(str(out["skip"]))
    return out


def payload_from(info: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    [state] = info["internal_states"]
    usage = state["memory_usage"]
    startup = info["startup_time"]
    return {
        "launch_command": info["launch_command"],
        "spec": info["speculative_algorithm"] is not None,
        "tp": info["tp_size"],
        "numbers": {
            "weight": usage["weight"],
            "kvcache": usage["kvcache"],
            "startup_available": usage["startup_available"],
            "max_total_num_tokens": info["max_total_num_tokens"],
            "max_req_input_len": info["max_req_input_len"],
            "max_running_requests": state["effective_max_running_requests_per_dp"],
            "graph": usage["graph"] if isinstance(usage["graph"], dict) else {},
            "decode_bs": state["decode_cuda_graph_bs"],
            "load_weight": startup["load_weight"],
            "kv_cache_allocation": startup["kv_cache_allocation"],
            "scheduler_e2e": startup["scheduler_e2e"],
            "tokenizer_e2e": startup["tokenizer_e2e"],
            "hicache": info["enable_hierarchical_cache"],
            "page_size": info["page_size"],
        },
        "generate": {
            "prompt": meta["prompt_tokens"],
            "completion": meta["completion_tokens"],
            "verify_ct": meta.get("spec_verify_ct", 1),
            "correct": meta.get("spec_num_correct_drafts", 0),
            "histogram": meta.get("spec_correct_drafts_histogram", [1, 0, 0, 0]),
        },
    }


@pytest.fixture
def kimi_0523(launch_sim: Launcher) -> tuple[dict[str, Any], dict[str, Any]]:
    sim = launch_sim([*KIMI, "--mem-fraction-static", "0.88", "--sim-version", "0.5.23"],
                     scale=5000)  # fmt: skip
    sim.wait_ready()
    status, raw = request(f"{sim.base}/generate", {"text": "a b c", "sampling_params":
                          {"max_new_tokens": 8}})  # fmt: skip
    assert status == 200
    info = get_json(f"{sim.base}/server_info")  # after the request: spec counts exist
    return info, json.loads(raw)


@pytest.mark.parametrize(
    ("endpoint", "ours"), [("server_info", 0), ("generate", 1)], ids=["server_info", "generate"]
)
def test_the_reply_has_sglangs_shape(
    sglang_python: Path,
    kimi_0523: tuple[dict[str, Any], dict[str, Any]],
    endpoint: str,
    ours: int,
) -> None:
    """`/server_info` and the `/generate` reply, each the shape SGLang's own has."""
    info, reply = kimi_0523
    theirs = probe(sglang_python, payload_from(info, reply["meta_info"]))[endpoint]
    assert compare(shape(kimi_0523[ours]), shape(theirs)) == []
