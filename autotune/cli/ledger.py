"""`autotune ledger LOGFILE [--json]`: the memory ledger and outcome of any SGLang log.

Reads a log from any SGLang version (0.4.x to 0.5.23), e.g. one copied from the production box
or `journalctl -u sglang > server.log`, and prints where each GiB went, the effective limits,
how the run ended with the lines that prove it, and a short summary of the serving lines.
With `--json` it prints one object; fields the log does not show are null.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from autotune.review.ledgerview import as_json, as_text, read_log, summarize_log


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "ledger",
        help="print the memory ledger and outcome of an SGLang log",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("logfile", type=Path, help="an SGLang server log")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    log = read_log(args.logfile)
    ledger, verdict, serving = summarize_log(log)
    out = (
        as_json(ledger, verdict, serving, log) + "\n"
        if args.json
        else as_text(ledger, verdict, serving)
    )
    sys.stdout.write(out)
    return 0
