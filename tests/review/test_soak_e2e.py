"""A slow leak that passes every trial fails the confirm soak, and the export's default margin
covers it: `autotune run`, `export` and `confirm` as the operator runs them, on a simulated
Kimi-K2.5 whose footprint grows by 15 MiB per request served (`[mismatch]`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from autotune.sim.profiles import PROFILE_DIR
from tests import simstudy

GROWTH_MIB = 15.0


def _study(folder: Path) -> Path:
    profile = folder / "kimi-leak.toml"
    text = (PROFILE_DIR / "kimi-k2.5-tp8-96g.toml").read_text()
    profile.write_text(text + f"\n[mismatch]\ngrowth_mib_per_request = {GROWTH_MIB}\n")
    study = simstudy.sim_study(time_scale=30000, duration=0.5, sampler="grid")
    study = study.replace("concurrency = 8", "concurrency = 32")
    study = study.replace(
        "low = 0.88, high = 0.94, step = 0.03", "low = 0.88, high = 0.9, step = 0.02"
    )
    study = study.replace("n_trials = 3", "n_trials = 2")
    study = study.replace('sim_profile = "kimi-k2.5-tp8-96g"', f'sim_profile = "{profile}"')
    path = folder / "leak.toml"
    path.write_text(study)
    return path


def _run_two_ok(config: Path) -> list[dict[str, Any]]:
    """`autotune run` on the study, and its two trials' records, both ok."""
    ran = simstudy.run(config, "run")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    records = [
        json.loads(p.read_text())
        for p in sorted((config.parent / "results").glob("*/trials/*/trial.json"))
    ]
    assert [r["outcome"] for r in records] == ["ok", "ok"]
    return records


@pytest.mark.e2e
def test_a_leak_that_passes_the_trials_fails_the_soak_and_the_margin_covers_it(
    no_leftovers: Path,
) -> None:
    config = _study(no_leftovers)
    records = _run_two_ok(config)
    growth = [r["growth_gib"] for r in records]
    assert all(g is not None and g > 0.1 for g in growth), growth
    exported = simstudy.run(config, "export", "--format", "json")
    assert exported.returncode == 0, exported.stderr
    ex = json.loads(exported.stdout)
    margin = ex["margin"]
    # backed off (each step of the space, 0.02, hands back 1.9 GiB) for a soak long enough
    # that the growth the trials measured eats the spare headroom
    assert margin["soak"] is True and margin["steps"] >= 1 and margin["soak_factor"] >= 3, margin
    assert ex["params"]["mem_fraction_static"] < 0.9
    assert "GiB growth per trial" in margin["soak_plan"]
    assert f"for a {margin['soak_factor']:g}× soak" in margin["soak_plan"]
    # the best trial's own setting, as it ran, fails a soak that long
    best = max(records, key=lambda r: r["capacity_tokens"])
    as_ran = simstudy.run(config, "confirm", "--trial", str(best["number"]),
                          "--soak-factor", f"{margin['soak_factor']:g}")  # fmt: skip
    assert as_ran.returncode == 1, as_ran.stdout + as_ran.stderr
    assert "confirmation FAILED" in as_ran.stdout
    # the exported setting, soaked as long as its margin was sized for, passes
    soaked = simstudy.run(config, "confirm", "--cases", "none")
    assert soaked.returncode == 0, soaked.stdout + soaked.stderr
    assert "the soak the export's margin is sized for" in soaked.stdout
    assert f"with a {margin['soak_factor']:g}× soak" in soaked.stdout
    assert "confirmation PASSED" in soaked.stdout


@pytest.mark.e2e
def test_a_soak_that_fails_at_the_export_backs_it_off_and_the_next_soak_confirms_it(
    no_leftovers: Path,
) -> None:
    """The operator's loop when a confirmation fails: the exported setting's soak meets a leak
    faster than the trials measured (the box's profile leaks 20× as fast from the confirm on) and
    runs out of memory; the export then backs off a step more, names the failed soak, and the
    next confirm, at the trials' leak, soaks the new point and passes."""
    config = _study(no_leftovers)
    _run_two_ok(config)
    first = json.loads(simstudy.run(config, "export", "--format", "json").stdout)
    profile = no_leftovers / "kimi-leak.toml"
    as_run = profile.read_text()
    profile.write_text(as_run.replace(f"= {GROWTH_MIB}", f"= {20 * GROWTH_MIB}"))
    long = simstudy.run(config, "confirm", "--cases", "none")
    profile.write_text(as_run)
    assert long.returncode == 1, long.stdout + long.stderr
    assert "confirmation FAILED" in long.stdout and "runtime_oom" in long.stdout
    after = json.loads(simstudy.run(config, "export", "--format", "json").stdout)
    assert after["params"]["mem_fraction_static"] == pytest.approx(
        first["params"]["mem_fraction_static"] - 0.02
    )
    assert after["margin"]["steps"] == first["margin"]["steps"] + 1
    assert after["margin"]["uncovered"] == ["soak"]
    assert "not covered: the soak failed at the confirmed setting" in after["margin"]["soak_plan"]
    assert any("the confirmation's soak failed at the confirmed setting" in n
               for n in after["notes"])  # fmt: skip
    assert after["confirmed"] is None  # the new point has not been soaked yet
    again = simstudy.run(config, "confirm", "--cases", "none")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "confirmation PASSED" in again.stdout
    last = json.loads(simstudy.run(config, "export", "--format", "json").stdout)
    assert last["params"] == after["params"] and last["confirmed"] is True


MIXTRAL = (
    Path(__file__).resolve().parents[2] / "scripts" / "bench_profiles" / "mixtral-8x7b-tp2-48g.toml"
)
NARROW = simstudy.sim_study(
    time_scale=30000,
    duration=0.5,
    headroom_gib=1.65,
    n_trials=2,
    profile=str(MIXTRAL),
    flags='model-path = "mistralai/Mixtral-8x7B-Instruct-v0.1"\ntp-size = 2',
    search="[search]\nmem_fraction_static = 0.93\nmax_running_requests = { choices = [32, 64] }"
    "\n\n[baseline]\nmax_running_requests = 32",
)


@pytest.mark.e2e
def test_a_narrow_window_exports_a_smaller_prefill_chunk_and_the_soak_passes(
    no_leftovers: Path,
) -> None:
    """Mixtral-8x7B on 2 × 48 GB at 0.93, the lowest fraction whose KV pool finds room, keeps
    less than the soak's margin under a 1.65 GiB headroom: the export lowers the prefill chunk
    instead of the fraction, and the exported command, soaked, passes."""
    config = no_leftovers / "narrow.toml"
    config.write_text(NARROW)
    records = _run_two_ok(config)
    ran_with = {r["ledger"]["chunked_prefill_size"] for r in records}
    assert len(ran_with) == 1, ran_with
    was = ran_with.pop()
    exported = simstudy.run(config, "export", "--format", "json")
    assert exported.returncode == 0, exported.stderr
    ex = json.loads(exported.stdout)
    chunk = ex["params"]["chunked_prefill_size"]
    assert chunk < was and ex["params"]["mem_fraction_static"] == 0.93, ex["params"]
    assert ex["predicted"] is True
    argv = ex["argv"]
    assert argv.count("--chunked-prefill-size") == 1
    assert argv[argv.index("--chunked-prefill-size") + 1] == str(chunk)
    assert any(f"chunked_prefill_size {chunk} instead of {was}" in n for n in ex["notes"])
    soaked = simstudy.run(config, "confirm", "--cases", "none")
    assert soaked.returncode == 0, soaked.stdout + soaked.stderr
    assert "confirmation PASSED" in soaked.stdout
    confirm = [
        json.loads(p.read_text())
        for p in sorted((no_leftovers / "results").glob("*/confirm/*/trial.json"))
    ]
    assert [c["ledger"]["chunked_prefill_size"] for c in confirm] == [chunk]
