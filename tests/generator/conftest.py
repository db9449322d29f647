"""Shared fixtures for the task tests: one process sandbox for the session and a pool of valid tasks."""

import pytest

import sandbox
from generator.build import generate_tasks


@pytest.fixture(scope="session")
def task_sb():
    with sandbox.open_sandbox(backend="process", timeout_s=5.0) as sb:
        yield sb


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
