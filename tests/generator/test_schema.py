"""The task record: JSON-only values, exact round trips, clear errors naming the bad field."""

import builtins
import json
import keyword
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from generator.fingerprint import ast_hash, task_id
from generator.schema import SCHEMA_VERSION, SchemaError, Task, check_json_value

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**12), 10**12)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12,
)
tests_st = st.lists(
    st.fixed_dictionaries({"input": st.lists(json_values, max_size=3), "output": json_values}), max_size=4
)


def make(**kw):
    base = dict(
        id="t1",
        family="list_int",
        source="procedural",
        split="train",
        level=2,
        description="Sort it.",
        entry_point="solve",
        signature="def solve(xs: list[int]) -> list[int]",
        reference_solution="def solve(xs):\n    return sorted(xs)\n",
    )
    base.update(kw)
    return Task(**base)


@settings(max_examples=60, deadline=None)
@given(
    visible=tests_st,
    hidden=tests_st,
    params=st.dictionaries(st.text(max_size=5), json_values, max_size=3),
    difficulty=st.none() | st.floats(0, 1),
    parents=st.lists(st.text(max_size=6), max_size=3),
    step=st.integers(0, 10**9),
    source=st.sampled_from(["procedural", "generator", "import"]),
)
def test_json_round_trip_is_exact(visible, hidden, params, difficulty, parents, step, source):
    task = make(
        visible_tests=visible,
        hidden_tests=hidden,
        params=params,
        difficulty=difficulty,
        parent_ids=parents,
        created_step=step,
        source=source,
        checks={"parses": True, "novel": False},
    )
    text = task.to_json()
    back = Task.from_json(text)
    assert back == task and back.to_json() == text
    assert json.loads(text)["schema_version"] == SCHEMA_VERSION


@pytest.mark.parametrize(
    "value, message",
    [
        ((1, 2), "tuple is not a JSON value"),
        ({1, 2}, "set is not a JSON value"),
        (math.nan, "not a finite"),
        ({1: "a"}, "dict key 1 is not a string"),
        ([b"x"], "bytes is not a JSON value"),
    ],
)
def test_non_json_values_are_refused(value, message):
    with pytest.raises(SchemaError, match=message):
        check_json_value(value, "x")
    with pytest.raises(SchemaError, match=message):
        make(hidden_tests=[{"input": [value], "output": 1}]).validate_shape()


@pytest.mark.parametrize(
    "change, message",
    [
        ({"level": 7}, "level must be an integer 1..4"),
        ({"source": "web"}, "source 'web'"),
        ({"difficulty": 1.5}, "difficulty"),
        ({"parent_ids": "t0"}, "parent_ids"),
        ({"visible_tests": [{"input": 3, "output": 1}]}, "visible_tests\\[0\\].input must be a list"),
        ({"hidden_tests": [{"args": []}]}, "hidden_tests\\[0\\] must be"),
    ],
)
def test_bad_fields_are_named(change, message):
    data = make().to_dict()
    data.update(change)
    with pytest.raises(SchemaError, match=message):
        Task.from_dict(data)


def test_missing_unknown_and_future_fields():
    data = make().to_dict()
    with pytest.raises(SchemaError, match="unknown field\\(s\\) colour"):
        Task.from_dict({**data, "colour": "red"})
    del data["entry_point"]
    with pytest.raises(SchemaError, match="missing field\\(s\\) entry_point"):
        Task.from_dict(data)
    with pytest.raises(SchemaError, match="newer than this code"):
        Task.from_dict({**make().to_dict(), "schema_version": SCHEMA_VERSION + 1})
    with pytest.raises(SchemaError, match="not JSON"):
        Task.from_json("{nope")


names = st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True).filter(
    lambda n: not keyword.iskeyword(n) and n not in dir(builtins) and n != "x"
)


@settings(max_examples=60, deadline=None)
@given(fn=names, arg=names, var=names)
def test_ast_hash_ignores_names_and_docstrings(fn, arg, var):
    if len({fn, arg, var}) < 3:
        return
    a = "def solve(xs):\n    ys = [x * 2 for x in xs]\n    return ys\n"
    b = f'def {fn}({arg}):\n    """Doubles."""\n    {var} = [x * 2 for x in {arg}]\n    return {var}  # done\n'
    assert ast_hash(a) == ast_hash(b)
    assert ast_hash(a) != ast_hash(a.replace("* 2", "* 3"))
    assert task_id(a, "solve", [[1]]) == task_id(b, "solve", [[1]]) != task_id(a, "solve", [[2]])
    assert ast_hash("def (") is None
