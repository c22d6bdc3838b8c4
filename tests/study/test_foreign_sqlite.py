"""A SQLite file that is not an Optuna storage is refused, byte for byte unchanged."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import optuna
import pytest

from autotune.errors import UsageError
from autotune.study.storage import check_sqlite
from tests.reliability.helpers import World, one_line


def _app_db(path: Path) -> str:
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    db.execute("INSERT INTO users (name) VALUES ('ada')")
    db.commit()
    db.close()
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_only_an_optuna_or_empty_sqlite_file_passes(tmp_path: Path) -> None:
    app = tmp_path / "app.db"
    digest = _app_db(app)
    with pytest.raises(UsageError) as e:
        check_sqlite(f"sqlite:///{app}")
    assert str(e.value) == (
        f"--storage sqlite:///{app}: {app} is a SQLite database but no Optuna storage (its "
        "tables: users; no version_info or studies table); it was left unchanged: name a new "
        "file or an Optuna storage"
    )
    assert hashlib.sha256(app.read_bytes()).hexdigest() == digest
    optuna.create_study(storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    check_sqlite(f"sqlite:///{tmp_path / 'optuna.db'}")
    (tmp_path / "empty.db").write_bytes(b"")
    check_sqlite(f"sqlite:///{tmp_path / 'empty.db'}")
    check_sqlite(f"sqlite:///{tmp_path / 'new.db'}")
    check_sqlite("postgresql://u@127.0.0.1:1/x")
    (tmp_path / "junk.db").write_bytes(b"not a database at all, not even close" * 100)
    with pytest.raises(UsageError, match="cannot open it"):
        check_sqlite(f"sqlite:///{tmp_path / 'junk.db'}")


@pytest.mark.e2e
def test_run_and_the_readers_refuse_a_foreign_sqlite_file(tmp_path: Path) -> None:
    world = World(tmp_path)
    try:
        world.study()
        app = tmp_path / "app.db"
        digest = _app_db(app)
        url = f"sqlite:///{app}"
        for command in (
            world.run_args("--storage", url),
            ["status", "--study", "rel", "--storage", url],
            ["export", "--config", str(tmp_path / "rel.toml"), "--storage", url],
            ["rebuild", "--config", str(tmp_path / "rel.toml"), "--storage", url],
        ):
            done = world.autotune(*command)
            assert done.rc == 2, (command, done.out, done.err)
            assert "is a SQLite database but no Optuna storage" in one_line(done.err), done.err
            assert hashlib.sha256(app.read_bytes()).hexdigest() == digest, command
        assert not world.results.exists(), "a refused storage must leave nothing written"
    finally:
        world.finish()
