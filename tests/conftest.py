"""Fixtures every test folder may use: `no_leftovers`, the test's folder, checked at the end for
processes that outlive the test (see tests/simstudy.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.simstudy import assert_none_left


@pytest.fixture
def no_leftovers(tmp_path: Path) -> Iterator[Path]:
    """The test's folder; at the end no process mentioning it may be alive."""
    yield tmp_path
    assert_none_left(tmp_path)
