"""The morning review end to end: a short study through the simulator, then report, explain,
export and confirm as the operator runs them (real processes, real HTTP on 127.0.0.1).

One study serves every test in this module (it takes the longest); every process started here
carries the module's folder in its command line, and none may be left when the module ends.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import optuna
import pytest

from autotune.cli.main import main
from autotune.config.space import params_from_flags
from autotune.config.studyfile import load_study
from autotune.server.flagcheck import canonical_argv, inspect_argv
from tests import simstudy

pytestmark = pytest.mark.e2e


class Done(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


def cli(folder: Path, capsys: pytest.CaptureFixture[str], *args: str) -> Done:
    """`autotune ARGS` in this process (the servers it starts are still processes of their own)."""
    capsys.readouterr()
    try:
        code = main([*args, "--config", str(folder / "e2e.toml"),
                     "--results-dir", str(folder / "results")])  # fmt: skip
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return Done(code, out, err)


def autotune(folder: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return simstudy.run(folder / "e2e.toml", *args, timeout=timeout)


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The study folder after `autotune run`; `report` ran while trial 0 ran and at the end."""
    folder = tmp_path_factory.mktemp("review")
    config = folder / "e2e.toml"
    config.write_text(simstudy.sim_study(time_scale=3000))
    run = simstudy.start(config, "run")
    try:
        simstudy.wait_ready(folder / "results/e2e/trials/0000/server.log", run)
        during = autotune(folder, "report")
        (folder / "during.txt").write_text(f"{during.returncode}\n{during.stdout}{during.stderr}")
        out, _ = run.communicate(timeout=240)
        assert run.returncode == 0, out
        after = autotune(folder, "report")
        (folder / "after.txt").write_text(f"{after.returncode}\n{after.stdout}{after.stderr}")
        yield folder
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate(timeout=30)
        simstudy.assert_none_left(folder)


def _trial_json(folder: Path, number: int) -> dict[str, object]:
    data = json.loads((folder / f"results/e2e/trials/{number:04d}/trial.json").read_text())
    assert isinstance(data, dict)
    return data


def _without_launch_flags(argv: object) -> list[str]:
    """A recorded command without what the harness picks per launch."""
    assert isinstance(argv, list)
    out = [str(a) for a in argv]
    for flag in ("--sim-gpu-dir", "--host", "--port"):
        i = out.index(flag)
        del out[i : i + 2]
    return out


def _canonical(argv: list[str]) -> list[str]:
    """The command with each flag spelt as the server's parser names it (what export prints)."""
    return list(canonical_argv(argv, inspect_argv(argv, backend="sim").canonical))


def test_report_while_running_and_after(study: Path) -> None:
    during = (study / "during.txt").read_text()
    assert during.startswith("0\n"), during
    assert "running" in during
    after = (study / "after.txt").read_text()
    assert after.startswith("0\n"), after
    assert "3 trials finished" in after and "UNCONFIRMED" in after
    html = study / "results/e2e/report.html"
    page = html.read_text()
    assert "Plotly.newPlot" in page and "KV pool = A − P × (1 − f)" in page
    pngs = sorted((study / "results/e2e/report").glob("*.png"))
    assert {"pareto.png", "capacity.png", "feasibility.png", "ledger-winner.png"} <= {
        p.name for p in pngs
    }
    assert all(p.stat().st_size > 5000 for p in pngs)


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium not installed")
def test_report_opens_in_headless_chromium(study: Path) -> None:
    html = study / "results/e2e/report.html"
    shot = study / "shot.png"
    argv = ["chromium", "--headless=new", "--no-sandbox", "--disable-gpu",
            "--enable-logging=stderr", "--v=0", "--window-size=1300,2600",
            "--virtual-time-budget=8000", f"--user-data-dir={study / 'chromium'}"]  # fmt: skip
    pic = subprocess.Popen([*argv, f"--screenshot={shot}", html.as_uri()], cwd=study,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)  # fmt: skip
    dom_argv = [*argv[:-1], f"--user-data-dir={study / 'chromium-dom'}"]
    dom = subprocess.run([*dom_argv, "--dump-dom", html.as_uri()], capture_output=True,
                         text=True, timeout=120, start_new_session=True)  # fmt: skip
    assert pic.wait(timeout=120) == 0 and shot.stat().st_size > 50_000
    console = [line for line in dom.stderr.splitlines() if ":CONSOLE" in line]
    assert not console, console
    assert dom.stdout.count('class="main-svg"') >= 6  # every plotly figure was drawn


def test_explain_prints_the_arithmetic(study: Path, capsys: pytest.CaptureFixture[str]) -> None:
    done = cli(study, capsys, "explain", "--trial", "0")
    assert done.returncode == 0, done.stderr
    assert "KV pool = A − P × (1 − f) = 21.71 − 94.05 × (1 − 0.88) = 10.42 GiB" in done.stdout
    assert "Reserve P × (1 − f) = 11.29 GiB" in done.stdout
    assert done.stdout.startswith("baseline 0.88: ")
    assert "Stress peak" in done.stdout and "What limits it" in done.stdout


def test_export_prints_each_format_with_the_flags_the_trial_ran(
    study: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = load_study(study / "e2e.toml")
    for fmt in ("flags", "shell", "json", "systemd"):
        done = cli(study, capsys, "export", "--format", fmt)
        assert done.returncode == 0, done.stderr
        assert "--mem-fraction-static" in done.stdout
    unit = cli(study, capsys, "export", "--format", "systemd").stdout
    assert "\nExecStart=\nExecStart=" in unit and "UNCONFIRMED" in unit
    ran = _trial_json(study, 0)
    exported = json.loads(cli(study, capsys, "export", "--format", "json", "--trial", "0").stdout)
    argv = _canonical(_without_launch_flags(ran["argv"]))
    assert exported["argv"] == argv
    assert params_from_flags(exported["argv"], cfg.search) == ran["params"]
    assert exported["params"] == ran["params"] and exported["trial"] == 0


def test_confirm_records_pass_and_fail(study: Path, capsys: pytest.CaptureFixture[str]) -> None:
    passed = cli(study, capsys, "confirm", "--margin", "0", "--soak-factor", "1.5",
                 "--cases", "none")  # fmt: skip
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert "confirmation PASSED" in passed.stdout
    failed = cli(study, capsys, "confirm", "--trial", "2")  # 0.94 does not start
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "confirmation FAILED" in failed.stdout
    url = f"sqlite:///{study / 'results/e2e/study.db'}"
    attrs = optuna.load_study(study_name="e2e", storage=url).user_attrs
    assert [c["passed"] for c in attrs["confirmations"]] == [True, False]
    assert attrs["confirmation"]["params"]["mem_fraction_static"] == 0.94
    shown = cli(study, capsys, "export", "--margin", "0", "--format", "json")
    exported = json.loads(shown.stdout)
    assert exported["confirmed"] is True
    soaked = json.loads((study / "results/e2e/confirm/0000/trial.json").read_text())
    assert _canonical(_without_launch_flags(soaked["argv"])) == exported["argv"]  # as exported
    assert "CONFIRMED by a soak" in cli(study, capsys, "explain", "--margin", "0").stdout
    assert "UNCONFIRMED" in cli(study, capsys, "export").stdout  # the default margin: not soaked


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("report", "--study", "nosuch"), "nosuch"),
        (("explain", "--trial", "99"), "--trial 99"),
        (("export", "--format", "xml"), "--format xml"),
        (("export", "--margin", "lots"), "--margin"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(
    study: Path, args: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    if args[1] == "--study":
        cmd = [sys.executable, "-m", "autotune", *args, "--results-dir", str(study / "results")]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=study)
    else:
        done = cli(study, capsys, *args)  # type: ignore[assignment]
    assert done.returncode == 2
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_a_study_with_no_trials_is_exit_code_2(
    study: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = study / "results" / "empty"
    folder.mkdir()
    optuna.create_study(study_name="empty", storage=f"sqlite:///{folder / 'study.db'}")
    capsys.readouterr()
    code = main(["report", "--study", "empty", "--results-dir", str(study / "results")])
    assert code == 2 and "no trials yet" in capsys.readouterr().err
