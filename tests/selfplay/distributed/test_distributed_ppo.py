"""PPO updates on 2 real ranks (torchrun, gloo, DeepSpeed on the CPU): plain torch and DeepSpeed ZeRO-2 give the
same update for any micro-batch size, take one optimiser step per minibatch, and keep the adaptive beta equal on all
ranks (tests/selfplay/distributed/ppo_ranks.py runs on each rank)."""

import math
import os
from pathlib import Path

import pytest
import torch

from tests.selfplay.distributed.test_distributed import two_ranks

pytestmark = pytest.mark.distributed
SCRIPT = Path(__file__).with_name("ppo_ranks.py")
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    from tests.selfplay.distributed import ppo_ranks

    out = tmp_path_factory.mktemp("ppo_ranks")
    two_ranks(
        [str(SCRIPT), str(out)],
        timeout=600,
        env={"PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])},
    )
    return [torch.load(out / f"rank_{r}.pt", weights_only=False) for r in (0, 1)], ppo_ranks


def test_torch_and_deepspeed_updates_agree_for_any_micro_batch_size(ranks):
    results, _ = ranks
    reference = results[0]["torch/1"]["delta"]
    assert reference.norm() > 0
    for r in results:
        for key, res in r.items():
            cos = torch.nn.functional.cosine_similarity(res["delta"], reference, dim=0).item()
            assert cos > 0.9999, (key, cos)
            assert torch.allclose(res["delta"], reference, rtol=1e-4, atol=1e-6), key


def test_one_optimiser_step_per_minibatch_on_both_backends(ranks):
    results, script = ranks
    expected = script.EPOCHS * math.ceil(script.BATCH / script.MINI)  # 6 rollouts, minibatches of 4: 2 per epoch
    for r in results:
        for key, res in r.items():
            assert res["steps"] == [expected] * script.UPDATES, key


def test_adaptive_beta_is_the_same_on_every_rank(ranks):
    results, _ = ranks
    for key in results[0]:
        betas = [r[key]["beta"] for r in results]
        assert betas[0] == betas[1], (key, betas)
        assert betas[0] != pytest.approx(0.1)  # it adapted
