"""The solver's hybrid reward: each term computed on its own, weighted in config, logged
under its own name so ablations can switch terms on and off.

    correctness  share of hidden tests passed                                     in [0, 1]
    solved       1 when every hidden test passes, else 0 (the binary reward)      in {0, 1}
    efficiency   reference runtime / solution runtime on the tests, capped at 1   in [0, 1]   (only if all pass)
    quality      radon cyclomatic complexity and maintainability index,           in [0, 1]
                 relative to the reference: 0.5·min(1, cc_ref/cc) + 0.5·min(1, mi/mi_ref)
    progress     newly passing visible tests in a turn / number of visible tests  in [-1, 1] (multi-turn)
    penalty      −1 for each of: syntax error, banned API, timeout, empty answer   (weighted per kind)
    overlong     DAPO's soft length penalty near the token budget (reward.overlong_cache; added by the loop, which
                 knows each answer's tokens: `overlong_penalties`)                 in [-1, 0]

The default weights are correctness alone, as the article advises: shaped terms invite shortcuts, so they are
there for ablations, not by default. All functions are pure; the episode code gathers their inputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PENALTY_KINDS = ("syntax_error", "banned_api", "timeout", "empty_answer")


@dataclass
class RewardConfig:
    correctness: float = 1.0  # weight of the share of hidden tests passed
    solved: float = 0.0  # weight of 1 when every hidden test passes (binary reward: correctness=0 solved=1)
    efficiency: float = 0.0  # weight of reference/solution runtime (0 = off)
    quality: float = 0.0  # weight of radon complexity/maintainability relative to the reference (0 = off)
    progress: float = 0.0  # weight of newly passing visible tests per turn in multi-turn episodes (0 = off)
    syntax_error: float = 0.0  # penalty weight when the answer does not parse
    banned_api: float = 0.0  # penalty weight when the answer uses a banned module or call
    timeout: float = 0.0  # penalty weight when the answer ran out of time
    empty_answer: float = 0.0  # penalty weight when no code could be extracted
    # DAPO's soft overlong penalty, in tokens: an answer longer than ppo.max_new_tokens less this many loses up to 1,
    # linearly, reaching -1 at the budget (added to the reward the solver's PPO update trains on); 0 = off
    overlong_cache: int = 0


@dataclass
class RewardInputs:
    """What an episode observed; everything optional except the hidden-test counts."""

    hidden_passed: int
    hidden_total: int
    solution_time_s: float | None = None  # total runtime of the solution on the tests
    reference_time_s: float | None = None  # same for the reference solution
    solution_code: str | None = None  # for the quality term
    reference_code: str | None = None
    visible_passed_before: int = 0  # multi-turn: visible tests passing before this turn
    visible_passed_after: int = 0
    visible_total: int = 0
    flags: set[str] = field(default_factory=set)  # subset of PENALTY_KINDS


def correctness(passed: int, total: int) -> float:
    return passed / total if total > 0 else 0.0


def efficiency(solution_time_s: float | None, reference_time_s: float | None, all_passed: bool) -> float:
    """min(1, t_ref / t_sol) for a correct solution; 0 when incorrect or unmeasured."""
    if not all_passed or not solution_time_s or reference_time_s is None:
        return 0.0
    return min(1.0, reference_time_s / solution_time_s)


def code_metrics(code: str) -> tuple[float, float] | None:
    """(total cyclomatic complexity, maintainability index) by radon; None if radon cannot parse the code."""
    from radon.complexity import cc_visit
    from radon.metrics import mi_visit

    try:
        blocks = cc_visit(code)
        mi = mi_visit(code, multi=True)
    except (SyntaxError, ValueError, TypeError):
        return None
    return float(sum(b.complexity for b in blocks) or 1), float(mi)


def quality(solution_code: str | None, reference_code: str | None) -> float:
    if not solution_code or not reference_code:
        return 0.0
    sol, ref = code_metrics(solution_code), code_metrics(reference_code)
    if sol is None or ref is None:
        return 0.0
    (cc, mi), (cc_ref, mi_ref) = sol, ref
    return 0.5 * min(1.0, cc_ref / cc) + 0.5 * (min(1.0, mi / mi_ref) if mi_ref > 0 else 1.0)


def progress(before: int, after: int, total: int) -> float:
    return (after - before) / total if total > 0 else 0.0


def reward_terms(x: RewardInputs) -> dict[str, float]:
    """Every term, unweighted, by name (logged as solver/reward/<name>)."""
    unknown = x.flags - set(PENALTY_KINDS)
    if unknown:
        raise ValueError(f"unknown penalty flag(s) {sorted(unknown)}; known: {PENALTY_KINDS}")
    all_passed = x.hidden_total > 0 and x.hidden_passed == x.hidden_total
    terms = {
        "correctness": correctness(x.hidden_passed, x.hidden_total),
        "solved": float(all_passed),
        "efficiency": efficiency(x.solution_time_s, x.reference_time_s, all_passed),
        "quality": quality(x.solution_code, x.reference_code),
        "progress": progress(x.visible_passed_before, x.visible_passed_after, x.visible_total),
    }
    for kind in PENALTY_KINDS:
        terms[kind] = -1.0 if kind in x.flags else 0.0
    return terms


def total_reward(terms: dict[str, float], cfg: RewardConfig) -> float:
    """Σ weight · term. Terms with weight 0 are not computed by callers that care about cost (see `needed`)."""
    return sum(getattr(cfg, name) * value for name, value in terms.items())


def needed(cfg: RewardConfig) -> set[str]:
    """The terms with a non-zero weight: callers skip expensive measurements (timing, radon) for the rest."""
    return {
        name
        for name in ("correctness", "solved", "efficiency", "quality", "progress", *PENALTY_KINDS)
        if getattr(cfg, name) != 0.0
    }


def overlong_penalty(length: int, max_len: int, cache: int) -> float:
    """DAPO's soft overlong punishment (Yu et al. 2025) for an answer of `length` tokens under a budget of `max_len`
    with a cache of `cache` tokens: 0 up to max_len - cache, then (max_len - cache - length) / cache down to -1 at
    max_len, and -1 beyond. 0 when cache is 0 (off)."""
    if cache <= 0:
        return 0.0
    start = max_len - cache
    if length <= start:
        return 0.0
    return max(-1.0, (start - length) / cache)


def turn_lengths(mask) -> list[int]:
    """The tokens of each answer turn in a rollout's token mask (runs of 1: what the policy chose; 0: observations
    between turns)."""
    runs, current = [], 0
    for m in mask:
        if m:
            current += 1
        elif current:
            runs.append(current)
            current = 0
    return runs + [current] if current else runs


def overlong_penalties(masks, max_len: int, cache: int) -> list[float]:
    """Each rollout's overlong penalty from its token mask: its longest turn's (the budget `max_len`,
    ppo.max_new_tokens, holds per turn); all 0 when cache is 0."""
    return [overlong_penalty(max(turn_lengths(m), default=0), max_len, cache) for m in masks]
