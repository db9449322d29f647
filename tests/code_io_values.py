"""What the code_io tests share: plain Python values (Hypothesis strategies: what a program may take and return)."""

from __future__ import annotations

from hypothesis import strategies as st

scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=6)
)
hashables = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3).map(tuple), max_leaves=4)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(hashables, inner, max_size=3)
        | st.sets(hashables, max_size=3)
    ),
    max_leaves=8,
)
