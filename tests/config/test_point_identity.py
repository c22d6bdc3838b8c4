"""A point's identity is defined once (`config.space`): snapped to the space's own step, compared
and hashed the same way by the search, the workers and the review."""

from __future__ import annotations

import ast
import re
from dataclasses import replace
from pathlib import Path

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from autotune.config.schema import Choices, Fixed, FloatRange, IntRange, SearchConfig
from autotune.config.space import (
    CONTINUOUS_FRACTION_STEP,
    FIXED_FRACTION_STEP,
    canonical,
    fraction_step,
    point_key,
    same_point,
    same_value,
    settings_for,
    settings_of,
    snap,
    step_of,
    stored_space,
)
from autotune.record.view import views
from autotune.review.winner import Margin, choose
from autotune.search.planner import Goal, plan
from tests.review.fakes import trial

F = "mem_fraction_static"
R = "max_running_requests"
ROOT = Path(__file__).resolve().parents[2] / "autotune"

SEARCH = SearchConfig(
    params=(
        FloatRange(F, 0.80, 0.99, 0.01),
        IntRange(R, 16, 128, 16),
        Choices("enable_mixed_chunk", (True, False)),
        Choices("attention_backend", ("fa3", "flashinfer")),
        FloatRange("other", 0.1, 0.9),
        Fixed("tp_size", 2),
    ),
    baseline={},
)
DISTRIBUTIONS = {
    F: FloatDistribution(0.80, 0.99, step=0.01),
    R: IntDistribution(16, 128, step=16),
    "enable_mixed_chunk": CategoricalDistribution([True, False]),
    "other": FloatDistribution(0.1, 0.9),
}
"""The same space as Optuna holds it (what a sampler is given, what a study stores)."""


# ---- snapping ---------------------------------------------------------------------------------


def test_a_float_is_snapped_to_two_decimals_more_than_its_step() -> None:
    assert snap(0.8800000000000001, 0.01) == 0.88
    assert snap(0.890001, 0.01) == 0.89
    assert snap(0.8250000001, 0.005) == 0.825
    assert snap(0.82504, 0.005) == 0.82504  # on a finer point than the lattice: kept


def test_without_a_step_only_the_float_noise_goes() -> None:
    assert snap(0.8600000000000001) == 0.86
    assert snap(0.8260405859375) == 0.8260405859375  # a baseline SGLang computed itself
    assert snap(0.890001) == 0.890001


def test_the_step_is_the_spaces_own_in_either_form() -> None:
    for space in (SEARCH, DISTRIBUTIONS):
        assert step_of(space, F) == 0.01
        assert step_of(space, R) == 16
        assert step_of(space, "other") is None  # a range without a step
        assert step_of(space, "enable_mixed_chunk") is None
        assert step_of(space, "not_searched") is None
        assert fraction_step(space) == 0.01
    assert step_of(None, F) is None


def test_a_continuous_fraction_moves_by_one_lattice_in_the_search_and_the_review() -> None:
    continuous = SearchConfig(params=(FloatRange(F, 0.67, 0.97),), baseline={})
    fixed = SearchConfig(params=(Fixed(F, 0.88),), baseline={})
    assert fraction_step(continuous) == CONTINUOUS_FRACTION_STEP
    assert fraction_step({F: FloatDistribution(0.67, 0.97)}) == CONTINUOUS_FRACTION_STEP
    # a fraction the study never moves backs off in the hundredths an operator writes
    assert fraction_step(fixed) == FIXED_FRACTION_STEP
    assert fraction_step(None) == FIXED_FRACTION_STEP
    # the continuous fraction keeps every digit it was given as its identity
    a = {F: 0.8260405859375}
    assert not same_point(a, {F: 0.826}, continuous)
    assert same_point(a, {F: 0.8260405859375000001}, continuous)


# ---- equality and hashing ----------------------------------------------------------------------


def test_points_equal_after_snapping_are_one_point_and_hash_alike() -> None:
    a = {F: 0.86, R: 64, "enable_mixed_chunk": True}
    b = {"enable_mixed_chunk": True, R: 64, F: 0.8600000000000001}
    c = {F: 0.860001, R: 64, "enable_mixed_chunk": True}
    for space in (SEARCH, DISTRIBUTIONS, None):
        assert point_key(a, space) == point_key(b, space)
        assert hash(point_key(a, space)) == hash(point_key(b, space))
        assert len({point_key(p, space) for p in (a, b)}) == 1
    # equal after the space's step (0.01: four decimals), not without it
    assert same_point(a, c, SEARCH) and same_point(a, c, DISTRIBUTIONS)
    assert not same_point(a, c)
    assert canonical(c, SEARCH) == a


def test_ints_compare_as_numbers() -> None:
    assert same_point({R: 64}, {R: 64.0}, SEARCH)
    assert not same_point({R: 64}, {R: 80}, SEARCH)
    assert canonical({R: 64}, SEARCH) == {R: 64} and isinstance(canonical({R: 64})[R], int)


def test_a_bool_is_never_the_number_it_equals_in_python() -> None:
    assert not same_value(True, 1) and not same_value(False, 0)
    assert not same_point({"enable_mixed_chunk": True}, {"enable_mixed_chunk": 1}, SEARCH)
    assert same_point({"enable_mixed_chunk": False}, {"enable_mixed_chunk": False}, SEARCH)
    assert same_value("fa3", "fa3") and not same_value("fa3", "flashinfer")
    assert not same_value("0.88", 0.88)


def test_the_same_names_make_the_same_point() -> None:
    assert not same_point({F: 0.86}, {F: 0.86, R: 64})
    key = point_key({F: 0.86, R: 64, "tp_size": 2}, SEARCH)
    assert point_key({R: 64.0}).within(key)
    assert not point_key({R: 80}).within(key)
    assert key.without((F, "tp_size")) == point_key({R: 64})
    assert key.only((F,)) == point_key({F: 0.8600000000000001})
    assert key.names == {F, R, "tp_size"}


def test_values_read_back_from_storage_hash_too() -> None:
    assert point_key({"x": [1, 2]}) == point_key({"x": (1, 2)})
    assert same_value(None, None) and not same_value(None, 0)


# ---- one constructor of Settings ---------------------------------------------------------------


def test_settings_hold_the_canonical_point_and_its_flags() -> None:
    fixed = {F: 0.88, R: 48, "enable_mixed_chunk": True, "attention_backend": "fa3", "other": 0.5}
    s = settings_of({**fixed, F: 0.8800000000000001, "tp_size": 2}, SEARCH)
    assert s.params[F] == 0.88
    assert "0.88" in s.flags and "--enable-mixed-chunk" in s.flags
    assert settings_for(optuna.trial.FixedTrial(fixed), SEARCH) == s


# ---- search and review deduplicate alike -------------------------------------------------------


def test_search_and_review_take_two_points_equal_after_snapping_as_one() -> None:
    """0.890001 and 0.89 are one point in a space with a 0.01 step: the search does not propose
    0.89 while 0.890001 runs, and the review exports 0.89 with the figures of the trial that ran
    0.890001. Without the step they are two points, for both."""
    ran = 0.890001
    space = {F: FloatDistribution(0.80, 0.99, step=0.01), R: IntDistribution(16, 128, step=16)}
    axes = {F: (0.88, 0.89, 0.90, 0.91)}  # the conservative start is 0.89
    assert plan(axes, [], [{F: ran}], Goal(), space).params[F] == 0.88
    assert plan(axes, [], [{F: ran}], Goal()).params[F] == 0.89

    frozen = [trial(0, 0.90), trial(1, 0.89, outcome="runtime_oom")]
    seen = views(frozen)
    seen[1] = replace(seen[1], params={**seen[1].params, F: ran})
    assert stored_space(frozen) == space
    w = choose(seen, space=space, margin=Margin(steps=1))
    assert w is not None and w.params[F] == 0.89
    assert w.source is not None and w.source.number == 1
    apart = choose(seen, fraction_step=0.01, margin=Margin(steps=1))
    assert apart is not None and apart.source is None


# ---- defined once ------------------------------------------------------------------------------

_IDENTITY = re.compile(r"^_?(same\w*|\w*same_(params|point|combo)\w*|snap|norm)$")
"""Names a definition of a point's identity would take (an equality, a normal form, a snap)."""
_NOT_A_POINT = {
    ("record/seeds.py", "_same_flag"): "a fixed flag against a log's server_args",
    ("study/records.py", "_same_json"): "a trial's stored record against the storage's",
    ("study/storage.py", "same_machine"): "a host, not a point",
    ("search/points.py", "same_gpu"): "two memory Settings (fraction, requests, chunk)",
    ("search/holding.py", "same_demand"): "two memory Settings' demand",
}
"""Comparisons that carry such a name but compare something that is not a point."""


def _definitions() -> list[tuple[str, str, int]]:
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "config/space.py" or rel.startswith("sim/"):
            continue  # the one definition; the simulator knows no study points
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                out.append((rel, node.name, node.lineno))
    return out


def test_a_point_is_compared_snapped_and_hashed_in_config_space_only() -> None:
    second = [
        f"autotune/{rel}:{line} {name}"
        for rel, name, line in _definitions()
        if _IDENTITY.match(name) and (rel, name) not in _NOT_A_POINT
    ]
    assert not second, (
        "a second definition of a point's identity; compare points with "
        f"config.space.point_key / same_point / same_value: {second}"
    )


def test_the_allowed_comparisons_still_exist() -> None:
    defined = {(rel, name) for rel, name, _ in _definitions()}
    assert set(_NOT_A_POINT) <= defined, set(_NOT_A_POINT) - defined


def test_settings_are_built_by_the_one_constructor() -> None:
    built = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "config/space.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name | ast.Attribute):
                name = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
                if name == "Settings":
                    built.append(f"autotune/{rel}:{node.lineno}")
    assert not built, f"build Settings with config.space.settings_of: {built}"


@pytest.mark.parametrize("value", [0.84, 0.85, 0.93, 0.94])
def test_a_grid_value_is_its_own_canonical_form(value: float) -> None:
    assert canonical({F: value}, SEARCH) == {F: value}
