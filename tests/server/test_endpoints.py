"""Each route autotune reads, asked once and judged by its shape (`server.endpoints`), against the
fake SGLang server: what it answers as SGLang does is go, what it lacks is named."""

from __future__ import annotations

from collections.abc import Callable

from autotune.server.endpoints import Endpoint, _info_shape, check_endpoints
from autotune.testing import fakeserver


def test_each_route_is_judged_by_what_autotune_reads_of_it(
    fake_server: Callable[..., fakeserver.Running],
) -> None:
    srv = fake_server()
    seen = {e.route: e for e in check_endpoints(srv.url, None, timeout_s=5.0)}
    assert seen["/generate"] == Endpoint("/generate", True, "200, text and meta_info")
    assert seen["/health"].ok and seen["/health_generate"].ok
    assert not seen["/health"].needed and seen["/generate"].needed
    flush = seen["/flush_cache"]  # the fake server has no such route
    assert not flush.ok and flush.needed and "404" in flush.detail


def test_a_server_info_without_what_autotune_reads_is_named() -> None:
    assert _info_shape([1, 2]) == "not a JSON object"
    assert _info_shape({"version": "0.5.23"}) == "no `internal_states` list"
    assert _info_shape({"internal_states": [{}], "version": "x"}) == (
        "no `internal_states[0].memory_usage`"
    )
    assert _info_shape({"internal_states": [{"memory_usage": {}}]}) == "no `version`"
    assert _info_shape({"internal_states": [{"memory_usage": {}}], "version": "0.5.9"}) == ""
