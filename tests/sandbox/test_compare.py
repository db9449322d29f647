"""Properties of normalize / outputs_equal, and of the child's serialisation round trip."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sandbox
from sandbox import normalize, outputs_equal

scalars = st.none() | st.booleans() | st.integers(-(10**20), 10**20) | st.floats() | st.text(max_size=20)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=5) | st.tuples(inner, inner) | st.dictionaries(st.text(max_size=8), inner, max_size=5)
    ),
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


# ------------------------------------------------------------------- the compare is total over protocol values
huge_ints = st.builds(
    lambda sign, e, d: sign * (10**e + d), st.sampled_from([1, -1]), st.integers(300, 2000), st.integers(0, 10**6)
)
any_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | huge_ints
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=10)
    | st.binary(max_size=4)
    | st.complex_numbers(allow_nan=True)
)
any_values = st.recursive(
    any_scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=4) | st.integers(), inner, max_size=4)
        | st.frozensets(st.integers() | huge_ints | st.text(max_size=4), max_size=3)
    ),
    max_leaves=25,
)


def _nested(depth: int, leaf):
    value = leaf
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


@settings(max_examples=300)
@given(any_values, any_values)
def test_outputs_equal_never_raises(a, b):
    assert outputs_equal(a, b) in (True, False)
    assert outputs_equal(b, a) in (True, False)


@given(st.integers() | huge_ints, st.floats(allow_nan=True, allow_infinity=True), st.integers(0, 3))
def test_any_int_against_any_float_expectation_is_a_verdict(answer, expected, depth):
    wrapped_answer, wrapped_expected = _nested(depth, answer), _nested(depth, expected)
    assert outputs_equal(wrapped_answer, wrapped_expected) in (True, False)
    assert not outputs_equal(wrapped_expected, wrapped_answer)  # a float never meets an int expectation


def _same_shape(value, draw):
    """`value` with each leaf (scalar) replaced by itself, a float (nan, inf included) or any other scalar."""
    if isinstance(value, (list, tuple)):
        return type(value)(_same_shape(v, draw) for v in value)
    if isinstance(value, dict):
        return {k: _same_shape(v, draw) for k, v in value.items()}
    return draw(st.just(value) | st.floats(allow_nan=True, allow_infinity=True) | any_scalars)


@settings(max_examples=300)
@given(any_values, st.data())
def test_outputs_equal_never_raises_against_an_expectation_of_the_same_shape(value, data):
    expected = _same_shape(value, data.draw)
    assert outputs_equal(value, expected) in (True, False)
    assert outputs_equal(expected, value) in (True, False)


@given(any_values)
def test_outputs_equal_is_reflexive_on_json_values(value):
    value = normalize(_jsonable(value))
    assert outputs_equal(value, value)


def _jsonable(value):
    """`value` with what JSON cannot carry (bytes, complex, sets, non-str keys) made plain."""
    if isinstance(value, (list, tuple, frozenset)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (bytes, complex)):
        return repr(value)
    return value


def test_a_huge_int_against_a_float_is_compared_not_raised():
    assert not outputs_equal(10**400, 1.5) and not outputs_equal(-(10**400), -1.5)
    assert not outputs_equal(10**400, math.inf) and not outputs_equal(10**400, math.nan)
    assert not outputs_equal([1, {"a": 10**400}], [1, {"a": 2.0}])
    assert outputs_equal(2**1024 - 1, 1.7976931348623157e308)  # within the tolerance, exactly computed
    assert outputs_equal(10**400, 10**400) and not outputs_equal(10**400 + 1, 10**400)


def test_any_nesting_depth_compares():
    for depth in (1000, 50_000):
        assert outputs_equal(_nested(depth, 1), _nested(depth, 1.0))
        assert not outputs_equal(_nested(depth, 10**400), _nested(depth, 1.0))


def test_values_whose_equality_raises_are_not_equal():
    class Raises:
        def __eq__(self, other):
            raise RuntimeError("no")

        __hash__ = object.__hash__

    assert not outputs_equal(Raises(), Raises()) and not outputs_equal([Raises()], [Raises()])


def test_an_int_too_large_for_a_float_fails_its_test_through_run_tests(sb):
    program = "def f(x):\n    return 10 ** 400 if x else 2.5\n"
    rep = sb.run_tests(program, "f", [[1], [0]], [1.5, 2.5])
    assert rep.status == "ok" and rep.tests[0].status == "ok" and rep.tests[0].output == 10**400
    assert [t.passed for t in rep.tests] == [False, True]
    rep = sb.run_tests(program, "f", [[1]], [[1.5]])
    assert rep.tests[0].passed is False


json_protocol = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | huge_ints
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=15,
)


@settings(max_examples=20, deadline=None)
@given(answer=json_protocol, expected=json_protocol)
def test_run_tests_always_returns_a_report(sb, answer, expected):
    rep = sb.run_tests("def f(x):\n    return x\n", "f", [[answer]], [expected])
    assert rep.status == "ok" and rep.tests[0].status == "ok"
    assert rep.tests[0].passed is outputs_equal(normalize(answer), normalize(expected))
