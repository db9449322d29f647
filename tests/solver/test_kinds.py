"""Solver task kinds (solver/kinds.py): a task with a reference program and tests asked as deduction, abduction or
induction through code_io, graded in a real sandbox, right, wrong and hostile answers alike."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from generator.build import generate_tasks
from generator.code_io import rename_entry
from generator.schema import Task
from solver.code_io import CodeIOTask, verify, verify_many
from solver.kinds import KINDS, PROGRAM, KindEpisode, code_io_tasks, kind_answer, kind_examples, kind_prompt
from solver.prompts import answer_text, task_prompt
from solver.rewards import RewardConfig

BINARY = RewardConfig(correctness=0.0, solved=1.0)  # the binary reward: 1 when solved, else 0
PENALISED = RewardConfig(banned_api=1.0, empty_answer=1.0, syntax_error=1.0)  # correctness and the penalties

PAIR_TASK = Task(
    id="pair",
    family="manual",
    source="import",
    split="train",
    level=1,
    description="Return the smallest and the largest value\nof the list, as a pair.",
    entry_point="solve",
    signature="def solve(xs: list[int]) -> tuple[int, int]",
    # a tuple result: its JSON test outputs read as lists, its typed outputs keep the tuple
    reference_solution="def solve(xs):\n    f = min(xs)  # a name f of its own\n    return (f, max(xs))\n",
    visible_tests=[{"input": [[3, 1, 2]], "output": [1, 3]}, {"input": [[5]], "output": [5, 5]}],
    hidden_tests=[{"input": [[4, 9, -2]], "output": [-2, 9]}, {"input": [[0, 0]], "output": [0, 0]}],
)


def asked(task: Task, kind: str, sb) -> CodeIOTask:
    (io_task,) = code_io_tasks([task], [kind], sb)
    assert io_task is not None and io_task.kind == kind
    return io_task


def graded(task: Task, kind: str, answer: str, sb, reward_cfg: RewardConfig = BINARY) -> KindEpisode:
    episode = KindEpisode(task, asked(task, kind, sb), sb, reward_cfg=reward_cfg)
    assert episode.act(answer) is None and episode.done
    return episode


def fenced(text: str) -> str:
    return f"Let me think.\n```python\n{text}\n```"


@pytest.fixture(scope="module")
def procedural(task_sb) -> Task:
    (task,) = generate_tasks(1, level=2, split="train", seed=3, sb=task_sb)
    return task


# ------------------------------------------------------------------------------------------------ conversion
def test_the_entry_point_is_renamed_f_and_a_name_f_of_its_own_first():
    assert KINDS == ("program", "deduction", "abduction", "induction")
    renamed = rename_entry(PAIR_TASK.reference_solution, "solve")
    assert renamed == "def f(xs):\n    f_0 = min(xs)  # a name f of its own\n    return (f_0, max(xs))\n"
    assert rename_entry("def solve(n):\n    return solve(n - 1) if n else 0\n", "solve") == (
        "def f(n):\n    return f(n - 1) if n else 0\n"
    )
    assert rename_entry("def g(x):\n    return x\n", "solve") is None  # no entry point to rename
    assert rename_entry("def solve(x):\n    return x.solve + math.f\n", "solve") == (
        "def f(x):\n    return x.solve + math.f\n"  # attributes are not names of the program
    )
    assert rename_entry("solve = 3\n", "solve") is None  # not a function
    assert rename_entry("def solve(x:\n", "solve") is None  # does not tokenize


def test_a_procedural_task_in_each_kind(procedural, task_sb):
    program, deduction, abduction, induction = code_io_tasks([procedural] * 4, list(KINDS), task_sb)
    assert program is None  # asked as today's program task
    shown = rename_entry(procedural.reference_solution, procedural.entry_point)
    tests = {repr(tuple(t["input"])): t["output"] for t in procedural.tests}
    for one in (deduction, abduction):
        ((args, output),) = one.pairs
        assert one.program == shown and tests[repr(args)] == output  # one of the task's own tests
        assert "def f(" in kind_prompt(one) and procedural.entry_point + "(" not in kind_prompt(one)
    # induction: the visible tests shown, the hidden ones held back, the description as its one-line message
    assert [list(a) for a, _ in induction.shown] == [t["input"] for t in procedural.visible_tests]
    assert [list(a) for a, _ in induction.pairs] == [t["input"] for t in procedural.hidden_tests]
    assert induction.message and "\n" not in induction.message and len(induction.message) <= 300
    assert "Hint: " in kind_prompt(induction)
    # the same question for every sample, rank and call: a function of the task's id and the kind
    assert code_io_tasks([procedural] * 4, list(KINDS), task_sb) == [program, deduction, abduction, induction]


def test_typed_outputs_come_from_running_the_reference(task_sb):
    deduction = asked(PAIR_TASK, "deduction", task_sb)
    ((args, output),) = deduction.pairs
    assert isinstance(output, tuple)  # the stored JSON output is a list
    message = asked(PAIR_TASK, "induction", task_sb).message
    assert message == "Return the smallest and the largest value of the list, as a pair."  # on one line
    assert graded(PAIR_TASK, "deduction", fenced(repr(output)), task_sb).result.reward == 1.0
    assert graded(PAIR_TASK, "deduction", fenced(repr(list(output))), task_sb).result.reward == 0.0  # not a tuple


def test_a_task_that_cannot_be_asked_in_a_kind_gives_none(task_sb):
    no_hidden = dataclasses.replace(PAIR_TASK, hidden_tests=[])
    no_entry = dataclasses.replace(PAIR_TASK, entry_point="other")
    # a stored output the reference does not give: that pair is dropped, the task asked about the others
    one_bad = dataclasses.replace(PAIR_TASK, visible_tests=[{"input": [[3, 1, 2]], "output": [0, 0]}])
    got = code_io_tasks(
        [no_hidden, no_hidden, no_entry, one_bad, one_bad],
        ["induction", "deduction", "abduction", "induction", "deduction"],
        task_sb,
    )
    assert got[0] is None and got[1] is not None and got[2] is None and got[3] is None
    assert got[4] is not None and got[4].pairs[0][0] != ([3, 1, 2],)
    with pytest.raises(ValueError, match="unknown task kind"):
        code_io_tasks([PAIR_TASK], ["poetry"], task_sb)


# ------------------------------------------------------------------------------------------------ examples
def test_warm_start_examples_pass_their_own_verifiers(task_sb):
    tasks = [t for level in (1, 2, 3, 4) for t in generate_tasks(6, level=level, split="train", seed=5, sb=task_sb)]
    kinds = [KINDS[i % len(KINDS)] for i in range(len(tasks))]
    examples = kind_examples(tasks, kinds, task_sb, prompt_kw={"max_examples": 2})
    assert [e.kind for e in examples] == kinds  # every procedural task here can be asked in its kind
    graded = [e for e in examples if e.asked is not None]
    assert {e.kind for e in graded} == set(KINDS) - {PROGRAM} and len(graded) == 18
    verdicts = verify_many([e.asked for e in graded], [e.answer for e in graded], task_sb)
    assert [v.status for v in verdicts] == ["correct"] * len(graded), [v.detail for v in verdicts]
    assert all(e.prompt == kind_prompt(e.asked) for e in graded)
    for task, e in zip(tasks, examples):
        if e.kind == PROGRAM:
            assert e.asked is None and e.prompt == task_prompt(task, max_examples=2)
            assert e.answer == answer_text(task.reference_solution)
    # the verifiers tell answers apart: each answer given to the next task of its kind
    shifted = [graded[(i + 3) % len(graded)].answer for i in range(len(graded))]
    wrong = verify_many([e.asked for e in graded], shifted, task_sb)
    assert sum(v.status == "correct" for v in wrong) < len(graded) // 2


def test_kind_answers_keep_the_outputs_type(task_sb):
    deduction, abduction, induction = code_io_tasks([PAIR_TASK] * 3, ["deduction", "abduction", "induction"], task_sb)
    ((args, output),) = deduction.pairs
    assert kind_answer(deduction) == f"```python\n{output!r}\n```" and isinstance(output, tuple)
    assert kind_answer(abduction).startswith("```python\nf([") and kind_answer(induction).count("def f(") == 1
    for asked in (deduction, abduction, induction):
        assert verify(asked, kind_answer(asked), task_sb).status == "correct"
    # a task that cannot be asked in its kind is taught as a program task
    (example,) = kind_examples([dataclasses.replace(PAIR_TASK, hidden_tests=[])], ["induction"], task_sb)
    assert example.kind == PROGRAM and example.answer == answer_text(PAIR_TASK.reference_solution)


# ------------------------------------------------------------------------------------------------- grading
def test_deduction_right_wrong_and_hostile(procedural, task_sb):
    ((_, output),) = asked(procedural, "deduction", task_sb).pairs
    right = graded(procedural, "deduction", fenced(repr(output)), task_sb)
    assert right.result.reward == 1.0 and right.result.solved and right.result.status == "correct"
    wrong = graded(procedural, "deduction", fenced(repr([output, output])), task_sb)
    assert wrong.result.reward == 0.0 and not wrong.result.solved and wrong.result.status == "wrong"
    hostile = [
        fenced("__import__('os').system('echo owned')"),  # a call, not a literal: never evaluated
        fenced("[" + "1, " * 50_000 + "]"),  # a huge answer
        "",  # nothing
    ]
    for answer in hostile:
        episode = graded(procedural, "deduction", answer, task_sb, PENALISED)
        assert episode.result.status == "no_answer" and not episode.result.solved
    assert graded(procedural, "deduction", "", task_sb, PENALISED).result.reward == -1.0  # empty_answer penalty


def test_abduction_runs_the_answers_input_through_the_reference(procedural, task_sb):
    io_task = asked(procedural, "abduction", task_sb)
    ((args, _),) = io_task.pairs
    call = f"f({', '.join(repr(a) for a in args)})"
    assert graded(procedural, "abduction", fenced(call), task_sb).result.reward == 1.0
    # another input that gives the same output counts: the answer is checked by running, not compared
    other = asked(PAIR_TASK, "abduction", task_sb)
    ((_, (low, high)),) = other.pairs
    assert graded(PAIR_TASK, "abduction", fenced(f"f([{high}, {low}, {low}])"), task_sb).result.solved
    assert not graded(PAIR_TASK, "abduction", fenced(f"f([{high + 1}, {low}])"), task_sb).result.solved
    for answer in (
        fenced("f([1, 2"),  # does not parse
        fenced("f(xs=[1, 2])"),  # a keyword argument
        fenced("f(__import__('os').listdir('/'))"),  # a call inside: not a literal
        fenced("f(" + "[" * 200 + "]" * 200 + ")"),  # nested past what a value may be
    ):
        episode = graded(PAIR_TASK, "abduction", answer, task_sb)
        assert episode.result.status == "no_answer" and episode.result.reward == 0.0
    # an input the reference raises on
    assert graded(PAIR_TASK, "abduction", fenced("f([])"), task_sb).result.status == "error"


def test_induction_grades_the_answers_program_on_the_held_back_tests(procedural, task_sb, tmp_path: Path):
    reference = rename_entry(procedural.reference_solution, procedural.entry_point)
    right = graded(procedural, "induction", fenced(reference), task_sb)
    assert right.result.reward == 1.0 and right.result.hidden_total == len(procedural.hidden_tests)
    wrong = graded(procedural, "induction", fenced("def f(*args):\n    return None\n"), task_sb)
    assert wrong.result.reward == 0.0 and wrong.result.status == "wrong"
    # the reward config's correctness: the share of held-back tests passed
    partial = graded(PAIR_TASK, "induction", fenced("def f(xs):\n    return (-2, 9)\n"), task_sb, RewardConfig())
    assert partial.result.reward == 0.5 and not partial.result.solved
    huge = graded(procedural, "induction", fenced("def f(*args):\n    return 'x' * 10_000_000\n"), task_sb)
    assert (
        huge.result.reward == 0.0
        and "exceeds" in verify(huge.asked, fenced("def f(*a):\n    return 'x' * 10**7"), task_sb).detail
    )
    marker = tmp_path / "owned"
    calling_os = f"import os\n\ndef f(*args):\n    os.system('touch {marker}')\n    return None\n"
    refused = graded(procedural, "induction", fenced(calling_os), task_sb, PENALISED)
    assert refused.result.status == "error" and refused.result.terms["banned_api"] == -1.0
    assert refused.result.reward == -1.0 and not marker.exists()  # refused before it ran
    sneaky = f"def f(*args):\n    __import__('os').system('touch {marker}')\n    return None\n"
    assert graded(procedural, "induction", fenced(sneaky), task_sb).result.reward == 0.0 and not marker.exists()
    broken = graded(procedural, "induction", fenced("def f(x:\n    return"), task_sb, PENALISED)
    assert broken.result.status == "no_answer" and broken.result.terms["syntax_error"] == -1.0
    with pytest.raises(RuntimeError, match="finished"):
        right.act("again")
