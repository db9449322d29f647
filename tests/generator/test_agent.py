"""The generator agent's prompt and proposal parser (pure, CPU)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from generator.agent import (
    INSTRUCTIONS,
    MAX_INPUTS,
    Proposal,
    ProposalError,
    build_prompt,
    choose_instruction,
    format_proposal,
    parse_proposal,
    proposal_to_task,
)
from generator.schema import Task

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
json_values = st.recursive(
    json_scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=4), c, max_size=3), max_leaves=8
)
names = st.from_regex(r"[a-z_][a-z0-9_]{0,10}", fullmatch=True).filter(
    lambda n: n not in {"if", "in", "is", "or", "as", "def", "for", "and", "not", "del", "try"}
)


def make_task(name="solve", description="Sort the list.", code=None, inputs=None, level=1, family="list_int"):
    code = code or f"def {name}(xs):\n    return sorted(xs)\n"
    inputs = inputs if inputs is not None else [[[3, 1, 2]], [[]], [[5, 5, 1]]]
    tests = [{"input": i, "output": None} for i in inputs]
    return Task(
        id=f"t-{name}-{level}",
        family=family,
        source="procedural",
        split="train",
        level=level,
        description=description,
        entry_point=name,
        signature=f"def {name}(xs: list[int]) -> list[int]",
        reference_solution=code,
        visible_tests=tests[:2],
        hidden_tests=tests[2:],
    )


@settings(max_examples=60)
@given(
    name=names,
    description=st.text(min_size=1, max_size=80).filter(lambda s: s.split()),
    inputs=st.lists(st.lists(json_values, max_size=3), min_size=1, max_size=6),
    constant=st.integers(-100, 100),
)
def test_format_then_parse_round_trips(name, description, inputs, constant):
    code = f"def helper(x):\n    return x + {constant}\n\n\ndef {name}(xs):\n    # a comment\n    return xs\n"
    task = make_task(name=name, description=description, code=code, inputs=inputs)
    parsed = parse_proposal(format_proposal(task))
    assert isinstance(parsed, Proposal), parsed
    assert parsed.description == " ".join(description.split())
    assert parsed.entry_point == name
    assert parsed.code == code
    assert parsed.inputs == inputs


@given(st.text(max_size=400))
def test_parse_never_raises_on_arbitrary_text(text):
    result = parse_proposal(text)
    assert isinstance(result, (Proposal, ProposalError))


def test_fences_prose_and_trailing_garbage_are_tolerated():
    answer = (
        "Sure! Here is a task.\nDESCRIPTION: Double each number.\nSIGNATURE: def double(xs: list[int]) -> "
        "list[int]\nCODE:\n```python\ndef double(xs):\n    return [2 * x for x in xs]\n```\nINPUTS:\n[[1, 2]]\n\n"
        "[[-3]]\nEND\nsome trailing text INPUTS: [[9]]"
    )
    p = parse_proposal(answer)
    assert isinstance(p, Proposal)
    assert p.code == "def double(xs):\n    return [2 * x for x in xs]\n"
    assert p.inputs == [[[1, 2]], [[-3]]]


def test_rejections_name_the_reason():
    good = format_proposal(make_task())
    cases = {
        "": "empty answer",
        good.replace("DESCRIPTION: Sort the list.", "DESCRIPTION:"): "empty DESCRIPTION",
        good.replace("SIGNATURE: def solve", "SIGNATURE: solve"): "SIGNATURE is not",
        good.replace("    return sorted(xs)", "    return sorted(xs"): "CODE does not parse",
        good.replace("def solve(xs):", "def other(xs):"): "does not define solve()",
        good.replace("[[3, 1, 2]]", "[[3, 1, 2]"): "INPUTS line 1 is not JSON",
        good.replace("[[3, 1, 2]]", '{"a": 1}'): "INPUTS line 1 is not a list",
        good.replace("INPUTS:\n[[3, 1, 2]]\n[[]]\n[[5, 5, 1]]\n", "INPUTS:\n"): "no INPUTS",
        good.replace("CODE:", "CODEX:"): "missing CODE section",
        good.replace("END", "DESCRIPTION: again\nEND"): "appears twice",
        good.replace("INPUTS:\n", "INPUTS:\n" + "[[1]]\n" * MAX_INPUTS): f"more than {MAX_INPUTS} INPUTS",
    }
    for text, reason in cases.items():
        result = parse_proposal(text)
        assert isinstance(result, ProposalError), text
        assert reason in result.reason, (reason, result.reason)


def test_prompt_holds_references_and_instruction():
    refs = [make_task(name="a", family="list_int", level=2), make_task(name="b", family="string", level=3)]
    prompt = build_prompt(refs, "compose")
    assert "Reference task 1:" in prompt and "Reference task 2:" in prompt
    assert INSTRUCTIONS["compose"] in prompt
    assert "def a(xs)" in prompt and "def b(xs)" in prompt
    assert choose_instruction(random.Random(0), 1) != "compose"


def test_proposal_becomes_a_generator_task_without_outputs():
    refs = [make_task(name="a", family="list_int", level=2), make_task(name="b", family="string", level=3)]
    p = parse_proposal(format_proposal(make_task(inputs=[[[1]], [[2]], [[3]], [[4]], [[5]]])))
    task = proposal_to_task(p, refs, step=7, n_visible=3)
    assert task.source == "generator" and task.family == "generator/list_int+string"
    assert task.level == 3 and task.created_step == 7 and task.parent_ids == [refs[0].id, refs[1].id]
    assert [t["input"] for t in task.visible_tests] == [[[1]], [[2]], [[3]]]
    assert not task.outputs_computed
    task.validate_shape()
    same = proposal_to_task(
        parse_proposal(format_proposal(make_task(inputs=[[[1]], [[2]], [[3]], [[4]], [[5]]]))), refs, step=9
    )
    assert same.id == task.id  # the id depends on the content only
