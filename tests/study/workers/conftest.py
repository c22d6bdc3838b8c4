"""Fixtures for the workers' tests: a fresh PostgreSQL database per test (`no_leftovers`, the
check that no process a test started outlives it, is in tests/conftest.py).

Tests marked `postgres` need the server on 127.0.0.1:5432 (trust auth; `.ci/run` starts it).
When it cannot be reached they fail with the reason; deselect them with `-m "not postgres"`.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

PG_HOST = os.environ.get("AUTOTUNE_TEST_PGHOST", "127.0.0.1")
PG_PORT = int(os.environ.get("AUTOTUNE_TEST_PGPORT", "5432"))
PG_USERS = ("postgres", "root")


def _admin_connection() -> tuple[object, str]:
    import psycopg

    errors = []
    for user in PG_USERS:
        try:
            conn = psycopg.connect(
                host=PG_HOST, port=PG_PORT, user=user, dbname="test", connect_timeout=5
            )
        except psycopg.Error as exc:
            errors.append(f"{user}: {str(exc).strip().splitlines()[0]}")
            continue
        conn.autocommit = True
        return conn, user
    pytest.fail(
        f"PostgreSQL at {PG_HOST}:{PG_PORT} (database test) is unreachable ({'; '.join(errors)}); "
        "start it (`.ci/run` does) or deselect these tests with -m 'not postgres'",
        pytrace=False,
    )


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A database of its own for this test (created now, dropped at the end), as a URL."""
    conn, user = _admin_connection()
    name = f"autotune_test_{uuid.uuid4().hex[:12]}"
    cur = conn.cursor()  # type: ignore[attr-defined]
    cur.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql://{user}@{PG_HOST}:{PG_PORT}/{name}"
    finally:
        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.close()  # type: ignore[attr-defined]
