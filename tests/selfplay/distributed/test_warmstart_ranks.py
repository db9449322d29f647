"""The warm start under DeepSpeed on 2 CPU ranks (torchrun, gloo, DS_ACCELERATOR=cpu).

- `sft_engine` against `sft` (tests/selfplay/distributed/warmstart_ranks.py runs on each rank): under ZeRO-2 and
  ZeRO-3, each batch split over the ranks in micro-batches of 2, the first step's loss and gradient norm are plain
  torch's, the losses fall, and both ranks end with the same weights, which rank 0's consolidated copy holds; with
  DeepSpeed's bf16 the losses follow `sft`'s through its fp32 master weights;
- `selfplay train` from an empty run folder under ZeRO-2, and under ZeRO-3 with LoRA: every rank takes part in the
  warm start, step_0 holds the weights every rank trained (its `param_checksums`), loads (with LoRA its KL reference
  the policy with its adapter off), and training continues one iteration.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from tests.conftest import SMOKE
from tests.selfplay.distributed.test_distributed import two_ranks

pytestmark = pytest.mark.distributed
SCRIPT = Path(__file__).with_name("warmstart_ranks.py")
REPO = Path(__file__).resolve().parents[3]
ZERO = ("zero2_cpu.json", "zero3_cpu.json")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("warmstart_ranks")
    two_ranks(
        [str(SCRIPT), str(out)],
        timeout=600,
        env={"PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])},
    )
    return [json.loads((out / f"rank_{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.parametrize("zero", ZERO)
def test_the_first_step_is_plain_torchs_and_the_losses_fall(ranks, zero):
    for r in ranks:
        res = r[zero]
        assert (res["micro_batch"], res["accumulation"]) == (2, 2)  # 3 rows of a batch of 6 per rank, 2 at a time
        # fp32 on both sides, the same rows: only the grouping of the sums differs (the batch's 6 rows in 3
        # micro-batches on one process against 2 per rank, then an all-reduce), float32 rounding of a few hundred
        # terms, about 1e-7 relative each: 1e-5 relative bounds it with room
        assert res["losses"][0] == pytest.approx(r["plain_losses"][0], rel=1e-5)
        # the gradient the engine clips is the whole batch's: normalised by the batch's answer tokens, times the
        # ranks the engine averages over (a scale error would show here and not in the loss)
        assert res["grad_norm_first"] == pytest.approx(r["plain_grad_norm_first"], rel=1e-5)
        assert all(math.isfinite(x) for x in res["losses"])
        assert sum(res["losses"][-3:]) < sum(res["losses"][:3])  # learning: the answer is the prompt reversed
        # the same AdamW (betas, decay, clipping) and schedule as `sft`: the whole curve follows plain torch's,
        # the last batch too short for rank 1 included (its zero-weighted pass adds nothing)
        assert res["losses"] == pytest.approx(r["plain_losses"], rel=1e-4)


def test_deepspeed_bf16_with_fp32_masters_follows_sft_through_its_master_weights(ranks):
    for r in ranks:
        res, plain = r["zero2_bf16"]["losses"], r["plain_bf16_losses"]
        # the same bf16 weights and rows, grouped differently: the first loss differs by bf16 rounding of the logits
        # of differently shaped passes at most (2^-9 relative each, averaged over the batch's answer tokens); 1e-3
        # bounds that, while a wrong token normalisation or rank scaling would be off by tens of percent
        assert res[0] == pytest.approx(plain[0], rel=1e-3)
        # then both step fp32 masters with the same AdamW and round them to bf16; the curves part by that rounding
        # only (1.9e-4 relative at most, measured): 2e-3
        assert res == pytest.approx(plain, rel=2e-3)
        assert sum(res[-3:]) < sum(res[:3])


@pytest.mark.parametrize("zero", (*ZERO, "zero2_bf16"))
def test_both_ranks_end_with_the_weights_rank_0_consolidates(ranks, zero):
    a, b = (r[zero] for r in ranks)
    assert a["trained"] == b["trained"]
    assert a["consolidated"] == a["trained"]  # gathered one parameter at a time into a plain copy
    assert a["losses"] == b["losses"]  # the batch's loss, all-reduced


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides",
    [
        ("distributed.zero_config=zero2_cpu.json",),
        ("distributed.zero_config=zero3_cpu.json", "model.arch=llama", "model.lora.r=4"),
    ],
    ids=["zero2", "zero3-lora"],
)
def test_selfplay_train_warm_starts_on_both_ranks_and_continues(tmp_path, overrides):
    import torch

    from selfplay.models.agent import load_agent_parts
    from selfplay.models.factory import ActorCritic, AdapterOff
    from selfplay.runtime.distributed import param_checksum

    run = tmp_path / "run"
    output = two_ranks(
        [
            "-m",
            "selfplay",
            "train",
            *SMOKE,
            f"run.dir={run}",
            "distributed.deepspeed=true",
            *overrides,
            "train.steps=1",
        ],
        timeout=900,
    )
    assert "solver SFT 40 steps on 2 ranks (DeepSpeed)" in output, output[-3000:]
    ckpt = run / "checkpoints"
    step0 = json.loads((ckpt / "step_0" / "state.json").read_text())
    ws = step0["warmstart"]
    assert ws["sft_ranks"] == 2
    for agent in ("solver", "generator"):
        first, last = ws[f"{agent}_sft_loss_first"], ws[f"{agent}_sft_loss_last"]
        assert math.isfinite(first) and math.isfinite(last) and last < first, (agent, first, last)
        # step_0 holds the weights both ranks trained (they matched this checksum, else the warm start stops)
        loaded = ActorCritic.from_pretrained(ckpt / "step_0" / agent, dtype=torch.float32)
        assert param_checksum(loaded)["sha256"] == step0["param_checksums"][agent]
        assert (ckpt / "step_0" / agent / "reference").is_dir()
        if "model.lora.r=4" in overrides:  # the KL reference as the loop builds it: the policy with its adapter off
            model, reference, _ = load_agent_parts(ckpt / "step_0" / agent)
            assert isinstance(reference, AdapterOff) and model.lora_base == "reference"
    step1 = json.loads((ckpt / "step_1" / "state.json").read_text())
    assert step1["step"] == 1 and step1["world_size"] == 2  # loaded by both ranks, one iteration trained
    assert set(step1["param_checksums"]) == {"solver", "generator"}  # equal on both ranks, else the save fails
