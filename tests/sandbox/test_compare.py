"""Properties of normalize / outputs_equal, and of the child's serialisation round trip."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sandbox
from sandbox import normalize, outputs_equal

scalars = st.none() | st.booleans() | st.integers(-10 ** 20, 10 ** 20) | st.floats() | st.text(max_size=20)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=5) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=20,
)


@given(json_values)
def test_normalize_is_idempotent_and_reflexive(value):
    once = normalize(value)
    assert outputs_equal(normalize(once), once)
    assert outputs_equal(once, once)


def _floats(value):
    """`value` with every int (not bool) made a float."""
    if isinstance(value, list):
        return [_floats(v) for v in value]
    if isinstance(value, dict):
        return {k: _floats(v) for k, v in value.items()}
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


@given(json_values, json_values)
def test_outputs_equal_is_symmetric_but_for_ints_against_floats(a, b):
    """Symmetric except where it is built not to be (an int output against a float expectation, below): with every
    int made a float on both sides, the order of the two never matters."""
    a, b = _floats(normalize(a)), _floats(normalize(b))
    assert outputs_equal(a, b) == outputs_equal(b, a)


def test_a_float_expectation_accepts_an_int_and_an_int_expectation_no_float():
    assert outputs_equal(0, 0.0) and outputs_equal(3, 3.0000001) and outputs_equal([1], [1.0])
    assert not outputs_equal(0.0, 0) and not outputs_equal(3.0, 3) and not outputs_equal([1.0], [1])


@given(st.lists(json_values, max_size=4))
def test_tuples_and_lists_are_the_same(items):
    assert outputs_equal(normalize(tuple(items)), normalize(list(items)))


@given(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e12, max_value=1e12))
def test_float_tolerance(x):
    assert outputs_equal(x, x * (1 + 1e-9))
    assert outputs_equal(x, x + 1e-12)
    assert not outputs_equal(x, x + max(1.0, abs(x) * 1e-3))


@given(st.integers(), st.integers())
def test_integers_compare_exactly(a, b):
    assert outputs_equal(a, b) == (a == b)


def test_fixed_cases():
    assert outputs_equal(math.nan, math.nan) and not outputs_equal(math.nan, 0.0)
    assert not outputs_equal(True, 1) and not outputs_equal(0, False) and outputs_equal(1, 1.0)
    assert not outputs_equal("1", 1) and not outputs_equal(None, 0) and not outputs_equal([], {})
    assert not outputs_equal([1, 2], [1, 2, 3]) and not outputs_equal({"a": 1}, {"b": 1})
    assert normalize({1: (2, 3)}) == {"1": [2, 3]}
    for bad in ({1, 2}, object(), b"bytes", {(1, 2): 3}):
        with pytest.raises(sandbox.SandboxConfigError, match="not JSON-serialisable"):
            normalize(bad)


@settings(max_examples=25, deadline=None)
@given(value=json_values)
def test_child_serialisation_matches_normalize(sb, value):
    rep = sb.run_tests("def identity(x):\n    return x\n", "identity", [[value]], [value])
    assert rep.status == "ok" and rep.all_passed
    assert outputs_equal(rep.outputs[0], normalize(value))
