"""The RL math against numbers computed by hand (the formulas of docs/architecture.md and docs/rl.md)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from selfplay.rl import core as rl


def t(*rows):
    return torch.tensor(rows, dtype=torch.float64)


def test_gae_three_steps_by_hand():
    # r = [0, 0, 1], V = [0.5, 0.6, 0.7], gamma = 1, lam = 0.5, terminal after the last token:
    # t=2: delta = 1 - 0.7 = 0.3                     A2 = 0.3
    # t=1: delta = 0.7 - 0.6 = 0.1                   A1 = 0.1 + 0.5 * 0.3 = 0.25
    # t=0: delta = 0.6 - 0.5 = 0.1                   A0 = 0.1 + 0.5 * 0.25 = 0.225
    adv, ret = rl.gae(t([0, 0, 1]), t([0.5, 0.6, 0.7]), t([1, 1, 1]), gamma=1.0, lam=0.5)
    assert adv.tolist()[0] == pytest.approx([0.225, 0.25, 0.3])
    assert ret.tolist()[0] == pytest.approx([0.725, 0.85, 1.0])


def test_gae_with_discount_and_lambda_one_gives_discounted_returns():
    # gamma = 0.9, lam = 1: A2 = 0.3; A1 = 0.9*0.7 - 0.6 + 0.9*0.3 = 0.3; A0 = 0.9*0.6 - 0.5 + 0.9*0.3 = 0.31
    adv, ret = rl.gae(t([0, 0, 1]), t([0.5, 0.6, 0.7]), t([1, 1, 1]), gamma=0.9, lam=1.0)
    assert adv.tolist()[0] == pytest.approx([0.31, 0.3, 0.3])
    assert ret.tolist()[0] == pytest.approx([0.81, 0.9, 1.0])
    assert rl.discounted_returns(t([0, 0, 1]), t([1, 1, 1]), 0.9).tolist()[0] == pytest.approx([0.81, 0.9, 1.0])


def test_gae_skips_padding_and_observation_tokens():
    # row 0: right padding (the 9 is ignored): A1 = 1 - 0.4 = 0.6, A0 = 0.4 - 0.2 + 0.5 * 0.6 = 0.5
    # row 1: a hole in the middle (observation token): same as the 2-step episode V=[0.5, 0.7], r=[0, 1]
    #        A2 = 0.3, A0 = 0.7 - 0.5 + 0.5 * 0.3 = 0.35; the reward 5 on the hole is ignored
    rewards, values, mask = t([0, 1, 0], [0, 5, 1]), t([0.2, 0.4, 9], [0.5, 99, 0.7]), t([1, 1, 0], [1, 0, 1])
    adv, ret = rl.gae(rewards, values, mask, gamma=1.0, lam=0.5)
    assert adv.tolist() == [pytest.approx([0.5, 0.6, 0.0]), pytest.approx([0.35, 0.0, 0.3])]
    assert ret.tolist() == [pytest.approx([0.7, 1.0, 0.0]), pytest.approx([0.85, 0.0, 1.0])]


@pytest.mark.parametrize(
    "ratio, adv, expected",
    [
        (1.5, 1.0, -1.2),  # above the clip range, positive advantage: clipped at 1.2
        (1.5, -1.0, 1.5),  # above the range, negative advantage: the pessimistic unclipped term wins
        (1.1, 2.0, -2.2),  # inside the range: plain -A * ratio
        (0.5, 1.0, -0.5),  # below the range, positive advantage: unclipped
        (0.5, -1.0, 0.8),  # below the range, negative advantage: clipped at 0.8
    ],
)
def test_clipped_policy_loss(ratio, adv, expected):
    logp, old = t([math.log(ratio)]), t([0.0])
    assert rl.clipped_policy_loss(logp, old, t([adv]), t([1.0]), clip=0.2).item() == pytest.approx(expected)


def test_clip_fraction_and_approx_kl():
    logp, old, mask = t([math.log(1.5), math.log(1.1), math.log(0.5), 0.0]), t([0, 0, 0, 0]), t([1, 1, 1, 0])
    assert rl.clip_fraction(logp, old, mask, 0.2).item() == pytest.approx(2 / 3)
    # k3 per token: r - 1 - log r
    expected = sum(r - 1 - math.log(r) for r in (1.5, 1.1, 0.5)) / 3
    assert rl.approx_kl(logp, old, mask).item() == pytest.approx(expected)


def test_clipped_value_loss():
    # V = 1.0, V_old = 0.5, R = 1: unclipped 0; clipped V = 0.7 -> 0.09; 0.5 * max = 0.045
    assert rl.clipped_value_loss(t([1.0]), t([0.5]), t([1.0]), t([1.0]), 0.2).item() == pytest.approx(0.045)
    # inside the range: 0.5 * (0.6 - 1)^2 = 0.08
    assert rl.clipped_value_loss(t([0.6]), t([0.5]), t([1.0]), t([1.0]), 0.2).item() == pytest.approx(0.08)


def test_kl_estimators():
    logp, ref = t([-1.0]), t([-2.0])
    assert rl.kl_estimate(logp, ref, "k1").item() == pytest.approx(1.0)
    assert rl.kl_estimate(logp, ref, "k2").item() == pytest.approx(0.5)
    assert rl.kl_estimate(logp, ref, "k3").item() == pytest.approx(math.exp(-1))  # e^-1 + 1 - 1
    assert rl.kl_estimate(ref, ref, "k3").item() == 0.0
    with pytest.raises(ValueError, match="k4"):
        rl.kl_estimate(logp, ref, "k4")


def test_k1_and_k3_are_unbiased_estimates_of_the_true_kl():
    gen = torch.Generator().manual_seed(0)
    p, q = torch.tensor([0.7, 0.2, 0.1], dtype=torch.float64), torch.tensor([0.4, 0.4, 0.2], dtype=torch.float64)
    true_kl = (p * (p / q).log()).sum().item()
    x = torch.multinomial(p, 200_000, replacement=True, generator=gen)
    for kind in ("k1", "k3"):
        assert rl.kl_estimate(p.log()[x], q.log()[x], kind).mean().item() == pytest.approx(true_kl, abs=5e-3)


def test_whitening_gives_mean_zero_std_one_on_the_mask():
    x, mask = t([1.0, 2.0, 3.0, 100.0], [4.0, 5.0, 7.0, -50.0]), t([1, 1, 1, 0], [1, 1, 1, 0])
    w = rl.masked_whiten(x, mask)
    assert rl.masked_mean(w, mask).item() == pytest.approx(0.0, abs=1e-9)
    assert rl.masked_var(w, mask).item() == pytest.approx(1.0, rel=1e-6)
    assert w[:, 3].tolist() == [0.0, 0.0]
    # shift_mean=False: mean 2 kept, spread scaled by 1/std (std = sqrt(2)) -> 2 -+ 1/sqrt(2)
    kept = rl.masked_whiten(t([1.0, 3.0]), t([1, 1]), shift_mean=False)
    assert kept.tolist()[0] == pytest.approx([2 - 1 / math.sqrt(2), 2 + 1 / math.sqrt(2)])


def test_masked_mean_and_var_by_hand():
    x, mask = t([1.0, 2.0, 6.0, 50.0]), t([1, 1, 1, 0])
    assert rl.masked_mean(x, mask).item() == pytest.approx(3.0)
    assert rl.masked_var(x, mask).item() == pytest.approx(7.0)  # (4 + 1 + 9) / 2
    assert rl.masked_var(x, mask, unbiased=False).item() == pytest.approx(14 / 3)
    assert rl.masked_mean(x, torch.zeros_like(x)).item() == 0.0


def test_explained_variance():
    mask = t([1, 1, 1])
    # R = [1, 2, 3], V = [1, 2, 2]: Var(R - V) = Var([0, 0, 1]) = 2/9, Var(R) = 2/3 -> 1 - 1/3
    assert rl.explained_variance(t([1, 2, 2]), t([1, 2, 3]), mask).item() == pytest.approx(2 / 3)
    assert rl.explained_variance(t([1, 2, 3]), t([1, 2, 3]), mask).item() == pytest.approx(1.0)
    assert rl.explained_variance(t([2, 2, 2]), t([1, 2, 3]), mask).item() == pytest.approx(0.0)
    assert math.isnan(rl.explained_variance(t([1, 2, 3]), t([1, 1, 1]), mask).item())


def test_entropy_and_logprobs_from_logits():
    logits = torch.zeros(1, 1, 4)
    assert rl.entropy_from_logits(logits).item() == pytest.approx(math.log(4))
    peaked = torch.tensor([[[0.0, math.log(3.0)]]])  # probabilities 1/4, 3/4
    assert rl.entropy_from_logits(peaked).item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)))
    assert rl.logprobs_from_logits(peaked, torch.tensor([[1]])).item() == pytest.approx(math.log(0.75))


def test_kl_controllers():
    fixed = rl.FixedKLController(0.05)
    assert fixed.update(100.0, 64) == 0.05
    ctl = rl.AdaptiveKLController(0.1, target=6.0, horizon=10_000)
    assert ctl.update(12.0, 100) == pytest.approx(0.1 * (1 + 0.2 * 100 / 10_000))  # error clipped at +0.2
    before = ctl.value
    # 4.5/6 - 1 = -0.25, clipped at -0.2
    assert ctl.update(4.5, 100) == pytest.approx(before * (1 - 0.2 * 100 / 10_000))
    ctl2 = rl.AdaptiveKLController(0.1, 6.0, 10_000)
    ctl2.load_state_dict(ctl.state_dict())
    assert ctl2.value == ctl.value
    # a checkpoint restores an adapted beta only toward the same start and target; a fixed beta is the config's
    for other in (rl.AdaptiveKLController(0.2, 6.0, 10_000), rl.AdaptiveKLController(0.1, 3.0, 10_000)):
        other.load_state_dict(ctl.state_dict())
        assert other.value == other.init != ctl.value
    fresh = rl.AdaptiveKLController(0.1, 6.0, 10_000)
    fresh.load_state_dict(fixed.state_dict())  # a warm start saved with a fixed beta
    assert fresh.value == 0.1
    stronger = rl.FixedKLController(0.3)
    stronger.load_state_dict(fixed.state_dict())
    assert stronger.value == 0.3


def test_linear_schedule():
    assert rl.linear_schedule(0.01, 0.001, 0, 100) == pytest.approx(0.01)
    assert rl.linear_schedule(0.01, 0.001, 50, 100) == pytest.approx(0.0055)
    assert rl.linear_schedule(0.01, 0.001, 1000, 100) == pytest.approx(0.001)
    assert rl.linear_schedule(0.01, 0.001, 5, 0) == 0.01


def test_rloo_advantages_by_hand():
    # task "a": returns 1, 0, 0 -> baselines 0, 0.5, 0.5; task "b": 0.2, 0.6 -> baselines 0.6, 0.2; "c" alone
    adv = rl.rloo_advantages(torch.tensor([1.0, 0.2, 0.0, 0.6, 0.0, 0.7]), ["a", "b", "a", "b", "a", "c"])
    assert adv.tolist() == pytest.approx([1.0, -0.4, -0.5, 0.4, -0.5, 0.7])
    assert rl.rloo_advantages(torch.zeros(4), [1, 1, 2, 2]).tolist() == [0.0] * 4  # all failed: no signal
    with pytest.raises(ValueError, match="group ids"):
        rl.rloo_advantages(torch.zeros(3), ["a", "b"])


def test_mixed_groups_by_hand():
    # task "a" scored 1, 0, 0 (mixed); "b" 0.5, 0.5 (uniform); "c" alone (uniform by definition)
    assert rl.mixed_groups([1.0, 0.5, 0.0, 0.5, 0.0, 0.7], ["a", "b", "a", "b", "a", "c"]) == [
        True,
        False,
        True,
        False,
        True,
        False,
    ]
    with pytest.raises(ValueError, match="group ids"):
        rl.mixed_groups([0.0, 1.0], ["a"])


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.sampled_from([0.0, 0.25, 1.0])), min_size=1, max_size=20), st.randoms())
def test_mixed_groups_flags_exactly_the_groups_with_some_rloo_signal(rows, rnd):
    groups, scores = [g for g, _ in rows], [s for _, s in rows]
    mixed = rl.mixed_groups(scores, groups)
    adv = rl.rloo_advantages(torch.tensor(scores, dtype=torch.float64), groups)
    for i, g in enumerate(groups):
        others = {s for h, s in rows if h == g}
        assert mixed[i] == (len(others) > 1)
        if not mixed[i] and groups.count(g) > 1:
            assert float(adv[i]) == 0.0  # a uniform group has no leave-one-out signal: nothing lost by dropping it
    order = list(range(len(rows)))
    rnd.shuffle(order)  # a property of each group, not of the order the samples came in
    assert rl.mixed_groups([scores[i] for i in order], [groups[i] for i in order]) == [mixed[i] for i in order]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.floats(-2, 2, allow_nan=False)), min_size=1, max_size=20))
def test_rloo_advantages_sum_to_zero_per_group_and_ignore_a_shared_shift(rows):
    groups, values = [g for g, _ in rows], torch.tensor([v for _, v in rows], dtype=torch.float64)
    adv = rl.rloo_advantages(values, groups)
    shifted = rl.rloo_advantages(values + 3.0, groups)
    for g in set(groups):
        members = [i for i, x in enumerate(groups) if x == g]
        if len(members) > 1:
            assert abs(float(adv[members].sum())) < 1e-9
            assert torch.allclose(adv[members], shifted[members])  # a constant added to a task's returns cancels
        else:
            assert float(adv[members[0]]) == float(values[members[0]])


def test_token_means_of_micro_batches_add_up_to_the_minibatch_mean():
    x, mask = t([1.0, 2.0, 0.0], [4.0, 0.0, 0.0]), t([1, 1, 0], [1, 0, 0])
    assert rl.token_mean(x, mask).item() == pytest.approx(7 / 3)
    parts = [rl.token_mean(x[i : i + 1], mask[i : i + 1], 3).item() for i in range(2)]  # 3 tokens in the minibatch
    assert parts == pytest.approx([3 / 3, 4 / 3]) and sum(parts) == pytest.approx(7 / 3)
    # a loss given the minibatch's count is that share: (per micro-batch token means would give 1.5 and 4)
    adv, zero = t([1.0, -1.0, 0.0], [2.0, 0.0, 0.0]), torch.zeros(2, 3, dtype=torch.float64)
    assert rl.clipped_policy_loss(zero, zero, adv, mask, 0.2, n_tokens=3).item() == pytest.approx(-2 / 3)


def test_sampling_logprobs_is_the_tempered_log_softmax():
    logits = torch.tensor([0.0, math.log(3.0)], dtype=torch.float64)
    assert torch.exp(rl.sampling_logprobs(logits, 1.0)).tolist() == pytest.approx([0.25, 0.75])
    # temperature 0.5 squares the odds: 1 : 9
    assert torch.exp(rl.sampling_logprobs(logits, 0.5)).tolist() == pytest.approx([0.1, 0.9])
    assert rl.gather_tokens(rl.sampling_logprobs(logits[None, None], 0.5), torch.tensor([[1]])).item() == pytest.approx(
        math.log(0.9)
    )
    with pytest.raises(ValueError, match="temperature"):
        rl.sampling_logprobs(logits, 0.0)


def test_truncated_is_weights_are_the_capped_ratio_of_trainer_to_sampler():
    old = torch.log(t([0.5, 0.5, 0.5], [0.2, 0.2, 0.2]))
    sampler = torch.log(t([0.25, 0.5, 1.0], [0.2, 0.05, 0.2]))
    sampler[1, 2] = float("nan")  # a token with no sampler log-prob (e.g. an observation): weight 1
    w = rl.truncated_is_weights(old, sampler, cap=3.0)
    assert w.flatten().tolist() == pytest.approx([2.0, 1.0, 0.5, 1.0, 3.0, 1.0])  # 0.2 / 0.05 = 4, capped at 3
    old.requires_grad_(True)
    assert not rl.truncated_is_weights(old, sampler, cap=3.0).requires_grad  # a weight, not a path for gradients
