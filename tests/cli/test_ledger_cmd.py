"""`autotune ledger LOGFILE [--json]` through the real command line entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.cli.main import main

LOGS = Path(__file__).parent.parent / "fixtures" / "logs"
REQUIRED = (
    "max_total_num_tokens",
    "kv_gib",
    "weights_gib",
    "avail_after_weights_gib",
    "graph_gib",
    "avail_after_graphs_gib",
    "chunked_prefill_size",
    "max_running_requests",
    "context_len",
    "ready",
    "outcome",
)
OUTCOMES = {
    "ready",
    "startup_oom",
    "startup_error",
    "runtime_oom",
    "crash",
    "hang",
    "timeout",
    "stopped",
    "unknown",
    "machine_error",  # a log that names its machine's fault: a port taken, a full disk
}


def run_json(path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    assert main(["ledger", str(path), "--json"]) == 0
    out = capsys.readouterr().out
    assert len(out.strip().splitlines()) == 1, "one JSON object on one line"
    doc = json.loads(out)
    assert isinstance(doc, dict)
    return doc


@pytest.mark.parametrize("name", sorted(p.name for p in LOGS.glob("*.log")))
def test_json_has_every_required_field(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    doc = run_json(LOGS / name, capsys)
    assert set(REQUIRED) <= set(doc)
    assert doc["outcome"] in OUTCOMES
    assert isinstance(doc["ready"], bool)


def test_operator_log_values(capsys: pytest.CaptureFixture[str]) -> None:
    doc = run_json(LOGS / "v0_5_9_kimi_tp8_eagle3.log", capsys)
    assert doc["max_total_num_tokens"] == 159277
    assert doc["kv_gib"] == 10.42
    assert doc["weights_gib"] == 72.33
    assert doc["avail_after_graphs_gib"] == 5.47
    assert doc["max_running_requests"] == 48
    assert (doc["ready"], doc["outcome"]) == (True, "ready")


def test_fields_the_log_lacks_are_null(capsys: pytest.CaptureFixture[str]) -> None:
    doc = run_json(LOGS / "startup_no_kv_room_v0_5_9.log", capsys)
    assert doc["kv_gib"] is None and doc["graph_gib"] is None and doc["context_len"] is None
    assert (doc["ready"], doc["outcome"]) == (False, "startup_oom")


def test_text_output_names_outcome_and_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ledger", str(LOGS / "runtime_torch_oom.log")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("outcome: runtime_oom (torch_oom)")
    assert "CUDA out of memory" in out
    assert "231,140" in out


def test_missing_file_is_a_one_line_error_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["ledger", str(tmp_path / "nope.log"), "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1
    assert "nope.log" in captured.err


def test_directory_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ledger", str(tmp_path)]) == 2
    assert "not a file" in capsys.readouterr().err
