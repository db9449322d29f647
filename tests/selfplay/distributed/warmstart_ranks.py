"""Run under torchrun (2 ranks, gloo, DS_ACCELERATOR=cpu) by test_warmstart_ranks.py: one policy's SFT through plain
torch (`sft`, the same on every rank) and inside DeepSpeed engines under ZeRO-2 and ZeRO-3 (`sft_engine`, each batch
split over the ranks, micro-batches of 2, a last batch too short for both ranks; ZeRO-2 also with DeepSpeed's bf16),
from the same initial weights.

Writes OUT/rank_N.json: the plain losses (fp32, and bf16 through fp32 masters) and fp32 first-step gradient norm;
per engine, the losses, its first-step gradient norm, the checksum of the weights this rank trained and (rank 0) of
its consolidated copy.
"""

from __future__ import annotations

import copy
import json
import random
import sys
from pathlib import Path

import torch

from selfplay.rl.sft import batch_backward, collate, length_batches, sft, sft_engine
from selfplay.runtime.config import CONFIG_DIR, load_config
from selfplay.runtime.distributed import init_distributed, param_checksum
from selfplay.train.warmstart_ranks import consolidate, engine_config, start_engine
from tests.selfplay.distributed.ppo_ranks import EOS, PAD, policy  # a 2-block GPT-2, the same on every rank

BATCH, MICRO, STEPS, LR, MAX_LEN, SEED = 6, 2, 12, 3e-3, 32, 0


def examples() -> list[tuple[list[int], list[int]]]:
    """13 (prompt, answer) pairs: batches of 6, 6 and 1 (the last leaves rank 1 without a row). The answer is the
    prompt reversed, something a model can learn."""
    rng = random.Random(1)
    out = []
    for _ in range(13):
        prompt = [rng.randrange(1, EOS) for _ in range(rng.randrange(2, 9))]
        out.append((prompt, prompt[::-1] + [EOS]))
    return out


# the SFT settings both paths run with
SFT = dict(steps=STEPS, batch_size=BATCH, lr=LR, pad_id=PAD, max_len=MAX_LEN, seed=SEED, micro_batch_size=MICRO)


def plain(data, dtype: torch.dtype = torch.float32) -> tuple[list[float], float]:
    """`sft`'s losses on one process, and the gradient norm of its first batch (the batch `sft` draws first)."""
    losses = sft(policy().to(dtype), data, **SFT)
    model = policy()
    idx = length_batches([len(p) + len(a) for p, a in data], BATCH, random.Random(SEED)).pop()
    batch_backward(model, *collate([data[i] for i in idx], PAD, MAX_LEN), MICRO)
    norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None]))
    return losses, float(norm)


def under(zero: str, data, rank: int, world: int) -> dict:
    cfg = load_config(
        "configs/smoke.yaml",
        [
            f"warmstart.batch_size={BATCH}",
            f"warmstart.micro_batch_size={MICRO}",
            f"warmstart.lr={LR}",
            "distributed.deepspeed=true",
            f"distributed.zero_config={zero}",
        ],
    )
    model = policy()
    plain = copy.deepcopy(model) if rank == 0 else None
    engine = start_engine(model, engine_config(cfg, world))
    norms = []
    losses = sft_engine(
        engine,
        data,
        **SFT,
        rank=rank,
        world=world,
        on_step=lambda i, loss: norms.append(float(engine.get_global_grad_norm())),
    )
    consolidate(model, plain)
    out = {
        "losses": losses,
        "grad_norm_first": norms[0],
        "trained": param_checksum(model)["sha256"],
        "micro_batch": engine.train_micro_batch_size_per_gpu(),
        "accumulation": engine.gradient_accumulation_steps(),
    }
    engine.destroy()
    if plain is not None:
        out["consolidated"] = param_checksum(plain)["sha256"]
    return out


def main(out: str) -> None:
    info = init_distributed("gloo")
    data = examples()
    losses, norm = plain(data)
    result = {"plain_losses": losses, "plain_grad_norm_first": norm}
    result["plain_bf16_losses"] = plain(data, torch.bfloat16)[0]  # through `sft`'s fp32 MasterWeights
    for zero in ("zero2_cpu.json", "zero3_cpu.json"):
        result[zero] = under(zero, data, info.rank, info.world_size)
    # ZeRO-2 with DeepSpeed's bf16 mixed precision (as configs/deepspeed/zero2.json): bf16 weights, fp32 masters
    ds = json.loads((CONFIG_DIR / "deepspeed" / "zero2_cpu.json").read_text())
    bf16 = Path(out, f"zero2_bf16_rank_{info.rank}.json")
    bf16.write_text(json.dumps({**ds, "bf16": {"enabled": True}}))
    result["zero2_bf16"] = under(str(bf16), data, info.rank, info.world_size)
    Path(out, f"rank_{info.rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1])
