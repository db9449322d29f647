"""Solver hybrid reward: each term by hand, the default is correctness alone."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from solver.rewards import RewardConfig, RewardInputs, code_metrics, needed, quality, reward_terms, total_reward

SIMPLE = "def f(xs):\n    return sorted(xs)\n"
BRANCHY = (
    "def f(xs):\n    out = []\n    for x in xs:\n        if x > 0:\n            if x % 2:\n"
    "                out.append(x)\n"
    "            elif x > 10:\n                out.append(-x)\n    return sorted(out)\n"
)


def test_default_is_correctness_alone():
    terms = reward_terms(
        RewardInputs(
            hidden_passed=3,
            hidden_total=4,
            solution_time_s=2.0,
            reference_time_s=1.0,
            solution_code=BRANCHY,
            reference_code=SIMPLE,
            flags={"timeout"},
        )
    )
    assert terms["correctness"] == 0.75
    assert terms["timeout"] == -1.0
    assert total_reward(terms, RewardConfig()) == 0.75
    assert needed(RewardConfig()) == {"correctness"}


def test_efficiency_only_for_correct_solutions():
    ok = reward_terms(RewardInputs(hidden_passed=4, hidden_total=4, solution_time_s=2.0, reference_time_s=1.0))
    assert ok["efficiency"] == 0.5
    fast = reward_terms(RewardInputs(hidden_passed=4, hidden_total=4, solution_time_s=0.5, reference_time_s=1.0))
    assert fast["efficiency"] == 1.0
    wrong = reward_terms(RewardInputs(hidden_passed=3, hidden_total=4, solution_time_s=0.5, reference_time_s=1.0))
    assert wrong["efficiency"] == 0.0


def test_quality_prefers_simpler_code():
    cc_simple, _ = code_metrics(SIMPLE)
    cc_branchy, _ = code_metrics(BRANCHY)
    assert cc_branchy > cc_simple
    assert quality(SIMPLE, SIMPLE) == pytest.approx(1.0)
    assert quality(BRANCHY, SIMPLE) < 0.9
    assert quality("def f(:", SIMPLE) == 0.0


def test_progress_and_weights():
    terms = reward_terms(
        RewardInputs(
            hidden_passed=1,
            hidden_total=2,
            visible_passed_before=1,
            visible_passed_after=3,
            visible_total=4,
            flags={"syntax_error"},
        )
    )
    assert terms["progress"] == 0.5
    cfg = RewardConfig(correctness=1.0, progress=0.2, syntax_error=0.5)
    assert total_reward(terms, cfg) == pytest.approx(0.5 + 0.1 - 0.5)


def test_unknown_flag_is_an_error():
    with pytest.raises(ValueError, match="unknown penalty flag"):
        reward_terms(RewardInputs(hidden_passed=0, hidden_total=1, flags={"typo"}))


@given(st.integers(0, 50), st.integers(0, 50))
def test_correctness_is_a_share(passed, extra):
    total = passed + extra
    c = reward_terms(RewardInputs(hidden_passed=passed, hidden_total=total))["correctness"]
    assert 0.0 <= c <= 1.0
    assert c == (passed / total if total else 0.0)


@given(st.integers(0, 50), st.integers(0, 50))
def test_solved_is_the_binary_reward(passed, extra):
    total = passed + extra
    terms = reward_terms(RewardInputs(hidden_passed=passed, hidden_total=total))
    assert terms["solved"] == (1.0 if total and extra == 0 else 0.0)
    binary = RewardConfig(correctness=0.0, solved=1.0)
    assert total_reward(terms, binary) == terms["solved"] and needed(binary) == {"solved"}
