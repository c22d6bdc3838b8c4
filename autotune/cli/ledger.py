"""`autotune ledger LOGFILE [--json]`: the memory ledger and outcome of any SGLang log.

Reads a log from any SGLang version (0.4.x to 0.5.23), e.g. one copied from the production box
or `journalctl -u sglang > server.log`, and prints where each GiB went, the effective limits,
how the run ended with the lines that prove it, a short summary of the serving lines, and what
other mem_fraction_static values would give (the pool, the memory left after startup, the
lowest fraction that can hold a pool), with the rules of the SGLang release the log shows.
Every prefix SGLang has printed reads (`[2024-07-20 04:40:55 TP0]`, 0.3.0's `[04:40:55 TP0]`,
0.2.x's `[gpu=0]`); a log that begins after the start (serving lines only) gives its serving
figures and says the startup is missing (`startup_missing` in the JSON).
With `--json` it prints one object; fields the log does not show are null.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from autotune.cli import common
from autotune.review.ledgerview import as_json, as_text, read_log, summarize_log
from autotune.review.whatif import as_text as what_if_text
from autotune.review.whatif import what_if


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `autotune ledger` and its arguments to the subcommands."""
    p = common.add_documented_command(
        sub, "ledger", "print the memory ledger and outcome of an SGLang log", __doc__
    )
    p.add_argument("logfile", type=Path, help="an SGLang server log")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    common.add_fraction_arg(p, "also predict this mem_fraction_static (repeatable)")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    """Print the ledger, outcome and serving summary of `LOGFILE`, with what other fractions would
    give, as text or (`--json`) one object."""
    extra = common.fractions(args)
    log = read_log(args.logfile)
    ledger, verdict, serving = summarize_log(log)
    other = what_if(ledger, extra=extra)
    if args.json:
        doc = json.loads(as_json(ledger, verdict, serving, log))
        doc["what_if"] = other.to_dict() if other is not None else None
        sys.stdout.write(json.dumps(doc) + "\n")
        return 0
    out = as_text(ledger, verdict, serving, log)
    if other is not None:
        out += "\n" + what_if_text(other)
    sys.stdout.write(out)
    return 0
