"""The code_io solver tasks: built from an accepted proposal, prompted, answers parsed and graded (abduction and
induction in a real sandbox)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from generator.code_io import AcceptedProposal, canonical_text, format_args, parse_proposal, validate_proposal
from solver.code_io import (
    CodeIOTask,
    Verdict,
    abduction_tasks,
    deduction_tasks,
    induction_task,
    parse_input,
    parse_output,
    task_prompt,
    tasks_from_proposal,
    verify,
    verify_deduction,
    verify_many,
)
from tests.code_io_values import values

PROGRAM = "def f(xs, k):\n    return sorted(xs)[:k]\n"
ACCEPTED = AcceptedProposal(
    PROGRAM,
    (([3, 1, 2], 2), ([5, 4, 9, 1], 3), ([2], 1), ([7, 7], 0)),
    ([1, 2], [1, 4, 5], [2], []),
    "the k smallest values",
)
REFERENCE = f"```python\n{PROGRAM}```"


# --------------------------------------------------------------------------------------------------- tasks
def test_tasks_from_a_proposal():
    tasks = tasks_from_proposal(ACCEPTED)
    assert [t.kind for t in tasks] == ["deduction"] * 4 + ["abduction"] * 4 + ["induction"]
    assert tasks[1].pairs == ((([5, 4, 9, 1], 3), [1, 4, 5]),)
    induction = tasks[-1]
    assert induction.shown == ((([3, 1, 2], 2), [1, 2]), (([5, 4, 9, 1], 3), [1, 4, 5]))
    assert induction.pairs == ((([2], 1), [2]), (([7, 7], 0), []))
    assert induction.message == "the k smallest values"
    assert [t.kind for t in tasks_from_proposal(ACCEPTED, ["induction"])] == ["induction"]


def test_one_pair_gives_no_induction_task():
    single = AcceptedProposal(PROGRAM, (([1], 1),), ([1],))
    assert induction_task(single) is None
    assert [t.kind for t in tasks_from_proposal(single)] == ["deduction", "abduction"]


def test_induction_split_bounds():
    assert len(induction_task(ACCEPTED, n_shown=3).pairs) == 1
    for n in (0, 4):
        with pytest.raises(ValueError):
            induction_task(ACCEPTED, n_shown=n)
    with pytest.raises(ValueError):
        tasks_from_proposal(ACCEPTED, ["translation"])


# ------------------------------------------------------------------------------------------------- prompts
def test_deduction_prompt_shows_program_and_call_not_output():
    prompt = task_prompt(deduction_tasks(ACCEPTED)[1])
    assert PROGRAM.strip() in prompt and "What does f([5, 4, 9, 1], 3) return?" in prompt
    assert "[1, 4, 5]" not in prompt


def test_abduction_prompt_shows_program_and_output_not_input():
    prompt = task_prompt(abduction_tasks(ACCEPTED)[1])
    assert PROGRAM.strip() in prompt and "Find arguments for which f returns [1, 4, 5]." in prompt
    assert "[5, 4, 9, 1]" not in prompt


def test_induction_prompt_shows_pairs_and_hint_not_program_nor_held_back():
    prompt = task_prompt(induction_task(ACCEPTED))
    assert "f([3, 1, 2], 2) == [1, 2]" in prompt and "f([5, 4, 9, 1], 3) == [1, 4, 5]" in prompt
    assert "Hint: the k smallest values" in prompt
    assert "sorted" not in prompt and "[7, 7]" not in prompt and "f([2], 1)" not in prompt


def test_typed_values_appear_as_literals_in_prompts():
    p = AcceptedProposal("def f(x):\n    return (x, {x})\n", (((1, 2),), ("a",)), (((1, 2), {(1, 2)}), ("a", {"a"})))
    assert "f((1, 2)) == ((1, 2), {(1, 2)})" in task_prompt(induction_task(p))
    assert "What does f((1, 2)) return?" in task_prompt(deduction_tasks(p)[0])


# ------------------------------------------------------------------------------------------------- parsers
@pytest.mark.parametrize(
    "answer, value",
    [
        ("```python\n[1, 2]\n```", [1, 2]),
        ("First I sort.\n```python\nsorted([3, 1])\n```\nSo:\n```python\n(1, 3)\n```", (1, 3)),
        ("```python\nf([3, 1, 2], 2) == [1, 2]\n```", [1, 2]),
        ("The answer is {'a': {1}}", {"a": {1}}),
        ("output: None", None),
        ("```\nset()\n```", set()),
    ],
)
def test_parse_output(answer, value):
    parsed = parse_output(answer)
    assert parsed.ok and canonical_text(parsed.value) == canonical_text(value)


@pytest.mark.parametrize(
    "answer, reason",
    [
        ("", "empty answer"),
        ("I do not know", "answer is not a Python literal"),
        ("```python\nfloat('nan')\n```", "answer is not a Python literal"),
        ("```python\nlen([1])\n```", "answer is not a Python literal"),
    ],
)
def test_parse_output_failures(answer, reason):
    assert parse_output(answer).reason == reason and not parse_output(answer).ok


@pytest.mark.parametrize(
    "answer, args",
    [
        ("```python\nf([2, 1], 2)\n```", ([2, 1], 2)),
        ("```python\n# a short list\nf([1])\n```", ([1],)),
        ("```python\nf(\n    [1,\n     2],\n    (3,),\n)\n```", ([1, 2], (3,))),
        ("```python\nf('a') == 'b'\n```", ("a",)),
        ("input: [1], 'x'", ([1], "x")),
        ("```python\nf()\n```", ()),
    ],
)
def test_parse_input(answer, args):
    parsed = parse_input(answer)
    assert parsed.ok and canonical_text(parsed.value) == canonical_text(args)


@pytest.mark.parametrize(
    "answer, reason",
    [
        ("", "empty answer"),
        ("```python\nf(k=1)\n```", "input: arguments must be positional literals (no name=value)"),
        ("```python\nf(list(range(3)))\n```", "input: arguments are not Python literals"),
    ],
)
def test_parse_input_failures(answer, reason):
    parsed = parse_input(answer)
    assert not parsed.ok and parsed.reason == reason


@given(values)
def test_parse_output_reads_back_any_plain_value(value):
    parsed = parse_output(f"Reasoning...\n```python\n{value!r}\n```")
    assert parsed.ok and canonical_text(parsed.value) == canonical_text(value)


@given(st.lists(values, max_size=3).map(tuple))
def test_parse_input_reads_back_any_call(args):
    parsed = parse_input(f"```python\nf({format_args(args)})\n```")
    assert parsed.ok and canonical_text(parsed.value) == canonical_text(args)


@pytest.mark.parametrize("junk", [None, 7, "```", "```python\n", "f(", "```python\nf(1\n```"])
def test_parsers_never_raise(junk):
    assert not parse_output(junk).ok and parse_output(junk).reason
    assert not parse_input(junk).ok and parse_input(junk).reason


# ------------------------------------------------------------------------------------------------ verifiers
def test_deduction_compares_typed_values():
    task = CodeIOTask("deduction", "def f(x):\n    return x\n", (((1,), (1, True, 0.5)),))
    assert verify_deduction(task, "```python\n(1, True, 0.5)\n```") == Verdict(1.0, "correct")
    assert verify_deduction(task, "```python\n(1, True, 0.5000000001)\n```").reward == 1.0  # float tolerance
    assert verify_deduction(task, "```python\n[1, True, 0.5]\n```") == Verdict(0.0, "wrong", "answered [1, True, 0.5]")
    assert verify_deduction(task, "```python\n(1, 1, 0.5)\n```").status == "wrong"  # True is not 1
    assert verify_deduction(task, "```python\n(1.0, True, 0.5)\n```").status == "wrong"  # an int wants an int
    assert verify_deduction(task, "no idea") == Verdict(0.0, "no_answer", "answer is not a Python literal")
    sets = CodeIOTask("deduction", "def f(x):\n    return x\n", (((1,), {"b", "a"}),))
    assert verify_deduction(sets, "{'a', 'b'}").reward == 1.0


def test_abduction_runs_the_program_on_the_answer(task_sb):
    task = abduction_tasks(ACCEPTED)[0]  # f(?) == [1, 2]
    assert verify(task, "```python\nf([2, 9, 1], 2)\n```", task_sb) == Verdict(1.0, "correct")  # not the original input
    assert verify(task, "```python\nf([3, 1, 2], 2)\n```", task_sb) == Verdict(1.0, "correct")
    assert verify(task, "```python\nf([3, 1, 2], 1)\n```", task_sb) == Verdict(
        0.0, "wrong", "f returns [1] on that input"
    )
    assert verify(task, "```python\nf((2, 1), 2)\n```", task_sb).reward == 1.0  # sorted() of a tuple is a list
    error = verify(task, "```python\nf(5, 2)\n```", task_sb)
    assert error.status == "error" and error.reward == 0.0 and "TypeError" in error.detail
    assert verify(task, "f(k)", task_sb).status == "no_answer"


def test_abduction_of_a_tuple_output_needs_a_tuple(task_sb):
    p = AcceptedProposal("def f(x):\n    return tuple(x)\n", (([1, 2],),), ((1, 2),))
    task = abduction_tasks(p)[0]
    assert verify(task, "f((1, 2))", task_sb).reward == 1.0
    assert verify(task, "f('ab')", task_sb) == Verdict(0.0, "wrong", "f returns ('a', 'b') on that input")


def test_induction_grades_on_held_back_inputs(task_sb):
    task = induction_task(ACCEPTED)
    assert verify(task, REFERENCE, task_sb) == Verdict(1.0, "correct", "2/2 held-back inputs")
    lookup = (
        "```python\ndef f(xs, k):\n    return {(3, 1, 2): [1, 2], (5, 4, 9, 1): [1, 4, 5]}.get(tuple(xs), [2])\n```"
    )
    assert verify(task, lookup, task_sb) == Verdict(0.0, "wrong", "1/2 held-back inputs")
    assert verify(task, lookup, task_sb, partial_credit=True) == Verdict(0.5, "wrong", "1/2 held-back inputs")
    crash = verify(task, "```python\ndef f(xs, k):\n    return xs[k]\n```", task_sb)
    assert crash.reward == 0.0 and crash.status == "error" and "IndexError" in crash.detail
    assert verify(task, "```python\ndef g(xs, k):\n    return []\n```", task_sb).status == "error"
    assert verify(task, "I cannot write it.", task_sb) == Verdict(0.0, "no_answer", "no code found")


def test_induction_answer_that_hangs_times_out(task_sb):
    verdict = verify(
        induction_task(ACCEPTED), "```python\ndef f(xs, k):\n    while True:\n        pass\n```", task_sb, timeout_s=0.3
    )
    assert verdict.reward == 0.0 and verdict.status == "error" and "timeout" in verdict.detail


def test_verify_many_keeps_order_across_kinds(task_sb):
    tasks = tasks_from_proposal(ACCEPTED)
    answers = ["[1, 2]", "[1, 4]", "[2]", "[]", "f([1, 2, 3], 2)", "f([9], 1)", "f([2], 1)", "f([8], 0)", REFERENCE]
    assert [v.reward for v in verify_many(tasks, answers, task_sb)] == [1, 0, 1, 1, 1, 0, 1, 1, 1]
    with pytest.raises(ValueError):
        verify_many(tasks, answers[:-1], task_sb)
    with pytest.raises(ValueError):
        verify(tasks[-1], REFERENCE)  # induction needs a sandbox


def test_from_proposal_text_to_graded_answers(task_sb):
    text = (
        "```python\ndef f(s):\n    return {c: s.count(c) for c in sorted(set(s))}\n```\n"
        "input: 'abca'\ninput: 'zz'\ninput: ''\ninput: 'xy'\nmessage: how often each character occurs\n"
    )
    accepted = validate_proposal(parse_proposal(text), task_sb).accepted
    assert accepted.outputs == ({"a": 2, "b": 1, "c": 1}, {"z": 2}, {}, {"x": 1, "y": 1})
    tasks = tasks_from_proposal(accepted)
    answers = [f"```python\n{o!r}\n```" for o in accepted.outputs]
    answers += [f"```python\nf({format_args(a)})\n```" for a in accepted.inputs]
    answers.append(
        "```python\nfrom collections import Counter\n\ndef f(s):\n    return dict(sorted(Counter(s).items()))\n```"
    )
    assert all(v.reward == 1.0 for v in verify_many(tasks, answers, task_sb))
