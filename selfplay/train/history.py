"""What a run records of itself and tells its reader: the per-iteration history (checkpointed; `compare` reads it
back), what the run has spent, the closing summary, and the log lines around the iterations.

Everything here is a pure function of the run's records (history entries, held-out evaluations, counters), so that
`selfplay compare` and the tests read a run's figures the way the loop wrote them.
"""

from __future__ import annotations

import statistics
import sys

import numpy as np
from tqdm import tqdm

from selfplay.eval.evaluate import BREAKDOWNS
from selfplay.eval.stats import paired_delta

# per-iteration figures kept in the run's history (checkpointed) and summed up at the end: history key -> scalar
HISTORY = {
    "solve_rate": "solver/pass_rate",
    "validity": "generator/validity_rate",
    "level": "mixer/level",
    "parse_rate": "generator/parse_rate",
    "generator_in_band": "generator/in_band_rate",
    "generator_never_solved": "generator/never_solved_rate",
    "generator_always_solved": "generator/always_solved_rate",
    "solver_in_band": "solver/in_band_rate",
    "generator_share": "mixer/share/generator",
    "generator_batch_share": "solver/share/generator",
    "generator_reward": "generator/reward_mean",
    "alarm_solver_collapse": "mixer/alarm/solver_collapse",
    "alarm_generator_diversity": "mixer/alarm/generator_diversity",
    "alarm_kl_blowup": "mixer/alarm/kl_blowup",
}
COLLAPSE_ALARMS = ("alarm_solver_collapse", "alarm_generator_diversity", "alarm_kl_blowup")  # not the trust alarms
SUMMARY_WINDOW = 10  # the closing summary compares the first and the last this many iterations
# what a run has spent, summed over its iterations and ranks (`compute/` scalars, the checkpoint's and the summary's
# `compute`): the solver episodes its PPO batches held, every solver episode sampled (those measuring proposals
# beyond the generator's share too) and their policy-sampled tokens, the proposals made and the tokens of the
# generator's kept answers (none with generator.source=random_edits; answers struck by the novelty screen and drawn
# again are not counted), and the programs the sandbox executed (cache hits left out; held-out evaluation too)
COMPUTE = (
    "ppo_episodes",
    "solver_episodes",
    "solver_tokens",
    "generator_proposals",
    "generator_tokens",
    "sandbox_execs",
)


def history_entry(step: int, metrics: dict) -> dict:
    """One iteration's figures for the run's history: None where the iteration had none (or NaN)."""
    entry: dict[str, float | None] = {"step": step}
    for key, tag in HISTORY.items():
        value = metrics.get(tag)
        entry[key] = None if value is None or not np.isfinite(value) else float(value)
    return entry


def heldout_changes(before: dict, after: dict) -> dict:
    """Per held-out split, the paired change of greedy pass@1 between two evaluations with its task count and a
    bootstrap 95 % interval over the tasks (stats.paired_delta); splits without per-task outcomes are left out."""
    b, a = before.get("per_task", {}), after.get("per_task", {})
    return {
        split: paired_delta(b[split], a[split], "pass@1_greedy")
        for split in sorted(set(b) & set(a))
        if set(b[split]) & set(a[split])
    }


def window_means(history: list[dict], n: int = SUMMARY_WINDOW) -> dict:
    """Means of each history figure over the first and the last n iterations (they overlap in a run shorter than
    2n), for the closing summary; None where no iteration of the window had the figure."""
    out = {}
    for name, part in (("first_iterations", history[:n]), ("last_iterations", history[-n:])):
        means: dict[str, float | None] = {"n": len(part)}
        for key in HISTORY:
            values = [h[key] for h in part if h.get(key) is not None]
            means[key] = statistics.fmean(values) if values else None
        out[name] = means
    return out


def run_summary(
    run_dir,
    mode: str,
    steps: int,
    seconds: float,
    warmstart_s: float | None,
    evals: dict[str, dict],
    history: list[dict],
    corpus_by_source: dict,
    compute: dict,
) -> dict:
    """The run so far (`SelfPlay.summary`): held-out results before and after (with their paired change), the
    corpus by source, what it spent, and the first and last iterations' means."""
    evaluated = sorted(evals, key=int)
    before = evals.get(evaluated[0], {}) if evaluated else {}
    after = evals.get(evaluated[-1], {}) if evaluated else {}
    validity = [h["validity"] for h in history if h.get("validity") is not None]
    return {
        "run_dir": str(run_dir),
        "mode": mode,
        "steps": steps,
        "seconds": seconds,
        "warmstart_seconds": warmstart_s,
        "selfplay_seconds": seconds - (warmstart_s or 0.0),
        "heldout_before": {s: r.get("pass@1_greedy") for s, r in before.items() if s not in BREAKDOWNS},
        "heldout_after": {s: r.get("pass@1_greedy") for s, r in after.items() if s not in BREAKDOWNS},
        "heldout_change": heldout_changes(before, after) if len(evaluated) > 1 else {},
        "corpus_by_source": corpus_by_source,
        "compute": dict(compute),
        "validity_rate": statistics.mean(validity) if validity else None,
        **window_means(history),
    }


def verdict(change: dict) -> str:
    """The paired change of a held-out figure in words: its 95 % interval above 0, below 0, or across it."""
    low, high = change["ci95"]
    if low > 0:
        return "the solver improved"
    if high < 0:
        return "the solver got worse"
    return "no measurable change (the interval holds 0)"


def print_summary(s: dict) -> None:
    """The closing summary (`run_summary`) as a few lines on stdout."""
    ws = s["warmstart_seconds"]
    took = (f"warm start {ws / 60:.1f} min, " if ws is not None else "") + f"{s['steps']} iterations"
    lines = [f"run {s['run_dir']} ({s['mode']}): {took} in {s['selfplay_seconds'] / 60:.1f} min"]
    for split in s["heldout_after"]:
        b, a = s["heldout_before"].get(split), s["heldout_after"][split]
        change = s["heldout_change"].get(split)
        paired = (
            f" ({change['tasks']} tasks; change {change['delta']:+.3f}, 95 % CI "
            f"[{change['ci95'][0]:+.3f}, {change['ci95'][1]:+.3f}])"
            if change
            else ""
        )
        lines.append(
            f"  held-out {split:<22} greedy pass@1 {_fmt(b)} -> {_fmt(a)}{paired}"
            + (f": {verdict(change)}" if change else "")
        )
    lines.append(f"  corpus by source: {s['corpus_by_source']}")
    if s["validity_rate"] is not None:
        lines.append(f"  generator validity rate (mean): {s['validity_rate']:.2f}")
    first, last = s["first_iterations"], s["last_iterations"]
    shown = [k for k in HISTORY if first.get(k) is not None or last.get(k) is not None]
    if shown:
        heads = f"first {first['n']}", f"last {last['n']}"
        lines.append(f"  {'per iteration (mean)':<26} {heads[0]:>9} {heads[1]:>9}")
        lines += [f"  {HISTORY[k]:<26} {_fmt(first.get(k)):>9} {_fmt(last.get(k)):>9}" for k in shown]
    print("\n".join(lines), flush=True)


def say(msg: str) -> None:
    """A log line on stdout that does not glue onto a progress bar (tqdm clears and redraws the bars around it)."""
    tqdm.write(msg, file=sys.stdout)
    sys.stdout.flush()


def run_estimate(iteration_s: float, left: int, eval_every: int) -> str:
    """One line after the first iteration: how long the iterations left will take at its pace."""
    evals = f", plus {left // eval_every} periodic evaluations" if eval_every and left >= eval_every else ""
    return (
        f"the first iteration took {iteration_s:.0f} s: the {left} left take about {iteration_s * left / 60:.0f} "
        f"min at that pace{evals}, plus the closing evaluation"
    )


def _fmt(x) -> str:
    return "  n/a" if x is None else f"{x:.3f}"
