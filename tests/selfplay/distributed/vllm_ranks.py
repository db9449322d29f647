"""Run under torchrun (2 ranks, gloo, CPU) by test_vllm_ranks.py: each rank holds two agents, each with its own
vLLM engine (the solver's in-process, vLLM's external_launcher executor, tensor-parallel size 1; the generator's in a
child process, one engine per process), the solver trained under DDP and the generator under DeepSpeed ZeRO-2, both
on the trainer's process group of world 2.

Each rank samples its own prompts (rank 1 one more batch than rank 0: generation must need no collective), both
agents take a PPO step, the engines take the updated weights, and the engines' log-probs are compared with the
trainer's. Writes OUT/rank_N.json: the world sizes seen by the trainer and by vLLM, log-prob gaps before and after
the update, how far the update moved the engine's log-probs, the weights' checksums and a sum over the default group.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from selfplay.models.agent import LMAgent
from selfplay.models.factory import ActorCritic, build_tiny_model, frozen_copy, train_tokenizer
from selfplay.rollout.engine import RolloutConfig, VLLMEngine, logprob_gap
from selfplay.rollout.engine_process import ChildEngine
from selfplay.runtime import distributed as D
from selfplay.runtime.config import DistributedConfig, PPOConfig
from tests.selfplay.rollout.test_engine import TEXTS, engine_prompt_logprobs, trainer_logprobs

BATCH = 4


def make_agent(name: str, tok, info, deepspeed: bool, seed: int) -> LMAgent:
    """A 1-layer Llama (head size 32), the same weights on every rank; `seed` makes the two agents differ."""
    torch.manual_seed(seed)
    policy = build_tiny_model(tok, arch="llama", n_layer=1, n_embd=64, n_head=2, max_positions=256)
    with torch.no_grad():
        policy.model.norm.weight.mul_(5.0)  # a peaked distribution, so that a wrong weight shows in the log-probs
    cfg = PPOConfig(
        mini_batch_size=BATCH, micro_batch_size=BATCH, max_new_tokens=16, temperature=0.7, epochs=1, lr=3e-3
    )
    dcfg = DistributedConfig(deepspeed=deepspeed, zero_config="zero2_cpu.json")
    return LMAgent(
        name,
        ActorCritic(policy),
        frozen_copy(policy),
        tok,
        cfg,
        seed=0,
        wrap=lambda m: D.wrap_model(m, cfg, dcfg, info),
    )


def main(out: str) -> None:
    info = D.init_distributed()
    torch.set_num_threads(1)
    rank, root = info.rank, Path(out)
    tok = train_tokenizer(TEXTS, vocab_size=400, kind="bpe")
    agents = [
        make_agent("solver", tok, info, deepspeed=False, seed=0),
        make_agent("generator", tok, info, deepspeed=True, seed=1),
    ]
    for agent in agents:  # rank 0 writes each agent's folder, as the loop's checkpoints are written
        if rank == 0:
            agent.module.save_pretrained(root / agent.name)
            tok.save_pretrained(root / agent.name)
    dist.barrier()
    for agent in agents:  # every rank builds its engines in the same order (building one is collective)
        engine = VLLMEngine if agent.name == "solver" else ChildEngine  # one engine per process
        agent.engine = engine(agent, root / agent.name, RolloutConfig(engine="vllm"), seed=rank)
    from vllm.distributed import parallel_state as ps

    result = {
        "rank": rank,
        "world": dist.get_world_size(),
        "vllm_world": ps.get_world_group().world_size,
        "vllm_tp": ps.get_tp_group().world_size,
        "vllm_dp": ps.get_dp_group().world_size,
        "backend": str(dist.get_backend()),
        "agents": {},
    }
    for agent in agents:
        prompts = [agent.chat_ids(f"rank {rank} task {i}") for i in range(BATCH)]
        ids = agent.chat_ids("fixed") + tok("REF 1\nEDIT add 3\nEND\n")["input_ids"]
        before = engine_prompt_logprobs(agent, ids)
        answers = agent.sample(prompts)
        if rank == 1:  # a batch rank 0 does not sample: an engine's step must wait on no other rank
            agent.sample(prompts[:3])
        r = {
            "gap_sampled": logprob_gap(agent, answers),
            "gap_fixed_before": float((before - trainer_logprobs(agent, ids)).abs().max()),
            "answers": [a.tokens for a in answers],
        }
        stats = agent.update(answers, [1.0, 0.0, 1.0, 0.0])
        after = engine_prompt_logprobs(agent, ids)
        again = agent.sample(prompts)
        r.update(
            weight_sync_s=stats["weight_sync_s"],
            gap_fixed_after=float((after - trainer_logprobs(agent, ids)).abs().max()),
            moved=float((after - before).abs().max()),
            gap_sampled_after=logprob_gap(agent, again),
            checksum=agent.checksum(),
        )
        result["agents"][agent.name] = r
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)  # the trainer's default group still spans both ranks
    result["all_reduce"] = float(total)
    (root / f"rank_{rank}.json").write_text(json.dumps(result))
    dist.barrier()


if __name__ == "__main__":
    main(sys.argv[1])
    # as the CLI ends a distributed run: left to interpreter shutdown, torch's C++ store and group threads (and the
    # engines') can abort a finished rank ("terminate called without an active exception", exit -6)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
