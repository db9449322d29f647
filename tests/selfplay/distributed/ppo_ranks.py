"""Run under torchrun (2 ranks, gloo, DS_ACCELERATOR=cpu) by test_distributed_ppo.py: the same PPO updates through
plain torch (DDP) and DeepSpeed ZeRO-2, with micro-batches of 1 and 2, on batches that are not a multiple of the
minibatch. SGD without clipping, so the parameter change is the loss gradient itself and shows its weighting.

Writes OUT/rank_N.pt: for each (backend, micro) the parameter change after the updates, the optimiser steps each
update took (counted by the optimiser itself: torch's step hooks, DeepSpeed's global_steps) and the adaptive beta.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import GPT2Config, GPT2LMHeadModel

from selfplay.models.factory import ActorCritic, frozen_copy
from selfplay.rl.ppo import PPOTrainer
from selfplay.runtime.config import PPOConfig
from selfplay.runtime.distributed import init_distributed

PAD, EOS, VOCAB = 0, 15, 16
BATCH, MINI, EPOCHS, UPDATES, LR = 6, 4, 2, 2, 0.1


def policy():
    torch.manual_seed(0)  # the same initial weights on every rank and for every run
    return GPT2LMHeadModel(
        GPT2Config(
            vocab_size=VOCAB,
            n_layer=2,
            n_embd=32,
            n_head=2,
            n_positions=64,
            bos_token_id=EOS,
            eos_token_id=EOS,
            pad_token_id=PAD,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
    )


def rollouts(rank: int, update: int):
    """Each rank its own answers, of 1 to 9 tokens (short and long ones share micro-batches)."""
    g = torch.Generator().manual_seed(100 * rank + update)
    queries = [torch.randint(1, EOS, (3,), generator=g).tolist() for _ in range(BATCH)]
    lengths = [1, 9, 2, 7, 1, 5] if rank == 0 else [8, 1, 3, 1, 9, 2]
    responses = [torch.randint(1, EOS, (n,), generator=g).tolist() for n in lengths]
    scores = [float(r[0] % 2) for r in responses]
    return queries, responses, scores


def run(backend: str, micro: int, rank: int, world: int) -> dict:
    model = ActorCritic(policy())
    ref = frozen_copy(model.policy)
    before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    cfg = PPOConfig(
        lr=LR,
        epochs=EPOCHS,
        mini_batch_size=MINI,
        micro_batch_size=micro,
        max_grad_norm=1e9,
        adaptive_kl=True,
        kl_coef=0.1,
        kl_target=0.4,
        kl_horizon=50,
        kl_estimator="k3",
    )
    steps = [0]
    if backend == "torch":
        wrapped = torch.nn.parallel.DistributedDataParallel(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=LR)
        optimizer.register_step_post_hook(lambda *_: steps.__setitem__(0, steps[0] + 1))
        trainer = PPOTrainer(wrapped, ref, cfg, optimizer, pad_token_id=PAD, seed=0)
        count = lambda: steps[0]  # noqa: E731
    else:
        import deepspeed

        ds_config = {
            "train_micro_batch_size_per_gpu": micro,
            "gradient_accumulation_steps": MINI // micro,
            "train_batch_size": MINI * world,
            "gradient_clipping": 1e9,
            "zero_allow_untested_optimizer": True,
            "zero_optimization": {"stage": 2, "contiguous_gradients": True, "overlap_comm": False},
            "steps_per_print": 10**6,
        }
        engine, _, _, _ = deepspeed.initialize(
            model=model, optimizer=torch.optim.SGD(model.parameters(), lr=LR), config=ds_config
        )
        trainer = PPOTrainer(engine, ref, cfg, pad_token_id=PAD, seed=0)
        count = lambda: engine.global_steps  # noqa: E731
    per_update = []
    for update in range(UPDATES):
        start = count()
        trainer.step(*rollouts(rank, update))
        per_update.append(count() - start)
    after = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    return {"delta": after - before, "steps": per_update, "beta": trainer.kl_ctl.value}


def main(out: str) -> None:
    info = init_distributed()
    torch.set_num_threads(1)
    results = {
        f"{backend}/{micro}": run(backend, micro, info.rank, info.world_size)
        for backend in ("torch", "deepspeed")
        for micro in (1, 2)
    }
    Path(out).mkdir(parents=True, exist_ok=True)
    torch.save(results, Path(out) / f"rank_{info.rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
