"""Fixtures shared across test packages.

`warm_run`: one warm-started smoke run folder per session (the slowest step of the end-to-end tests); tests that
train copy it (`copy_run`) and continue, which is what `selfplay train` does on a folder holding a checkpoint.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import sandbox

SMOKE = [
    "configs/smoke.yaml",
    "warmstart.tasks=160",
    "warmstart.solver_steps=40",
    "warmstart.generator_steps=10",
    "eval.tasks_per_split=2",
]
REPO = Path(__file__).resolve().parents[1]


def selfplay(*args, timeout=900, check=True, env=None):
    """`python -m selfplay ARGS` in a subprocess; `env`: variables set for it on top of this one's."""
    proc = subprocess.run(
        [sys.executable, "-m", "selfplay", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **env} if env else None,
    )
    if check and proc.returncode != 0:
        err = proc.stderr if len(proc.stderr) < 6000 else proc.stderr[:3000] + "\n...\n" + proc.stderr[-3000:]
        raise AssertionError(f"selfplay {' '.join(args)} exited {proc.returncode}:\n{err}")
    return proc


@pytest.fixture
def one_thread():
    """Tiny models gain nothing from intra-op threads, and on a shared 2-core machine they spin (4x slower)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def task_sb():
    """One process sandbox for the session: the task, generator and solver tests grade in it."""
    with sandbox.open_sandbox(backend="process", timeout_s=5.0) as sb:
        yield sb


@pytest.fixture(scope="session")
def warm_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("warm") / "run"
    selfplay("warmstart", *SMOKE, f"run.dir={run}")
    return run


def copy_run(warm_run: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(warm_run, dst)
    return dst
