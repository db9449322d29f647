"""Run under torchrun (2 ranks, gloo, DS_ACCELERATOR=cpu) by test_sampling_ranks.py: the generator under DeepSpeed
ZeRO-3 with the trainer's own `generate`, where every generation step gathers the partitioned weights from both
ranks, while the ranks make different numbers of sampling calls: mutation answers drawn again on rank 0 only (rank
1's one proposal has nothing to be screened against), batches of one prompt (three on rank 0, one on rank 1), and
free answers in two tied stages whose first stage ends (so that a second is drawn) on rank 0 only. Unless the ranks
agree on their calls, a rank's extra call waits on the other forever or their collectives cross.

Writes OUT/rank_N.json: what each rank drew (how many answers were struck and drawn again, how many answers each
call returned, how many free answers went on to a second stage)."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import sandbox
from generator.build import generate_tasks
from generator.validity import MemoryIndex
from selfplay.models.agent import LMAgent
from selfplay.models.factory import ActorCritic, build_tiny_model, frozen_copy, train_tokenizer
from selfplay.rl.sft import sft
from selfplay.rollout.episodes import _sample_tied, generator_rollouts
from selfplay.runtime.config import DistributedConfig, PPOConfig
from selfplay.runtime.distributed import init_distributed, wrap_model
from tests.selfplay.rollout.test_constrained import MISMATCHED, TEXTS


def zero3_agent(tok, info, memorise: str | None = None) -> LMAgent:
    """A tiny generator under ZeRO-3, the same weights on both ranks (optionally one answer learnt by heart first)."""
    torch.manual_seed(0)
    policy = build_tiny_model(tok, n_layer=2, n_embd=64, n_head=2, max_positions=192)
    cfg = PPOConfig(mini_batch_size=2, micro_batch_size=1, max_new_tokens=128, temperature=1.0, epochs=1)
    if memorise is not None:
        answer = list(tok(memorise, add_special_tokens=False)["input_ids"]) + [tok.eos_token_id]
        prompt = list(tok("Write a task.", add_special_tokens=False)["input_ids"])
        sft(policy, [(prompt, answer)] * 8, steps=150, batch_size=8, lr=1e-2, pad_id=tok.pad_token_id, max_len=192,
            warmup=10)
    dist_cfg = DistributedConfig(deepspeed=True, zero_config="zero3_cpu.json")
    return LMAgent("generator", ActorCritic(policy), frozen_copy(policy), tok, cfg, seed=0,
                   wrap=lambda model: wrap_model(model, cfg, dist_cfg, info))


def main(out: str) -> None:
    info = init_distributed()
    torch.set_num_threads(1)
    tok = train_tokenizer(TEXTS, vocab_size=400, kind="bpe")
    result = {}
    # mutation answers: rank 0 redraws what the screen strikes, rank 1 never does
    a = zero3_agent(tok, info)
    assert a.zero3
    a.constrain("mutation")
    rng = random.Random(4 + info.rank)
    with sandbox.open_sandbox(backend="process", timeout_s=5.0) as sb:
        corpus = generate_tasks(300, split="train", seed=5, sb=sb)
        # rank 1: one proposal and an empty corpus, so nothing for its screen to strike
        groups = [[t] for t in rng.sample(corpus, 12 if info.rank == 0 else 1)]
        index = MemoryIndex(corpus if info.rank == 0 else [])
        rollouts = generator_rollouts(a, groups, sb, step=1, rng=rng, corpus_index=index, max_prompt_tokens=60,
                                      fmt="mutation", redraws=3)
    result["redrawn"] = sum(r.redrawn for r in rollouts)
    # one sampling call, in batches of one prompt: three on rank 0, one on rank 1 (LMAgent.sample_hf)
    prompt = list(tok("Write a task.", add_special_tokens=False)["input_ids"])
    result["answers"] = len(a.sample([prompt] * (3 if info.rank == 0 else 1), max_new_tokens=8, batch_size=1))
    # free answers in two stages: rank 0's first stages end, rank 1's are cut off (no second stage to draw)
    g = zero3_agent(tok, info, memorise=MISMATCHED)
    g.constrain("free")
    answers = _sample_tied(g, g.constraint, [prompt] * 4, 128 if info.rank == 0 else 12)
    result["second_stages"] = sum("\nCODE:" in x.text for x in answers)  # the first stage ends at SIGNATURE
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / f"rank_{info.rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
