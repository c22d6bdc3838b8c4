"""A standard stream whose encoding cannot carry a character (an ASCII locale, `LC_ALL=C` with
`PYTHONUTF8=0`) is not a stream gone: the line goes out with backslash escapes and the stream
stays (`autotune.cli.streams.Tolerant`)."""

from __future__ import annotations

import io

from autotune.cli.streams import Tolerant


def test_a_character_the_locale_cannot_carry_is_escaped_not_a_stream_gone() -> None:
    raw = io.BytesIO()
    inner = io.TextIOWrapper(raw, encoding="ascii", write_through=True)
    err_raw = io.BytesIO()
    out = Tolerant(inner, "output")
    out.other = Tolerant(io.TextIOWrapper(err_raw, encoding="ascii", write_through=True), "error")
    assert out.write("ETA ≥ 3s under /tmp/é\n") == len("ETA ≥ 3s under /tmp/é\n")
    out.write("next line\n")
    out.flush()
    assert not out.gone
    assert raw.getvalue() == b"ETA \\u2265 3s under /tmp/\\xe9\nnext line\n"
    assert err_raw.getvalue() == b""  # no "standard output is gone" warning
