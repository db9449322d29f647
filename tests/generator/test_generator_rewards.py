"""Generator rewards: hand-computed values and properties."""

import pytest
from hypothesis import given, strategies as st

from generator.rewards import (
    PENALTY_INVALID,
    PENALTY_UNPARSABLE,
    ProposalOutcome,
    generator_rewards,
    learnability,
    repetition_penalties,
)


def test_learnability_band():
    assert learnability(0.0) == 0.0
    assert learnability(1.0) == 0.0
    assert learnability(0.25) == pytest.approx(0.75)
    assert learnability(0.875) == pytest.approx(0.125)
    with pytest.raises(ValueError):
        learnability(1.5)


def test_repetition_penalty_is_cluster_share():
    assert repetition_penalties(["a", "a", "b", None]) == [0.5, 0.5, 0.25, 0.25]
    assert repetition_penalties([]) == []


def test_rewards_by_hand():
    outcomes = [
        ProposalOutcome(parsed=False, valid=False),
        ProposalOutcome(parsed=True, valid=False),
        ProposalOutcome(parsed=True, valid=True, solve_rate=0.5, cluster="x"),
        ProposalOutcome(parsed=True, valid=True, solve_rate=0.25, cluster="x"),
        ProposalOutcome(parsed=True, valid=True, solve_rate=1.0, cluster="y"),
        ProposalOutcome(parsed=True, valid=True, solve_rate=0.0, cluster="z"),
    ]
    # 4 valid proposals: clusters x (2), y (1), z (1) -> penalties 0.5, 0.5, 0.25, 0.25
    r = generator_rewards(outcomes, repetition_weight=0.5)
    assert r == pytest.approx([PENALTY_UNPARSABLE, PENALTY_INVALID, 0.5 - 0.25, 0.75 - 0.25, -0.125, -0.125])


def test_valid_without_solve_rate_is_an_error():
    with pytest.raises(ValueError, match="no solve rate"):
        generator_rewards([ProposalOutcome(parsed=True, valid=True)])


@given(st.lists(st.tuples(st.booleans(), st.booleans(), st.floats(0, 1), st.sampled_from("abc")), max_size=20))
def test_invalid_never_beats_valid_unique(items):
    outcomes = [ProposalOutcome(p, p and v, s, c) for p, v, s, c in items]
    rewards = generator_rewards(outcomes, repetition_weight=0.0)
    for o, r in zip(outcomes, rewards):
        if not o.parsed:
            assert r == PENALTY_UNPARSABLE
        elif not o.valid:
            assert r == PENALTY_INVALID
        else:
            assert 0.0 <= r <= 1.0  # 1 - p rounds to 1.0 for p ~ 1e-300
