"""A checkpoint written by N ranks resumes on M (a requeued job may get another allocation): 2 -> 1 and 1 -> 2 CPU
ranks under torchrun over gloo, with DDP and with DeepSpeed ZeRO-2 (and ZeRO-3, 2 -> 1). DDP's checkpoint is whole
(the HF weights and one optimizer.pt); ZeRO's optimiser shards are cut per rank, so they are converted to DeepSpeed's
universal checkpoint, which loads on the new number of ranks. Either way nothing is reset: the resumed run says it
changed world size and its optimiser's step count continues from the checkpoint's. Where the shards cannot be
converted, that agent's optimiser starts afresh from the saved weights, and the warning names why."""

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


def zero_on(ranks: int, run: Path, steps: int, zero_config: str) -> str:
    """`selfplay train` under DeepSpeed ZeRO (`zero_config`) on `ranks` CPU ranks (torchrun, even for one); its
    output."""
    zero = ["distributed.deepspeed=true", f"distributed.zero_config={zero_config}"]
    args = ["-m", "selfplay", "train", *SMOKE, f"run.dir={run}", f"train.steps={steps}", *STEPS, *zero]
    if ranks == 2:
        return two_ranks(args, timeout=900)
    one = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "--master_port", str(free_port())]
        + args,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"},
    )
    out = one.stdout + one.stderr
    assert one.returncode == 0, out[-3000:]
    return out


def zero_steps(run: Path, step: int, name: str) -> tuple[list[float], int]:
    """(each ZeRO shard's Adam step count, the engine's global_steps) of agent `name` in checkpoint `step` (ZeRO-1/2
    keep the base optimiser's state under `base_optimizer_state`, ZeRO-3 under `optimizer_state_dict`)."""
    folder = run / "checkpoints" / f"step_{step}" / name / "deepspeed" / "agent"
    adam = []
    for shard in sorted(folder.glob("*_optim_states.pt")):
        zero = torch.load(shard, map_location="cpu", weights_only=False)["optimizer_state_dict"]
        base = zero.get("base_optimizer_state") or zero["optimizer_state_dict"]
        adam.append(float(base["state"][0]["step"]))
    engine = torch.load(next(folder.glob("*model_states.pt")), map_location="cpu", weights_only=False)
    return adam, int(engine["global_steps"])


@pytest.mark.parametrize(
    "first,then,zero_config",
    [(2, 1, "zero2_cpu.json"), (1, 2, "zero2_cpu.json"), (2, 1, "zero3_cpu.json")],
    ids=["2to1", "1to2", "zero3-2to1"],
)
def test_zero_optimiser_shards_resume_on_another_number_of_ranks_through_a_universal_checkpoint(
    warm_run, tmp_path, first, then, zero_config
):
    """DeepSpeed ZeRO cuts its optimiser states per rank: a checkpoint of `first` ranks resumed on `then` is
    converted to DeepSpeed's universal checkpoint (kept beside the shards) and loaded, so both agents' Adam moments,
    fp32 master weights and step counts carry over; nothing starts afresh."""
    run = copy_run(warm_run, tmp_path)
    zero_on(first, run, 1, zero_config)
    solver = run / "checkpoints" / "step_1" / "solver"
    assert len(list((solver / "deepspeed" / "agent").glob("*_optim_states.pt"))) == first
    out = zero_on(then, run, 2, zero_config)
    assert f"step_1 was written by {first} rank(s); resuming on {then}" in out, out[-3000:]
    assert (
        f"the ZeRO optimiser states of the solver and generator in step_1, sharded over {first} rank(s), load on "
        f"{then} from DeepSpeed's universal checkpoint" in out
    ), out[-3000:]
    assert "starts afresh" not in out
    assert (solver / "deepspeed" / "universal" / "zero" / "optimizer_state.pt").exists()
    final = state(run, 2)
    assert final["world_size"] == then and [h["step"] for h in final["history"]] == [1, 2]
    # the optimisers went on from step 1's state: their step counts are step 1's plus step 2's optimiser steps
    scalars = read_scalars(run)
    for name in ("solver", "generator"):
        (before, *_), global_before = zero_steps(run, 1, name)
        after, global_after = zero_steps(run, 2, name)
        optimizer_steps = dict(scalars[f"ppo/{name}/optimizer_steps"])[2]
        assert len(after) == then and set(after) == {before + optimizer_steps}, (name, before, after)
        assert before > 0 and global_after == global_before + optimizer_steps


def test_zero_shards_that_cannot_be_converted_start_afresh_with_a_warning_naming_why(tmp_path):
    """Where DeepSpeed cannot convert an agent's ZeRO shards to its universal checkpoint (here, unreadable shard
    files), that agent's optimiser starts afresh from the saved weights and the warning names the agent and why; the
    other agent's states (none sharded here) are not named."""
    from types import SimpleNamespace

    from selfplay.train.checkpointing import resized

    folder = tmp_path / "step_1"
    shards = folder / "solver" / "deepspeed" / "agent"
    shards.mkdir(parents=True)
    for rank in (0, 1):
        (shards / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").write_bytes(b"not a checkpoint")
    lines: list[str] = []
    cfg = SimpleNamespace(distributed=SimpleNamespace(deepspeed=True))
    resized(SimpleNamespace(cfg=cfg, world=1, main=True, log=lines.append), folder, 2)
    assert lines[0] == "step_1 was written by 2 rank(s); resuming on 1"
    (warning,) = lines[1:]
    assert warning.startswith(
        "warning: the ZeRO optimiser states of the solver in step_1 are sharded over 2 rank(s) and could not be "
        "converted to DeepSpeed's universal checkpoint ("
    ), warning
    assert "starts afresh from the saved weights" in warning
    assert not (shards.parent / "universal").exists()
