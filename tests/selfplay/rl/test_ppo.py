"""The PPO trainer on toy problems: it learns a rewarded token, stays put with lr 0, and agrees with `generate`."""

import math

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from selfplay.models.factory import ActorCritic, frozen_copy
from selfplay.rl import ppo
from selfplay.runtime.config import PPOConfig

VOCAB, PAD, EOS, A = 8, 0, 7, 3
PROMPT = [1, 2, 5]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def tiny_policy(seed=0):
    torch.manual_seed(seed)
    return GPT2LMHeadModel(
        GPT2Config(
            vocab_size=VOCAB,
            n_layer=2,
            n_embd=32,
            n_head=2,
            n_positions=32,
            bos_token_id=EOS,
            eos_token_id=EOS,
            pad_token_id=PAD,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
    )


def prob_of_a(model):
    with torch.no_grad():
        logits = ppo.policy_of(model)(torch.tensor([PROMPT])).logits[0, -1]
    return torch.softmax(logits, -1)[A].item()


def test_pad_rollouts_marks_the_response_tokens():
    ids, attn, actions = ppo.pad_rollouts(
        [[1, 2], [4]], [[5, 6, 7], [3]], pad_token_id=0, response_masks=[[1, 0, 1], [1]]
    )
    assert ids.tolist() == [[1, 2, 5, 6, 7], [4, 3, 0, 0, 0]]
    assert attn.tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    # logits at position i score token i+1: row 0's response tokens 5, 6, 7 are scored at 1, 2, 3 (6 is masked out)
    assert actions.tolist() == [[0, 1, 0, 1], [1, 0, 0, 0]]
    with pytest.raises(ValueError, match="empty"):
        ppo.pad_rollouts([[1]], [[]], 0)


def test_ppo_raises_the_probability_of_a_rewarded_token():
    model = ActorCritic(tiny_policy())
    ref = frozen_copy(model.policy)
    cfg = PPOConfig(lr=3e-3, mini_batch_size=16, micro_batch_size=8, kl_coef=0.01, max_new_tokens=2)
    trainer = ppo.PPOTrainer(model, ref, cfg, pad_token_id=PAD, seed=0)
    before = prob_of_a(model)
    torch.manual_seed(1)
    history = []
    for _ in range(12):
        samples = ppo.generate(model, [PROMPT] * 32, pad_token_id=PAD, eos_token_id=EOS, max_new_tokens=2)
        scores = [1.0 if s.tokens[0] == A else 0.0 for s in samples]
        history.append(sum(scores) / len(scores))
        metrics = trainer.step([PROMPT] * 32, [s.tokens for s in samples], scores)
    after = prob_of_a(model)
    assert before < 0.3, before
    assert after > 0.8 and after > before + 0.5, (before, after, history)
    assert history[-1] > history[0]
    for name in (
        "policy_loss",
        "value_loss",
        "kl",
        "entropy",
        "clipfrac",
        "explained_var",
        "approx_kl",
        "score_mean",
        "grad_norm",
        "entropy_coef",
        "kl_coef",
    ):
        assert name in metrics and math.isfinite(metrics[name]), name
    assert metrics["kl"] > 0.0  # it moved away from the reference
    assert trainer.updates == 12 and metrics["entropy_coef"] < cfg.entropy_coef_start


def test_lr_zero_leaves_everything_at_ratio_one():
    model = ActorCritic(tiny_policy())
    ref = frozen_copy(model.policy)
    before = [p.clone() for p in model.parameters()]
    trainer = ppo.PPOTrainer(model, ref, PPOConfig(lr=0.0, mini_batch_size=4, micro_batch_size=2), pad_token_id=PAD)
    metrics = trainer.step([PROMPT, [4, 4]], [[3, 3, 7], [5]], [1.0, 0.0])
    assert metrics["approx_kl"] == pytest.approx(0.0, abs=1e-7) and metrics["clipfrac"] == 0.0
    assert metrics["kl"] == pytest.approx(0.0, abs=1e-7)  # policy == reference
    assert metrics["tokens"] == 4 and metrics["response_len"] == 2.0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_rloo_learns_from_mixed_tasks_and_ignores_uniform_ones():
    cfg = PPOConfig(
        lr=1e-2,
        mini_batch_size=4,
        micro_batch_size=2,
        kl_coef=0.0,
        entropy_coef_start=0.0,
        entropy_coef_end=0.0,
        advantage="rloo",
    )
    # every task's answers scored alike (all failed, or all passed): zero advantage, so no policy change at all
    model = ActorCritic(tiny_policy())
    before = [p.clone() for p in model.parameters()]
    trainer = ppo.PPOTrainer(model, frozen_copy(model.policy), cfg, pad_token_id=PAD)
    metrics = trainer.step(
        [PROMPT] * 4, [[A, EOS], [5, EOS], [A, EOS], [6, EOS]], [0.0, 0.0, 1.0, 1.0], groups=["t1", "t1", "t2", "t2"]
    )
    assert metrics["mixed_groups"] == 0.0 and metrics["policy_loss"] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # nor the critic: no value loss
    # a task with one success and one failure: the rewarded answer becomes more likely
    p0 = prob_of_a(model)
    for _ in range(5):
        metrics = trainer.step([PROMPT] * 4, [[A, EOS], [5, EOS]] * 2, [1.0, 0.0] * 2, groups=["t", "t", "u", "u"])
    assert metrics["mixed_groups"] == 1.0 and prob_of_a(model) > p0 + 0.2
    with pytest.raises(ValueError, match="group"):
        trainer.step([PROMPT] * 2, [[A], [5]], [1.0, 0.0])
    with pytest.raises(ppo.UserError, match="ppo.advantage"):
        ppo.PPOTrainer(model, frozen_copy(model.policy), PPOConfig(advantage="ppo2"), pad_token_id=PAD)


def test_adaptive_kl_and_state_round_trip():
    model = ActorCritic(tiny_policy())
    cfg = PPOConfig(
        lr=1e-2,
        adaptive_kl=True,
        kl_estimator="k3",
        kl_target=1e-3,
        kl_horizon=100,
        mini_batch_size=4,
        micro_batch_size=4,
    )
    trainer = ppo.PPOTrainer(model, frozen_copy(model.policy), cfg, pad_token_id=PAD)
    betas, kls = [], []
    for _ in range(3):
        kls.append(trainer.step([PROMPT] * 4, [[A, A]] * 4, [1.0] * 4)["kl_seq"])
        betas.append(trainer.kl_ctl.value)
    assert kls[0] == pytest.approx(0.0, abs=1e-6) and betas[0] < cfg.kl_coef  # no KL yet: beta shrinks
    assert kls[2] > 1.2 * cfg.kl_target and betas[2] > betas[1]  # KL above target pushes beta up
    other = ppo.PPOTrainer(model, frozen_copy(model.policy), cfg, pad_token_id=PAD)
    other.load_state_dict(trainer.state_dict())
    assert other.kl_ctl.value == trainer.kl_ctl.value and other.updates == 3


def test_generate_logprobs_match_the_trainer_scores():
    model = ActorCritic(tiny_policy(seed=3))
    prompts = [[1, 2, 5], [4, 4], [6, 6, 6, 6]]  # different lengths: left padding must not shift anything
    torch.manual_seed(0)
    samples = ppo.generate(model, prompts, pad_token_id=PAD, eos_token_id=EOS, max_new_tokens=6, temperature=0.7)
    trainer = ppo.PPOTrainer(model, frozen_copy(model.policy), PPOConfig(temperature=0.7), pad_token_id=PAD)
    ids, attn, actions = ppo.pad_rollouts(prompts, [s.tokens for s in samples], PAD)
    logp, _, _ = trainer._policy_forward(ids, attn)
    for b, s in enumerate(samples):
        assert 1 <= len(s.tokens) <= 6 and s.finished == (s.tokens[-1] == EOS)
        assert EOS not in s.tokens[:-1]
        got = logp[b][actions[b].bool()].tolist()
        assert got == pytest.approx(s.logprobs, abs=1e-4)
    # scoring only the answer region (logits_to_keep) gives the same numbers as the full sequence
    start = int(actions.any(0).float().argmax())
    part, values, _ = trainer._policy_forward(ids, attn, start)
    assert start > 0 and part.shape == (3, ids.shape[1] - 1 - start)
    assert torch.allclose(part, logp[:, start:], atol=1e-5)
    assert torch.allclose(trainer._ref_logprobs(ids, attn, start), logp[:, start:], atol=1e-5)  # ref == policy


def test_end_to_end_on_procedural_tasks_graded_in_the_sandbox(tmp_path):
    """Real tasks -> tiny model built from their text -> sampled answers parsed and graded in the sandbox -> PPO.
    The reference solutions join the batch as rewarded answers; their log-probability must rise."""
    import sandbox
    from generator.build import generate_tasks
    from selfplay.models.factory import build_models
    from selfplay.runtime.config import load_config
    from solver.parse import extract_code
    from solver.prompts import answer_text, conversation, render

    with sandbox.open_sandbox(workers=2, timeout_s=5.0) as sb:
        tasks = generate_tasks(4, level=1, seed=0, sb=sb)
        texts = [
            task_prompt_text
            for t in tasks
            for task_prompt_text in (conversation(t)[0]["content"], answer_text(t.reference_solution))
        ]
        cfg = load_config(
            overrides=[
                "model.n_layer=1",
                "model.n_embd=32",
                "model.n_head=2",
                "model.vocab_size=400",
                "model.max_positions=1024",
            ]
        )
        model, ref, tok = build_models(cfg.model, tmp_path, texts=texts)
        encode = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
        prompts = [encode(render(conversation(t), tok)) for t in tasks]
        gold = [encode(answer_text(t.reference_solution) + tok.eos_token) for t in tasks]
        trainer = ppo.PPOTrainer(
            model, ref, PPOConfig(lr=2e-3, mini_batch_size=6, micro_batch_size=6), pad_token_id=tok.pad_token_id
        )

        def gold_logprob():
            ids, attn, actions = ppo.pad_rollouts(prompts, gold, tok.pad_token_id)
            with torch.no_grad():
                return (trainer._policy_forward(ids, attn)[0] * actions).sum().item()

        before = gold_logprob()
        torch.manual_seed(0)
        for _ in range(2):
            samples = ppo.generate(
                model, prompts, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, max_new_tokens=16
            )
            scores, statuses = [], []
            for task, s in zip(tasks, samples):
                parsed = extract_code(tok.decode(s.tokens, skip_special_tokens=True), entry_point=task.entry_point)
                statuses.append(parsed.status)
                if not parsed.ok:
                    scores.append(-0.1)  # unparsable answer: a penalised episode, not a crash
                    continue
                rep = sb.run_tests(
                    parsed.code,
                    task.entry_point,
                    [t["input"] for t in task.hidden_tests],
                    [t["output"] for t in task.hidden_tests],
                )
                scores.append(rep.passed / max(rep.total, 1))
            gold_scores = []
            for task, g in zip(tasks, gold):
                code = extract_code(tok.decode(g, skip_special_tokens=True), entry_point=task.entry_point).code
                rep = sb.run_tests(
                    code,
                    task.entry_point,
                    [t["input"] for t in task.hidden_tests],
                    [t["output"] for t in task.hidden_tests],
                )
                gold_scores.append(rep.passed / rep.total)
            assert gold_scores == [1.0] * len(tasks)  # the round trip prompt -> tokens -> parser -> sandbox holds
            metrics = trainer.step(prompts + prompts, [s.tokens for s in samples] + gold, scores + gold_scores)
            assert all(st in ("ok", "empty", "no_code", "syntax_error") for st in statuses)
            assert all(math.isfinite(metrics[k]) for k in ("policy_loss", "value_loss", "kl", "entropy"))
    assert gold_logprob() > before + 1.0


# ---------------------------------------------------------------------------- loss normalisation, sampling, modes


def param_delta(model, before):
    return torch.cat([(p.detach() - b).flatten() for p, b in zip(model.parameters(), before)])


def sgd_update(micro: int, seed: int = 0, **kw):
    """One PPO update with SGD (lr 1, no clipping, one epoch, one minibatch of 4) on answers of 1 and 9 tokens:
    the parameter change, which is then the plain gradient of the loss."""
    model = ActorCritic(tiny_policy(seed))
    before = [p.detach().clone() for p in model.parameters()]
    cfg = PPOConfig(lr=1.0, epochs=1, mini_batch_size=4, micro_batch_size=micro, max_grad_norm=1e9, **kw)
    trainer = ppo.PPOTrainer(
        model, frozen_copy(model.policy), cfg, torch.optim.SGD(model.parameters(), lr=1.0), pad_token_id=PAD, seed=seed
    )
    responses = [[A], [5] * 8 + [EOS], [6], [A] * 8 + [EOS]]
    trainer.step([PROMPT] * 4, responses, [1.0, 0.0, 0.0, 1.0], groups=["t", "t", "u", "u"])
    return param_delta(model, before)


@pytest.mark.parametrize("advantage", ["gae", "rloo"])
def test_update_does_not_depend_on_the_micro_batch_size(advantage):
    """Every token weighs 1 / (tokens in its minibatch), however the minibatch is split into micro-batches."""
    deltas = [sgd_update(micro, advantage=advantage) for micro in (1, 2, 4)]
    assert deltas[0].norm() > 0
    for d in deltas[1:]:
        assert torch.nn.functional.cosine_similarity(d, deltas[0], dim=0) > 0.9999
        assert torch.allclose(d, deltas[0], atol=1e-6, rtol=1e-4)


def full_generation_config(path):
    """A generation_config.json carrying every decoding option a causal LM's checkpoint can set."""
    from transformers import GenerationConfig

    gc = GenerationConfig(
        do_sample=True,
        temperature=0.5,
        top_k=6,
        top_p=0.95,
        min_p=0.05,
        typical_p=0.95,
        epsilon_cutoff=0.01,
        eta_cutoff=0.01,
        top_h=0.95,
        repetition_penalty=50.0,
        no_repeat_ngram_size=2,
        bad_words_ids=[[4], [5, 6]],
        suppress_tokens=[2],
        begin_suppress_tokens=[6],
        min_length=4,
        min_new_tokens=2,
        exponential_decay_length_penalty=(1, 3.0),
        forced_bos_token_id=3,
        forced_eos_token_id=EOS,
        renormalize_logits=True,
        remove_invalid_values=True,
        pad_token_id=PAD,
        eos_token_id=EOS,
        bos_token_id=EOS,
        max_new_tokens=2,
    )
    gc.save_pretrained(path)
    return path


def load_with_every_option(path):
    """The saved policy with its generation_config.json, plus a sequence bias (which JSON cannot carry)."""
    from transformers import GPT2LMHeadModel

    policy = GPT2LMHeadModel.from_pretrained(path)
    policy.generation_config.sequence_bias = {(3,): 5.0}
    return ActorCritic(policy)


def test_a_checkpoints_generation_config_changes_neither_samples_nor_scores(tmp_path):
    """Sampling uses one explicit distribution (temperature only); the trainer scores that same distribution, and a
    checkpoint's generation_config.json (which can set a repetition penalty, n-gram bans, min_p, ...) is ignored."""
    from transformers import GPT2LMHeadModel

    tiny_policy(seed=3).save_pretrained(tmp_path / "plain")
    tiny_policy(seed=3).save_pretrained(tmp_path / "loaded")
    full_generation_config(tmp_path / "loaded")
    plain = ActorCritic(GPT2LMHeadModel.from_pretrained(tmp_path / "plain"))
    loaded = load_with_every_option(tmp_path / "loaded")
    assert loaded.policy.generation_config.repetition_penalty == 50.0  # the options really reached the model
    prompts = [[1, 2, 5], [4, 4], [6, 6, 6, 6]] * 4
    runs = []
    for model in (plain, loaded):
        torch.manual_seed(0)
        runs.append(ppo.generate(model, prompts, pad_token_id=PAD, eos_token_id=EOS, max_new_tokens=8, temperature=0.7))
    assert [s.tokens for s in runs[0]] == [s.tokens for s in runs[1]]
    trainer = ppo.PPOTrainer(loaded, frozen_copy(loaded.policy), PPOConfig(temperature=0.7), pad_token_id=PAD)
    ids, attn, actions = ppo.pad_rollouts(prompts, [s.tokens for s in runs[1]], PAD)
    logp, _, _ = trainer._policy_forward(ids, attn)
    for b, s in enumerate(runs[1]):
        assert logp[b][actions[b].bool()].tolist() == pytest.approx(s.logprobs, abs=1e-4)
        assert runs[0][b].logprobs == pytest.approx(s.logprobs, abs=1e-5)


def test_sampler_draws_from_the_distribution_the_trainer_scores(tmp_path):
    """Step by step, the scores Hugging Face samples from (output_scores: after every logits processor) are the
    trainer's log-distribution of the same positions, even with a generation_config.json setting every option."""
    tiny_policy(seed=4).save_pretrained(tmp_path)
    full_generation_config(tmp_path)
    model = load_with_every_option(tmp_path)
    prompts = [[1, 2, 5], [4, 4]]
    torch.manual_seed(0)
    samples, scores = ppo.generate(
        model, prompts, pad_token_id=PAD, eos_token_id=EOS, max_new_tokens=6, temperature=0.7, return_scores=True
    )
    trainer = ppo.PPOTrainer(model, frozen_copy(model.policy), PPOConfig(temperature=0.7), pad_token_id=PAD)
    for b, (p, s) in enumerate(zip(prompts, samples)):
        ids = torch.tensor([p + s.tokens])
        _, _, logdist = trainer._policy_forward(ids, torch.ones_like(ids), len(p) - 1)
        n = len(s.tokens)
        assert torch.allclose(logdist[0, :n], torch.log_softmax(scores[b, :n], -1), atol=1e-4)


def test_top_k_and_top_p_are_refused_where_the_trainer_could_not_score_them():
    model = ActorCritic(tiny_policy())
    for kw in ({"top_k": 3}, {"top_p": 0.9}):
        with pytest.raises(ppo.UserError, match="ppo.top_[kp]"):
            ppo.PPOTrainer(model, frozen_copy(model.policy), PPOConfig(**kw), pad_token_id=PAD)
        with pytest.raises(ppo.UserError, match="top_[kp]"):
            ppo.generate(model, [PROMPT], pad_token_id=PAD, eos_token_id=EOS, max_new_tokens=2, **kw)


def saved_for_backward(fn) -> tuple[int, object]:
    """(bytes of the tensors autograd saves for the backward pass while `fn` runs, fn's result)."""
    saved = [0]

    def pack(t):
        saved[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return saved[0], out


def test_gradient_checkpointing_is_active_in_the_update_and_changes_nothing():
    """With checkpointing enabled, the PPO update's forward keeps only the blocks' inputs for the backward pass
    (the activations it saves shrink), and the update itself is the same; dropout stays off (ratios start at 1)."""
    deltas, saved = [], []
    for checkpointing in (False, True):
        model = ActorCritic(tiny_policy(0))
        if checkpointing:
            model.policy.gradient_checkpointing_enable()
        before = [p.detach().clone() for p in model.parameters()]
        cfg = PPOConfig(lr=1.0, epochs=1, mini_batch_size=4, micro_batch_size=4, max_grad_norm=1e9)
        trainer = ppo.PPOTrainer(
            model, frozen_copy(model.policy), cfg, torch.optim.SGD(model.parameters(), lr=1.0), pad_token_id=PAD
        )
        nbytes, metrics = saved_for_backward(
            lambda trainer=trainer: trainer.step(
                [PROMPT] * 4, [[A, 4, 4, 4, EOS], [5, EOS], [A, 6, EOS], [6]], [1.0, 0.0, 1.0, 0.0]
            )
        )
        saved.append(nbytes)
        assert metrics["approx_kl"] == pytest.approx(0.0, abs=1e-7)  # ratios 1 at the first step: no dropout
        assert not model.training  # evaluation mode again, for sampling
        deltas.append(param_delta(model, before))
    assert saved[1] < 0.5 * saved[0], saved
    assert torch.allclose(deltas[0], deltas[1], atol=1e-6)


def test_whitening_keeps_the_sign_of_one_or_two_answers():
    """Whitening over a batch of one or two answers would subtract their mean and erase the sign of a lone reward:
    below three sequences the advantages are only scaled."""
    model = ActorCritic(tiny_policy())
    trainer = ppo.PPOTrainer(model, frozen_copy(model.policy), PPOConfig(kl_coef=0.0), pad_token_id=PAD)
    for responses, scores in (
        ([[A, A, EOS]], [1.0]),
        ([[A, EOS], [5, EOS]], [1.0, 1.0]),
        ([[A, EOS], [5, EOS]], [-1.0, -1.0]),
    ):
        rollout, _ = trainer._prepare([PROMPT] * len(responses), responses, scores, None)
        last = ppo.last_index(rollout.action_mask)
        for b, s in enumerate(scores):
            assert math.copysign(1.0, rollout.advantages[b, last[b]].item()) == math.copysign(1.0, s)


# ---------------------------------------------------------------------------- forward passes left out


def counted_update(reuse: bool | None, seed: int = 0, **kw):
    """One SGD update (as sgd_update, rloo, no KL in the reward) with the old-policy pass reused or not (None: the
    trainer's own choice); returns (parameter change, metrics, policy forwards, reference forwards)."""
    model = ActorCritic(tiny_policy(seed))
    ref = frozen_copy(model.policy)
    before = [p.detach().clone() for p in model.parameters()]
    kw = {"advantage": "rloo", "kl_coef": 0.0, "epochs": 1, "mini_batch_size": 4, **kw}
    cfg = PPOConfig(lr=1.0, micro_batch_size=2, max_grad_norm=1e9, **kw)
    trainer = ppo.PPOTrainer(model, ref, cfg, torch.optim.SGD(model.parameters(), lr=1.0), pad_token_id=PAD, seed=seed)
    if reuse is not None:
        trainer.reuses_forward = lambda batch: reuse
    calls = {"policy": 0, "ref": 0}
    model.policy.register_forward_hook(lambda *a: calls.__setitem__("policy", calls["policy"] + 1))
    ref.register_forward_hook(lambda *a: calls.__setitem__("ref", calls["ref"] + 1))
    responses = [[A], [5] * 8 + [EOS], [6], [A] * 8 + [EOS]]
    metrics = trainer.step([PROMPT] * 4, responses, [1.0, 0.0, 0.0, 1.0], groups=["t", "t", "u", "u"])
    return param_delta(model, before), metrics, calls["policy"], calls["ref"]


def test_one_step_without_a_critic_reuses_its_forward_and_computes_the_same_update():
    """One epoch, one minibatch, a group advantage, no KL in the reward: the old policy's separate pass is left out
    (2 micro-batches: 2 policy forwards, not 4), and the update and its metrics are those of the full path."""
    full, m_full, pol_full, ref_full = counted_update(reuse=False)
    fast, m_fast, pol_fast, ref_fast = counted_update(reuse=None)
    assert (pol_full, pol_fast) == (4, 2) and ref_full == ref_fast == 2
    assert full.norm() > 0 and torch.allclose(fast, full, atol=1e-6, rtol=1e-4)
    for key in ("policy_loss", "entropy", "kl", "kl_seq", "clipfrac", "approx_kl", "score_mean", "advantages_mean"):
        assert m_fast[key] == pytest.approx(m_full[key], rel=1e-4, abs=1e-6), key
    assert m_fast["approx_kl"] == 0.0 and "values_mean" not in m_fast


@pytest.mark.parametrize(
    "kw",
    [
        dict(epochs=2),
        dict(mini_batch_size=2),
        dict(kl_coef=0.05),
        dict(advantage="gae"),
        dict(advantage="rloo", adaptive_kl=True),
    ],
)
def test_the_old_policy_pass_stays_where_it_can_change_the_update(kw):
    """Two optimiser steps, a KL penalty in the reward or a critic: the old log-probs (or values) are needed before
    the update, so they are scored in their own pass."""
    *_, policy_forwards, _ = counted_update(reuse=None, **kw)
    assert policy_forwards == 2 + 2 * kw.get("epochs", 1)  # 2 micro-batches of 2: the old pass, then each epoch


def test_no_reference_pass_when_the_kl_is_neither_a_reward_nor_measured():
    _, metrics, _, ref_forwards = counted_update(reuse=None, kl_metric=False)
    assert ref_forwards == 0 and "kl" not in metrics and math.isfinite(metrics["policy_loss"])
    _, metrics, _, ref_forwards = counted_update(reuse=False, kl_metric=False)
    assert ref_forwards == 0 and "kl" not in metrics
    *_, ref_forwards = counted_update(reuse=None, kl_coef=0.05, kl_metric=False)
    assert ref_forwards == 2  # in the reward: always scored


def shared_prompt_update(share: bool, seed: int = 0):
    """One SGD update of a tiny Llama on 2 tasks x 3 answers of different lengths (two minibatches: the old pass
    runs), its prompts shared or not: (parameter change, metrics, tokens the embedding saw)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    policy = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            pad_token_id=PAD,
            eos_token_id=EOS,
            bos_token_id=EOS,
        )
    )
    model = ActorCritic(policy)
    before = [p.detach().clone() for p in model.parameters()]
    cfg = PPOConfig(
        lr=1.0,
        epochs=1,
        mini_batch_size=3,
        micro_batch_size=3,
        max_grad_norm=1e9,
        advantage="gae",
        kl_coef=0.05,
        share_prompts=share,
    )
    trainer = ppo.PPOTrainer(
        model, frozen_copy(model.policy), cfg, torch.optim.SGD(model.parameters(), lr=1.0), pad_token_id=PAD, seed=seed
    )
    tokens = []
    policy.model.embed_tokens.register_forward_hook(lambda mod, args, out: tokens.append(args[0].numel()))
    long_prompt, short_prompt = [1, 2, 5, 6, 2, 1], [4, 2]
    queries = [long_prompt] * 3 + [short_prompt] * 3
    responses = [[A], [5, 6, EOS], [6, 6, 6, 6, 2], [A, EOS], [2], [5, 5, 5, 5, 5, 5, EOS]]
    metrics = trainer.step(queries, responses, [1.0, 0.0, 0.5, 1.0, 0.0, 0.0])
    return param_delta(model, before), metrics, sum(tokens)


def test_answers_sharing_their_prompt_give_the_same_update_from_fewer_tokens():
    """ppo.share_prompts: a task's prompt runs once for its answers (old pass and update), the same parameter
    change and metrics as the plain forward, and the policy's embedding sees fewer tokens."""
    plain, m_plain, tokens_plain = shared_prompt_update(False)
    shared, m_shared, tokens_shared = shared_prompt_update(True)
    assert plain.norm() > 0 and torch.allclose(shared, plain, atol=1e-5, rtol=1e-4)
    for key in ("policy_loss", "value_loss", "entropy", "kl", "values_mean", "approx_kl"):
        assert m_shared[key] == pytest.approx(m_plain[key], rel=1e-4, abs=1e-6), key
    assert tokens_shared < tokens_plain


def test_pad_behaviour_puts_each_sampler_logprob_where_its_token_is_scored():
    queries, responses = [[1, 2], [4]], [[5, 6, 7], [3]]
    ids, _, actions = ppo.pad_rollouts(queries, responses, pad_token_id=0)
    lp = ppo.pad_behaviour(queries, responses, [[-0.1, -0.2, -0.3], None], ids.shape[1])
    assert lp.shape == actions.shape
    assert lp[0][actions[0].bool()].tolist() == pytest.approx([-0.1, -0.2, -0.3])
    assert torch.isnan(lp[0][~actions[0].bool()]).all() and torch.isnan(lp[1]).all()
    with pytest.raises(ValueError, match="2 sampler log-probs for 3"):
        ppo.pad_behaviour(queries, responses, [[-0.1, -0.2], None], ids.shape[1])


def tis_update(cap: float, log_ratio: float | None):
    """One SGD update (as counted_update, no entropy term: the policy loss is the only gradient) with the sampler's
    log-probs set to the trainer's own plus `log_ratio` (None: none given); (parameter change, metrics)."""
    model = ActorCritic(tiny_policy(0))
    before = [p.detach().clone() for p in model.parameters()]
    cfg = PPOConfig(
        lr=1.0,
        epochs=1,
        mini_batch_size=4,
        micro_batch_size=2,
        max_grad_norm=1e9,
        advantage="rloo",
        kl_coef=0.0,
        entropy_coef_start=0.0,
        entropy_coef_end=0.0,
        tis_cap=cap,
    )
    trainer = ppo.PPOTrainer(
        model, frozen_copy(model.policy), cfg, torch.optim.SGD(model.parameters(), lr=1.0), pad_token_id=PAD, seed=0
    )
    queries, responses = [PROMPT] * 4, [[A], [5] * 8 + [EOS], [6], [A] * 8 + [EOS]]
    behaviour = None
    if log_ratio is not None:  # the trainer's own log-prob of each answer token, shifted by -log_ratio
        ids, attn, actions = ppo.pad_rollouts(queries, responses, PAD)
        with torch.no_grad():
            logp, _, _ = trainer._policy_forward(ids, attn)
        behaviour = [(logp[b][actions[b].bool()] - log_ratio).tolist() for b in range(4)]
    metrics = trainer.step(
        queries, responses, [1.0, 0.0, 0.0, 1.0], groups=["t", "t", "u", "u"], behaviour_logprobs=behaviour
    )
    return param_delta(model, before), metrics


def test_truncated_importance_sampling_weights_the_policy_gradient_by_the_capped_ratio():
    """ppo.tis_cap: a sampler that gave every token a quarter of the trainer's probability (ratio 4) is capped at
    2: the policy gradient doubles; a sampler that agrees with the trainer leaves the update as it was."""
    plain, m_plain = tis_update(cap=0.0, log_ratio=None)
    same, m_same = tis_update(cap=2.0, log_ratio=0.0)
    doubled, m_doubled = tis_update(cap=2.0, log_ratio=math.log(4.0))
    assert plain.norm() > 0 and "tis_weight" not in m_plain
    assert torch.allclose(same, plain, atol=1e-6) and m_same["tis_weight"] == pytest.approx(1.0, abs=1e-5)
    assert m_same["tis_truncated"] == 0.0
    assert torch.allclose(doubled, 2 * plain, atol=1e-6, rtol=1e-4)
    assert m_doubled["tis_weight"] == pytest.approx(2.0) and m_doubled["tis_truncated"] == pytest.approx(1.0)
    assert m_doubled["policy_loss"] == pytest.approx(2 * m_plain["policy_loss"], rel=1e-4, abs=1e-7)
    off, _ = tis_update(cap=0.0, log_ratio=math.log(4.0))  # off: the sampler's log-probs are not used
    assert torch.equal(off, plain)


def test_a_tis_cap_below_one_is_refused_with_its_key():
    from selfplay.runtime.config import load_config
    from selfplay.runtime.errors import UserError

    with pytest.raises(UserError, match="ppo.tis_cap"):
        load_config("configs/smoke.yaml", overrides=["ppo.tis_cap=0.5"])
