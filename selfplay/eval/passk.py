"""pass@k, the unbiased estimator of the Codex paper (Chen et al., 2021).

With n samples of which c are correct, the probability that at least one of k samples drawn without
replacement is correct is

    pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n - c + 1}^{n} (1 - k / i)

computed in the product form, which is exact enough and never overflows.
"""

from __future__ import annotations

from collections.abc import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    if not 0 <= c <= n or k < 1:
        raise ValueError(f"need 0 <= c <= n and k >= 1, got n={n}, c={c}, k={k}")
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per task, got {n}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def mean_pass_at_k(samples: Sequence[tuple[int, int]], k: int) -> float:
    """Mean over tasks of pass@k, each task given as (n, c)."""
    if not samples:
        return float("nan")
    return sum(pass_at_k(n, c, k) for n, c in samples) / len(samples)
