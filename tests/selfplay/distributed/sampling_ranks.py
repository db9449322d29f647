"""Run under torchrun (2 ranks, gloo, DS_ACCELERATOR=cpu) by test_sampling_ranks.py: the generator and the solver
under DeepSpeed ZeRO-3 with the trainer's own `generate`, where every generation step gathers the partitioned weights
from both ranks, while the ranks make different numbers of sampling calls: mutation answers drawn again on rank 0
only (rank 1's one proposal has nothing to be screened against), batches of one prompt (three on rank 0, one on rank
1), free answers in two tied stages whose first stage ends (so that a second is drawn) on rank 0 only, and the
solver's multi-turn episodes, which run all their turns on rank 0 and end after the first answer on rank 1 (its
prompts leave no room for a second one, so they are submitted while rank 0 samples on). Unless the ranks agree on
their calls, a rank's extra call waits on the other forever or their collectives cross.

Writes OUT/rank_N.json: what each rank drew (how many answers were struck and drawn again, how many answers each
call returned, how many free answers went on to a second stage, how many answers each solver episode sampled and
the actions its episode took)."""

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
from selfplay.rollout.episodes import TURN_ROOM, _sample_tied, generator_rollouts, solver_rollouts
from selfplay.runtime.config import DistributedConfig, PPOConfig
from selfplay.runtime.distributed import init_distributed, wrap_model
from solver.episode import static_report
from solver.prompts import feedback_text, task_prompt
from tests.selfplay.rollout.test_constrained import MISMATCHED, TEXTS

POSITIONS = 192  # the tiny models' context
SOLVER_TURNS = 3
SOLVER_CUTS = (48, None)  # the solver's prompts: cut to 48 tokens on rank 0, to all the model leaves room for on rank 1


def tiny_policy(tok):
    """A tiny causal LM, the same weights on both ranks."""
    torch.manual_seed(0)
    return build_tiny_model(tok, n_layer=2, n_embd=64, n_head=2, max_positions=POSITIONS)


def ppo_config(max_new_tokens: int) -> PPOConfig:
    return PPOConfig(mini_batch_size=2, micro_batch_size=1, max_new_tokens=max_new_tokens, temperature=1.0, epochs=1)


def learn(tok, policy, examples) -> None:
    """Fine-tune `policy` on (prompt, answer) token pairs until it knows the answers by heart."""
    sft(policy, examples, steps=150, batch_size=8, lr=1e-2, pad_id=tok.pad_token_id, max_len=POSITIONS, warmup=10)


def under_zero3(name: str, policy, tok, cfg: PPOConfig, info) -> LMAgent:
    dist_cfg = DistributedConfig(deepspeed=True, zero_config="zero3_cpu.json")
    return LMAgent(
        name,
        ActorCritic(policy),
        frozen_copy(policy),
        tok,
        cfg,
        seed=0,
        wrap=lambda model: wrap_model(model, cfg, dist_cfg, info),
    )


def zero3_agent(tok, info, memorise: str | None = None) -> LMAgent:
    """A tiny generator under ZeRO-3, the same weights on both ranks (optionally one answer learnt by heart first)."""
    policy = tiny_policy(tok)
    if memorise is not None:
        answer = list(tok(memorise, add_special_tokens=False)["input_ids"]) + [tok.eos_token_id]
        prompt = list(tok("Write a task.", add_special_tokens=False)["input_ids"])
        learn(tok, policy, [(prompt, answer)] * 8)
    return under_zero3("generator", policy, tok, ppo_config(128), info)


def zero3_checker(tok, info, tasks) -> LMAgent:
    """A tiny solver under ZeRO-3 that answers "ACTION: check" at every turn of these tasks' multi-turn episodes:
    fine-tuned first (the same on both ranks) on the context of each turn, with each prompt cut to each of
    SOLVER_CUTS, up to the turn whose context has no room for another answer (which solver_rollouts submits)."""
    policy = tiny_policy(tok)
    cfg = ppo_config(16)  # room for the answer and its end
    plain = LMAgent("solver", ActorCritic(policy), frozen_copy(policy), tok, cfg)  # its token ids only
    answer = list(tok("ACTION: check", add_special_tokens=False)["input_ids"]) + [tok.eos_token_id]
    examples = []
    for task in tasks:
        observation = plain.observation_ids(feedback_text(static_report(task, "")[0]))  # a check of no code
        for cut in SOLVER_CUTS:
            context = plain.chat_ids(task_prompt(task, multi_turn=True), cut)
            for _ in range(SOLVER_TURNS):
                if len(context) + TURN_ROOM > POSITIONS:  # no room for another answer: solver_rollouts submits
                    break
                examples.append((context, answer))
                context = context + answer + observation
    learn(tok, policy, examples)
    return under_zero3("solver", policy, tok, cfg, info)


def answers_sampled(mask: list[int]) -> int:
    """How many answers a solver episode sampled: the runs of policy tokens (1) between observations (0)."""
    return sum(1 for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1]))


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
        rollouts = generator_rollouts(
            a, groups, sb, step=1, rng=rng, corpus_index=index, max_prompt_tokens=60, fmt="mutation", redraws=3
        )
    result["redrawn"] = sum(r.redrawn for r in rollouts)
    # one sampling call, in batches of one prompt: three on rank 0, one on rank 1 (HFEngine.sample)
    prompt = list(tok("Write a task.", add_special_tokens=False)["input_ids"])
    result["answers"] = len(a.sample([prompt] * (3 if info.rank == 0 else 1), max_new_tokens=8, batch_size=1))
    # free answers in two stages: rank 0's first stages end, rank 1's are cut off (no second stage to draw)
    g = zero3_agent(tok, info, memorise=MISMATCHED)
    g.constrain("free")
    answers = _sample_tied(g, g.constraint, [prompt] * 4, 128 if info.rank == 0 else 12)
    result["second_stages"] = sum("\nCODE:" in x.text for x in answers)  # the first stage ends at SIGNATURE
    # the solver's episodes: SOLVER_TURNS answers each on rank 0, one on rank 1 (whose prompts fill the context)
    solver = zero3_checker(tok, info, corpus[:4])
    with sandbox.open_sandbox(backend="process", timeout_s=5.0) as sb:
        episodes = solver_rollouts(
            solver,
            corpus[:2] if info.rank == 0 else corpus[2:4],
            2,
            sb,
            max_turns=SOLVER_TURNS,
            greedy=True,
            max_prompt_tokens=SOLVER_CUTS[info.rank],
        )
    result["solver_answers"] = [answers_sampled(r.mask) for r in episodes]
    result["solver_actions"] = [r.result.actions for r in episodes]
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / f"rank_{info.rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
