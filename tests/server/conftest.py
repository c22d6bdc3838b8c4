"""The guard every lifecycle test uses: each process a test started must be gone when it ends
(what is left is killed by process group, and the test fails)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from server_helpers import Guard


@pytest.fixture
def guard() -> Iterator[Guard]:
    g = Guard()
    yield g
    deadline = time.monotonic() + 3.0
    left = g.leftovers()
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = g.leftovers()
    g.kill_all()
    assert not left, f"processes left behind by the test: {left}"
