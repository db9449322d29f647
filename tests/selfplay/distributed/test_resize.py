"""A checkpoint written by N ranks resumes on M (a requeued job may get another allocation): 2 -> 1 and 1 -> 2 CPU
ranks under torchrun with DDP over gloo. DDP's checkpoint is whole (the HF weights and one optimizer.pt), so nothing is
reset: the resumed run says it changed world size and its optimiser's step count continues from the checkpoint's.
Under DeepSpeed ZeRO the optimiser shards of 2 ranks are not loaded on 1: the weights are kept, the reset is named."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from selfplay.runtime.tb import read_scalars
from tests.conftest import REPO, SMOKE, copy_run, selfplay
from tests.selfplay.distributed.test_distributed import free_port, two_ranks

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

STEPS = ["train.checkpoint_every=1", "run.torch_threads=1"]


def on_two_ranks(run: Path, steps: int) -> str:
    return two_ranks(["-m", "selfplay", "train", *SMOKE, f"run.dir={run}", f"train.steps={steps}", *STEPS], timeout=900)


def on_one_rank(run: Path, steps: int) -> str:
    proc = selfplay("train", *SMOKE, f"run.dir={run}", f"train.steps={steps}", *STEPS)
    return proc.stdout + proc.stderr


def state(run: Path, step: int) -> dict:
    return json.loads((run / "checkpoints" / f"step_{step}" / "state.json").read_text())


def adam_steps(run: Path, step: int) -> float:
    """The solver optimiser's step count in checkpoint `step` (the same for every parameter)."""
    saved = torch.load(run / "checkpoints" / f"step_{step}" / "solver" / "optimizer.pt", map_location="cpu")
    return float(next(iter(saved["state"].values()))["step"])


@pytest.mark.parametrize("first,then", [(2, 1), (1, 2)], ids=["2to1", "1to2"])
def test_a_checkpoint_resumes_on_another_number_of_ranks(warm_run, tmp_path, first, then):
    run = copy_run(warm_run, tmp_path)
    (on_two_ranks if first == 2 else on_one_rank)(run, 1)
    assert state(run, 1)["world_size"] == first
    out = (on_two_ranks if then == 2 else on_one_rank)(run, 2)
    assert f"step_1 was written by {first} rank(s); resuming on {then}" in out, out[-3000:]
    assert "starts afresh" not in out  # DDP: nothing reset
    final = state(run, 2)
    assert final["world_size"] == then and [h["step"] for h in final["history"]] == [1, 2]
    assert set(final["rng"]) == {str(r) for r in range(then)}
    if then == 2:  # the rank the first run did not have draws its own random numbers
        assert final["rng"]["0"] != final["rng"]["1"]
    # the optimiser went on from the checkpoint's state: its step count is step 1's plus step 2's optimiser steps
    optimizer_steps = dict(read_scalars(run)["ppo/solver/optimizer_steps"])[2]
    assert adam_steps(run, 2) == adam_steps(run, 1) + optimizer_steps > optimizer_steps
    assert (run / "checkpoints" / "step_2" / "solver" / "reference.json").exists()


def test_zero_optimiser_shards_of_two_ranks_start_afresh_on_one_with_a_warning_naming_them(warm_run, tmp_path):
    """DeepSpeed ZeRO-2 cuts its optimiser states per rank: a checkpoint of 2 ranks resumed on 1 keeps the weights
    (the HF copy) and starts both agents' optimisers afresh, saying so."""
    run = copy_run(warm_run, tmp_path)
    zero = ["distributed.deepspeed=true", "distributed.zero_config=zero2_cpu.json"]
    two_ranks(["-m", "selfplay", "train", *SMOKE, f"run.dir={run}", "train.steps=1", *STEPS, *zero], timeout=900)
    shards = run / "checkpoints" / "step_1" / "solver" / "deepspeed" / "agent"
    assert len(list(shards.glob("*_optim_states.pt"))) == 2
    one = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "--master_port", str(free_port())]
        + ["-m", "selfplay", "train", *SMOKE, f"run.dir={run}", "train.steps=2", *STEPS, *zero],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"},
    )
    out = one.stdout + one.stderr
    assert one.returncode == 0, out[-3000:]
    assert "step_1 was written by 2 rank(s); resuming on 1" in out
    assert "the ZeRO optimiser states of the solver and generator in step_1 are sharded over 2 ranks" in out
    assert "starts afresh from the saved weights" in out
    final = state(run, 2)
    assert final["world_size"] == 1 and [h["step"] for h in final["history"]] == [1, 2]
