"""Shared fixtures for the task tests: a pool of valid tasks (graded in tests/conftest.py's `task_sb`)."""

import pytest

from generator.build import generate_tasks


class Pool(list):
    def __repr__(self) -> str:  # keep hypothesis' failure reports short
        return f"<{len(self)} tasks>"


@pytest.fixture(scope="session")
def task_pool(task_sb):
    """Valid procedural tasks of every level (train split) plus some of each held-out split."""
    tasks = generate_tasks(24, split="train", seed=101, sb=task_sb)
    for split in ("heldout_types", "heldout_compositions", "deeper", "noisy"):
        tasks += generate_tasks(4, split=split, seed=202, sb=task_sb)
    return Pool(tasks)
