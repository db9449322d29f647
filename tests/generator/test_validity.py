"""Validity checks: every procedural task passes them all, and each kind of corrupted record is rejected by the
check that should catch it (all through the real process sandbox)."""

import ast
import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from generator.build import generate_tasks
from generator.schema import without_outputs
from generator.splits import SPLITS
from generator.validity import (
    CHECKS,
    MemoryIndex,
    check_description,
    check_parses,
    check_safe,
    check_signature,
    validate,
    validate_many,
)

SETTINGS = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def trivial_programs(task):
    """Independent re-statement of the trivial battery, one program each."""
    ep = task.entry_point
    hidden = [t["output"] for t in task.hidden_tests]
    common = max(hidden, key=lambda o: sum(o == p for p in hidden))
    table = {repr(t["input"]): t["output"] for t in task.visible_tests}
    bodies = [
        "return args[0]",
        f"return {common!r}",
        "return []",
        "return ''",
        "return 0",
        "return None",
        "return sorted(args[0])",
        "return args[0][::-1]",
        f"return {table!r}.get(repr(list(args)), {common!r})",
    ]
    return [f"def {ep}(*args):\n    {body}\n" for body in bodies]


@SETTINGS
@given(seed=st.integers(0, 2**31), level=st.sampled_from([1, 2, 3, 4]), split=st.sampled_from(SPLITS))
def test_procedural_tasks_pass_every_check(task_sb, seed, level, split):
    if split in ("heldout_compositions",) and level < 3 or split == "deeper":
        level = None  # these splits choose their own levels
    if split == "noisy" and level in (1, 4):
        level = None
    (task,) = generate_tasks(1, level=level, split=split, seed=seed, sb=task_sb)
    assert task.checks == {name: True for name in CHECKS}
    assert task.split == split and (level is None or task.level == level)
    # re-validation from scratch agrees, and recomputes the same outputs
    again = validate(
        dataclasses.replace(
            task, visible_tests=without_outputs(task.visible_tests), hidden_tests=without_outputs(task.hidden_tests)
        ),
        task_sb,
    )
    assert again.ok, again.reason
    assert again.task.tests == task.tests
    # the reference passes its own tests
    inputs = [t["input"] for t in task.tests]
    report = task_sb.run_tests(
        task.reference_solution, task.entry_point, inputs, expected=[t["output"] for t in task.tests]
    )
    assert report.all_passed
    # and no trivial program passes the hidden tests
    for program in trivial_programs(task):
        rep = task_sb.run_tests(
            program,
            task.entry_point,
            [t["input"] for t in task.hidden_tests],
            expected=[t["output"] for t in task.hidden_tests],
        )
        assert not rep.all_passed, program


def _wrap(task, imports, result):
    """The reference renamed _inner, under a new entry point with the same parameters returning `result`."""
    src = task.reference_solution.replace(f"def {task.entry_point}(", "def _inner(", 1)
    params = task.signature.split("(", 1)[1].split(")")[0].split(":")[0]
    return f"{imports}{src}\n\ndef {task.entry_point}({params}):\n    return {result.format(p=params)}\n"


def _nondeterministic(task):
    return _wrap(task, "import uuid\n\n", "[uuid.uuid4().hex, _inner({p})]")


def _returns_a_set(task):
    return _wrap(task, "", "{{repr(_inner({p}))}}")


CORRUPTIONS = {
    # name: (how to corrupt, the check that must reject it)
    "wrong_output": (
        lambda t: dataclasses.replace(
            t, hidden_tests=[dict(t.hidden_tests[0], output=["surely", "wrong"])] + t.hidden_tests[1:]
        ),
        "outputs_match",
    ),
    "nondeterministic": (
        lambda t: dataclasses.replace(
            t,
            reference_solution=_nondeterministic(t),
            visible_tests=without_outputs(t.visible_tests),
            hidden_tests=without_outputs(t.hidden_tests),
        ),
        "deterministic",
    ),
    "banned_import": (
        lambda t: dataclasses.replace(t, reference_solution="import os\n" + t.reference_solution),
        "safe",
    ),
    "unparsable": (
        lambda t: dataclasses.replace(t, reference_solution=t.reference_solution + "\n    return (\n"),
        "parses",
    ),
    "non_json_input": (
        lambda t: dataclasses.replace(
            t, visible_tests=[{"input": [{1, 2}], "output": t.visible_tests[0]["output"]}] + t.visible_tests[1:]
        ),
        "json_values",
    ),
    "non_json_output": (
        lambda t: dataclasses.replace(
            t,
            reference_solution=_returns_a_set(t),
            visible_tests=without_outputs(t.visible_tests),
            hidden_tests=without_outputs(t.hidden_tests),
        ),
        "json_values",
    ),
    "empty_description": (lambda t: dataclasses.replace(t, description="  "), "description"),
    "wrong_signature": (lambda t: dataclasses.replace(t, signature="def other(xs: list) -> list"), "signature"),
}


@SETTINGS
@given(index=st.integers(0, 10**6), corruption=st.sampled_from(sorted(CORRUPTIONS)))
def test_corrupted_records_are_rejected_with_the_right_reason(task_sb, task_pool, index, corruption):
    task = task_pool[index % len(task_pool)]
    corrupt, check = CORRUPTIONS[corruption]
    report = validate(corrupt(task), task_sb)
    assert not report.ok
    assert report.rejection == check, report.reason
    assert report.task.checks[check] is False
    assert report.reason.startswith(check + ": ")


def test_duplicates_are_rejected_by_id_program_and_behaviour(task_sb, task_pool):
    task = task_pool[0]
    index = MemoryIndex([task])
    same = validate(task, task_sb, index)
    assert same.rejection == "novel" and "same id" in same.reason
    # the same program with renamed variables and other inputs is a near-duplicate
    names = {"xs": "values", "x": "item", "s": "text", "lines": "rows"}
    tree = ast.parse(task.reference_solution)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            node.id = names.get(node.id, node.id)
        elif isinstance(node, ast.arg):
            node.arg = names.get(node.arg, node.arg)
    param = task.signature.split("(")[1].split(":")[0]
    other = dataclasses.replace(
        task,
        id="",
        reference_solution=ast.unparse(tree),
        signature=task.signature.replace(f"({param}:", f"({names[param]}:"),
        visible_tests=without_outputs(task.hidden_tests),
        hidden_tests=without_outputs(task.visible_tests + task.hidden_tests[:3]),
    )
    report = validate(other, task_sb, MemoryIndex([task]))
    assert report.rejection == "novel" and "near-duplicate" in report.reason
    # within one batch the second copy is the duplicate
    reports = validate_many([task, task], task_sb)
    assert reports[0].ok and reports[1].rejection == "novel"


@pytest.mark.parametrize(
    "snippet, reason",
    [
        ("import subprocess", "subprocess"),
        ("import os.path", "'os'"),
        ("from socket import socket", "socket"),
        ("import threading", "threading"),
        ("import multiprocessing", "multiprocessing"),
        ("import time", "time"),
        ("import sys", "sys"),
        ("x = eval('1')", "eval"),
        ("exec('1')", "exec"),
        ("open('f')", "open"),
        ("__import__('os')", "__import__"),
        ("import random\nx = random.random()", "random without a fixed seed"),
        ("y = ().__class__.__subclasses__()", "dunder attribute"),
        ("g = getattr(1, 'real')", "getattr"),
    ],
)
def test_safe_rejects_banned_code(snippet, reason, task_pool):
    task = dataclasses.replace(task_pool[0], reference_solution=snippet + "\n" + task_pool[0].reference_solution)
    result = check_safe(task)
    assert not result.passed and reason in result.reason


def test_safe_allows_seeded_random_and_plain_code(task_pool):
    task = task_pool[0]
    seeded = dataclasses.replace(task, reference_solution="import random\nrandom.seed(3)\n" + task.reference_solution)
    assert check_safe(seeded).passed
    local = dataclasses.replace(
        task, reference_solution="import random\nR = random.Random(7)\n" + task.reference_solution
    )
    assert check_safe(local).passed and check_safe(task).passed


def test_static_checks_explain_themselves(task_pool):
    task = task_pool[0]
    assert check_parses(dataclasses.replace(task, reference_solution="def solve(:")).reason.startswith(
        "reference does not parse"
    )
    wrong_params = dataclasses.replace(task, signature=task.signature.replace("(", "(extra, ", 1))
    assert "differ" in check_signature(wrong_params).reason
    too_many = dataclasses.replace(task, hidden_tests=task.hidden_tests + [{"input": [1, 2, 3]}])
    assert "passes 3 argument(s)" in check_signature(too_many).reason
    assert check_description(dataclasses.replace(task, description="")).reason == "description is empty"


def test_tasks_that_trivial_programs_solve_are_rejected(task_sb, task_pool):
    task = task_pool[0]
    arg = task.signature.split("(")[1].split(":")[0]
    identity = dataclasses.replace(
        task,
        id="",
        reference_solution=f"def {task.entry_point}({arg}):\n    return {arg}\n",
        visible_tests=without_outputs(task.visible_tests),
        hidden_tests=without_outputs(task.hidden_tests),
    )
    report = validate(identity, task_sb)
    assert report.rejection == "trivial_fail" and "identity" in report.reason


def test_generator_style_task_without_params_is_validated(task_sb):
    """A generator-proposed task (no params, own entry point, outputs not computed) gets its outputs and checks."""
    from generator.schema import Task

    task = Task(
        id="",
        family="generator",
        source="generator",
        split="train",
        level=3,
        description="Return the running maximum of the list.",
        entry_point="running_max",
        signature="def running_max(nums: list[int]) -> list[int]",
        reference_solution=(
            "def running_max(nums):\n    out, best = [], None\n    for n in nums:\n"
            "        best = n if best is None or n > best else best\n"
            "        out.append(best)\n    return out\n"
        ),
        visible_tests=[{"input": [[3, 1, 4]]}, {"input": [[1, 5, 9, 2]]}],
        hidden_tests=[{"input": [[]]}, {"input": [[2]]}, {"input": [[5, 4, 3]]}, {"input": [[-1, -3, 0, 7]]}],
    )
    report = validate(task, task_sb)
    assert report.ok, report.reason
    assert report.task.visible_tests[0]["output"] == [3, 3, 4]
    assert report.task.id.startswith("t") and report.task.fingerprints["behaviour"]
