"""`growth_gib`: how far the server's footprint grew over a trial's workload, read after
`/flush_cache` before and after it.

The arithmetic is a pure function; the flush's retry is checked against a tiny HTTP server; the
whole measurement runs end to end on the simulator (Kimi-K2.5 TP8, startup sped up 30000×), whose
`[mismatch] growth_mib_per_request` makes the allocator keep memory per request served and whose
`/flush_cache` gives the rest of the cached transient back as `torch.cuda.empty_cache()` does.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import optuna
import pytest

from autotune.config.space import settings_for
from autotune.config.studyfile import load_study
from autotune.errors import HarnessError
from autotune.record import keys
from autotune.server.gpu import GpuMemory
from autotune.server.health import Answer, flush_cache
from autotune.sim.profiles import PROFILE_DIR
from autotune.study.runner import trial_dir
from autotune.trial import live as trial_live
from autotune.trial.gpuwatch import settled_usage
from autotune.trial.growth import footprint_growth_gib, least_used
from autotune.trial.live import live_launcher
from autotune.trial.plan import plan_trial
from autotune.trial.run import run_trial
from autotune.trial.trialfile import TrialRecord, write_record
from tests import simstudy

MiB = 1 << 20
GiB = 1 << 30


# ---- the arithmetic ------------------------------------------------------------------------------


def test_growth_is_the_most_any_of_the_servers_gpus_grew() -> None:
    before = {0: 60 * GiB, 1: 60 * GiB, 2: 0}
    after = {0: 60 * GiB + 100 * MiB, 1: 60 * GiB + 300 * MiB, 2: 0}
    assert footprint_growth_gib(before, after) == round(300 / 1024, 3)
    # an idle GPU (nothing in use at the first reading) is not the server's: a shrink shows
    assert footprint_growth_gib({0: GiB, 1: 0}, {0: GiB - 10 * MiB, 1: 0}) == -0.01
    assert footprint_growth_gib({0: GiB}, {0: GiB}) == 0.0
    assert footprint_growth_gib({0: 0}, {0: 5 * MiB}) == 0.005  # none in use yet: every GPU


def test_growth_is_none_without_both_readings() -> None:
    assert footprint_growth_gib(None, {0: GiB}) is None
    assert footprint_growth_gib({0: GiB}, None) is None
    assert footprint_growth_gib({0: GiB}, {1: GiB}) is None
    assert footprint_growth_gib({}, {}) is None


def test_the_footprint_is_the_least_of_several_flushed_readings() -> None:
    # the second flush caught a health check's forward on GPU 0: its transient is not growth
    readings = [{0: 60 * GiB, 1: 61 * GiB}, {0: 60 * GiB + 90 * MiB, 1: 61 * GiB - MiB, 2: 0}]
    assert least_used(readings) == {0: 60 * GiB, 1: 61 * GiB - MiB}
    assert least_used([]) is None


# ---- the flush and the settled reading ---------------------------------------------------------


@pytest.fixture
def flush_server() -> Iterator[tuple[str, list[int], list[str]]]:
    """A server whose `/flush_cache` answers the statuses queued in the list (200 once empty);
    the second list records each request's Authorization header."""
    statuses: list[int] = []
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization", ""))
            status = statuses.pop(0) if statuses else 200
            body = b"Cache flushed.\n" if status == 200 else b"Cache flush failed.\n"
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", statuses, seen
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_flush_retries_a_400_while_requests_drain(
    flush_server: tuple[str, list[int], list[str]],
) -> None:
    url, statuses, seen = flush_server
    statuses.extend([400, 400])
    answer = flush_cache(url, "sekrit", 5.0, retry_s=2.0)
    assert answer.ok and answer.status == 200 and answer.body.startswith(b"Cache flushed.")
    assert seen == ["Bearer sekrit"] * 3


def test_flush_gives_up_on_a_400_after_the_retry_time_and_at_once_on_other_errors(
    flush_server: tuple[str, list[int], list[str]],
) -> None:
    url, statuses, seen = flush_server
    statuses.extend([400] * 50)
    t0 = time.monotonic()
    answer = flush_cache(url, None, 5.0, retry_s=0.5)
    assert not answer.ok and answer.status == 400
    assert 0.5 <= time.monotonic() - t0 < 2.0 and seen[0] == ""
    statuses[:] = [500]
    assert flush_cache(url, None, 5.0).status == 500
    assert not statuses  # asked once


class _Probe:
    def __init__(self, readings: list[list[GpuMemory]] | None) -> None:
        self.readings = readings
        self.calls = 0

    def snapshot(self) -> list[GpuMemory]:
        self.calls += 1
        if self.readings is None:
            raise HarnessError("NVML failed reading GPU memory")
        return self.readings.pop(0) if len(self.readings) > 1 else self.readings[0]


def test_a_reading_settles_when_two_agree_and_is_none_when_the_probe_fails() -> None:
    gpu = GpuMemory(0, 80 * GiB, 70 * GiB)
    other = GpuMemory(1, 80 * GiB, 1 * GiB)
    probe = _Probe([[GpuMemory(0, 80 * GiB, 75 * GiB), other], [gpu, other], [gpu, other]])
    assert settled_usage(probe, (0,)) == {0: 70 * GiB}
    assert probe.calls == 3
    assert settled_usage(_Probe(None), None) is None


# ---- end to end on the simulator ---------------------------------------------------------------

# Startup in under a second; 32 requests at once for half a second, then one stress round of two.
STUDY = simstudy.sim_study(time_scale=30000, duration=0.5).replace(
    "concurrency = 8", "concurrency = 32"
)


def _profile(folder: Path, growth_mib: float) -> Path:
    text = (PROFILE_DIR / "kimi-k2.5-tp8-96g.toml").read_text()
    if growth_mib:
        text += f"\n[mismatch]\ngrowth_mib_per_request = {growth_mib}\n"
    path = folder / "kimi-growth.toml"
    path.write_text(text)
    return path


def _trial(folder: Path, growth_mib: float) -> tuple[TrialRecord, dict[str, object]]:
    """One trial at mem_fraction_static 0.88 on the simulated Kimi-K2.5 with `growth_mib` MiB
    kept per request served; the record and trial.json as written."""
    profile = _profile(folder, growth_mib)
    text = STUDY.replace('sim_profile = "kimi-k2.5-tp8-96g"', f'sim_profile = "{profile}"')
    assert text != STUDY
    path = folder / "configs" / "growth.toml"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    cfg = load_study(path)
    study_dir = folder / "results" / cfg.name
    launcher = live_launcher(cfg, study_dir)
    fixed = optuna.trial.FixedTrial({"mem_fraction_static": 0.88})
    plan = plan_trial(
        cfg,
        settings_for(fixed, cfg.search),
        number=0,
        trial_dir=trial_dir(study_dir, 0),
        extra=launcher.extra_args(),
    )
    record = run_trial(plan, launcher, clock=time.monotonic, phase=lambda _: None)
    written = json.loads(write_record(record, plan.trial_dir).read_text())
    return record, written


def _served(record: TrialRecord) -> int:
    """Requests the workload completed, phase by phase (the overall summary leaves out none
    here: the study has no warm-up phase)."""
    phases = record.workload["phases"]
    assert isinstance(phases, list)
    return sum(int(p["summary"]["completed"]) for p in phases)


@pytest.mark.e2e
def test_growth_while_serving_is_measured_after_flushing(no_leftovers: Path) -> None:
    record, written = _trial(no_leftovers, growth_mib=2.0)
    assert (record.state, record.outcome) == ("complete", "ok"), record.reason
    expected = 2.0 * _served(record) / 1024
    assert expected > 0.05, "too few requests for the growth to stand out of the rounding"
    assert record.growth_gib is not None
    assert abs(record.growth_gib - expected) <= 0.2 * expected, (record.growth_gib, expected)
    assert written[keys.GROWTH] == record.growth_gib
    assert record.result().attrs[keys.RECORD][keys.GROWTH] == record.growth_gib  # type: ignore[index]
    # the stress burst's transient is far above the growth: the flush gave it back
    assert record.stress_peak_gib is not None and record.stress_peak_gib > record.growth_gib


@pytest.mark.e2e
def test_no_growth_measures_zero_not_none(no_leftovers: Path) -> None:
    record, written = _trial(no_leftovers, growth_mib=0.0)
    assert (record.state, record.outcome) == ("complete", "ok"), record.reason
    assert record.growth_gib is not None and abs(record.growth_gib) < 0.02
    assert written[keys.GROWTH] == record.growth_gib


@pytest.mark.e2e
def test_a_refused_flush_leaves_growth_unmeasured_and_the_trial_ok(
    no_leftovers: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[str] = []

    def refused(base_url: str, api_key: str | None, timeout_s: float = 10.0) -> Answer:
        asked.append(base_url)
        return Answer(False, 400, "HTTP 400")

    monkeypatch.setattr(trial_live, "flush_cache", refused)
    record, written = _trial(no_leftovers, growth_mib=2.0)
    assert (record.state, record.outcome) == ("complete", "ok"), record.reason
    assert record.throughput_tok_s > 0 and record.headroom_gib is not None
    assert record.growth_gib is None and written[keys.GROWTH] is None
    assert len(asked) == 1  # the second flush is not asked for once the first was refused
