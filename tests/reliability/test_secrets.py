"""Secrets and exposure: loopback by default, the API key written nowhere, storage passwords
redacted in every output, log text escaped in the HTML report."""

from __future__ import annotations

import json
import os
import secrets
import signal
import stat
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from optuna.trial import TrialState

from autotune.server import procs
from tests.reliability.helpers import Done, World, one_line, server_record

pytestmark = pytest.mark.e2e

KEY_ENV = "REL_API_KEY"


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[World, str, list[Done]]]:
    """One study run with an API key, then every reading command; (world, key, their outputs)."""
    world = World(tmp_path_factory.mktemp("keyed"))
    key = "sk-rel-" + secrets.token_hex(12)
    env = {KEY_ENV: key}
    world.study(workload=f'api_key_env = "{KEY_ENV}"', duration=1.0)
    outputs = [world.run(env=env)]
    common = ["--config", str(world.folder / "rel.toml"), "--results-dir", str(world.results)]
    for command in (
        ["status", *common],
        ["report", *common],
        ["export", *common, "--format", "flags", "--trial", "0"],
        ["export", *common, "--format", "json", "--trial", "0"],
        ["export", *common, "--format", "systemd", "--trial", "0"],
    ):
        outputs.append(world.autotune(*command, env=env))
    try:
        yield world, key, outputs
    finally:
        world.finish()


def test_servers_bind_to_loopback_by_default(keyed: tuple[World, str, list[Done]]) -> None:
    world, _, _ = keyed
    log = (world.study_dir / "trials/0000/server.log").read_text()
    assert "Uvicorn running on http://127.0.0.1:" in log
    assert "--host 127.0.0.1 --port" in " ".join(world.trials()[0].user_attrs["record"]["argv"])


def test_servers_bind_where_configured_otherwise(world: World) -> None:
    world.study(server='host = "0.0.0.0"')
    done = world.run()
    assert done.rc == 0, done.err
    assert world.trials()[0].user_attrs["outcome"] == "ok"
    log = (world.study_dir / "trials/0000/server.log").read_text()
    assert "Uvicorn running on http://0.0.0.0:" in log


def test_api_key_reaches_server_and_client(keyed: tuple[World, str, list[Done]]) -> None:
    world, _, outputs = keyed
    assert outputs[0].rc == 0, outputs[0].err
    trial = world.trials()[0]
    assert (trial.state, trial.user_attrs["outcome"]) == (TrialState.COMPLETE, "ok")
    overall = trial.user_attrs["record"]["workload"]["overall"]
    assert overall["completed"] > 0 and overall["failed"] == 0  # the server demands the key
    log = (world.study_dir / "trials/0000/server.log").read_text()
    assert "Authorization" not in log and "api_key=" in log  # the server was given one


def test_api_key_is_written_nowhere(keyed: tuple[World, str, list[Done]]) -> None:
    world, key, outputs = keyed
    assert all(d.rc == 0 for d in outputs), [d.err for d in outputs]
    files = [p for p in world.folder.rglob("*") if p.is_file()]
    assert any(p.suffix == ".html" for p in files) and any(p.suffix == ".db" for p in files)
    holding = [str(p) for p in files if key.encode() in p.read_bytes()]
    assert holding == [], f"the API key is written in {holding}"
    printed = [d for d in outputs if key in d.out + d.err]
    assert printed == [], "the API key was printed"


# ------------------------------------------------------------------------------------------------
# Storage URLs with passwords
# ------------------------------------------------------------------------------------------------

PASSWORD = "pw-" + uuid.uuid4().hex


@pytest.mark.parametrize("command", ["run", "status", "report", "export"])
def test_unreachable_storage_url_is_redacted(world: World, command: str) -> None:
    world.study()
    url = f"postgresql://autotune:{PASSWORD}@127.0.0.1:1/nowhere"
    args = ["--config", str(world.folder / "rel.toml"), "--results-dir", str(world.results)]
    done = world.autotune(command, *args, "--storage", url)
    assert done.rc in (1, 2)
    line = one_line(done.err)
    assert PASSWORD not in done.out + done.err
    assert "autotune:***@127.0.0.1:1" in line, line


@pytest.fixture
def pg_database() -> Iterator[str]:
    """A fresh PostgreSQL database on 127.0.0.1:5432 (trust auth, so any password is taken)."""
    psycopg = pytest.importorskip("psycopg")
    try:
        conn = psycopg.connect(host="127.0.0.1", port=5432, user="postgres", dbname="postgres",
                               connect_timeout=3)  # fmt: skip
    except psycopg.Error as exc:
        pytest.skip(f"no PostgreSQL on 127.0.0.1:5432: {exc}")
    conn.autocommit = True
    name = f"autotune_rel_{uuid.uuid4().hex[:12]}"
    with conn.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        with conn.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.close()


def test_storage_password_is_redacted_in_every_output(world: World, pg_database: str) -> None:
    url = f"postgresql://postgres:{PASSWORD}@127.0.0.1:5432/{pg_database}"
    world.study()
    args = ["--config", str(world.folder / "rel.toml"), "--results-dir", str(world.results)]
    outputs = [
        world.autotune(*world.run_args("--storage", url)),
        world.autotune("status", *args, "--storage", url),
        world.autotune("report", *args, "--storage", url),
        world.autotune("export", *args, "--storage", url, "--trial", "0"),
    ]
    assert all(d.rc == 0 for d in outputs), [d.err for d in outputs]
    assert "postgres:***@127.0.0.1:5432" in outputs[0].out
    assert all(PASSWORD not in d.out + d.err for d in outputs)
    files = [p for p in world.folder.rglob("*") if p.is_file()]
    assert [str(p) for p in files if PASSWORD.encode() in p.read_bytes()] == []


# ------------------------------------------------------------------------------------------------
# Log text in the HTML report
# ------------------------------------------------------------------------------------------------

INJECTED = "<script>alert('rel')</script>"


def test_html_report_escapes_log_text(world: World) -> None:
    """The server prints a line of markup and dies during startup; its last log lines become
    the trial's evidence and reason, and the report must show them as text. (The server's
    Python picks up a `sitecustomize` from PYTHONPATH, set in `[server.env]`.)"""
    site = world.folder / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        f"import os\nprint({f'weights corrupt: {INJECTED}'!r}, flush=True)\nos._exit(3)\n"
    )
    world.study(flags=f'\n[server.env]\nPYTHONPATH = "{site}"')
    done = world.run()
    assert done.rc == 0, done.err
    trial = world.trials()[0]
    assert INJECTED in (world.study_dir / "trials/0000/server.log").read_text()
    assert INJECTED in trial.user_attrs["reason"]
    args = ["--config", str(world.folder / "rel.toml"), "--results-dir", str(world.results)]
    report = world.autotune("report", *args)
    assert report.rc == 0, report.err
    pages = [p.read_text() for p in world.study_dir.rglob("*.html")]
    assert pages and all(INJECTED not in page for page in pages)
    assert any("&lt;script&gt;alert(" in page for page in pages)


# ------------------------------------------------------------------------------------------------
# The live log, and who may read a trial's folder
# ------------------------------------------------------------------------------------------------


def _writer_of(log: Path) -> procs.ProcInfo | None:
    """The masking writer that writes `log` (its command line names the log)."""
    for p in procs.all_procs():
        try:
            argv = Path(f"/proc/{p.pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(b"masking.py") for a in argv) and str(log).encode() in argv:
            return p
    return None


def _generate(port: int, key: str) -> int:
    body = json.dumps({"text": "hello", "sampling_params": {"max_new_tokens": 2}}).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/generate",
        data=body,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return int(resp.status)


def test_api_key_is_never_in_the_live_log_even_after_autotune_dies(world: World) -> None:
    """SGLang prints its arguments, the key among them, at startup. The server writes into a
    pipe and a masking writer (its own session, every signal but SIGKILL ignored) writes the
    log: the key is never in the file, not even while the server runs. autotune SIGKILLed
    mid-trial neither stops nor blocks the server: it goes on serving and logging (masked); the
    resume stops server and writer alike. Trial folders are 0700, logs and records 0600."""
    key = "sk-live-" + secrets.token_hex(12)
    env = {KEY_ENV: key}
    world.foreign_sleep()
    world.study(workload=f'api_key_env = "{KEY_ENV}"', duration=30, n_trials=2)
    proc = world.start(*world.run_args(), env=env)
    log = world.study_dir / "trials/0000/server.log"
    deadline = time.monotonic() + 60
    while b"Decode batch" not in (log.read_bytes() if log.exists() else b""):
        assert key.encode() not in (log.read_bytes() if log.exists() else b"")
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.01)
    assert b"api_key='***'" in log.read_bytes() or b"api_key=***" in log.read_bytes()
    record = server_record(world)
    writer = _writer_of(log)
    assert writer is not None, "no masking writer"
    assert writer.sid == writer.pid != record.sid  # a session of its own
    assert (writer.pid, writer.start_ticks) in record.members  # a resume stops it too
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    time.sleep(1.0)
    assert procs.is_alive(record.pid, record.start_ticks), "the server died with autotune"
    assert procs.is_alive(writer.pid, writer.start_ticks), "the writer died with autotune"
    size = log.stat().st_size
    assert _generate(record.port, key) == 200  # still serving, and still logging
    deadline = time.monotonic() + 10
    while log.stat().st_size == size:
        assert time.monotonic() < deadline, "nothing logged after autotune died"
        time.sleep(0.05)
    assert key.encode() not in log.read_bytes()
    world.study(workload=f'api_key_env = "{KEY_ENV}"', duration=0.5, n_trials=2)
    done = world.run(env=env)
    assert done.rc == 0, done.out + done.err
    assert "recovered trials [0]" in done.out
    assert not procs.is_alive(writer.pid, writer.start_ticks)
    assert world.problems() == []
    files = [p for p in world.folder.rglob("*") if p.is_file()]
    assert [str(p) for p in files if key.encode() in p.read_bytes()] == []
    trials = sorted((world.study_dir / "trials").iterdir())
    assert len(trials) >= 2
    assert stat.S_IMODE((world.study_dir / "trials").stat().st_mode) == 0o700
    for folder in trials:
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
        for name in ("server.log", "trial.json"):
            if (folder / name).exists():
                assert stat.S_IMODE((folder / name).stat().st_mode) == 0o600, folder / name
