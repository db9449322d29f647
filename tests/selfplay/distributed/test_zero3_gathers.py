"""ZeRO-3 on 2 real ranks (torchrun, gloo, CPU): the weight sync (`policy_weight_items`, and its safetensors file
written one tensor at a time, `write_weights`), the checkpoint's Hugging Face copy (`LMAgent.save`) and
`param_checksum` gather one parameter at a time, and give the same tensors, bytes and checksums as gathering the whole
model at once; a LoRA policy's sync gathers one adapted layer (its base weight and its adapter) at a time, gives its
merged copy's tensors and leaves its partitions as they were, and its checkpoint writes that merged copy's files
byte for byte the same way, its reference once. This file is also what each rank runs."""

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
        assert r["file_mismatched"] == [] and r["file_max_available"] <= 1, r
        assert r["gathered_available"] == 0, r  # `gathered` gathers nothing
        # LoRA: a layer's base weight with its A and B at most, the merged copy's tensors, the policy untouched
        assert r["lora_partitioned"] > 10 and r["lora_sync_tensors"] > 0 and r["lora_layer_params"] in (3, 4), r
        assert 1 <= r["lora_max_available"] <= r["lora_layer_params"], r  # one adapted layer: W (bias), A, B
        assert r["lora_mismatched"] == [] and r["lora_file_mismatched"] == [] and r["lora_policy_changed"] == [], r
        assert r["checksum_equal"] and r["checksum_max_available"] <= 1, r
        # saving: one parameter at a time, the value head (its weight and bias) as one group
        assert 1 <= r["save_max_available"] <= r["value_head_tensors"] <= 2, r
    assert ranks[0]["checksum"] == ranks[1]["checksum"]
    # the LoRA checkpoint: never more than one adapted layer's base weight (and bias) whole, the merged copy's files
    # byte for byte, the reference once
    for r in ranks:
        assert 1 <= r["lora_save_base_max_available"] <= 2 and r["lora_adapter_params"] > 2, r
    assert ranks[0]["lora_saved"] and all(ranks[0]["lora_saved"].values()), ranks[0]["lora_saved"]
    second = ranks[0]["lora_second_files"]
    assert ranks[0]["lora_first_reference"] and "reference.json" in second, second
    assert not [f for f in second if f.startswith("reference/")], second
    assert ranks[0]["lora_frozen_in_deepspeed"] == 0  # DeepSpeed's files hold no share of the frozen weights
    for r in ranks:  # and a resume from them restores every weight
        assert r["lora_resume_params"] > 20 and r["lora_resume_mismatched"] == [], r
    saved = ranks[0]["saved"]
    assert {"model.safetensors", "config.json", "value_head.pt", "critic/model.safetensors"} <= set(saved), saved
    assert all(same for same in saved.values()), saved  # byte for byte what the whole gather wrote


# ---- what each rank runs --------------------------------------------------------------------------------------------


def main(out: str) -> None:
    import deepspeed
    import torch
    import torch.distributed as dist
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
    from peft import LoraConfig
    from safetensors import safe_open

    from selfplay.models.agent import LMAgent
    from selfplay.models.factory import ActorCritic, attach_lora, frozen_copy, merged_copy, train_tokenizer
    from selfplay.rollout.engine import gathered, policy_weight_items, policy_weight_specs, write_weights
    from selfplay.runtime.config import DistributedConfig
    from selfplay.runtime.distributed import init_distributed, param_checksum, wrap_model
    from tests.selfplay.distributed.sampling_ranks import ppo_config, tiny_policy, under_zero3
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

    def available(among=params) -> int:
        """How many partitioned parameters (beyond those DeepSpeed keeps whole, ds_persist) are whole now."""
        return sum(p.ds_status == ZeroParamStatus.AVAILABLE for p in among)

    def mismatched(expected: dict, path: Path) -> list[str]:
        """Names missing from, extra in, or different in the safetensors file at `path`."""
        with safe_open(str(path), framework="pt") as f:
            keys = set(f.keys())
            return sorted(
                set(expected) ^ keys
                | {k for k in keys & set(expected) if not torch.equal(expected[k], f.get_tensor(k))}
            )

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
        if info.rank == 0:  # Hugging Face's save of the whole model, as the checkpoint wrote it before it streamed
            module.policy.save_pretrained(old)
            module.critic.save_pretrained(old / "critic")
            torch.save(module.value_head.state_dict(), old / "value_head.pt")

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
    path = write_weights(policy_weight_items(agent), policy_weight_specs(agent), Path(out) / f"file_{info.rank}")
    result["file_mismatched"] = mismatched(expected, path)
    result["file_max_available"] = max(entered)
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
    # a LoRA policy (a trained adapter: B is not 0), its merged copy and its own tensors taken before ZeRO-3
    torch.manual_seed(1)
    lora = attach_lora(tiny_policy(tok), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.1)
    lora_expected = {k: v.clone() for k, v in merged_copy(lora).state_dict().items()}
    if info.rank == 0:  # the checkpoint's Hugging Face copy as the whole merged copy wrote it
        merged_copy(lora).save_pretrained(Path(out) / "lora_whole")
    lora_before = {k: v.clone() for k, v in lora.state_dict().items()}
    lora_agent = under_zero3("generator", lora, tok, cfg, info)
    lora_params = [p for p in lora_agent.module.policy.parameters() if hasattr(p, "ds_id") and not p.ds_persist]
    result["lora_partitioned"] = len(lora_params)
    result["lora_layer_params"] = max(
        sum(id(p) in {id(q) for q in lora_params} for p in m.parameters())
        for m in lora_agent.module.policy.modules()
        if hasattr(m, "lora_A")
    )
    entered.clear()
    seen, most = {}, 0
    for name, tensor in policy_weight_items(lora_agent):
        most = max(most, available(lora_params))
        seen[name] = tensor.clone()
    result["lora_sync_tensors"] = len(seen)
    result["lora_max_available"] = max(most, *entered)
    result["lora_mismatched"] = sorted(
        set(lora_expected) ^ set(seen)
        | {k for k in set(lora_expected) & set(seen) if not torch.equal(lora_expected[k], seen[k])}
    )
    path = write_weights(
        policy_weight_items(lora_agent), policy_weight_specs(lora_agent), Path(out) / f"lora_{info.rank}"
    )
    result["lora_file_mismatched"] = mismatched(lora_expected, path)
    with deepspeed.zero.GatheredParameters(list(lora_agent.module.policy.parameters())):
        now = lora_agent.module.policy.state_dict()
        result["lora_policy_changed"] = sorted(k for k in lora_before if not torch.equal(lora_before[k], now[k]))

    # the LoRA checkpoint: its merged copy streamed one adapted layer at a time, the adapter gathered (its own
    # tensors only), the reference written with the first checkpoint and pointed to by the second
    adapter = [p for n, p in lora_agent.module.policy.named_parameters() if "lora_" in n and hasattr(p, "ds_id")]
    base_params = [p for p in lora_params if all(p is not q for q in adapter)]
    seen_base: list[int] = []
    counting = deepspeed.zero.GatheredParameters.__enter__

    def base_counting_enter(self):
        counting(self)
        seen_base.append(available(base_params))

    deepspeed.zero.GatheredParameters.__enter__ = base_counting_enter
    root = Path(out) / "lora_checkpoints"
    for step in (1, 2):
        lora_agent.save(root / f"step_{step}" / "generator", write_hf=info.rank == 0)
        dist.barrier()  # (the loop's checkpoints are apart by barriers)
    deepspeed.zero.GatheredParameters.__enter__ = counting
    result["lora_save_base_max_available"] = max(seen_base)
    # resuming: a fresh engine over the same frozen base (which a run loads from the reference), its adapter and value
    # head not the saved ones, loads the DeepSpeed checkpoint (which holds no frozen weights): every weight as saved
    torch.manual_seed(2)
    again = under_zero3(
        "generator",
        attach_lora(tiny_policy(tok), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear")),
        tok,
        cfg,
        info,
    )
    again.load_training_state(root / "step_2" / "generator")
    with deepspeed.zero.GatheredParameters(list(again.module.parameters()) + list(lora_agent.module.parameters())):
        theirs = dict(lora_agent.module.named_parameters())
        result["lora_resume_mismatched"] = sorted(
            n for n, p in again.module.named_parameters() if not torch.equal(p.detach(), theirs[n].detach())
        )
        result["lora_resume_params"] = len(theirs)
    result["lora_adapter_params"] = len(adapter)
    if info.rank == 0:
        whole, first, second = Path(out) / "lora_whole", root / "step_1" / "generator", root / "step_2" / "generator"
        result["lora_saved"] = {
            name: (whole / name).read_bytes() == (folder / name).read_bytes()
            for folder in (first, second)
            for name in ("model.safetensors", "config.json")
        }
        result["lora_first_reference"] = (first / "reference" / "model.safetensors").is_file()
        result["lora_frozen_in_deepspeed"] = sum(
            len(torch.load(f, map_location="cpu", weights_only=False).get("frozen_param_fragments") or {})
            for f in (second / "deepspeed" / "agent").glob("*model_states.pt")
        )
        result["lora_second_files"] = sorted(str(f.relative_to(second)) for f in second.rglob("*") if f.is_file())

    Path(out, f"rank_{info.rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
