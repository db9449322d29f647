"""Generator rewards (Absolute Zero, R-Zero, Self-Challenging; DESIGN.md §5).

A proposal that passed every validity check is rewarded by how *learnable* it is for the current solver:
with p the solver's solve rate over k attempts,

    r = 1 - p   if 0 < p < 1        (hard but solvable: the solver fails sometimes)
    r = 0       if p in {0, 1}      (never solved may mean ill-posed; always solved is too easy)

Invalid proposals get fixed penalties: -1 when the answer could not be parsed into a task at all, -0.5 when it
parsed but failed a validity check (AZR's values). Valid proposals then pay a repetition penalty (R-Zero):
the size of their near-duplicate cluster within the batch divided by the batch size, times a weight that the
mixer may raise when it sees diversity collapse.

Everything here is a pure function of numbers and cluster keys, so it can be tested by hand.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Sequence

PENALTY_UNPARSABLE = -1.0
PENALTY_INVALID = -0.5


def learnability(solve_rate: float) -> float:
    """1 - p for 0 < p < 1, else 0."""
    if not 0.0 <= solve_rate <= 1.0:
        raise ValueError(f"solve rate must be in [0, 1], got {solve_rate}")
    return 1.0 - solve_rate if 0.0 < solve_rate < 1.0 else 0.0


@dataclass(frozen=True)
class ProposalOutcome:
    """What the loop learned about one proposal."""

    parsed: bool  # the answer could be turned into a task
    valid: bool  # ... and it passed every validity check
    solve_rate: float | None = None  # solver solve rate over k attempts (valid proposals only)
    cluster: str | None = None  # near-duplicate key (e.g. normalised-AST or behaviour hash)


def repetition_penalties(clusters: Sequence[str | None]) -> list[float]:
    """|C| / B for each item of a batch of B, where C is the item's cluster; None counts as its own cluster."""
    n = len(clusters)
    if n == 0:
        return []
    counts = Counter(c for c in clusters if c is not None)
    return [(counts[c] if c is not None else 1) / n for c in clusters]


def generator_rewards(outcomes: Sequence[ProposalOutcome], repetition_weight: float = 1.0) -> list[float]:
    """Scalar reward per proposal. The repetition penalty is computed over the valid proposals of the batch."""
    valid_idx = [i for i, o in enumerate(outcomes) if o.parsed and o.valid]
    rep = repetition_penalties([outcomes[i].cluster for i in valid_idx])
    rep_of = dict(zip(valid_idx, rep))
    rewards = []
    for i, o in enumerate(outcomes):
        if not o.parsed:
            rewards.append(PENALTY_UNPARSABLE)
        elif not o.valid:
            rewards.append(PENALTY_INVALID)
        else:
            if o.solve_rate is None:
                raise ValueError(f"proposal {i} is valid but has no solve rate")
            rewards.append(learnability(o.solve_rate) - repetition_weight * rep_of[i])
    return rewards
