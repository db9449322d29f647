"""A distributed smoke check: a few PPO steps on a tiny random GPT-2 under torchrun, each rank on its own rollouts,
every rank's parameter checksum before and after written to OUT/rank_N.json (they must agree across ranks).

    torchrun --nproc_per_node 2 -m selfplay.rl.smoke --smoke OUT [--zero-config zero2_cpu.json] [--no-deepspeed]
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist

from selfplay.models.factory import ActorCritic, frozen_copy
from selfplay.rl.ppo import PPOTrainer, generate
from selfplay.runtime.config import DistributedConfig, PPOConfig
from selfplay.runtime.distributed import barrier, init_distributed, param_checksum, wrap_model


def smoke(out_dir: str, zero_config: str = "zero2_cpu.json", steps: int = 3, deepspeed_on: bool = True) -> dict:
    """A few PPO steps on a tiny random GPT-2, each rank on its own rollouts; writes OUT/rank_N.json."""
    from transformers import GPT2Config, GPT2LMHeadModel

    info = init_distributed()
    torch.manual_seed(0)  # same initial weights on every rank
    policy = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=64,
            n_layer=2,
            n_embd=32,
            n_head=2,
            n_positions=64,
            bos_token_id=63,
            eos_token_id=63,
            pad_token_id=0,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
    )
    model, ref = ActorCritic(policy), frozen_copy(policy)
    ppo_cfg = PPOConfig(lr=1e-3, mini_batch_size=4, micro_batch_size=2, epochs=2)
    engine, optimizer = wrap_model(
        model, ppo_cfg, DistributedConfig(deepspeed=deepspeed_on, zero_config=zero_config), info
    )
    before = param_checksum(engine)
    trainer = PPOTrainer(engine, ref, ppo_cfg, optimizer, pad_token_id=0, seed=info.rank)
    torch.manual_seed(1000 + info.rank)  # different rollouts per rank
    metrics = {}
    for _ in range(steps):
        prompts = torch.randint(1, 64, (8, 5)).tolist()
        samples = generate(engine, prompts, pad_token_id=0, eos_token_id=63, max_new_tokens=6)
        scores = [float(s.tokens[0] % 2) for s in samples]
        metrics = trainer.step(prompts, [s.tokens for s in samples], scores)
    result = {
        "rank": info.rank,
        "world_size": info.world_size,
        "before": before,
        "after": param_checksum(engine),
        "metrics": metrics,
    }
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    (Path(out_dir) / f"rank_{info.rank}.json").write_text(json.dumps(result, indent=1))
    barrier()
    if dist.is_initialized():
        dist.destroy_process_group()
    return result


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="distributed smoke check (run under torchrun)")
    parser.add_argument("--smoke", metavar="OUT", required=True, help="folder for rank_N.json checksums")
    parser.add_argument("--zero-config", default="zero2_cpu.json", help="file in configs/deepspeed/ or a path")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--no-deepspeed", action="store_true", help="plain torch (DDP across ranks)")
    a = parser.parse_args()
    smoke(a.smoke, a.zero_config, a.steps, not a.no_deepspeed)
