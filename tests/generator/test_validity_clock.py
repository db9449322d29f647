"""The validity checks time their programs on the sandbox's CPU clock (generator.validity.CLOCK) and name how a
run that did not finish ended, so a rejection for time says which clock ended it."""

from __future__ import annotations

import dataclasses

from generator.build import generate_tasks
from generator.schema import without_outputs
from generator.validity import CLOCK, validate


def test_a_reference_that_never_returns_is_rejected_by_its_cpu_time(task_sb):
    task = generate_tasks(1, level=1, split="train", seed=5, sb=task_sb)[0]
    loops = task.reference_solution.replace(f"def {task.entry_point}(", "def _inner(", 1)
    params = task.signature.split("(", 1)[1].split(")")[0].split(":")[0]
    loops += f"\n\ndef {task.entry_point}({params}):\n    while True:\n        pass\n"
    stuck = dataclasses.replace(
        task,
        reference_solution=loops,
        visible_tests=without_outputs(task.visible_tests),
        hidden_tests=without_outputs(task.hidden_tests),
    )
    report = validate(stuck, task_sb, timeout_s=0.2)
    assert CLOCK == "cpu"
    assert report.rejection == "runs"
    assert report.reason.startswith("runs: visible test 0: timeout (")
    assert "(clock cpu)" in report.reason
