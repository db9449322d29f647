"""ZeRO-3 on 2 real ranks (torchrun, gloo, CPU): the weight sync (`policy_weight_items`, `policy_weights`), the
checkpoint's Hugging Face copy (`LMAgent.save`) and `param_checksum` gather one parameter at a time, and give the same
tensors, bytes and checksums as gathering the whole model at once. This file is also what each rank runs."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[3]


def test_zero3_gathers_one_parameter_at_a_time_with_the_whole_gathers_results(tmp_path):
    from tests.selfplay.distributed.test_distributed import two_ranks

    two_ranks(
        [str(Path(__file__)), str(tmp_path)],
        timeout=600,
        env={"PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])},
    )
    ranks = [json.loads((tmp_path / f"rank_{r}.json").read_text()) for r in (0, 1)]
    for r in ranks:
        assert r["partitioned"] > 10 and r["whole_gather_max"] == r["partitioned"], r  # it sees a whole gather
        assert r["sync_tensors"] > 0 and r["sync_mismatched"] == [] and r["sync_max_available"] <= 1, r
        assert r["dict_mismatched"] == [] and r["dict_max_available"] <= 1, r
        assert r["gathered_available"] == 0, r  # `gathered` gathers nothing without LoRA
        assert r["checksum_equal"] and r["checksum_max_available"] <= 1, r
        # saving: one parameter at a time, the value head (its weight and bias) as one group
        assert 1 <= r["save_max_available"] <= r["value_head_tensors"] <= 2, r
    assert ranks[0]["checksum"] == ranks[1]["checksum"]
    saved = ranks[0]["saved"]
    assert {"model.safetensors", "config.json", "value_head.pt", "critic/model.safetensors"} <= set(saved), saved
    assert all(same for same in saved.values()), saved  # byte for byte what the whole gather wrote


# ---- what each rank runs --------------------------------------------------------------------------------------------


def main(out: str) -> None:
    import deepspeed
    import torch
    import torch.distributed as dist
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    from selfplay.models.agent import LMAgent
    from selfplay.models.factory import ActorCritic, frozen_copy, train_tokenizer
    from selfplay.rollout.engine import gathered, policy_weight_items, policy_weights
    from selfplay.runtime.config import DistributedConfig
    from selfplay.runtime.distributed import init_distributed, param_checksum, wrap_model
    from tests.selfplay.distributed.sampling_ranks import ppo_config, tiny_policy
    from tests.selfplay.rollout.test_constrained import TEXTS

    info = init_distributed()
    torch.set_num_threads(1)
    tok = train_tokenizer(TEXTS, vocab_size=400, kind="bpe")
    policy = tiny_policy(tok)  # tied embeddings: one parameter under two names
    cfg = ppo_config(8)
    dist_cfg = DistributedConfig(deepspeed=True, zero_config="zero3_cpu.json")
    agent = LMAgent(
        "solver",
        ActorCritic(policy, value_model="separate"),
        frozen_copy(policy),
        tok,
        cfg,
        seed=0,
        wrap=lambda model: wrap_model(model, cfg, dist_cfg, info),
    )
    assert agent.zero3
    module = agent.module
    params = [p for p in module.parameters() if hasattr(p, "ds_id") and not p.ds_persist]

    def available() -> int:
        """How many partitioned parameters (beyond those DeepSpeed keeps whole, ds_persist) are whole now."""
        return sum(p.ds_status == ZeroParamStatus.AVAILABLE for p in params)

    entered: list[int] = []  # the count each time a gather has begun, whoever gathers
    enter = deepspeed.zero.GatheredParameters.__enter__

    def counting_enter(self):
        enter(self)
        entered.append(available())

    deepspeed.zero.GatheredParameters.__enter__ = counting_enter
    result: dict = {"partitioned": len(params), "value_head_tensors": len(list(module.value_head.parameters()))}
    assert available() == 0

    # what the whole-model gather gives: the policy's weights, the checksum's bytes, the HF copy's files
    old = Path(out) / "whole"
    with deepspeed.zero.GatheredParameters(list(module.parameters())):
        result["whole_gather_max"] = available()
        expected = {k: v.detach().clone() for k, v in module.policy.state_dict().items()}
        h = hashlib.sha256()
        for name, p in sorted(module.named_parameters()):
            h.update(name.encode())
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        whole_sha = h.hexdigest()
        if info.rank == 0:
            module.save_pretrained(old)

    entered.clear()

    # the weight sync, one parameter at a time
    seen, most = {}, 0
    for name, tensor in policy_weight_items(agent):
        most = max(most, available())
        seen[name] = tensor.clone()
    result["sync_tensors"] = len(seen)
    result["sync_mismatched"] = sorted(
        set(expected) ^ set(seen) | {k for k in set(expected) & set(seen) if not torch.equal(expected[k], seen[k])}
    )
    result["sync_max_available"] = max(most, *entered)
    entered.clear()
    with gathered(agent):
        result["gathered_available"] = available()
    weights = policy_weights(agent)
    result["dict_mismatched"] = sorted(k for k in expected if not torch.equal(expected[k], weights.get(k)))
    result["dict_max_available"] = max(entered)
    entered.clear()

    # the checksum
    checksum = param_checksum(module)
    result["checksum"] = checksum["sha256"]
    result["checksum_equal"] = checksum["sha256"] == whole_sha
    result["checksum_max_available"] = max(entered)
    entered.clear()

    # the checkpoint's HF copy
    new = Path(out) / "checkpoints" / "step_1" / "solver"
    agent.save(new, write_hf=info.rank == 0)
    result["save_max_available"] = max(entered)
    if info.rank == 0:
        result["saved"] = {
            str(f.relative_to(old)): f.read_bytes() == (new / f.relative_to(old)).read_bytes()
            for f in sorted(old.rglob("*"))
            if f.is_file()
        }
    Path(out, f"rank_{info.rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
