"""Generator rewards (Absolute Zero, R-Zero, Self-Challenging; docs/selfplay.md).

A proposal that passed every validity check is rewarded by how *learnable* it is for the current solver. With p
the solver's solve rate over k attempts, `generator.reward.learnability` chooses

    one_minus_p     r = 1 - p      if 0 < p < 1, else 0   (Absolute Zero: hard but solvable)
    p_one_minus_p   r = p (1 - p)  if 0 < p < 1, else 0   (SFL's learnability: the variance of the outcome)

(never solved may mean ill-posed; always solved is too easy), or a function registered with
`@register_learnability(NAME)` (`LEARNABILITIES`; docs/extending.md "A reward"). Invalid proposals get fixed
penalties: -1 when the answer could not be parsed into a task at all, -0.5 when it parsed but failed a validity
check (AZR's values). An answer the sampler had to close inside its token budget (generator.close_reserve) that then
fails a check gets `generator.reward.closed_invalid`: "invalid" (-0.5, as any parsed answer) or "unparsable" (-1, as
the cut-off answer it would have been without the closing).

Valid proposals then pay R-Zero's repetition penalty: the size |C| of their near-duplicate cluster among the
batch's valid proposals, divided by the batch size B (every proposal of the iteration, valid or not), times a
weight w that the mixer raises when the valid proposals repeat each other. The valid reward never goes below
`VALID_FLOOR`, half-way between the invalid penalty and 0:

    r_valid = max(VALID_FLOOR, learnability(p) - w |C| / B)

so whatever weight the mixer sets and however few of the batch's proposals are valid, a valid proposal always
scores strictly above an invalid one (R-Zero clips at 0 for the same reason; the floor sits below 0 so that a
repeated valid proposal still scores below a unique one that the solver always or never solves).

Everything here is a pure function of numbers and cluster keys, so it can be tested by hand.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

PENALTY_UNPARSABLE = -1.0
PENALTY_INVALID = -0.5
VALID_FLOOR = PENALTY_INVALID / 2  # the lowest reward a valid proposal can get: strictly above any invalid one
LEARNABILITY = ("one_minus_p", "p_one_minus_p")  # the built-in learnabilities (LEARNABILITIES: every registered one)
CLOSED_INVALID = {"invalid": PENALTY_INVALID, "unparsable": PENALTY_UNPARSABLE}

Learnability = Callable[[float], float]  # solve rate p, 0 < p < 1 -> the valid proposal's reward before repetition
LEARNABILITIES: dict[str, Learnability] = {}  # name -> function, filled by register_learnability


def register_learnability(name: str) -> Callable[[Learnability], Learnability]:
    """`@register_learnability(NAME)` on `f(p) -> float`: `generator.reward.learnability=NAME` then rewards a valid
    proposal solved at rate p (0 < p < 1; p in {0, 1} gets 0 without asking f) with f(p) in [0, 1], less the
    repetition penalty, never below VALID_FLOOR. A taken name is refused."""

    def add(fn: Learnability) -> Learnability:
        if name in LEARNABILITIES:
            raise ValueError(f"generator.reward.learnability {name!r} is taken")
        LEARNABILITIES[name] = fn
        return fn

    return add


@register_learnability("one_minus_p")
def one_minus_p(p: float) -> float:
    """Absolute Zero's: hard but solvable."""
    return 1.0 - p


@register_learnability("p_one_minus_p")
def p_one_minus_p(p: float) -> float:
    """SFL's: the variance of the outcome."""
    return p * (1.0 - p)


@dataclass
class GeneratorRewardConfig:
    # one_minus_p (1 - p, Absolute Zero) | p_one_minus_p (p (1 - p), SFL) | a name registered with
    # @register_learnability; one_minus_p gave more valid proposals in band on the tiny default's validation split
    # (lab/selfplay_measured.md: "The two learnability options under the current default")
    learnability: str = "one_minus_p"
    # the penalty of an answer closed inside its budget (generator.close_reserve) that fails a check: "invalid" (-0.5)
    # or "unparsable" (-1, what it would have scored cut off)
    closed_invalid: str = "invalid"


def check_learnability(kind: str) -> str:
    if kind not in LEARNABILITIES:
        raise ValueError(f"generator.reward.learnability must be one of {', '.join(LEARNABILITIES)}, got {kind!r}")
    return kind


def check_closed_invalid(kind: str) -> str:
    if kind not in CLOSED_INVALID:
        raise ValueError(f"generator.reward.closed_invalid must be one of {', '.join(CLOSED_INVALID)}, got {kind!r}")
    return kind


def learnability(solve_rate: float, kind: str = "one_minus_p") -> float:
    """The registered learnability `kind` of p for 0 < p < 1 (1 - p, p (1 - p), ...), else 0; a value outside
    [0, 1] is refused naming the learnability."""
    check_learnability(kind)
    if not 0.0 <= solve_rate <= 1.0:
        raise ValueError(f"solve rate must be in [0, 1], got {solve_rate}")
    if not 0.0 < solve_rate < 1.0:
        return 0.0
    value = float(LEARNABILITIES[kind](solve_rate))
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"generator.reward.learnability {kind!r} gave {value} at p = {solve_rate}, outside [0, 1]")
    return value


def in_band(solve_rate: float | None) -> bool:
    """The solver solved the task on some but not all of its attempts."""
    return solve_rate is not None and 0.0 < solve_rate < 1.0


@dataclass(frozen=True)
class ProposalOutcome:
    """What the loop learned about one proposal."""

    parsed: bool  # the answer could be turned into a task
    valid: bool  # ... and it passed every validity check
    solve_rate: float | None = None  # solver solve rate over k attempts (valid proposals only)
    cluster: str | None = None  # near-duplicate key (e.g. normalised-AST or behaviour hash)
    closed: bool = False  # its answer was closed inside the token budget by the sampler (generator.close_reserve)


def repetition_penalties(clusters: Sequence[str | None], batch_size: int | None = None) -> list[float]:
    """|C| / B for each of the given items, where C is the item's cluster among them and B is `batch_size`
    (default: the number of items); None counts as its own cluster."""
    n = len(clusters) if batch_size is None else batch_size
    if n < len(clusters):
        raise ValueError(f"batch size {n} is smaller than the {len(clusters)} items in it")
    counts = Counter(c for c in clusters if c is not None)
    return [(counts[c] if c is not None else 1) / n for c in clusters]


def diversity(outcomes: Sequence[ProposalOutcome]) -> float | None:
    """Unique near-duplicate clusters among the valid proposals / valid proposals (None when none is valid; a
    valid proposal without a cluster key counts as unique). Invalid proposals do not enter: a batch with few valid
    proposals is not a repetitive one."""
    clusters = [o.cluster for o in outcomes if o.parsed and o.valid]
    if not clusters:
        return None
    return (len({c for c in clusters if c is not None}) + sum(c is None for c in clusters)) / len(clusters)


def generator_rewards(
    outcomes: Sequence[ProposalOutcome],
    repetition_weight: float = 1.0,
    learnability_kind: str = "one_minus_p",
    closed_invalid: str = "invalid",
) -> list[float]:
    """Scalar reward per proposal of one batch (all of the iteration's proposals: B = len(outcomes))."""
    if repetition_weight < 0:
        raise ValueError(f"repetition weight must be >= 0, got {repetition_weight}")
    check_learnability(learnability_kind)
    check_closed_invalid(closed_invalid)
    valid_idx = [i for i, o in enumerate(outcomes) if o.parsed and o.valid]
    rep = repetition_penalties([outcomes[i].cluster for i in valid_idx], batch_size=len(outcomes))
    rep_of = dict(zip(valid_idx, rep))
    rewards = []
    for i, o in enumerate(outcomes):
        if not o.parsed:
            rewards.append(PENALTY_UNPARSABLE)
        elif not o.valid:
            rewards.append(CLOSED_INVALID[closed_invalid] if o.closed else PENALTY_INVALID)
        else:
            if o.solve_rate is None:
                raise ValueError(f"proposal {i} is valid but has no solve rate")
            score = learnability(o.solve_rate, learnability_kind) - repetition_weight * rep_of[i]
            rewards.append(max(VALID_FLOOR, score))
    return rewards
