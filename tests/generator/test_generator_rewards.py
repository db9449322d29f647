"""Generator rewards: hand-computed values and properties."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from generator.rewards import (
    CLOSED_INVALID,
    LEARNABILITY,
    PENALTY_INVALID,
    PENALTY_UNPARSABLE,
    VALID_FLOOR,
    ProposalOutcome,
    diversity,
    generator_rewards,
    learnability,
    repetition_penalties,
)
from selfplay.train.mixer import MixerConfig


def test_learnability_band():
    assert learnability(0.0) == 0.0
    assert learnability(1.0) == 0.0
    assert learnability(0.25) == pytest.approx(0.75)
    assert learnability(0.875) == pytest.approx(0.125)
    with pytest.raises(ValueError):
        learnability(1.5)


def test_learnability_p_one_minus_p():
    assert learnability(0.0, "p_one_minus_p") == 0.0
    assert learnability(1.0, "p_one_minus_p") == 0.0
    assert learnability(0.5, "p_one_minus_p") == pytest.approx(0.25)
    assert learnability(0.25, "p_one_minus_p") == pytest.approx(0.1875)
    assert learnability(0.75, "p_one_minus_p") == learnability(0.25, "p_one_minus_p")
    with pytest.raises(ValueError, match="one_minus_p, p_one_minus_p"):
        learnability(0.5, "sfl")


def test_repetition_penalty_is_cluster_share_of_the_batch():
    assert repetition_penalties(["a", "a", "b", None]) == [0.5, 0.5, 0.25, 0.25]
    assert repetition_penalties(["a", "a"], batch_size=8) == [0.25, 0.25]
    assert repetition_penalties([]) == []
    with pytest.raises(ValueError, match="smaller"):
        repetition_penalties(["a", "b"], batch_size=1)


def test_rewards_by_hand():
    outcomes = [
        ProposalOutcome(parsed=False, valid=False),
        ProposalOutcome(parsed=True, valid=False, cluster="x"),  # an invalid twin does not count in x's cluster
        ProposalOutcome(parsed=True, valid=True, solve_rate=0.5, cluster="x"),
        ProposalOutcome(parsed=True, valid=True, solve_rate=0.25, cluster="x"),
        ProposalOutcome(parsed=True, valid=True, solve_rate=1.0, cluster="y"),
        ProposalOutcome(parsed=True, valid=True, solve_rate=0.0, cluster="z"),
    ]
    # a batch of 6, 4 of them valid: clusters x (2), y (1), z (1) -> penalties 2/6, 2/6, 1/6, 1/6
    r = generator_rewards(outcomes, repetition_weight=0.5)
    assert r == pytest.approx([PENALTY_UNPARSABLE, PENALTY_INVALID, 0.5 - 1 / 6, 0.75 - 1 / 6, -1 / 12, -1 / 12])
    # at weight 3 the x pair would score 0.5 - 1 and 0.75 - 1: the floor holds them above the invalid penalty
    r = generator_rewards(outcomes, repetition_weight=3.0)
    assert r[2:] == pytest.approx([VALID_FLOOR, VALID_FLOOR, VALID_FLOOR, VALID_FLOOR])
    r = generator_rewards(outcomes, repetition_weight=0.5, learnability_kind="p_one_minus_p")
    assert r[2:] == pytest.approx([0.25 - 1 / 6, 0.1875 - 1 / 6, -1 / 12, -1 / 12])


def test_the_one_valid_proposal_of_a_batch_beats_the_invalid_ones():
    """A batch of 8 with one valid proposal, never solved: it pays 1/8 of the weight, not all of it."""
    outcomes = [ProposalOutcome(parsed=True, valid=True, solve_rate=0.0, cluster="a")]
    outcomes += [ProposalOutcome(parsed=True, valid=False)] * 4 + [ProposalOutcome(parsed=False, valid=False)] * 3
    r = generator_rewards(outcomes, repetition_weight=1.0)
    assert r[0] == pytest.approx(-1 / 8)
    assert r[0] > PENALTY_INVALID == max(r[1:])
    for weight in (1.5, 2.25, MixerConfig().repetition_weight_max):
        assert generator_rewards(outcomes, repetition_weight=weight)[0] > PENALTY_INVALID


def test_a_closed_answer_that_fails_a_check_pays_the_chosen_penalty():
    closed = ProposalOutcome(parsed=True, valid=False, closed=True)
    plain = ProposalOutcome(parsed=True, valid=False)
    assert generator_rewards([closed, plain]) == [PENALTY_INVALID, PENALTY_INVALID]
    assert generator_rewards([closed, plain], closed_invalid="unparsable") == [PENALTY_UNPARSABLE, PENALTY_INVALID]
    with pytest.raises(ValueError, match="closed_invalid"):
        generator_rewards([closed], closed_invalid="cut")


def test_valid_without_solve_rate_is_an_error():
    with pytest.raises(ValueError, match="no solve rate"):
        generator_rewards([ProposalOutcome(parsed=True, valid=True)])
    with pytest.raises(ValueError, match=">= 0"):
        generator_rewards([], repetition_weight=-1.0)
    with pytest.raises(ValueError, match="learnability"):
        generator_rewards([], learnability_kind="nope")


def test_diversity_counts_the_valid_proposals_only():
    invalid = [ProposalOutcome(parsed=True, valid=False, cluster="q"), ProposalOutcome(parsed=False, valid=False)]
    one = [ProposalOutcome(parsed=True, valid=True, solve_rate=0.0, cluster="a")]
    assert diversity(one + invalid * 5) == 1.0  # 1 valid of 11: not a diversity collapse
    assert diversity(invalid) is None
    twins = [ProposalOutcome(parsed=True, valid=True, solve_rate=0.5, cluster=c) for c in ("a", "a", "b", None)]
    assert diversity(twins + invalid) == pytest.approx(3 / 4)


outcome = st.one_of(
    st.just(ProposalOutcome(parsed=False, valid=False)),
    st.builds(
        lambda c, closed: ProposalOutcome(parsed=True, valid=False, cluster=c, closed=closed),
        st.sampled_from("abc"),
        st.booleans(),
    ),
    st.builds(
        lambda p, c, closed: ProposalOutcome(parsed=True, valid=True, solve_rate=p, cluster=c, closed=closed),
        st.one_of(st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0]), st.floats(0, 1)),
        st.one_of(st.none(), st.sampled_from("abc")),
        st.booleans(),
    ),
)
weights = st.one_of(st.floats(0, MixerConfig().repetition_weight_max), st.floats(0, 1e6))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(outcome, min_size=1, max_size=24),
    weights,
    st.sampled_from(LEARNABILITY),
    st.sampled_from(sorted(CLOSED_INVALID)),
)
def test_a_valid_proposal_never_scores_below_an_invalid_one(outcomes, weight, kind, closed_invalid):
    """Whatever the repetition weight (every value the mixer can set, and far beyond), the solve rates, the
    cluster sizes, the mix of valid, invalid and unparsable proposals in the batch, and the penalty of an answer
    closed inside its budget (a closed valid one is paid as any valid one)."""
    rewards = generator_rewards(
        outcomes, repetition_weight=weight, learnability_kind=kind, closed_invalid=closed_invalid
    )
    valid = [r for o, r in zip(outcomes, rewards) if o.valid]
    invalid = [r for o, r in zip(outcomes, rewards) if o.parsed and not o.valid]
    unparsable = [r for o, r in zip(outcomes, rewards) if not o.parsed]
    assert all(
        r == (CLOSED_INVALID[closed_invalid] if o.closed else PENALTY_INVALID)
        for o, r in zip(outcomes, rewards)
        if o.parsed and not o.valid
    )
    assert all(r == PENALTY_UNPARSABLE for r in unparsable)
    assert all(VALID_FLOOR <= r <= 1.0 for r in valid)
    if valid and (invalid or unparsable):
        assert min(valid) > max(invalid + unparsable)


@settings(max_examples=200, deadline=None)
@given(st.lists(outcome, min_size=1, max_size=24), weights, weights, st.sampled_from(LEARNABILITY))
def test_more_weight_or_more_repeats_never_pays_more(outcomes, w1, w2, kind):
    lo, hi = sorted((w1, w2))
    r_lo = generator_rewards(outcomes, lo, kind)
    r_hi = generator_rewards(outcomes, hi, kind)
    assert all(b <= a for a, b in zip(r_lo, r_hi))
    # one more valid twin of the first valid proposal: the first one's reward does not rise
    first = next((i for i, o in enumerate(outcomes) if o.valid and o.cluster is not None), None)
    if first is not None:
        twin = outcomes + [ProposalOutcome(parsed=True, valid=True, solve_rate=0.5, cluster=outcomes[first].cluster)]
        assert generator_rewards(twin, lo, kind)[first] <= r_lo[first]


def test_the_learnability_option_is_checked_before_a_run_starts():
    from selfplay.runtime.config import load_config
    from selfplay.runtime.errors import UserError
    from selfplay.train.loop import SelfPlay

    cfg = load_config(None, ["generator.reward.learnability=p_one_minus_p"])
    SelfPlay._validate(cfg)
    with pytest.raises(UserError, match="generator.reward.learnability must be one of one_minus_p, p_one_minus_p"):
        SelfPlay._validate(load_config(None, ["generator.reward.learnability=sfl"]))
