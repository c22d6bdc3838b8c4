"""The live trial hands the workload driver every fact the ledger has: unit and end to end; the
night's time model hands it every fact the simulator's startup plan has, the same way."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from autotune.loadgen import ServerFacts
from autotune.logparse.ledger import Ledger
from autotune.sim.startupplan import StartupPlan
from tests import simstudy


def test_every_server_fact_is_a_ledger_field_and_is_wired_from_it() -> None:
    ledger_keys = {f.name for f in dataclasses.fields(Ledger)}
    names = [f.name for f in dataclasses.fields(ServerFacts)]
    assert set(names) <= ledger_keys, "a ServerFacts field is named unlike its ledger key"
    ledger = {name: 1000 + i for i, name in enumerate(names)}
    facts = ServerFacts.from_ledger(ledger)
    assert dataclasses.asdict(facts) == ledger  # every field read, none left at its default
    assert ServerFacts.from_ledger({}) == ServerFacts()
    assert ServerFacts.from_ledger({"context_len": True, "max_total_num_tokens": "x"}) == (
        ServerFacts()
    )


def test_every_server_fact_is_a_startup_plan_field_and_is_wired_from_it() -> None:
    names = [f.name for f in dataclasses.fields(ServerFacts)]
    assert set(names) <= {f.name for f in dataclasses.fields(StartupPlan)}
    source = SimpleNamespace(**{name: 1000 + i for i, name in enumerate(names)})
    assert dataclasses.asdict(ServerFacts.of(source)) == vars(source)
    with pytest.raises(AttributeError):
        ServerFacts.of(SimpleNamespace())


@pytest.mark.e2e
def test_autotune_run_cuts_the_stress_burst_to_the_pool(tmp_path: Path) -> None:
    """Kimi-K2.5 at 0.88 holds about 159K tokens: 48 prompts of 8K tokens would queue, so the
    burst is cut to one more than the pool holds at once, from the live trial's own ledger."""
    text = simstudy.sim_study(time_scale=3000, n_trials=1, duration=0.3)
    text = text.replace("rounds = 1\nrequests = 2\n", "rounds = 1\n")
    assert "requests = 2" not in text
    config = tmp_path / "e2e.toml"
    config.write_text(text)
    try:
        done = simstudy.run(config, "run")
        assert done.returncode == 0, done.stdout + done.stderr
    finally:
        simstudy.assert_none_left(tmp_path)
    record = json.loads((tmp_path / "results/e2e/trials/0000/trial.json").read_text())
    pool = record["ledger"]["max_total_num_tokens"]
    assert record["ledger"]["max_running_requests"] == 48
    (stress,) = [p for p in record["workload"]["phases"] if p["kind"] == "stress"]
    cut = pool // (8192 + 4) + 1
    assert cut < 48
    assert stress["plan"]["requests"] == cut
