"""End to end on the simulated SGLang 0.5.23: a trial whose request slots the pool lowers shows
asked vs ran on every surface (status, explain, the report, the ledger, the export, which sets
what ran), and the points SGLang would run as that trial are recorded as skipped, not launched."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.simstudy import assert_none_left, run, sim_study, workload

STUDY = sim_study(
    profile="qwen3-32b-h200",
    version="0.5.23",
    flags='model-path = "Qwen/Qwen3-32B"\nmax-total-tokens = 2048',
    search="[search]\nmem_fraction_static = 0.85\n"
    "max_running_requests = { choices = [128, 256, 512, 1024, 2048, 4096] }\n\n"
    "[baseline]\nmax_running_requests = 4096",
    load=workload(
        0.5,
        stress=False,
        input_len='{ dist = "uniform", min = 50, max = 100 }',
        output_len=8,
        concurrency=4,
    ),
    headroom_gib=None,
    n_trials=8,
)

ASKED_RAN = "max_running_requests: asked 4096, ran 1024 (the KV pool of 2048 tokens holds 1024"


def test_a_clamped_trial_shows_asked_vs_ran_and_its_twins_are_not_launched(
    tmp_path: Path,
) -> None:
    config = tmp_path / "clamped.toml"
    config.write_text(STUDY)
    try:
        night = run(config, "run", timeout=300)
        assert night.returncode == 0, night.stdout + night.stderr
        out = night.stdout + night.stderr
        # 6 grid points, the baseline (4096) first: the pool of 2048 tokens runs it at 1024
        # requests, so 1024 and 2048 are that trial again and are not launched
        assert out.count("skipped [not launched]") == 2, out
        assert "SGLang runs this point as trial 0 ran it" in out
        trials = tmp_path / "results" / "clamped" / "trials"
        launched = sorted(p.name for p in trials.iterdir() if p.is_dir())
        assert launched == ["0000", "0001", "0002", "0003"]
        log = (trials / "0000" / "server.log").read_text()
        assert "max_running_requests was reduced from the requested 4096 to 1024" in log

        status = run(config, "status")
        assert status.returncode == 0, status.stderr
        assert "4096→1024" in status.stdout
        assert f"trial 0: SGLang ran {ASKED_RAN}" in status.stdout
        assert "trial 4: not launched, SGLang runs its point as trial 0" in status.stdout
        assert "trial 5: not launched, SGLang runs its point as trial 0" in status.stdout

        explain = run(config, "explain", "--trial", "0")
        assert explain.returncode == 0, explain.stderr
        assert f"SGLang ran {ASKED_RAN}" in explain.stdout
        twin = run(config, "explain", "--trial", "4")
        assert "its figures are trial 0's" in twin.stdout, twin.stdout + twin.stderr

        ledger = run_ledger(config, trials / "0000" / "server.log")
        assert f"asked vs ran: {ASKED_RAN}" in ledger

        exported = run(config, "export", "--trial", "0", "--format", "json", "--no-flag-check")
        assert exported.returncode == 0, exported.stderr
        doc = json.loads(exported.stdout)
        assert doc["params"]["max_running_requests"] == 1024
        assert doc["asked"] == {"max_running_requests": 4096}
        i = doc["argv"].index("--max-running-requests")
        assert doc["argv"][i + 1] == "1024"
        assert any("not the 4096 asked" in line for line in doc["ran_other"])
        shell = run(config, "export", "--trial", "0", "--format", "shell", "--no-flag-check")
        assert "# note: SGLang runs max_running_requests=1024, not the 4096 asked" in shell.stdout
        flags = run(config, "export", "--trial", "0", "--format", "flags", "--no-flag-check")
        assert "--max-running-requests 1024" in flags.stdout
        assert "not the 4096 asked" in flags.stderr and "asked" not in flags.stdout

        report = run(config, "report")
        assert report.returncode == 0, report.stderr
        page = (tmp_path / "results" / "clamped" / "report.html").read_text()
        assert "max_running_requests=4096→1024" in page
        assert "SGLang ran max_running_requests: asked 4096, ran 1024" in page
    finally:
        assert_none_left(tmp_path)


def run_ledger(config: Path, log: Path) -> str:
    """`autotune ledger LOG`'s text (it takes no study)."""
    done = subprocess.run(
        [sys.executable, "-m", "autotune", "ledger", str(log)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=config.parent,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout
