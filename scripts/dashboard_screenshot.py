"""A screenshot of a study in Optuna Dashboard, taken with headless Chromium.

Serves Optuna Dashboard's own WSGI app (`optuna_dashboard.wsgi`, `pip install optuna-dashboard`)
over the study's storage on a free port of 127.0.0.1, points headless Chromium at the study's
page and writes the PNG; the server stops when the shot is taken. Chromium gets an empty profile
of its own and no network beyond the loopback page.

    python scripts/dashboard_screenshot.py results/demo/study.db dashboard.png
    python scripts/dashboard_screenshot.py sqlite:///results/demo/study.db out.png --study demo
    python scripts/dashboard_screenshot.py results/demo/study.db table.png --page trial-table
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import urllib.request
import warnings
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--hide-scrollbars",
)  # fmt: skip


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def storage_url(given: str) -> str:
    """A storage URL as given, or a SQLite file's URL."""
    return given if "://" in given else f"sqlite:///{Path(given).resolve()}"


def study_id(base: str, name: str | None) -> int:
    """The dashboard's id of the study named `name` (the only one when None)."""
    with urllib.request.urlopen(f"{base}/api/studies", timeout=30) as r:
        studies = json.loads(r.read())["study_summaries"]
    found = [s for s in studies if name is None or s["study_name"] == name]
    if len(found) != 1:
        names = ", ".join(str(s["study_name"]) for s in studies) or "none"
        raise SystemExit(f"name one study with --study (the storage holds: {names})")
    return int(found[0]["study_id"])


def shoot(url: str, out: Path, *, size: str, budget_ms: int, browser: str) -> None:
    """Headless Chromium's screenshot of `url` into `out`."""
    with tempfile.TemporaryDirectory(prefix="dashboard-chromium-") as profile:
        argv = [
            browser,
            *FLAGS,
            f"--user-data-dir={profile}",
            f"--window-size={size}",
            f"--virtual-time-budget={budget_ms}",
            f"--screenshot={out.resolve()}",
            url,
        ]
        subprocess.run(argv, check=True, capture_output=True, timeout=120)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("storage", help="a study.db file or a storage URL")
    p.add_argument("out", type=Path, help="the PNG to write")
    p.add_argument("--study", help="the study's name (needed when the storage holds several)")
    p.add_argument("--page", default="", help="a page of the study: trials, trial-table, …")
    p.add_argument("--window-size", default="1400,1000")
    p.add_argument("--budget-ms", type=int, default=10000, help="virtual time for the page's JS")
    args = p.parse_args(argv)
    browser = next((b for b in map(shutil.which, BROWSERS) if b), None)
    if browser is None:
        print("no Chromium found: apt-get install chromium", file=sys.stderr)
        return 2
    import optuna_dashboard  # a dev dependency; only this script needs it

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        app = optuna_dashboard.wsgi(storage_url(args.storage))
    server = make_server("127.0.0.1", 0, app, handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_port}"
        page = f"{base}/dashboard/studies/{study_id(base, args.study)}"
        page += f"/{args.page}" if args.page else ""
        shoot(page, args.out, size=args.window_size, budget_ms=args.budget_ms, browser=browser)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
    print(f"wrote {args.out} ({page})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
