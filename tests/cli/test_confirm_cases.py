"""`autotune confirm --cases`: which worst cases run after the soak; a name it does not know is
a one-line usage error before anything is opened or launched."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.cli.main import main
from autotune.review.worstcase import CASE_NAMES


def test_an_unknown_case_is_a_one_line_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["confirm", "--study", "demo", "--results-dir", str(tmp_path),
                 "--cases", "largest-chunk,longest-lunch"])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "--cases longest-lunch: unknown" in err and CASE_NAMES[0] in err
    assert not any(tmp_path.iterdir())
