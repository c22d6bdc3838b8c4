"""The soak's short variant: six simulator trials with random faults (simulator faults and faults
played on the live server), a SIGKILL of autotune mid-trial, a jumping wall clock and the review
commands in a loop alongside; nothing may be left running, lost or recorded wrongly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.reliability.helpers import World

pytestmark = pytest.mark.e2e
SOAK = Path(__file__).resolve().parents[2] / "scripts" / "soak.py"


def test_short_soak(world: World) -> None:
    world.foreign_sleep()
    done = subprocess.run(
        [sys.executable, str(SOAK), "--trials", "6", "--seed", "1", "--kill-rate", "0.3",
         "--folder", str(world.folder / "soak"), "--json"],
        capture_output=True, text=True, timeout=240, start_new_session=True,
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    figures = json.loads(done.stdout.splitlines()[-1])
    assert figures["orphans"] == [] and figures["lost"] == [], figures
    assert figures["wrong_records"] == [] and figures["counted_twice"] == [], figures
    assert figures["review_problems"] == [] and figures["foreign_alive"], figures
    assert sum(figures["review"].values()) >= 4, figures  # the review commands ran alongside
    assert figures["trials_counted"] == 6
    assert figures["events"].get("SIGKILL mid-trial", 0) >= 1  # a resume was exercised
    assert sum(n for f, n in figures["faults_injected"].items() if f != "none") >= 2
    assert figures["ok"] and done.returncode == 0
