"""The cores a rank sizes its sandbox pool by: its CPU affinity (what `srun --cpus-per-task`, taskset or a cgroup
cpuset leave it), not the machine's count; no SLURM cluster needed (tests/slurm/test_selfplay_sh.py runs the script
on one)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from tests.conftest import REPO

# what `selfplay train` sizes each rank's pool with (selfplay.train.setup.sandbox_workers), and the affinity's count
CODE = (
    "import os, sandbox; from selfplay.runtime.config import load_config; "
    "from selfplay.train.setup import sandbox_workers; "
    "print(sandbox.usable_cpus(), sandbox_workers(load_config()), os.cpu_count())"
)


def counts(*prefix: str, ranks: int = 1) -> tuple[int, int, int]:
    env = dict(os.environ, LOCAL_WORLD_SIZE=str(ranks))
    out = subprocess.run(
        [*prefix, sys.executable, "-c", CODE], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    usable, workers, machine = map(int, out.stdout.split())
    return usable, workers, machine


def test_a_rank_pinned_to_one_core_counts_one_core_and_one_worker():
    assert shutil.which("taskset"), "taskset is missing: install util-linux (.ci/run's Debian base has it)"
    usable, workers, machine = counts("taskset", "-c", "0")
    assert (usable, workers) == (1, 1) and machine == os.cpu_count()


def test_a_node_s_cores_are_shared_out_over_its_ranks():
    usable, workers, _ = counts(ranks=2)
    assert usable == len(os.sched_getaffinity(0))
    assert workers == max(1, usable // 2)
