"""check_safe refuses a reference that loads the interpreter's private or system interfaces (`_ctypes` reaches
every system call, `posix` is `os`), and says why; ordinary imports and `from __future__` still pass."""

from __future__ import annotations

import pytest

from generator.schema import Task
from generator.validity import check_safe

REFERENCE = "def add(a, b):\n    return a + b\n"


def task_with(prefix: str) -> Task:
    return Task(
        id="t",
        family="arith",
        source="generator",
        split="train",
        level=1,
        description="Return the sum of a and b.",
        signature="def add(a: int, b: int) -> int",
        entry_point="add",
        reference_solution=prefix + REFERENCE,
        visible_tests=[{"input": [1, 2], "output": 3}],
        hidden_tests=[{"input": [i, i], "output": 2 * i} for i in range(3)],
    )


@pytest.mark.parametrize(
    "snippet, module",
    [
        ("import _ctypes", "_ctypes"),
        ("from _ctypes import dlopen", "_ctypes"),
        ("import _posixsubprocess", "_posixsubprocess"),
        ("import _socket", "_socket"),
        ("import posix", "posix"),
        ("from posix import system", "posix"),
        ("import _io", "_io"),
        ("import sqlite3", "sqlite3"),
        ("import logging.handlers", "logging"),
    ],
)
def test_private_and_system_modules_are_refused_with_a_reason(snippet, module):
    result = check_safe(task_with(snippet + "\n"))
    assert not result.passed
    assert f"'{module}'" in result.reason and "no reason to load" in result.reason, result.reason


@pytest.mark.parametrize(
    "snippet",
    [
        "from __future__ import annotations",
        "import math",
        "import heapq",
        "from collections import Counter",
        "import functools, itertools",
    ],
)
def test_ordinary_imports_still_pass(snippet):
    assert check_safe(task_with(snippet + "\n")).passed
