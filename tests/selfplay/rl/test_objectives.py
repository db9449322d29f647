"""GRPO, Dr. GRPO and DAPO's clip-higher and overlong shaping against numbers computed by hand (docs/rl.md:
"Objectives beside PPO and RLOO"): the pure functions, their properties, the config's refusals, and the trainer."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_ppo import EOS, PAD, PROMPT, tiny_policy

from selfplay.models.factory import ActorCritic, frozen_copy
from selfplay.rl import core as rl
from selfplay.rl import ppo
from selfplay.runtime.config import LOSS_AGGREGATIONS, PPOConfig, load_config
from selfplay.runtime.errors import UserError
from solver.rewards import overlong_penalties, overlong_penalty, turn_lengths

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

SQRT3 = math.sqrt(3.0)


def t(*rows):
    return torch.tensor(rows, dtype=torch.float64)


def trainer_for(ref_seed=None, **kw):
    """A trainer on the tiny policy; its reference is a copy (KL 0) or another policy (`ref_seed`: KL > 0)."""
    model = ActorCritic(tiny_policy())
    ref = frozen_copy(model.policy if ref_seed is None else tiny_policy(ref_seed))
    settings_ = dict(
        lr=1e-2,
        mini_batch_size=8,
        micro_batch_size=8,
        kl_coef=0.0,
        entropy_coef_start=0.0,
        entropy_coef_end=0.0,
        max_new_tokens=4,
        epochs=1,
    )
    return ppo.PPOTrainer(model, ref, PPOConfig(**{**settings_, **kw}), pad_token_id=PAD, seed=0)


def answer_advantages(trainer, responses, scores, groups):
    """Each answer's advantage (the same on all its tokens) as `_prepare` computes it."""
    rollout, _ = trainer._prepare([PROMPT] * len(responses), responses, scores, None, groups)
    adv, mask = rollout.advantages, rollout.action_mask.bool()
    per_answer = [adv[b][mask[b]] for b in range(len(responses))]
    assert all(torch.allclose(a, a[0].expand_as(a)) for a in per_answer)  # applied to every answer token
    return [float(a[0]) for a in per_answer]


# ---------------------------------------------------------------------------- GRPO and Dr. GRPO advantages


def test_grpo_advantages_by_hand():
    # one task, rewards [1, 0, 0, 1]: mean 0.5, deviations +-0.5, sample variance 4 x 0.25 / 3 = 1/3, std 1/sqrt(3)
    # -> A = [1, -1, -1, 1] x 0.5 x sqrt(3) = +-0.866
    adv = rl.group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), ["a"] * 4)
    assert adv.tolist() == pytest.approx([SQRT3 / 2, -SQRT3 / 2, -SQRT3 / 2, SQRT3 / 2], rel=1e-5)
    # task "a": 1, 0 -> mean 0.5, std sqrt(0.5) -> +-0.5 / 0.7071 = +-0.7071; "b" 0.5, 0.5 uniform -> 0; "c" alone
    # keeps its return 0.7 (no baseline)
    adv = rl.group_advantages(torch.tensor([1.0, 0.5, 0.0, 0.5, 0.7]), ["a", "b", "a", "b", "c"])
    assert adv.tolist() == pytest.approx([math.sqrt(0.5), 0.0, -math.sqrt(0.5), 0.0, 0.7], rel=1e-5)
    with pytest.raises(ValueError, match="group ids"):
        rl.group_advantages(torch.zeros(3), ["a", "b"])


def test_dr_grpo_advantages_by_hand():
    # no std: rewards [1, 0, 0, 1] -> A = r - 0.5 = [0.5, -0.5, -0.5, 0.5]; "b" uniform -> 0; "c" alone keeps 0.7
    assert rl.group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), [0] * 4, scale=False).tolist() == [
        0.5,
        -0.5,
        -0.5,
        0.5,
    ]
    adv = rl.group_advantages(torch.tensor([1.0, 0.5, 0.0, 0.5, 0.7]), ["a", "b", "a", "b", "c"], scale=False)
    assert adv.tolist() == pytest.approx([0.5, 0.0, -0.5, 0.0, 0.7])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from([0.0, 0.25, 0.5, 1.0])), min_size=1, max_size=16))
def test_group_advantages_sum_to_zero_per_group_and_relate_to_rloo(rows):
    groups, values = [g for g, _ in rows], torch.tensor([v for _, v in rows], dtype=torch.float64)
    grpo, dr = rl.group_advantages(values, groups), rl.group_advantages(values, groups, scale=False)
    rloo = rl.rloo_advantages(values, groups)
    shifted = rl.group_advantages(values + 3.0, groups)
    for g in set(groups):
        m = [i for i, x in enumerate(groups) if x == g]
        n = len(m)
        if n == 1:  # no baseline: the return itself, as rloo
            assert float(grpo[m[0]]) == float(dr[m[0]]) == float(values[m[0]])
            continue
        assert abs(float(grpo[m].sum())) < 1e-9 and abs(float(dr[m].sum())) < 1e-9
        # r - mean = (n - 1) / n x (r - mean of the others)
        assert torch.allclose(dr[m], rloo[m] * (n - 1) / n)
        assert torch.allclose(grpo[m], shifted[m])  # a constant added to a task's rewards cancels
        if len(set(values[m].tolist())) > 1:  # scaled to sample std 1 (up to eps)
            assert float(grpo[m].std()) == pytest.approx(1.0, rel=1e-4)
        else:
            assert float(grpo[m].abs().max()) == 0.0  # a uniform group teaches nothing


# ---------------------------------------------------------------------------- the loss's token aggregation


def test_loss_aggregations_by_hand_and_their_micro_batches_add_up():
    # answer 0: one token, loss 4; answer 1: three tokens, losses 1, 2, 3 (8 tokens would not change a thing)
    x, mask = t([4, 0, 0], [1, 2, 3]), t([1, 0, 0], [1, 1, 1])
    expected = {
        "token_mean": (4 + 1 + 2 + 3) / 4,  # every token alike
        "seq_mean_token_mean": (4 / 1 + 6 / 3) / 2,  # GRPO: each answer's token mean, then their mean
        "seq_mean_token_sum_norm": (4 / 4 + 6 / 4) / 2,
    }  # Dr. GRPO: token sums / max_len 4, then their mean
    for mode, value in expected.items():
        whole = rl.token_mean(x, rl.loss_weights(mask, mode, max_len=4), 1.0)
        parts = [
            rl.token_mean(x[i : i + 1], rl.loss_weights(mask[i : i + 1], mode, n_tokens=4, n_seqs=2, max_len=4), 1.0)
            for i in range(2)
        ]
        assert whole.item() == pytest.approx(value) and sum(p.item() for p in parts) == pytest.approx(value), mode
    assert rl.token_mean(x, rl.loss_weights(mask, "token_mean"), 1.0).item() == rl.token_mean(x, mask).item()
    # the policy loss at ratio 1 under them: A = +1 on answer 0's token, -1 on answer 1's three
    adv, zero = t([1, 0, 0], [-1, -1, -1]), torch.zeros(2, 3, dtype=torch.float64)
    losses = {
        m: rl.clipped_policy_loss(zero, zero, adv, rl.loss_weights(mask, m, max_len=4), 0.2, 1.0).item()
        for m in rl.LOSS_AGGREGATIONS
    }
    assert losses == pytest.approx(
        {
            "token_mean": (-1 + 3) / 4,
            "seq_mean_token_mean": (-1 + 1) / 2,
            "seq_mean_token_sum_norm": (-1 / 4 + 3 / 4) / 2,
        }
    )
    assert LOSS_AGGREGATIONS == rl.LOSS_AGGREGATIONS  # the config's names are the math's
    with pytest.raises(ValueError, match="aggregation"):
        rl.loss_weights(mask, "sum")
    with pytest.raises(ValueError, match="max_len"):
        rl.loss_weights(mask, "seq_mean_token_sum_norm")


# ---------------------------------------------------------------------------- clip-higher


@pytest.mark.parametrize(
    "ratio, adv, symmetric, higher",
    [
        (1.25, 1.0, -1.2, -1.25),  # above 1.2, below 1.28, positive advantage: clipped only by the symmetric range
        (1.5, 1.0, -1.2, -1.28),  # above both: clipped at the ceiling
        (1.5, -1.0, 1.5, 1.5),  # negative advantage: the pessimistic unclipped term, whatever the ceiling
        (0.7, -1.0, 0.8, 0.8),  # below the floor 0.8, negative advantage: clipped at 1 - clip_low either way
        (0.7, 1.0, -0.7, -0.7),  # below the floor, positive advantage: unclipped
    ],
)
def test_clip_higher_by_hand(ratio, adv, symmetric, higher):
    logp, old, a, m = t([math.log(ratio)]), t([0.0]), t([adv]), t([1.0])
    assert rl.clipped_policy_loss(logp, old, a, m, 0.2).item() == pytest.approx(symmetric)
    assert rl.clipped_policy_loss(logp, old, a, m, 0.2, clip_high=0.28).item() == pytest.approx(higher)


def test_clip_fraction_with_separate_ranges():
    # ratios 0.7, 0.9, 1.25, 1.3: outside [0.8, 1.2]: 0.7, 1.25, 1.3 (3/4); outside [0.8, 1.28]: 0.7, 1.3 (2/4)
    logp, old, mask = t([math.log(r) for r in (0.7, 0.9, 1.25, 1.3)]), t([0.0] * 4), t([1.0] * 4)
    assert rl.clip_fraction(logp, old, mask, 0.2).item() == pytest.approx(0.75)
    assert rl.clip_fraction(logp, old, mask, 0.2, clip_high=0.28).item() == pytest.approx(0.5)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.floats(-1.5, 1.5), st.floats(-2, 2)), min_size=1, max_size=12),
    st.floats(0.01, 0.9),
    st.floats(0.0, 1.0),
)
def test_clip_higher_is_the_symmetric_clip_when_equal_and_never_more_pessimistic(rows, clip, extra):
    logp, adv = t([r for r, _ in rows]), t([a for _, a in rows])
    old, mask = torch.zeros_like(logp), torch.ones_like(logp)
    symmetric = rl.clipped_policy_loss(logp, old, adv, mask, clip)
    assert rl.clipped_policy_loss(logp, old, adv, mask, clip, clip_high=clip).item() == symmetric.item()
    assert (
        rl.clip_fraction(logp, old, mask, clip, clip_high=clip).item() == rl.clip_fraction(logp, old, mask, clip).item()
    )
    # a higher ceiling only lets positive-advantage tokens rise further: the loss can only go down
    assert rl.clipped_policy_loss(logp, old, adv, mask, clip, clip_high=clip + extra).item() <= symmetric.item() + 1e-12


# ---------------------------------------------------------------------------- overlong shaping


def test_overlong_penalty_by_hand():
    # budget 10, cache 4: free up to 6 tokens, then (6 - len) / 4: 7 -> -0.25, 9 -> -0.75, 10 -> -1; beyond -> -1
    assert [overlong_penalty(n, 10, 4) for n in (0, 6, 7, 9, 10, 12)] == [0.0, 0.0, -0.25, -0.75, -1.0, -1.0]
    assert [overlong_penalty(n, 10, 0) for n in (0, 10, 12)] == [0.0, 0.0, 0.0]  # off
    # a two-turn episode: answers of 2 and 3 tokens with an observation between them; its longest turn counts
    assert turn_lengths([1, 1, 0, 0, 1, 1, 1]) == [2, 3] and turn_lengths([0, 1]) == [1] and turn_lengths([]) == []
    assert overlong_penalties([[1] * 9, [1] * 3 + [0] * 5 + [1] * 7, [1] * 5], 10, 4) == [-0.75, -0.25, 0.0]


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 64), st.integers(0, 64), st.lists(st.integers(0, 100), min_size=2, max_size=10))
def test_overlong_penalty_is_monotone_and_in_minus_one_to_zero(max_len, cache, lengths):
    cache = min(cache, max_len)
    values = [overlong_penalty(n, max_len, cache) for n in sorted(lengths)]
    assert all(-1.0 <= v <= 0.0 for v in values)
    assert all(a >= b for a, b in zip(values, values[1:]))  # non-increasing in length
    assert overlong_penalty(max_len - cache, max_len, cache) == 0.0
    assert overlong_penalty(max_len + 1, max_len, cache) == (-1.0 if cache else 0.0)


# ---------------------------------------------------------------------------- the config's refusals


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["ppo.advantage=grpo", "train.samples_per_task=1"],
            r"train.samples_per_task=1 with ppo.advantage=grpo .*"
            r"train.samples_per_task >= 2",
        ),
        (["ppo.advantage=dr_grpo", "train.samples_per_task=1"], r"train.samples_per_task=1 with ppo.advantage=dr_grpo"),
        (["ppo.advantage=grpo2"], r"ppo.advantage must be one of gae, rloo, grpo, dr_grpo, got 'grpo2'"),
        (["ppo.loss_aggregation=sum"], r"ppo.loss_aggregation must be one of token_mean, .*got 'sum'"),
        (["ppo.clip_low=0"], r"ppo.clip_low must be in \(0, 1\)"),
        (["ppo.clip_low=1.0"], r"ppo.clip_low must be in \(0, 1\)"),
        (["ppo.clip_high=0"], r"ppo.clip_high must be > 0"),
        (["reward.overlong_cache=-1"], r"reward.overlong_cache must be in \[0, ppo.max_new_tokens=160\]"),
        (["reward.overlong_cache=161"], r"reward.overlong_cache must be in \[0, ppo.max_new_tokens=160\]"),
    ],
)
def test_bad_objective_settings_are_refused_naming_the_key(overrides, message):
    with pytest.raises(UserError, match=message):
        load_config(None, ["ppo.max_new_tokens=160", *overrides])


def test_the_objectives_defaults_change_nothing_and_good_settings_load():
    p = PPOConfig()
    assert (p.clip_low, p.clip_high, p.loss_aggregation) == (None, None, "")
    assert load_config(None, []).reward.overlong_cache == 0
    cfg = load_config(
        None,
        [
            "ppo.advantage=grpo",
            "ppo.clip_low=0.2",
            "ppo.clip_high=0.28",
            "ppo.loss_aggregation=token_mean",
            "reward.overlong_cache=32",
        ],
    )
    assert (cfg.ppo.advantage, cfg.ppo.clip_high, cfg.reward.overlong_cache) == ("grpo", 0.28, 32)
    load_config(None, ["ppo.advantage=dr_grpo"])
    trainer = trainer_for(clip=0.3)
    assert (trainer.clip_low, trainer.clip_high, trainer.aggregation) == (0.3, 0.3, "token_mean")
    assert trainer_for(advantage="grpo").aggregation == "seq_mean_token_mean"
    assert trainer_for(advantage="dr_grpo").aggregation == "seq_mean_token_sum_norm"
    with pytest.raises(UserError, match="ppo.loss_aggregation"):
        trainer_for(loss_aggregation="sum")


# ---------------------------------------------------------------------------- in the trainer


def test_the_trainers_grpo_and_dr_grpo_advantages_by_hand():
    # one task, scores [1, 0, 0, 1], no KL: grpo +-sqrt(3)/2 on every token of each answer, dr_grpo +-0.5
    responses, scores, groups = [[3, EOS], [5], [4, 4, EOS], [6]], [1.0, 0.0, 0.0, 1.0], ["t"] * 4
    assert answer_advantages(trainer_for(advantage="grpo"), responses, scores, groups) == pytest.approx(
        [SQRT3 / 2, -SQRT3 / 2, -SQRT3 / 2, SQRT3 / 2], rel=1e-5
    )
    assert answer_advantages(trainer_for(advantage="dr_grpo"), responses, scores, groups) == pytest.approx(
        [0.5, -0.5, -0.5, 0.5], abs=1e-6
    )


def test_with_a_kl_penalty_only_the_score_is_divided_by_its_std():
    """The KL penalties' return is centred in the task's group, not scaled: a task whose answers all scored alike
    gets only its answers' KL differences, in reward units (as rloo, times (n - 1) / n), not amplified to +-1."""
    responses, groups = [[3, EOS], [5], [4, 4, EOS], [6, 2]], ["t"] * 4
    for scores in ([1.0] * 4, [1.0, 0.0, 0.0, 1.0]):
        adv = {
            a: answer_advantages(trainer_for(ref_seed=1, advantage=a, kl_coef=0.1), responses, scores, groups)
            for a in ("rloo", "grpo", "dr_grpo")
        }
        assert adv["dr_grpo"] == pytest.approx([x * 3 / 4 for x in adv["rloo"]], abs=1e-6)
        if len(set(scores)) == 1:
            assert adv["grpo"] == pytest.approx(adv["dr_grpo"], abs=1e-6)
            assert 0 < max(abs(x) for x in adv["grpo"]) < 0.5
        else:  # the score's part scaled by 1 / std = 2 / sqrt(3), the KL part as dr_grpo's
            kl_part = [d - s for d, s in zip(adv["dr_grpo"], (0.5, -0.5, -0.5, 0.5))]
            assert adv["grpo"] == pytest.approx([k + s * SQRT3 / 2 for k, s in zip(kl_part, (1, -1, -1, 1))], rel=1e-5)


# task "t": scores 1, 0, 0 on answers of 1, 3 and 2 tokens; task "v": one answer of 2 tokens scored 0.6 (alone, it
# keeps its return); 8 action tokens, 4 answers, ppo.max_new_tokens=4
BATCH = ([[3], [5, 6, 5], [4, 4], [6, 2]], [1.0, 0.0, 0.0, 0.6], ["t", "t", "t", "v"])


@pytest.mark.parametrize(
    "settings_, expected",
    [
        # grpo: A_t = [2, -1, -1] / 3 / (1 / sqrt(3)) = [2, -1, -1] / sqrt(3), A_v = 0.6; at ratio 1 the loss is the
        # aggregate of -A. Per answer (grpo's own): the group's means cancel, -0.6 / 4 answers
        ({"advantage": "grpo"}, -0.6 / 4),
        # per token: (-2 + 3 + 2) / sqrt(3) - 2 x 0.6 over 8 tokens = (sqrt(3) - 1.2) / 8
        ({"advantage": "grpo", "loss_aggregation": "token_mean"}, (SQRT3 - 1.2) / 8),
        # dr_grpo: A_t = [2, -1, -1] / 3; token sums (-2/3 + 1 + 2/3 - 1.2) over max_len 4 and 4 answers = -0.2 / 16
        ({"advantage": "dr_grpo"}, -0.2 / 16),
    ],
)
def test_the_policy_loss_is_aggregated_as_each_method_does_it(settings_, expected):
    # one minibatch of 4 answers in micro-batches of 2 (their shares add up), one epoch: the logged loss is at ratio 1
    trainer = trainer_for(micro_batch_size=2, **settings_)
    stats = trainer.step([PROMPT] * 4, *BATCH[:2], groups=BATCH[2])
    assert stats["optimizer_steps"] == 1
    assert stats["policy_loss"] == pytest.approx(expected, rel=1e-4, abs=1e-6)


def test_the_trainers_clip_higher_by_hand():
    # two answers of one token, dr_grpo advantages +0.5 and -0.5; every ratio set to 1.25 by moving the old log-probs
    # symmetric [0.8, 1.2]: (-0.5 x 1.2 + 0.5 x 1.25) / 2 = 0.0125, both tokens clipped (1.25 > 1.2)
    # clip-higher [0.8, 1.28]: (-0.5 x 1.25 + 0.5 x 1.25) / 2 = 0, none clipped
    for clip_high, loss, clipfrac in ((None, 0.0125, 1.0), (0.28, 0.0, 0.0)):
        trainer = trainer_for(
            advantage="dr_grpo", loss_aggregation="token_mean", clip_low=0.2, clip_high=clip_high, epochs=2
        )  # two steps: the old log-probs are scored apart, and can be moved here
        rollout, _ = trainer._prepare([PROMPT] * 2, [[3], [5]], [1.0, 0.0], None, ["t", "t"])
        rollout.old_logp = rollout.old_logp - math.log(1.25)
        idx = torch.arange(2)
        _, _, stats = trainer._loss(rollout, idx, 0.0, rollout.action_mask.sum().item(), n_seqs=2)
        assert stats["policy_loss"] == pytest.approx(loss, abs=1e-6)
        assert stats["clipfrac"] == clipfrac and stats["clipfrac_high"] == clipfrac


def weights(model):
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize(
    "settings_",
    [
        {"advantage": "grpo"},
        {"advantage": "dr_grpo"},
        {"advantage": "rloo", "clip_low": 0.2, "clip_high": 0.28},
        {"advantage": "gae", "clip_low": 0.1, "clip_high": 0.3, "loss_aggregation": "seq_mean_token_mean"},
        {"advantage": "rloo", "loss_aggregation": "seq_mean_token_sum_norm"},
    ],
)
def test_one_update_with_each_objective_is_finite_and_moves_the_weights(settings_):
    trainer = trainer_for(ref_seed=1, kl_coef=0.05, epochs=2, micro_batch_size=4, **settings_)
    before = weights(trainer.model)
    stats = trainer.step(
        [PROMPT] * 8, [[3, EOS], [5], [4, 4, EOS], [6, 2]] * 2, [1.0, 0.0, 0.0, 0.5] * 2, groups=["t"] * 4 + ["u"] * 4
    )
    for name in (
        "loss",
        "policy_loss",
        "entropy",
        "clipfrac",
        "clipfrac_high",
        "approx_kl",
        "kl",
        "grad_norm",
        "advantages_mean",
        "score_mean",
    ):
        assert math.isfinite(stats[name]), name
    assert stats["optimizer_steps"] == 2
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))


def test_overlong_shaping_alone_teaches_a_task_whose_answers_all_passed():
    """Both answers of a task pass (score 1): without shaping a group baseline gives them nothing; with a budget of
    4 tokens and a cache of 2, the 4-token answer gets 1 - 1 and the 1-token one 1 + 0, so the long one falls."""
    responses, masks = [[3], [5, 5, 5, 5]], [[1], [1, 1, 1, 1]]
    assert overlong_penalties(masks, 4, 2) == [0.0, -1.0]

    def prob_of_long(model):
        with torch.no_grad():
            logits = ppo.policy_of(model)(torch.tensor([PROMPT])).logits[0, -1]
        return torch.softmax(logits, -1)[5].item()

    for cache, moves in ((0, False), (2, True)):
        trainer = trainer_for(advantage="grpo", epochs=2)
        before, p0 = weights(trainer.model), prob_of_long(trainer.model)
        scores = [1.0 + o for o in overlong_penalties(masks, 4, cache)]
        stats = trainer.step([PROMPT] * 2, responses, scores, groups=["t", "t"])
        assert math.isfinite(stats["loss"])
        changed = any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
        assert changed == moves, cache
        assert (prob_of_long(trainer.model) < p0) == moves
