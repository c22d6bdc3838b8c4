"""Harness overhead per trial: the time a study spends outside the server's own waits.

Runs a small grid study (in a temporary folder) through `autotune.study.runner.run` with the
launcher wrapped so the time spent waiting on the server — startup (`wait_ready`), the workload
(`drive`) and teardown (`stop`) — is measured; everything else (ask, parameters → flags,
launching the process, records, tell, progress) is harness overhead. Goal: ≤ 0.5 s per trial.

    .venv/bin/python scripts/bench_harness.py                 # the simulator, 6 trials
    .venv/bin/python scripts/bench_harness.py --backend fake  # no processes: the loop alone
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from autotune.cli.common import PACKAGE_CONFIGS
from autotune.config.studyfile import load_study
from autotune.study.runner import run
from autotune.study.storage import default_storage_url
from autotune.trial.plan import TrialPlan
from autotune.trial.seam import Launcher, Load, ServerRun, Startup, Stop

T = TypeVar("T")


@dataclasses.dataclass
class Waits:
    seconds: float = 0.0
    trials: int = 0


class _TimedRun:
    def __init__(self, inner: ServerRun, waits: Waits) -> None:
        self._inner, self._waits = inner, waits

    def _timed(self, fn: Callable[[], T]) -> T:
        t0 = time.perf_counter()
        try:
            return fn()
        finally:
            self._waits.seconds += time.perf_counter() - t0

    def wait_ready(self) -> Startup:
        return self._timed(self._inner.wait_ready)

    def drive(self, ledger: Mapping[str, object]) -> Load:
        return self._timed(lambda: self._inner.drive(ledger))

    def stop(self) -> Stop:
        return self._timed(self._inner.stop)


class TimedLauncher:
    """Wraps a launcher; `waits` collects the seconds spent waiting on servers."""

    def __init__(self, inner: Launcher) -> None:
        self.inner = inner
        self.waits = Waits()
        self.first_launch = 0.0

    def launch(self, plan: TrialPlan) -> ServerRun:
        if self.waits.trials == 0:
            self.first_launch = time.perf_counter()
        self.waits.trials += 1
        return _TimedRun(self.inner.launch(plan), self.waits)

    def extra_args(self) -> tuple[str, ...]:
        return self.inner.extra_args()

    def stop_orphans(self) -> list[str]:
        return self.inner.stop_orphans()


class _InstantRun:
    def wait_ready(self) -> Startup:
        return Startup("ready", ledger={"max_total_num_tokens": 159277}, sglang_version="fake")

    def drive(self, ledger: Mapping[str, object]) -> Load:
        return Load("ready", summary={"requests": 1}, throughput_tok_s=1.0, error_rate=0.0)

    def stop(self) -> Stop:
        return Stop(clean=True)


class InstantLauncher:
    """Servers that are ready, loaded and gone at once: what is left is the harness."""

    def launch(self, plan: TrialPlan) -> ServerRun:
        plan.log_path.write_text("")
        return _InstantRun()

    def extra_args(self) -> tuple[str, ...]:
        return ()

    def stop_orphans(self) -> list[str]:
        return []


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--backend", choices=("sim", "fake"), default="sim")
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--study", type=Path, default=PACKAGE_CONFIGS / "demo.toml")
    args = ap.parse_args()
    cfg = load_study(args.study, name="bench")
    cfg = dataclasses.replace(cfg, budget=dataclasses.replace(cfg.budget, n_trials=args.trials))
    with tempfile.TemporaryDirectory(prefix="autotune-bench-") as tmp:
        folder = Path(tmp) / "bench"
        folder.mkdir()
        if args.backend == "sim":
            from autotune.trial.live import live_launcher

            inner: Launcher = live_launcher(cfg, folder)
        else:
            inner = InstantLauncher()
        launcher = TimedLauncher(inner)
        out = io.StringIO()
        t0 = time.perf_counter()
        code = run(cfg, folder, default_storage_url(folder), launcher, out)
        wall = time.perf_counter() - t0
        end = time.perf_counter()
    n = max(launcher.waits.trials, 1)
    setup = launcher.first_launch - t0
    overhead = (end - launcher.first_launch - launcher.waits.seconds) / n
    print(f"backend {args.backend}: {launcher.waits.trials} trials in {wall:.2f} s (exit {code})")
    print(f"  once per run (open storage, recover, queue): {setup:.2f} s")
    print(f"  waiting on servers (startup, load, teardown): {launcher.waits.seconds:.2f} s")
    print(f"  harness overhead per trial: {overhead:.3f} s (goal ≤ 0.5 s)")
    if code != 0:
        sys.stderr.write(out.getvalue())
    return code


if __name__ == "__main__":
    raise SystemExit(main())
