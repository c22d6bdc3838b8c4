"""End to end through the simulator: `autotune run` on a study whose KV pool is too small for
its workload. The simulated SGLang retracts decode requests (`KV cache pool is full. Retract
requests.`, as 0.5.9 and 0.5.23 print it) and serves every request in the end: the trial is
COMPLETE `ok`, never an OOM, and `autotune ledger` on its log counts the retractions."""

from __future__ import annotations

import re

import pytest
from optuna.trial import TrialState

from tests.reliability.helpers import World

pytestmark = pytest.mark.e2e


def test_a_pool_at_its_edge_retracts_and_the_trial_is_ok(world: World) -> None:
    world.foreign_sleep()
    # nothing here is about a stall: the helper's 1.5 s reads a busy machine's pause as a hang
    path = world.study(
        flags="max-total-tokens = 1200\nschedule-conservativeness = 0.05", duration=2.0, stall_s=10
    )
    text = path.read_text().replace("output_len = 4\n", "output_len = 300\n", 1)
    path.write_text(text.replace("concurrency = 2", "concurrency = 6"))
    done = world.run()
    assert done.rc == 0, done.out + done.err
    first = world.trials()[0]
    assert (first.state, first.user_attrs["outcome"]) == (TrialState.COMPLETE, "ok")
    log = world.study_dir / "trials/0000/server.log"
    retractions = log.read_text().count("KV cache pool is full. Retract requests.")
    assert retractions >= 1, "the pool never ran out: the study no longer tests retractions"
    ledger = world.autotune("ledger", str(log))
    assert ledger.rc == 0, ledger.err
    m = re.search(r"(\d+) request\(s\) retracted in (\d+) retraction\(s\)", ledger.out)
    assert m is not None, ledger.out
    assert int(m.group(2)) == retractions and int(m.group(1)) >= retractions
    assert world.problems() == []
