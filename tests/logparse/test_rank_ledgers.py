"""Each rank's ledger apart (`logparse.accounting.rank_ledgers`): a rank whose line is missing shows
the field as not shown, while the merged ledger takes it from the ranks that printed it."""

from __future__ import annotations

from pathlib import Path

from autotune.logparse.accounting import RANK_FIELDS, build_ledger, rank_ledgers
from autotune.logparse.lines import parse_text

FIXTURES = Path(__file__).parent.parent / "fixtures" / "logs"
LOG = FIXTURES / "v0_5_8_kimi_vl_computed_fraction_tp8.log"


def test_every_rank_shows_its_own_lines() -> None:
    events = parse_text(LOG.read_text()).events
    ranks = rank_ledgers(events)
    assert list(ranks) == [f"TP{i}" for i in range(8)]
    for led in ranks.values():
        assert led.p_gib == 139.03 and led.kv_gib is not None
        assert all(getattr(led, name) is not None for name in ("p_gib", "avail_after_weights_gib"))


def test_a_rank_missing_its_line_is_seen_while_the_merged_ledger_hides_it() -> None:
    text = "\n".join(
        line for line in LOG.read_text().splitlines()
        if not ("TP3]" in line and "Load weight" in line)
    )  # fmt: skip
    events = parse_text(text).events
    ranks = rank_ledgers(events)
    assert ranks["TP3"].p_gib is None
    assert all(r.p_gib is not None for tag, r in ranks.items() if tag != "TP3")
    assert build_ledger(events).p_gib == 139.03
    assert "p_gib" in RANK_FIELDS and "max_total_num_tokens" not in RANK_FIELDS
