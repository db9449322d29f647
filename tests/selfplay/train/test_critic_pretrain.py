"""Critic pretraining of the warm start: the value head learns the outcome of graded rollouts, the policy stays put."""

from types import SimpleNamespace

import pytest
import torch

from selfplay.models.factory import ActorCritic
from selfplay.train.warmstart import critic_batch, critic_value_loss, pretrain_critic
from tests.selfplay.rl.test_ppo import EOS, PAD, tiny_policy

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def rollout(prompt, tokens, reward, mask=None):
    return SimpleNamespace(prompt=prompt, tokens=tokens, mask=mask or [1] * len(tokens), reward=reward)


def test_targets_are_the_discounted_outcome_on_the_chosen_tokens():
    ids, att, start, act, returns = critic_batch(
        [rollout([1, 2], [3, 4, 5], 1.0), rollout([1, 2, 2], [3, 9, 5], 0.5, mask=[1, 0, 1])], PAD, gamma=0.5
    )
    assert start == 1 and act.tolist() == [[1, 1, 1, 0], [0, 1, 0, 1]]
    # reward on the last chosen token; the observation token (mask 0) is skipped by the discount
    assert returns.tolist() == [[0.25, 0.5, 1.0, 0.0], [0.0, 0.25, 0.0, 0.5]]


def test_pretraining_lowers_the_value_loss_and_freezes_the_policy():
    model = ActorCritic(tiny_policy(seed=0))
    # tasks starting with token 1 are solved, those starting with 2 are not: the critic can tell them apart
    data = [
        rollout([first, 4 + i % 2, 5], [3, 6, EOS][: 1 + i % 3], 1.0 if first == 1 else 0.0)
        for i in range(12)
        for first in (1, 2)
    ]
    policy_before = [p.detach().clone() for p in model.policy.parameters()]
    head_before = model.value_head.summary.weight.detach().clone()
    out = pretrain_critic(model, data, steps=150, batch_size=8, lr=1e-2, pad_id=PAD, seed=0)
    assert out["after"] < 0.25 * out["before"] and out["after"] < 0.1, out  # constant guess 0.5 would score 0.25
    assert out["after"] == pytest.approx(critic_value_loss(model, data, pad_id=PAD, gamma=1.0))
    assert all(torch.equal(a, b) for a, b in zip(policy_before, model.policy.parameters()))
    assert not torch.equal(head_before, model.value_head.summary.weight)
    assert all(p.requires_grad for p in model.parameters())  # unfrozen again for PPO
    assert all(p.grad is None for p in model.parameters())  # nothing left over for PPO's first step


def test_critic_warm_start_grades_real_answers_in_the_sandbox(tmp_path):
    """Real procedural tasks, a tiny solver built from their text, answers graded in the process sandbox."""
    import sandbox
    from generator.build import generate_tasks
    from selfplay.models.agent import LMAgent
    from selfplay.models.factory import build_models
    from selfplay.runtime.config import load_config
    from selfplay.train.warmstart import critic_warm_start, solver_examples

    cfg = load_config(
        overrides=[
            "model.n_layer=1",
            "model.n_embd=32",
            "model.n_head=2",
            "model.vocab_size=400",
            "model.max_positions=1024",
            "ppo.max_new_tokens=24",
            "warmstart.critic_tasks=3",
            "warmstart.critic_samples=2",
            "warmstart.critic_steps=30",
            "warmstart.batch_size=4",
            "warmstart.critic_lr=1e-2",
            "reward.empty_answer=0.5",
            "reward.syntax_error=0.5",
        ]
    )
    with sandbox.open_sandbox(workers=2, timeout_s=5.0) as sb:
        tasks = generate_tasks(4, level=1, seed=0, sb=sb)
        texts = [x for pair in solver_examples(tasks) for x in pair]
        model, ref, tok = build_models(cfg.model, tmp_path, texts=texts)
        solver = LMAgent("solver", model, ref, tok, cfg.ppo)
        report = critic_warm_start(cfg, solver, tasks, sb)
    assert report["solver_critic_episodes"] == 6 and 0.0 <= report["solver_critic_solve_rate"] <= 1.0
    assert report["solver_critic_loss_after"] < report["solver_critic_loss_before"], report
