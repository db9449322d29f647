"""The code_io proposal format: parser, value handling, validity checks in a real sandbox, novelty, the proposer's
reward and the generator prompt."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from generator.agent import ProposalError
from generator.code_io import (
    CHECKS,
    CODE_IO_BANNED_CALLS,
    CODE_IO_BANNED_MODULES,
    KINDS,
    MAX_INPUTS,
    MAX_VALUE_CHARS,
    AcceptedProposal,
    NoveltyIndex,
    Proposal,
    behaviour_key,
    call_many,
    canonical_text,
    check_inputs,
    check_program_safe,
    format_args,
    format_proposal,
    generator_prompt,
    parse_args,
    parse_proposal,
    plain_problem,
    program_key,
    proposer_reward,
    solve_rate,
    validate_proposal,
    validate_proposals,
)
from tests.code_io_values import values

TEXT = """Here is my proposal.

```python
def f(xs, k):
    return sorted(xs)[:k]
```
input: [3, 1, 2], 2
input: [5, 4, 9, 1], 3
message: the k smallest values, in increasing order
"""


def test_parse_args_reads_the_inside_of_a_call():
    assert parse_args("") == ()
    assert parse_args("1") == (1,)
    assert parse_args("(1,)") == ((1,),)
    assert parse_args("[1, 2], 'a',") == ([1, 2], "a")
    assert parse_args("{1: (2, 3)}, {4}, set()") == ({1: (2, 3)}, {4}, set())
    assert parse_args("x") == "arguments are not Python literals"
    assert parse_args("k=1") == "arguments must be positional literals (no name=value, no *)"
    assert parse_args("*[1]") == "arguments must be positional literals (no name=value, no *)"
    assert parse_args("1), g(2") == "arguments do not parse"
    assert parse_args("1)\nimport os\n(") == "arguments do not parse"
    assert parse_args("float('nan')") == "arguments are not Python literals"


def test_plain_problem_uses_exact_types():
    assert plain_problem([1, (2.5, "a"), {None: {True}}]) == ""
    assert plain_problem(float("inf")) == "a non-finite float"
    assert plain_problem([1, b"x"]) == "a value of type bytes"
    assert plain_problem(frozenset({1})) == "a value of type frozenset"

    class Int(int):
        pass

    assert plain_problem({1: Int(3)}) == "a value of type Int"
    nested: list = []
    for _ in range(30):
        nested = [nested]
    assert plain_problem(nested).startswith("nested deeper than")


def test_canonical_text_tells_types_apart_and_ignores_order():
    texts = [canonical_text(v) for v in (1, 1.0, True, "1", [1], (1,), {1}, {1: 1})]
    assert len(set(texts)) == len(texts)
    assert canonical_text({"b": 1, "a": [2]}) == canonical_text({"a": [2], "b": 1})
    assert canonical_text({"x", "y", "z"}) == canonical_text({"z", "y", "x"})
    assert canonical_text([1, 2]) != canonical_text([2, 1])


@given(values)
def test_a_plain_value_survives_its_repr(value):
    assert plain_problem(value) == ""
    assert canonical_text(parse_args(repr(value))[0]) == canonical_text(value)


# ---------------------------------------------------------------------------------------------- parser
def test_parse_proposal_reads_program_inputs_and_message():
    p = parse_proposal(TEXT)
    assert p == Proposal(
        "def f(xs, k):\n    return sorted(xs)[:k]\n",
        (([3, 1, 2], 2), ([5, 4, 9, 1], 3)),
        "the k smallest values, in increasing order",
    )


def test_parse_proposal_is_lenient_about_surroundings():
    text = (
        "```py\nimport math\n```\nSome thought.\n```python\ndef f(x):\n    return math.floor(x)\n```\n"
        "- input: `2.5`\n* Input: (1, 2),\nMessage: `floor`\ntrailing prose\n"
    )
    p = parse_proposal(text)
    assert p == Proposal("def f(x):\n    return math.floor(x)\n", ((2.5,), ((1, 2),)), "floor")


@pytest.mark.parametrize(
    "text, reason",
    [
        ("", "empty answer"),
        ("def f(x):\n    return x\ninput: 1\n", "no ```python block with the program"),
        ("```python\ndef f(x):\n    return x\n```\nmessage: m\n", "no 'input:' line"),
        (
            "```python\ndef f(x):\n    return x\n```\ninput: 1\ninput: os.getcwd()\n",
            "input 2: arguments are not Python literals",
        ),
        (
            "```python\ndef f(x):\n    return x\n```\n" + "input: 1\n" * (MAX_INPUTS + 1),
            f"{MAX_INPUTS + 1} inputs, at most {MAX_INPUTS}",
        ),
    ],
)
def test_parse_proposal_refuses_with_a_reason(text, reason):
    assert parse_proposal(text) == ProposalError(reason)


@pytest.mark.parametrize("junk", [None, 3, "```", "```python\n", "input:\n```python\n```"])
def test_parse_proposal_never_raises(junk):
    assert isinstance(parse_proposal(junk), (Proposal, ProposalError))


PROGRAMS = [
    "def f(x):\n    return x\n",
    "def f(a, b=2):\n    '''Doc.'''\n    return [a] * b\n",
    "import math\n\n\ndef f(*xs):\n    return math.prod(len(str(x)) for x in xs)\n",
]
messages = st.text(st.characters(whitelist_categories=("Lu", "Ll", "Nd", "Zs")), max_size=40).map(str.strip)


@settings(max_examples=60)
@given(
    st.sampled_from(PROGRAMS),
    st.lists(st.lists(values, max_size=3).map(tuple), min_size=1, max_size=MAX_INPUTS),
    messages,
)
def test_format_then_parse_gives_the_proposal_back(program, inputs, message):
    proposal = Proposal(program, tuple(inputs), message)
    back = parse_proposal(format_proposal(proposal))
    assert back == proposal
    assert [canonical_text(a) for a in back.inputs] == [canonical_text(a) for a in proposal.inputs]


# ------------------------------------------------------------------------------------------ static checks
@pytest.mark.parametrize(
    "module",
    sorted(
        CODE_IO_BANNED_MODULES
        | {"os", "sys", "subprocess", "time", "datetime", "threading", "socket", "pathlib", "_ctypes"}
    ),
)
def test_banned_modules_are_refused(module):
    why = check_program_safe(f"import {module}\n\ndef f(x):\n    return x\n")
    assert f"imports banned module '{module}'" in why
    assert "banned module" in check_program_safe(f"from {module} import x\n\ndef f(y):\n    return y\n")


@pytest.mark.parametrize("call", sorted(CODE_IO_BANNED_CALLS | {"open", "exec", "eval", "__import__", "input"}))
def test_banned_calls_are_refused(call):
    assert check_program_safe(f"def f(x):\n    return {call}(x)\n") == f"calls banned function '{call}'"


def test_seeded_random_is_refused_and_pure_modules_pass():
    assert (
        check_program_safe("import random\nrandom.seed(0)\n\ndef f(x):\n    return random.random()\n")
        == "imports banned module 'random'"
    )
    ok = (
        "import math, itertools, functools, re, string\nfrom collections import Counter\n\n"
        "def f(xs):\n    return Counter(xs).most_common(1), math.gcd(*xs)\n"
    )
    assert check_program_safe(ok) == ""


def test_check_inputs_counts_arguments_and_refuses_repeats():
    program = "def f(a, b=1):\n    return a\n"
    assert check_inputs(program, [(1,), (1, 2)]) == ""
    assert check_inputs(program, [(1, 2, 3)]) == "input 0: 3 argument(s), f takes 1..2"
    assert check_inputs(program, [()]) == "input 0: 0 argument(s), f takes 1..2"
    assert check_inputs(program, [(1,), (2,), (1,)]) == "input 2 repeats input 0"
    assert check_inputs(program, [(1,), (1.0,)]) == ""  # 1 and 1.0 are different inputs
    assert check_inputs(program, [("x" * MAX_VALUE_CHARS,)]).startswith("input 0: 1002 characters exceeds")
    assert check_inputs(program, []) == "no inputs"
    assert check_inputs("def f(*xs):\n    return xs\n", [(1, 2, 3, 4)]) == ""
    assert check_inputs("def f(x, *, k):\n    return x\n", [(1,)]).startswith("f has keyword-only")


# ------------------------------------------------------------------------------------------ sandbox checks
def test_an_accepted_proposal_has_typed_outputs(task_sb):
    p = Proposal("def f(x):\n    return (x, {x: [x]}, {x % 3})\n", ((1,), (5,)), "tuple of things")
    verdict = validate_proposal(p, task_sb)
    assert verdict.ok and verdict.check == "" and verdict.reason == ""
    got = verdict.accepted
    assert got.outputs == ((1, {1: [1]}, {1}), (5, {5: [5]}, {2}))
    assert [canonical_text(o) for o in got.outputs] == [
        canonical_text((1, {1: [1]}, {1})),
        canonical_text((5, {5: [5]}, {2})),
    ]
    assert got.pairs == (((1,), (1, {1: [1]}, {1})), ((5,), (5, {5: [5]}, {2})))
    assert got.program_key == program_key(p.program)
    assert got.behaviour_key == behaviour_key(p.inputs, got.outputs)


def test_the_parsed_example_is_accepted_with_its_outputs(task_sb):
    verdict = validate_proposal(parse_proposal(TEXT), task_sb)
    assert verdict.ok
    assert verdict.accepted.outputs == ([1, 2], [1, 4, 5])
    assert verdict.accepted.message == "the k smallest values, in increasing order"


REJECTED = [
    (Proposal("def f(x)\n    return x\n", ((1,),)), "parses", "parses: does not parse: expected ':' (line 1)"),
    (Proposal("def g(x):\n    return x\n", ((1,),)), "parses", "parses: defines no top-level function 'f'"),
    (Proposal("import os\ndef f(x):\n    return x\n", ((1,),)), "safe", "safe: imports banned module 'os'"),
    (Proposal("def f(x):\n    return x\n", ((1, 2),)), "inputs", "inputs: input 0: 2 argument(s), f takes 1..1"),
    (
        Proposal("def f(x):\n    return x\n", ((1,),), "two\nlines"),
        "message",
        "message: the message must be one line of at most 300 characters",
    ),
    (
        Proposal("def f(x):\n    return 10 // x\n", ((1,), (0,))),
        "runs",
        "runs: input 1: error: ZeroDivisionError: integer division or modulo by zero",
    ),
    (
        Proposal("def f(x):\n    return object()\n", ((1,),)),
        "outputs",
        "outputs: input 0: returns a value of type object, not a plain value",
    ),
    (
        Proposal("def f(x):\n    return float('inf') * x\n", ((1,),)),
        "outputs",
        "outputs: input 0: returns a non-finite float, not a plain value",
    ),
    (
        Proposal("def f(x):\n    return 'a' * x\n", ((3,), (2000,))),
        "outputs",
        f"outputs: input 1: output of 2002 characters exceeds {MAX_VALUE_CHARS}",
    ),
    (
        Proposal("_seen = []\n\ndef f(x):\n    _seen.append(x)\n    return len(_seen) * x\n", ((1,), (2,))),
        "deterministic",
        "deterministic: input 0: 1 on one run, 2 on another",
    ),
    (
        Proposal("def f(x):\n    return len(str(x)) > 5\n", ((1,), (22,), (333,))),
        "nontrivial",
        "nontrivial: every input gives the same output False",
    ),
]


@pytest.mark.parametrize("proposal, check, reason", REJECTED, ids=[r[1] + str(i) for i, r in enumerate(REJECTED)])
def test_each_check_rejects_with_a_one_line_reason(task_sb, proposal, check, reason):
    verdict = validate_proposal(proposal, task_sb)
    assert not verdict.ok and verdict.accepted is None
    assert (verdict.check, verdict.reason) == (check, reason)
    assert check in CHECKS and "\n" not in verdict.reason


def test_a_program_that_runs_too_long_fails_runs_on_its_cpu_time(task_sb):
    """A proposal's validity is timed on the CPU clock (generator.validity.CLOCK: a busy machine cannot reject it);
    call_many's default, with which a solver's answers are graded, stays the wall clock."""
    loops = "def f(x):\n    while x:\n        pass\n"
    verdict = validate_proposal(Proposal(loops, ((1,),)), task_sb, timeout_s=0.3)
    assert verdict.check == "runs" and verdict.reason.startswith("runs: input 0: timeout: CPU-time timeout (clock cpu)")
    [[graded]] = call_many(task_sb, [(loops, [(1,)])], timeout_s=0.3, use_cache=False)
    assert graded.status == "timeout" and "wall-clock" in graded.reason


def test_a_program_cannot_unbind_the_harness_checks(task_sb):
    program = (
        "def f(x):\n    global __code_io_plain, repr\n    __code_io_plain = lambda value: ''\n"
        "    repr = lambda value: '5'\n    return object()\n"
    )
    verdict = validate_proposal(Proposal(program, ((1,),)), task_sb)
    assert verdict.reason == "outputs: input 0: returns a value of type object, not a plain value"


def test_one_input_may_have_any_output(task_sb):
    assert validate_proposal(Proposal("def f(x):\n    return 0\n", ((4,),)), task_sb).ok


def test_a_program_that_does_not_load_fails_runs(task_sb):
    raises = Proposal("TABLE = {}[0]\n\ndef f(x):\n    return x\n", ((1,),))
    assert validate_proposal(raises, task_sb).reason == "runs: input 0: the program did not load (error: KeyError: 0)"
    hangs = Proposal("def f(x):\n    return x\n\nwhile True:\n    pass\n", ((1,),))
    assert (
        validate_proposal(hangs, task_sb, timeout_s=0.3).reason
        == "runs: input 0: the program did not load (timeout: CPU-time timeout (clock cpu))"
    )


def test_inputs_that_are_not_a_sequence_are_refused(task_sb):
    verdict = validate_proposal(Proposal("def f(x):\n    return x\n", 3), task_sb)  # type: ignore[arg-type]
    assert verdict.reason == "inputs: inputs must be a sequence of argument tuples"


def test_a_program_that_is_not_text_is_refused(task_sb):
    verdict = validate_proposal(Proposal(None, ((1,),)), task_sb)  # type: ignore[arg-type]
    assert (verdict.check, verdict.reason) == ("parses", "parses: the program is not text")


# ------------------------------------------------------------------------------------------------ novelty
def test_novelty_against_the_index_and_within_the_batch(task_sb):
    first = validate_proposal(Proposal("def f(xs):\n    return sum(xs)\n", (([1, 2],), ([4],))), task_sb).accepted
    index = NoveltyIndex([first])
    renamed = Proposal("def f(values):\n    '''Total.'''\n    return sum(values)\n", (([5],), ([6, 7],)))
    same_io = Proposal("def f(xs):\n    t = 0\n    for x in xs:\n        t += x\n    return t\n", (([1, 2],), ([4],)))
    other_inputs = Proposal("def f(xs):\n    return max(xs) * 3\n", (([1, 2],), ([4],)))
    twin = Proposal("def f(ys):\n    return max(ys) * 3\n", (([0],), ([1],)))
    verdicts = validate_proposals([renamed, same_io, other_inputs, twin], task_sb, index)
    assert [(v.check, v.reason) for v in verdicts] == [
        ("novel_program", "novel_program: same program (up to names) as an accepted proposal"),
        ("novel_behaviour", "novel_behaviour: same inputs and outputs as an accepted proposal"),
        ("", ""),
        ("novel_program", "novel_program: same program (up to names) as an accepted proposal"),
    ]
    assert len(index) == 1  # the index is the caller's to extend
    index.add(verdicts[2].accepted)
    assert index.same_program(program_key(twin.program)) is verdicts[2].accepted


def test_behaviour_key_depends_on_types_and_pairs():
    assert behaviour_key([(1,)], [1]) != behaviour_key([(1,)], [1.0])
    assert behaviour_key([(1,)], [[1]]) != behaviour_key([(1,)], [(1,)])
    assert behaviour_key([(1,), (2,)], [3, 4]) != behaviour_key([(2,), (1,)], [3, 4])
    assert behaviour_key([({"a", "b"},)], [{"x", "y"}]) == behaviour_key([({"b", "a"},)], [{"y", "x"}])


def test_accepted_proposal_survives_json_with_its_types():
    p = AcceptedProposal("def f(x):\n    return x\n", (((1, 2), {3}),), ({1: "a", (2,): None},), "m", "pk", "bk")
    back = AcceptedProposal.from_dict(json.loads(json.dumps(p.to_dict())))
    assert back == p
    assert canonical_text(back.inputs) == canonical_text(p.inputs)
    assert canonical_text(back.outputs) == canonical_text(p.outputs)


def test_call_many_keeps_job_and_input_order(task_sb):
    jobs = [("def f(x):\n    return x * 2\n", [(1,), ("ab",), ((1,),)]), ("def f():\n    return None\n", [()])]
    outcomes = call_many(task_sb, jobs)
    assert [[o.value for o in job] for job in outcomes] == [[2, "abab", (1, 1)], [None]]
    assert all(o.status == "ok" for job in outcomes for o in job)


# -------------------------------------------------------------------------------------------------- reward
@pytest.mark.parametrize("rate, reward", [(0.0, 0.0), (1.0, 0.0), (0.25, 0.75), (0.5, 0.5), (0.875, 0.125)])
def test_proposer_reward_by_hand(rate, reward):
    assert proposer_reward(rate) == reward


def test_proposer_reward_refuses_a_rate_outside_0_1():
    for rate in (-0.1, 1.5):
        with pytest.raises(ValueError):
            proposer_reward(rate)


def test_solve_rate_is_the_mean_reward():
    assert solve_rate([1.0, 0.0, 0.0, 1.0]) == 0.5
    assert proposer_reward(solve_rate([0.0, 0.0, 0.0, 1.0])) == 0.75
    with pytest.raises(ValueError):
        solve_rate([])
    with pytest.raises(ValueError):
        solve_rate([2.0])


# -------------------------------------------------------------------------------------------------- prompt
def test_generator_prompt_shows_the_references_and_the_format():
    refs = [
        AcceptedProposal("def f(xs):\n    return sum(xs)\n", (([1, 2],), ([3],)), (3, 3), "total"),
        AcceptedProposal("def f(s):\n    return s[::-1]\n", (("ab",),), ("ba",), ""),
    ]
    prompt = generator_prompt(refs, "abduction")
    assert "Earlier functions (2)" in prompt
    assert "def f(xs):\n    return sum(xs)" in prompt and "f([1, 2]) == 3" in prompt and "message: total" in prompt
    assert "f('ab') == 'ba'" in prompt and "Reference 2:" in prompt
    assert "an abduction task, with 2 input(s)" in prompt
    assert "input: <the arguments of one call" in prompt and "message: <one line" in prompt
    assert "Earlier functions" not in generator_prompt([], "induction")
    assert "with 6 input(s)" in generator_prompt([], "induction")
    assert "with 3 input(s)" in generator_prompt([], "deduction", n_inputs=3)
    assert len({generator_prompt(refs, kind) for kind in KINDS}) == 3


def test_generator_prompt_refuses_unknown_kinds_and_counts():
    with pytest.raises(ValueError):
        generator_prompt([], "translation")
    with pytest.raises(ValueError):
        generator_prompt([], "deduction", n_inputs=MAX_INPUTS + 1)


def test_format_args_is_what_a_call_holds():
    assert format_args(([1], "a", (2,))) == "[1], 'a', (2,)"
    assert format_args(()) == ""
