"""A learnability of the generator's reward as an extension point (docs/extending.md "A reward"): the registry
`LEARNABILITIES` (generator/rewards.py), the worked example of the docs, docs/examples/uncertainty_reward.py,
chosen by `generator.reward.learnability` and run through the loop's reward stage, and the refusals."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from docs.examples.uncertainty_reward import uncertainty
from generator.rewards import (
    LEARNABILITIES,
    LEARNABILITY,
    PENALTY_INVALID,
    VALID_FLOOR,
    ProposalOutcome,
    generator_rewards,
    learnability,
    register_learnability,
)
from selfplay.runtime.config import load_config
from selfplay.runtime.errors import UserError
from selfplay.train.proposals import SharedProposal, reward_proposals
from selfplay.train.setup import validate_config
from tests.generator.test_family_example import guide_block


def test_the_built_in_learnabilities_and_the_example_are_registered_by_name():
    assert LEARNABILITY == ("one_minus_p", "p_one_minus_p") and set(LEARNABILITY) < set(LEARNABILITIES)
    assert LEARNABILITIES["uncertainty"] is uncertainty  # the example registered itself on import


@pytest.mark.parametrize(
    ("p", "expected"), [(0.0, 0.0), (0.125, 0.25), (0.25, 0.5), (0.5, 1.0), (0.875, 0.25), (1.0, 0.0)]
)
def test_uncertainty_by_hand(p, expected):
    assert learnability(p, "uncertainty") == pytest.approx(expected)


def proposal(task_id: str | None, cluster: str | None, parsed: bool = True) -> SharedProposal:
    task = {"id": task_id} if task_id is not None else None
    rejection = None if task_id is not None else ("unparsable" if not parsed else "trivial_fail")
    return SharedProposal(task, rejection, parsed, cluster, 0, "", False, False)


def test_the_loops_reward_stage_takes_the_learnability_the_config_names():
    """`reward_proposals` (selfplay/train/proposals.py) with `generator.reward` from load_config: two valid
    proposals of one cluster, one unique, one invalid and one unparsable, in a batch of B = 5 at weight 1."""
    cfg = load_config(None, ["generator.reward.learnability=uncertainty"])
    validate_config(cfg)  # the name is accepted where a run starts
    shared = [
        proposal("a", "c1"),
        proposal("b", "c1"),
        proposal("c", "c2"),
        proposal(None, None),
        proposal(None, None, parsed=False),
    ]
    rates = {"a": 0.5, "b": 0.25, "c": 0.75}
    out = reward_proposals(shared, [], rates, 1.0, cfg.generator.reward)
    assert out.rewards == pytest.approx([1.0 - 2 / 5, 0.5 - 2 / 5, 0.5 - 1 / 5, -0.5, -1.0])


@given(
    rates=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=8),
    clusters=st.lists(st.sampled_from("abc"), min_size=8, max_size=8),
    weight=st.floats(0.0, 1e3),
)
def test_a_valid_proposal_scores_above_every_invalid_one_whatever_the_weight(rates, clusters, weight):
    outcomes = [ProposalOutcome(True, True, p, c) for p, c in zip(rates, clusters)]
    outcomes.append(ProposalOutcome(True, False))
    rewards = generator_rewards(outcomes, weight, "uncertainty")
    assert all(VALID_FLOOR <= r <= 1.0 for r in rewards[:-1]) and rewards[-1] == PENALTY_INVALID < VALID_FLOOR


def test_an_unregistered_name_is_refused_naming_the_key_and_the_names():
    cfg = load_config(None, ["generator.reward.learnability=uncertainy"])
    names = r"one_minus_p, p_one_minus_p, (.*, )?uncertainty(, .*)?"  # the built-in ones first, then as registered
    with pytest.raises(UserError, match=rf"^generator.reward.learnability must be one of {names}, got 'uncertainy'$"):
        validate_config(cfg)


def test_a_taken_name_and_a_value_outside_0_1_are_refused_naming_the_learnability():
    with pytest.raises(ValueError, match="'uncertainty' is taken"):
        register_learnability("uncertainty")(lambda p: p)
    register_learnability("too_much")(lambda p: 2.0)
    try:
        with pytest.raises(ValueError, match=r"'too_much' gave 2.0 at p = 0.5, outside \[0, 1\]"):
            learnability(0.5, "too_much")
        assert learnability(1.0, "too_much") == 0.0  # p in {0, 1}: 0 without asking it
    finally:
        del LEARNABILITIES["too_much"]


def test_docs_example_is_the_module_the_test_runs():
    """docs/extending.md shows docs/examples/uncertainty_reward.py's learnability as it is."""
    block, module = guide_block("## 8. A reward")
    assert block.startswith("@register_learnability(") and block in module and "def uncertainty(" in module
