"""The solver's episodes (selfplay.rollout.episodes): what a rollout records for the update beside its tokens."""

import math

import pytest
import torch

from generator.build import generate_tasks
from selfplay.models.agent import LMAgent
from selfplay.models.factory import ActorCritic, build_tiny_model, frozen_copy, train_tokenizer
from selfplay.rl.sft import sft
from selfplay.rollout.episodes import solver_rollouts
from selfplay.runtime.config import PPOConfig
from solver.prompts import answer_text, conversation

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.mark.slow
def test_multi_turn_rollouts_carry_the_samplers_log_probs_and_truncated_is_weighs_them_one(task_sb):
    """Each episode keeps its sampler's log-prob of every token it chose (NaN at the observations between turns);
    the update with ppo.tis_cap reads them, and Hugging Face generation, whose sampler is the trainer's own
    distribution, gets weights of 1 (nothing truncated)."""
    tasks = generate_tasks(2, level=1, seed=0, sb=task_sb)
    texts = [x for t in tasks for x in (conversation(t)[0]["content"], answer_text(t.reference_solution))] * 4
    tok = train_tokenizer(texts + ["ACTION: check"] * 8, vocab_size=400, kind="bpe")
    torch.manual_seed(0)
    policy = build_tiny_model(tok, arch="llama", n_layer=1, n_embd=64, n_head=2, max_positions=1024)
    # taught to answer "ACTION: check" (a turn that is not the last gets an observation, then answers again)
    agent = LMAgent("solver", ActorCritic(policy), frozen_copy(policy), tok, PPOConfig(), seed=0)
    check = tok("ACTION: check", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    sft(
        policy,
        [(agent.chat_ids(str(i)), check) for i in range(8)],
        steps=150,
        batch_size=8,
        lr=3e-3,
        pad_id=tok.pad_token_id,
        max_len=256,
        warmup=0,
    )
    cfg = PPOConfig(
        mini_batch_size=4,
        micro_batch_size=4,
        max_new_tokens=12,
        epochs=1,
        lr=1e-3,
        advantage="rloo",
        kl_coef=0.0,
        tis_cap=2.0,
    )
    agent = LMAgent("solver", ActorCritic(policy), frozen_copy(policy), tok, cfg, seed=0)
    rollouts = solver_rollouts(agent, tasks, 2, task_sb, max_turns=2)
    assert any(0 in r.mask for r in rollouts)  # some episode took a second turn after an observation
    for r in rollouts:
        assert r.logprobs is not None and len(r.logprobs) == len(r.tokens) == len(r.mask)
        assert all(math.isnan(lp) == (m == 0) for lp, m in zip(r.logprobs, r.mask))
        assert all(lp <= 0 for lp, m in zip(r.logprobs, r.mask) if m)
    stats = agent.update(
        rollouts, [1.0, 0.0, 0.0, 1.0], masks=[r.mask for r in rollouts], groups=[r.task.id for r in rollouts]
    )
    assert stats["tis_weight"] == pytest.approx(1.0, abs=1e-3) and stats["tis_truncated"] == 0.0
