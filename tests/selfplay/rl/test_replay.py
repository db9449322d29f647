"""Replay of successful solver trajectories: the prioritised buffer (properties) and the auxiliary NLL loss in PPO
(hand-computed numbers and gradients on a tiny GPT-2)."""

import copy
import json
import math
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import GPT2Config, GPT2LMHeadModel

from selfplay.models.factory import ActorCritic, frozen_copy
from selfplay.rl import core as rl
from selfplay.rl import ppo
from selfplay.rl.replay import AnswerSet, ReplayBuffer, ReplayItem, priority, successes
from selfplay.runtime.config import PPOConfig
from tests.selfplay.rl.test_ppo import PAD, tiny_policy

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

# ---------------------------------------------------------------------------- the answer set (replay_source=sft)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 12), st.integers(0, 15), st.integers(0, 50), st.integers(0, 3))
def test_answer_set_draws_distinct_answers_as_a_function_of_the_step(size, n, now, seed):
    answers = AnswerSet([item(f"t{i}", [3 + i]) for i in range(size)], seed=seed)
    drawn = answers.sample(n, now)
    assert len(drawn) == min(n, size) and len({x.task_id for x in drawn}) == len(drawn)
    again = AnswerSet([item(f"t{i}", [3 + i]) for i in range(size)], seed=seed)  # a resumed run's fresh set
    assert [x.task_id for x in again.sample(n, now)] == [x.task_id for x in drawn]


def test_answer_set_draws_vary_with_the_step_and_cover_the_set():
    answers = AnswerSet([item(f"t{i}", [3]) for i in range(20)])
    draws = [tuple(x.task_id for x in answers.sample(4, step)) for step in range(30)]
    assert len(set(draws)) > 20 and {t for d in draws for t in d} == {f"t{i}" for i in range(20)}
    with pytest.raises(ValueError, match="at least one answer"):
        AnswerSet([])


# ---------------------------------------------------------------------------- the buffer

entries = st.tuples(
    st.sampled_from("abcdef"),  # task id
    st.lists(st.integers(3, 6), min_size=1, max_size=3),  # answer tokens
    st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0]),  # solve rate
    st.integers(0, 30),
)  # step


def item(task, tokens, rate=0.5, step=0):
    return ReplayItem(task, [1, 2], list(tokens), 1.0, rate, step)


def filled(capacity, adds, seed=0):
    buf = ReplayBuffer(capacity, seed=seed, half_life=10.0)
    for task, tokens, rate, step in adds:
        buf.add(item(task, tokens, rate, step))
    return buf


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.lists(entries, max_size=40))
def test_capacity_bound_and_unique_entries(capacity, adds):
    buf = filled(capacity, adds)
    keys = [x.key for x in buf.items()]
    assert len(buf) <= capacity and len(keys) == len(set(keys))
    assert len(buf) == min(capacity, len({(t, tuple(a)) for t, a, _, _ in adds}))


@settings(max_examples=40, deadline=None)
@given(entries, st.integers(0, 30), st.sampled_from([0.0, 0.5, 1.0]))
def test_the_same_answer_is_kept_once_and_refreshed(entry, later, rate):
    task, tokens, first_rate, step = entry
    buf = ReplayBuffer(4)
    assert buf.add(item(task, tokens, first_rate, step)) is True
    assert buf.add(item(task, tokens, rate, step + later)) is False
    assert len(buf) == 1
    (kept,) = buf.items()
    assert kept.step == step + later and kept.solve_rate == rate
    buf.add(item(task, tokens + [6]))  # another answer to the same task is another entry
    assert len(buf) == 2


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 5), st.lists(st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0]), min_size=1, max_size=12))
def test_eviction_keeps_the_hardest_of_one_step(capacity, rates):
    buf = ReplayBuffer(capacity)
    for i, rate in enumerate(rates):
        buf.add(item(f"t{i}", [3], rate, step=5))
    kept = {x.task_id for x in buf.items()}
    evicted = [r for i, r in enumerate(rates) if f"t{i}" not in kept]
    assert len(kept) == min(capacity, len(rates))
    if evicted:  # every kept success is on a task at least as hard as any evicted one
        assert max(x.solve_rate for x in buf.items()) <= min(evicted)


def test_priority_favours_hard_and_recent_successes():
    hard, easy, old_hard = item("h", [3], 0.25, 10), item("e", [3], 0.75, 10), item("o", [3], 0.25, 0)
    assert priority(hard, 10, 10.0) == pytest.approx(0.8)  # 1 - 0.25 + 0.05
    assert priority(old_hard, 10, 10.0) == pytest.approx(0.4)  # one half-life old
    buf = ReplayBuffer(3, half_life=10.0)
    for x in (easy, old_hard, hard):
        buf.add(x)
    assert [x.task_id for x in buf.ranked(10)] == ["h", "o", "e"]
    # draws of one: the hard, recent success comes first most often (seeded, so the counts are fixed)
    counts = {"h": 0, "o": 0, "e": 0}
    for _ in range(3000):
        counts[buf.sample(1, 10)[0].task_id] += 1
    assert counts["h"] > counts["o"] > counts["e"] > 0


@settings(max_examples=40, deadline=None)
@given(st.lists(entries, min_size=1, max_size=25), st.integers(0, 20), st.integers(1, 5))
def test_state_round_trip_gives_identical_samples(adds, draws_before, n):
    buf = filled(8, adds, seed=3)
    now = max(step for *_, step in adds)
    for _ in range(draws_before % 4):
        buf.sample(n, now)
    state = json.loads(json.dumps(buf.state_dict()))  # the checkpoint's state.json round trip
    other = ReplayBuffer(8, seed=99, half_life=10.0)
    other.load_state_dict(state)
    assert [x.key for x in other.items()] == [x.key for x in buf.items()]
    for _ in range(3):
        a, b = buf.sample(n, now), other.sample(n, now)
        assert [x.key for x in a] == [x.key for x in b]
        assert len(a) == min(n, len(buf)) and len({x.key for x in a}) == len(a)


def test_successes_keeps_solved_episodes_with_their_solve_rate():
    def rollout(task, tokens, solved, mask=None):
        return SimpleNamespace(
            task=SimpleNamespace(id=task),
            prompt=[1],
            tokens=tokens,
            mask=mask or [1] * len(tokens),
            reward=1.0 if solved else 0.0,
            result=SimpleNamespace(solved=solved),
        )

    got = successes(
        [rollout("a", [3, 4], True), rollout("a", [5], False), rollout("b", [3, 9, 4], True, [1, 0, 1])],
        {"a": 0.5, "b": 0.25},
        step=7,
    )
    assert [(x.task_id, x.solve_rate, x.step, x.mask) for x in got] == [("a", 0.5, 7, None), ("b", 0.25, 7, [1, 0, 1])]
    with pytest.raises(ValueError, match="solve_rate"):
        ReplayBuffer(2).add(item("a", [3], rate=1.5))


# ---------------------------------------------------------------------------- the auxiliary loss


def tiny_model(seed=0):
    return ActorCritic(tiny_policy(seed))


# PPO batch of 4 (one minibatch of two micro-batches); 3 replayed answers of other lengths (one prompt shorter than
# any PPO prompt, one sequence longer than any PPO row), the last with a masked observation token
QUERIES, RESPONSES, SCORES = [[1, 2, 5], [4, 4, 4], [6, 2, 2], [1, 1, 1]], [[3, 7], [5], [3, 3, 7], [2]], [1, 0, 1, 0]
R_QUERIES, R_RESPONSES, R_MASKS = (
    [[1, 2], [4, 4, 4, 4], [5, 6, 1]],
    [[3, 3, 7], [6], [2, 5, 4, 7]],
    [[1, 1, 1], [1], [1, 0, 1, 1]],
)
REPLAY = (R_QUERIES, R_RESPONSES, R_MASKS)


def hand_nll(policy) -> torch.Tensor:
    """Token mean of -log p(answer token | everything before it) over the replayed answers' chosen tokens."""
    total, count = 0.0, 0
    for q, a, m in zip(R_QUERIES, R_RESPONSES, R_MASKS):
        logp = torch.log_softmax(policy(torch.tensor([q + a])).logits[0].float(), -1)
        for j, (tok, keep) in enumerate(zip(a, m)):
            if keep:
                total = total - logp[len(q) - 1 + j, tok]
                count += 1
    return total / count


def test_nll_loss_matches_hand_numbers():
    logp = torch.tensor([[-1.0, -2.0, -9.0], [-0.5, -9.0, -9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert rl.nll_loss(logp, mask).item() == pytest.approx(3.5 / 3)
    assert rl.nll_loss(logp[:1], mask[:1], 3).item() + rl.nll_loss(logp[1:], mask[1:], 3).item() == pytest.approx(
        3.5 / 3
    )  # chunks normalised by the whole batch's count add up to its mean


def trainer(model, coef, lr=0.0, optimizer=None, temperature=1.0):
    cfg = PPOConfig(
        mini_batch_size=4,
        micro_batch_size=2,
        epochs=1,
        replay_coef=coef,
        max_grad_norm=1e9,
        lr=lr,
        temperature=temperature,
    )
    optimizer = optimizer or torch.optim.SGD(model.parameters(), lr=lr)
    return ppo.PPOTrainer(model, frozen_copy(model.policy), cfg, optimizer, pad_token_id=PAD, seed=0)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_replay_loss_equals_the_hand_computed_nll_and_leaves_ppo_terms_alone(temperature):
    """hand_nll is the untempered (T = 1) policy's: the replay NLL is that one at any sampling temperature, while
    the PPO terms of the same joint forward stay those of plain PPO at the sampling temperature."""
    model = tiny_model()
    with torch.no_grad():
        expected = hand_nll(model.policy).item()
    plain = trainer(model, 0.5, lr=0.0, temperature=temperature).step(QUERIES, RESPONSES, SCORES)
    with_replay = trainer(model, 0.5, lr=0.0, temperature=temperature).step(QUERIES, RESPONSES, SCORES, replay=REPLAY)
    assert "replay_loss" not in plain
    assert with_replay["replay_loss"] == pytest.approx(expected, rel=1e-5)
    for k in ("policy_loss", "value_loss", "entropy", "approx_kl", "loss"):  # one joint forward, same PPO numbers
        assert with_replay[k] == pytest.approx(plain[k], abs=1e-5), k
    off = trainer(model, 0.0).step(QUERIES, RESPONSES, SCORES, replay=REPLAY)
    assert "replay_loss" not in off  # coef 0: replay is ignored


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_replay_term_moves_parameters_by_coef_times_its_gradient(temperature):
    """SGD with lr 1 and no clipping: parameters move by minus the gradient. With replay at coef c the move differs
    from plain PPO's by exactly -c * grad(hand NLL), the untempered NLL at any PPO temperature; with coef 0 it does
    not differ at all."""
    base, coef = tiny_model(seed=1), 0.5
    reference = copy.deepcopy(base)
    nll = hand_nll(reference.policy)
    nll.backward()
    grad = {n: (p.grad if p.grad is not None else torch.zeros_like(p)) for n, p in reference.named_parameters()}

    def moved(c, replay):
        model = copy.deepcopy(base)
        trainer(model, c, lr=1.0, temperature=temperature).step(QUERIES, RESPONSES, SCORES, replay=replay)
        return {n: p.detach() - q.detach() for (n, p), q in zip(model.named_parameters(), base.parameters())}

    plain, replayed, zero = moved(0.0, None), moved(coef, REPLAY), moved(0.0, REPLAY)
    for name in plain:
        assert torch.equal(zero[name], plain[name]), name  # coef 0: bit-identical to no replay
        assert torch.allclose(replayed[name] - plain[name], -coef * grad[name], atol=2e-5, rtol=1e-3), name
    assert max((replayed[n] - plain[n]).abs().max().item() for n in plain) > 1e-3  # and it is not nothing
    # the replay term has no value loss: the value head moves as in plain PPO, up to float rounding of the joint
    # forward over a differently padded batch (~3e-8 here, against ~1e-3 for the replay gradient above)
    head = "value_head.summary.weight"
    assert torch.allclose(replayed[head], plain[head], rtol=0, atol=1e-6)


def two_token_model() -> ActorCritic:
    """A GPT-2 over a 2-token vocabulary whose logits are (0, log 3) at every position, whatever the input: the
    final layer norm's output is its bias h = (0, log 3, 0, 0) and the tied head reads the first two coordinates.
    So p(1) = 3/4 at temperature 1 and 9/10 at temperature 1/2 (logits / T = (0, 2 log 3))."""
    torch.manual_seed(0)
    policy = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=2,
            n_layer=1,
            n_embd=4,
            n_head=1,
            n_positions=16,
            bos_token_id=1,
            eos_token_id=1,
            pad_token_id=0,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
    )
    with torch.no_grad():
        policy.transformer.wte.weight.copy_(torch.eye(2, 4))
        policy.transformer.ln_f.weight.zero_()
        policy.transformer.ln_f.bias.copy_(torch.tensor([0.0, math.log(3.0), 0.0, 0.0]))
    return ActorCritic(policy)


def test_the_replay_nll_is_the_untempered_policys_by_hand_on_two_tokens():
    """PPO samples at T = 1/2; the replayed answers' NLL is taken at T = 1: tokens 1, 1, 0 give
    (2 log(4/3) + log 4) / 3, not the tempered (2 log(10/9) + log 10) / 3. The PPO rows of the same forward stay
    at T = 1/2: their entropy is that of (1/10, 9/10)."""
    model = two_token_model()
    cfg = PPOConfig(mini_batch_size=2, micro_batch_size=2, epochs=1, replay_coef=1.0, lr=0.0, temperature=0.5)
    t = ppo.PPOTrainer(
        model, frozen_copy(model.policy), cfg, torch.optim.SGD(model.parameters(), lr=0.0), pad_token_id=0, seed=0
    )
    stats = t.step([[1, 0], [0, 1, 1]], [[1, 1], [0]], [1.0, 0.0], replay=([[0, 1, 1], [1]], [[1, 1], [0]], None))
    untempered = (2 * math.log(4 / 3) + math.log(4)) / 3  # 0.6539
    tempered = (2 * math.log(10 / 9) + math.log(10)) / 3  # 0.8378
    assert stats["replay_loss"] == pytest.approx(untempered, rel=1e-5)
    assert abs(stats["replay_loss"] - tempered) > 0.1
    assert stats["entropy"] == pytest.approx(-(0.1 * math.log(0.1) + 0.9 * math.log(0.9)), rel=1e-5)  # 0.3251


def test_replay_raises_the_likelihood_of_the_replayed_answers():
    model = tiny_model(seed=2)
    with torch.no_grad():
        before = hand_nll(model.policy).item()
    t = trainer(model, 1.0, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3))
    for _ in range(10):
        stats = t.step(QUERIES, RESPONSES, [0.0] * 4, replay=REPLAY)  # equal scores: PPO has nothing to say
    with torch.no_grad():
        after = hand_nll(model.policy).item()
    assert after < 0.7 * before, (before, after)
    assert stats["replay_loss"] < before


def test_the_joint_forward_scores_constrained_ppo_rows_as_alone_and_replay_rows_untempered():
    """PPO rows carrying grammar masks (some tokens banned at some positions) are scored in the joint forward
    exactly as without replay rows beside them (masked, at ppo.temperature); the replay rows get the full
    vocabulary at temperature 1."""
    model = tiny_model(seed=3)
    t = trainer(model, 1.0, temperature=0.6)
    allowed = []
    for k, r in enumerate(RESPONSES):  # ban token (k + 6) % 8 at every step (never a token the row took)
        bits = torch.full((len(r), 1), 0xFF, dtype=torch.int32)
        bits[:, 0] &= ~(1 << ((k + 6) % 8))
        allowed.append(bits)
    assert all((k + 6) % 8 not in r for k, r in enumerate(RESPONSES))
    rollout, _ = t._prepare(QUERIES, RESPONSES, SCORES, None, groups=None, allowed=allowed)
    rep = t._prepare_replay(REPLAY)
    idx, ridx = torch.tensor([1, 2]), torch.tensor([0, 1, 2])
    with torch.no_grad():
        (logp, values, logdist), replay_logp = t._joint_forward(rollout, idx, rep, ridx)
        alone_logp, alone_values, alone_logdist = t._policy_forward(
            rollout.input_ids[idx], rollout.attention_mask[idx], rollout.start, rollout.allowed[idx]
        )
        expected_nll = hand_nll(model.policy)
    assert torch.allclose(logp * rollout.action_mask[idx], alone_logp * rollout.action_mask[idx], atol=1e-5)
    acts = rollout.action_mask[idx].bool()  # the banned token at every action position, only there
    assert torch.isinf(logdist[0, acts[0], 7]).all() and torch.isinf(logdist[1, acts[1], 0]).all()
    assert torch.isfinite(logdist[0, ~acts[0]]).all()
    assert rl.nll_loss(replay_logp, rep.action_mask).item() == pytest.approx(expected_nll.item(), rel=1e-5)
