"""pass@k against the closed form with binomial coefficients."""

from math import comb

import pytest
from hypothesis import given
from hypothesis import strategies as st

from selfplay.eval.passk import mean_pass_at_k, pass_at_k


def test_by_hand():
    assert pass_at_k(10, 0, 1) == 0.0
    assert pass_at_k(10, 10, 5) == 1.0
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert mean_pass_at_k([(4, 1), (4, 4)], 2) == pytest.approx(0.75)


@given(st.integers(1, 60).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_matches_binomial_form(nck):
    n, c, k = nck
    assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k), abs=1e-9)


def test_bad_arguments():
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError, match="at least 5 samples"):
        pass_at_k(3, 1, 5)
