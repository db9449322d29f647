"""Plots of an evaluation: one PNG with a panel per question a researcher asks of a checkpoint.

    plot_eval(results, "runs/x/eval/step_40.png")   # results: the dict `selfplay eval` writes as JSON

Panels, those of the suites evaluated (each says "no data" when its part of the results is empty, e.g. a run without
a generator):
    held-out pass@1 by split at this checkpoint (greedy, sampled pass@1, pass@k)
    held-out greedy pass@1 over the run's evaluations (one line per split)
    generator validity rate over iterations
    measured solve rates of generator-made tasks (histogram; the learnable band 0 < p < 1 is what it is paid for)
    generator tasks, new distinct programs and their mean solve rate by creation step (diversity, difficulty)
    frozen snapshot of generated tasks and HumanEval (greedy and sampled pass@1)

matplotlib with the Agg backend (no display needed); every function takes plain dicts, so plots can be redrawn
from saved JSON.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from selfplay.eval.evaluate import BREAKDOWNS  # noqa: E402
from selfplay.eval.real_code import TITLES as REAL_CODE_TITLES  # noqa: E402

BAR_KEYS = ("pass@1_greedy", "pass@1")  # bars per split; pass@k is added when present
LABELS = {"pass@1_greedy": "greedy pass@1", "pass@1": "sampled pass@1"}  # legend names of result keys


def _no_data(ax, title: str, why: str) -> None:
    ax.set_title(title)
    ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes, color="grey")
    ax.set_xticks([])
    ax.set_yticks([])


def _pass_keys(rows: list[dict]) -> list[str]:
    extra = sorted({k for r in rows for k in r if k.startswith("pass@") and k not in BAR_KEYS})
    return [k for k in BAR_KEYS if any(k in r for r in rows)] + extra


def bars_by_group(ax, groups: dict[str, dict], title: str, why: str = "no results") -> None:
    """Grouped bars: one group per name (split, suite), one bar per pass@ metric present."""
    groups = {name: res for name, res in groups.items() if isinstance(res, dict) and res.get("tasks", 1)}
    keys = _pass_keys(list(groups.values()))
    if not groups or not keys:
        _no_data(ax, title, why)
        return
    width = 0.8 / len(keys)
    for j, key in enumerate(keys):
        xs = [i + (j - (len(keys) - 1) / 2) * width for i in range(len(groups))]
        bars = ax.bar(xs, [res.get(key) or 0.0 for res in groups.values()], width, label=LABELS.get(key, key))
        ax.bar_label(bars, fmt="%.2f", fontsize=6)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([name.replace("_", "\n") for name in groups], fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("pass rate")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper right")


def lines_over_steps(
    ax, series: dict[str, list], title: str, ylabel: str, mean: float | None = None, why: str = "no points yet"
) -> None:
    """One line per name from [[step, value], ...] points."""
    series = {name: pts for name, pts in series.items() if pts}
    if not series:
        _no_data(ax, title, why)
        return
    for name, pts in series.items():
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3, label=name)
    if mean is not None:
        ax.axhline(mean, linestyle="--", color="grey", linewidth=1, label=f"mean {mean:.2f}")
    ax.set_ylim(-0.02, 1.05)
    steps = [p[0] for pts in series.values() for p in pts]
    if max(steps) - min(steps) < 2:  # one or two iterations: keep whole-number ticks around them
        ax.set_xlim(min(steps) - 1, max(steps) + 1)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("iteration")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7)


def solve_rate_hist(ax, solve_rates: dict | None, why: str = "no measured generator tasks") -> None:
    title = "solve rates of generated tasks"
    hist = (solve_rates or {}).get("histogram")
    if not hist or not sum(hist["counts"]):
        _no_data(ax, title, why)
        return
    edges, counts = hist["edges"], hist["counts"]
    ax.bar(edges[:-1], counts, width=[b - a for a, b in zip(edges, edges[1:])], align="edge", edgecolor="white")
    ax.set_xlim(0, 1)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("solver solve rate p (share of samples that passed)")
    ax.set_ylabel("tasks")
    shares = [
        (name, solve_rates.get(key))
        for name, key in (("p=0", "never_solved"), ("0<p<1", "learnable"), ("p=1", "always_solved"))
    ]
    ax.set_title(title + "\n" + ", ".join(f"{n}: {v:.0%}" for n, v in shares if v is not None), fontsize=10)


def diversity_over_steps(ax, diversity: dict | None, why: str = "no generator tasks") -> None:
    title = "generated tasks by creation step"
    timeline = (diversity or {}).get("by_step") or []
    if not timeline:
        _no_data(ax, title, why)
        return
    steps = [p["step"] for p in timeline]
    ax.bar(steps, [p["tasks"] for p in timeline], color="lightsteelblue", label="tasks")
    ax.bar(steps, [p["new_programs"] for p in timeline], width=0.5, color="steelblue", label="new distinct programs")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("iteration (creation step)")
    ax.set_ylabel("count")
    ratio = diversity.get("distinct_ratio")
    ax.set_title(title + (f" (distinct {ratio:.0%})" if ratio is not None else ""))
    measured = [(p["step"], p["solve_rate_mean"]) for p in timeline if p.get("solve_rate_mean") is not None]
    handles, labels = ax.get_legend_handles_labels()
    if measured:  # the solve rate of each step's tasks on a second axis: is the generator tracking the solver?
        twin = ax.twinx()
        (line,) = twin.plot(
            [m[0] for m in measured], [m[1] for m in measured], color="darkorange", marker="o", markersize=3
        )
        twin.set_ylim(-0.02, 1.05)
        twin.set_ylabel("mean solve rate")
        handles, labels = handles + [line], labels + ["mean solve rate"]
    ax.legend(handles, labels, fontsize=7, loc="lower right")


def plot_eval(results: dict, path: str | Path) -> Path:
    """Draw the evaluation `results` (the JSON of `selfplay eval`) into one PNG at `path`: the panels of the suites
    evaluated (all six for `--suite all`, 16 x 9 inches; `--suite heldout` its two), each with "no data" where its
    part is empty."""
    generator = results.get("generator") or {}
    skipped = {
        suite: f"not evaluated (--suite {suite})"
        for suite in ("heldout", "humaneval", "generator")
        if suite not in results
    }
    heldout = {k: v for k, v in (results.get("heldout") or {}).items() if k not in BREAKDOWNS}
    validity = results.get("validity_over_time") or generator.get("validity") or {}
    others = {"generated\nsnapshot": generator.get("snapshot"), "HumanEval": results.get("humaneval")}
    others.update({title: results.get(suite) for suite, title in REAL_CODE_TITLES.items()})  # real_code.py's suites
    panels = []  # (shown, draw(ax)) in reading order
    panels.append(
        (
            "heldout" in results,
            lambda ax: bars_by_group(
                ax, heldout, f"held-out pass@1, step {results.get('step', '?')}", skipped.get("heldout", "no results")
            ),
        )
    )
    panels.append(
        (
            "heldout" in results or bool(results.get("heldout_over_time")),
            lambda ax: lines_over_steps(
                ax,
                results.get("heldout_over_time") or {},
                "held-out greedy pass@1 over the run",
                "greedy pass@1",
                why="no evaluations in the run's history",
            ),
        )
    )
    panels.append(
        (
            "generator" in results or bool(results.get("validity_over_time")),
            lambda ax: lines_over_steps(
                ax,
                {"validity": validity.get("by_step") or []},
                "generator validity rate",
                "valid proposals / proposals",
                validity.get("mean"),
                why="no iterations with proposals",
            ),
        )
    )
    panels.append(
        (
            "generator" in results,
            lambda ax: solve_rate_hist(
                ax, generator.get("solve_rates"), skipped.get("generator", "no measured generator tasks")
            ),
        )
    )
    panels.append(
        (
            "generator" in results,
            lambda ax: diversity_over_steps(
                ax, generator.get("diversity"), skipped.get("generator", "no generator tasks")
            ),
        )
    )
    panels.append(
        (
            "generator" in results or "humaneval" in results or any(s in results for s in REAL_CODE_TITLES),
            lambda ax: bars_by_group(
                ax,
                {k: _as_group(v) for k, v in others.items() if v},
                ", ".join(k.replace("\n", " ") for k, v in others.items() if v) or "generated snapshot, HumanEval",
                _last_panel_note(skipped),
            ),
        )
    )
    draws = [draw for shown, draw in panels if shown]
    cols = min(3, max(1, len(draws)))
    rows = max(1, -(-len(draws) // 3))
    fig, axes = plt.subplots(rows, cols, figsize=(16 * cols / 3, 4.5 * rows), squeeze=False)
    for ax, draw in zip(axes.flat, draws):
        draw(ax)
    if not draws:
        _no_data(axes[0, 0], "evaluation", "nothing evaluated")
    for ax in list(axes.flat)[max(1, len(draws)) :]:
        ax.set_visible(False)
    fig.suptitle(f"{results.get('checkpoint', '')}", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _last_panel_note(skipped: dict) -> str:
    if "humaneval" in skipped and "generator" in skipped:
        return "not evaluated (--suite humaneval, generator)"
    return "no snapshot tasks" if "humaneval" in skipped else "no results"


def _as_group(res: dict) -> dict:
    """HumanEval counts problems, not tasks: one shape for bars_by_group."""
    return {"tasks": res.get("tasks", res.get("problems", 0)), **res}
