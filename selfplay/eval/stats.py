"""Intervals for comparisons of evaluations over seeds (training runs) and held-out tasks.

A comparison of two arms is a table of per-task differences D[s, t], one row per seed. What the interval must
resample depends on how the tasks were drawn, the comparison's **design**:

- `crossed`: every seed evaluated the *same* tasks (one shared warm start, so one held-out draw). A task that is
  easy for arm B and hard for arm A is so in every seed: the task effect is common to the rows, and the mean's
  variance is about var(seed)/S + var(task)/T + var(rest)/(S T). The bootstrap resamples seeds and tasks together:
  one draw of S seed indices and one of T task indices, the mean taken over the crossed cells.
- `nested`: each seed drew its own tasks (each seed its own warm start and held-out draw): the task effects of
  different seeds are independent. The bootstrap resamples seeds, then the tasks of each drawn seed.

Resampling tasks within each seed of a crossed design (the nested bootstrap on shared tasks) treats the common task
effect as if it were independent S times over and gives intervals too narrow: on the variance components of the
project's own records (seed sd 0.015, task sd 0.15, residual sd 0.16; 4 seeds x 400 tasks) its nominal 95 %
covers the truth about 85 % of the time, the crossed bootstrap about 95 % (tests/selfplay/eval/test_stats.py
simulates both). `design_of` reads the design from the task ids, so a comparison cannot use the wrong one.

With one seed both designs are the task bootstrap. Levels: `level` is the two-sided coverage before correction;
`k` > 1 comparisons (choosing a default among k candidates) widen each interval to level 1 - (1 - level) / k
(Bonferroni), so the chance that any of the k covers wrongly stays at most 1 - level.

Everything here is pure numpy and seeded: the same inputs give the same interval."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

import numpy as np

CROSSED, NESTED = "crossed", "nested"
DESIGNS = (CROSSED, NESTED)
RESAMPLES = {
    CROSSED: "seeds and tasks together (crossed: the seeds share their tasks)",
    NESTED: "seeds, then tasks within each seed (nested: each seed drew its own tasks)",
}


def percentiles(level: float = 0.95, k: int = 1) -> tuple[float, float]:
    """The lower and upper percentiles (0-100) of a two-sided interval at `level`, Bonferroni-corrected for `k`
    comparisons."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if k < 1:
        raise ValueError(f"k (the number of comparisons) must be >= 1, got {k}")
    alpha = (1 - level) / k
    return 100 * alpha / 2, 100 * (1 - alpha / 2)


def bootstrap_ci(values, n_boot: int = 4000, seed: int = 0, level: float = 0.95, k: int = 1) -> list[float]:
    """Percentile bootstrap interval of the mean of `values` (resampled with replacement, seeded)."""
    values = np.asarray(values, dtype=float)
    if values.size == 0:
        raise ValueError("no values to bootstrap")
    boot = np.random.default_rng(seed).choice(values, size=(n_boot, len(values)), replace=True).mean(axis=1)
    lo, hi = np.percentile(boot, percentiles(level, k))
    return [float(lo), float(hi)]


def bootstrap_ci95(values, n_boot: int = 4000, seed: int = 0) -> list[float]:
    """Percentile bootstrap 95 % interval of the mean of `values` (the task bootstrap of one evaluation)."""
    return bootstrap_ci(values, n_boot, seed)


def _counts(rng: np.random.Generator, n_boot: int, n: int) -> np.ndarray:
    """(n_boot, n) multiplicities of a resample of n items with replacement."""
    return rng.multinomial(n, np.full(n, 1.0 / n), size=n_boot).astype(float)


def crossed_boot(table: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Bootstrap means of a (seeds, tasks) table, seeds and tasks resampled together (one task draw per replicate,
    used for every drawn seed)."""
    s, t = table.shape
    ws = _counts(rng, n_boot, s) if s > 1 else np.ones((n_boot, 1))
    wt = _counts(rng, n_boot, t)
    return np.einsum("bs,st,bt->b", ws, table, wt) / (s * t)


def nested_boot(rows: Sequence[np.ndarray], n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Bootstrap means of per-seed rows of differing tasks, seeds resampled, then each drawn seed's tasks (every task
    of every seed weighted alike)."""
    s = len(rows)
    sizes = np.array([len(r) for r in rows], dtype=float)
    ws = _counts(rng, n_boot, s) if s > 1 else np.ones((n_boot, 1))
    totals = np.zeros(n_boot)
    for j, row in enumerate(rows):
        # each of the ws[b, j] copies of seed j gets its own task resample: their summed totals are one multinomial
        # draw of ws[b, j] * len(row) tasks
        totals += rng.multinomial(ws[:, j].astype(np.int64) * len(row), np.full(len(row), 1.0 / len(row))) @ row
    return totals / (ws @ sizes)


def design_of(task_sets: Sequence[set]) -> str:
    """`crossed` when every seed has the same tasks (one held-out draw shared by all), else `nested` (each seed
    drew its own: independent draws may still repeat a task, which is part of their sampling)."""
    if all(s == task_sets[0] for s in task_sets[1:]):
        return CROSSED
    return NESTED


def paired_interval(
    pairs: Mapping, value, n_boot: int = 4000, seed: int = 0, level: float = 0.95, k: int = 1, design: str | None = None
) -> dict:
    """The change from arm A to arm B over seeds and tasks, with the interval its design calls for.

    `pairs`: {seed: (A's per-task rows, B's)}, each {task_id: row}; `value(row) -> float`. Per seed only the tasks
    both arms evaluated count. `design` None reads it from the task ids (`design_of`). Returns seeds, tasks (cells),
    before, after, delta (the mean over every (seed, task) cell), ci (at `level`, corrected for `k`), level, k,
    design and `resamples` (what the interval covers, in words)."""
    rows_a, rows_b, task_sets, ids_by_seed = [], [], [], []
    for before, after in pairs.values():
        ids = sorted(set(before) & set(after))
        if ids:
            rows_a.append(np.array([value(before[i]) for i in ids], dtype=float))
            rows_b.append(np.array([value(after[i]) for i in ids], dtype=float))
            task_sets.append(set(ids))
            ids_by_seed.append(ids)
    if not rows_a:
        raise ValueError("the two arms share no task in any seed")
    design = design or design_of(task_sets)
    if design not in DESIGNS:
        raise ValueError(f"design must be one of {', '.join(DESIGNS)}, got {design!r}")
    diffs = [b - a for a, b in zip(rows_a, rows_b)]
    rng = np.random.default_rng(seed)
    if design == CROSSED:
        if any(s != task_sets[0] for s in task_sets[1:]):
            raise ValueError("a crossed design needs the same tasks in every seed")
        boot = crossed_boot(np.stack(diffs), n_boot, rng)
    else:
        boot = nested_boot(diffs, n_boot, rng)
    lo, hi = np.percentile(boot, percentiles(level, k))
    a, b = np.concatenate(rows_a), np.concatenate(rows_b)
    return {
        "seeds": len(diffs),
        "tasks": int(len(a)),
        "before": float(a.mean()),
        "after": float(b.mean()),
        "delta": float((b - a).mean()),
        "ci": [float(lo), float(hi)],
        "level": level,
        "k": k,
        "design": design,
        "resamples": RESAMPLES[design] if len(diffs) > 1 else "tasks (one seed)",
    }


OUTCOME_METRICS = ("pass@1_greedy", "pass@1")  # what a per-task outcome row [greedy solved, n, c] gives


def outcome_value(row, metric: str) -> float:
    """One task's value in a per-task row [greedy solved, n, c]: the greedy outcome or the sampled share c/n."""
    return float(row[0]) if metric == "pass@1_greedy" else (row[2] / row[1] if row[1] else 0.0)


def paired_delta(before: dict, after: dict, metric: str = "pass@1", n_boot: int = 4000, seed: int = 0) -> dict:
    """The change of `metric` between two evaluations, paired over the tasks both saw.

    `before`/`after`: {task_id: [greedy solved, n, c]} (evaluate.per_task_outcomes). Per task the value is the
    greedy outcome (metric "pass@1_greedy") or the sampled solve share c/n ("pass@1", the unbiased pass@1). Returns
    the means, their difference and a percentile bootstrap 95 % interval of it (tasks resampled with replacement,
    `n_boot` times, seeded). The interval covers task sampling only: the evaluation's own sampling noise is in the
    per-task values, and a second seed of the training run is a separate question."""
    if metric not in OUTCOME_METRICS:
        raise ValueError(f"metric must be one of {', '.join(OUTCOME_METRICS)}, got {metric!r}")
    ids = sorted(set(before) & set(after))
    if not ids:
        raise ValueError("the two evaluations share no task")
    b = np.array([outcome_value(before[i], metric) for i in ids])
    a = np.array([outcome_value(after[i], metric) for i in ids])
    diff = a - b
    return {
        "tasks": len(ids),
        "before": float(b.mean()),
        "after": float(a.mean()),
        "delta": float(diff.mean()),
        "ci95": bootstrap_ci95(diff, n_boot, seed),
    }


def significant(ci: Sequence[float]) -> bool:
    """Whether an interval excludes zero."""
    return ci[0] > 0 or ci[1] < 0


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value): an arm's figure over its seeds."""
    values = list(values)
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)
