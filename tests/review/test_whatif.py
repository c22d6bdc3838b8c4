"""`autotune ledger LOG` predicts other fractions from one log: checked against the simulator's
own launches at those fractions, in 0.5.9 and 0.5.23 mode."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune.logparse.ledger import Ledger
from autotune.review.whatif import as_text, what_if
from tests.review.fakes import ledger
from tests.simstudy import assert_none_left

pytestmark = pytest.mark.e2e
FRACTIONS = ("0.85", "0.88", "0.90", "0.93")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _launch_log(folder: Path, version: str, fraction: str) -> Path:
    """Start the simulator at `fraction`, wait for "fired up", stop it; its log."""
    log = folder / f"{version}-{fraction}.log"
    argv = [sys.executable, "-m", "autotune.sim", "--sim-profile", "kimi-k2.5-tp8-96g",
            "--sim-version", version, "--sim-time-scale", "30000",
            "--sim-gpu-dir", str(folder / f"gpu-{version}-{fraction}"),
            "--model-path", "moonshotai/Kimi-K2.5", "--tp-size", "8", "--trust-remote-code",
            "--speculative-algorithm", "EAGLE3",
            "--speculative-draft-model-path", "lightseekorg/kimi-k2.5-eagle3",
            "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", "4", "--mem-fraction-static", fraction,
            "--max-running-requests", "48", "--enable-hierarchical-cache", "--hicache-size", "48",
            "--host", "127.0.0.1", "--port", str(_port())]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while "fired up" not in log.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return log


def _ledger(log: Path, *extra: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-m", "autotune", "ledger", str(log), "--json", *extra],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert isinstance(doc, dict)
    return doc


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_one_log_predicts_the_other_fractions(no_leftovers: Path, version: str) -> None:
    logs = {f: _launch_log(no_leftovers, version, f) for f in FRACTIONS}
    doc = _ledger(logs["0.88"], "--fraction", "0.85", "--fraction", "0.90", "--fraction", "0.93")
    what = doc["what_if"]
    assert isinstance(what, dict) and what["semantics"] == version
    rows = {round(r["fraction"], 2): r for r in what["rows"]}
    for f in ("0.85", "0.90", "0.93"):
        actual = _ledger(logs[f])
        tokens = actual["max_total_num_tokens"]
        free = actual["available_gpu_mem_gib"] or actual["avail_after_graphs_gib"]
        assert isinstance(tokens, int) and isinstance(free, float)
        row = rows[float(f)]
        assert abs(row["tokens"] - tokens) <= 0.005 * tokens, (f, row, tokens)
        assert abs(row["free_after_startup_gib"] - free) <= 0.1, (f, row, free)
    assert 0.7 < what["lowest_fraction"] < 0.85
    assert any("does not size the pool" in w for w in what["words"])
    assert_none_left(no_leftovers)


def test_a_pool_held_by_max_total_tokens_is_said_with_the_fraction_that_reaches_it() -> None:
    """A launch with `--max-total-tokens` below what its budget holds (SGLang's docs run
    EAGLE-3 at 0.6 with 20,480 tokens): the table keeps the pool at the cap, and the words say
    from which fraction the cap holds it, instead of only how the pool grows with the fraction."""
    d = ledger(0.88)
    d["max_total_num_tokens"] = d["max_total_tokens_cap"] = 100_000
    w = what_if(Ledger.from_dict(d), fraction=0.88)
    assert w is not None and max(r.tokens for r in w.rows) == 100_000
    said = [s for s in w.words if "caps the pool" in s]
    assert len(said) == 1 and said[0].startswith("--max-total-tokens 100,000 caps the pool: from f")
    reach = float(said[0].split("from f = ")[1].split(",")[0])
    assert all((r.tokens == 100_000) == (r.fraction >= reach) for r in w.rows), w.rows
    uncapped = what_if(Ledger.from_dict(ledger(0.88)), fraction=0.88)
    assert uncapped is not None and not any("caps the pool" in s for s in uncapped.words)


def test_a_launch_at_a_third_decimal_prints_its_rows_to_it() -> None:
    """A log launched at 0.831 steps its rows from there (0.791, …): each is printed to its
    third decimal, the log's own row as 0.831, not 0.83."""
    w = what_if(Ledger.from_dict(ledger(0.831)), fraction=0.831)
    text = as_text(w)
    own = next(line for line in text.splitlines() if line.endswith("(this log)"))
    assert own.split()[0] == "0.831", own
    rounded = as_text(what_if(Ledger.from_dict(ledger(0.88)), fraction=0.88))
    own = next(line for line in rounded.splitlines() if line.endswith("(this log)"))
    assert own.split()[0] == "0.88", own
