"""Held-out change of several RL runs (one per seed) from their shared warm start, per run and pooled over seeds.

    python notes/paired_seeds.py runs/ws_v1/warmstart 80 runs/v1_w0/seed_0/fixed runs/v1_w1/seed_1/fixed ...
    PLOT=notes/ppo_fixed_r.png python notes/paired_seeds.py ...     # also a figure: training vs held-out
    AGAINST="runs/ctl_w0/seed_0/fixed runs/ctl_w1/seed_1/fixed" python notes/paired_seeds.py ...   # vs controls
    UNSEEN=runs/ws_wide/warmstart/heldout.jsonl python notes/paired_seeds.py ...   # also: tasks new to that set
    FOREST=notes/ppo_fixed8.png python notes/paired_seeds.py ...   # also a figure: every change and its interval
    BEFORE=runs/ws_ptx8/ws_T08_seed0.json python notes/paired_seeds.py WS 80 runs/ptx8_w0/T08_seed0.json   # two evals

For each run folder: the paired change on the warm start's held-out `test` split at iteration STEP (from the
checkpoint's state.json), on all tasks, on the levels the fixed-mode runs train on (1-2) and on level 3, greedy
pass@1, sampled pass@1 and "any" (pass@n: solved by at least one of the n samples). A run of seed k is paired with
the warm start evaluated with the same sampling seed, read from WARMSTART/../ws_seed{k}.json (`selfplay eval
WARMSTART --suite heldout --seed k --json ...`; seed 0 is the warm start's own evaluation), so the sampled changes
are on common random numbers. The pooled line averages each task's change over the runs, then bootstraps over tasks
(`selfplay.eval.compare.paired_delta`'s method): it covers task sampling, with seed-to-seed variation averaged in; the
spread over seeds is printed beside it. With PLOT=OUT.png: each run's training pass rate (TensorBoard
`solver/pass_rate`, 10-iteration mean) beside its held-out greedy pass@1 on levels 1-2 at every evaluation up to
STEP. With AGAINST="RUN ...": each run is paired with the control run of its seed at the same STEP instead of the
warm start (the same sampling seed, so again common random numbers). With UNSEEN=TASKS.jsonl: one more subset,
"new", of the held-out tasks whose program (AST fingerprint) is not in that file, e.g. an earlier test set that
results were already read on. With FOREST=OUT.png: a figure of every change printed (each seed's and the pooled one,
with its 95 % interval), one panel per subset and metric. A RUN may also be an evaluation JSON (`selfplay eval ...
--json`), and BEFORE=EVAL.json pairs every run with that evaluation instead, e.g. both models at another temperature.
"""

import itertools
import json
import os
import statistics
import sys
from pathlib import Path

import numpy as np

from selfplay.eval.compare import bootstrap_ci95, outcome_value
from selfplay.eval.evaluate import read_tasks

METRICS = (("greedy", "pass@1_greedy"), ("sampled", "pass@1"), ("any", "pass@n"))
SUBSETS = (("levels 1-2", {1, 2}), ("level 3", {3}), ("all", {1, 2, 3, 4}))


def value(row, metric: str) -> float:
    """One task's value: `outcome_value`'s greedy outcome or sampled share, or for "pass@n" whether any of the n
    samples solved it."""
    return float(row[2] > 0) if metric == "pass@n" else outcome_value(row, metric)


def state(run: Path, step: int) -> dict:
    return json.loads((run / "checkpoints" / f"step_{step}" / "state.json").read_text())


def run_seed(run: Path, step: int) -> int:
    """The sampling seed of a run folder (its config) or of an evaluation JSON (`selfplay eval --json`)."""
    if run.suffix == ".json":
        return int(json.loads(run.read_text())["options"]["seed"])
    return int(state(run, step)["config"]["run"]["seed"])


def per_task(run: Path, step: int) -> dict:
    """The test split's per-task outcomes of a run folder at iteration STEP, or of an evaluation JSON."""
    if run.suffix == ".json":
        return json.loads(run.read_text())["heldout"]["per_task"]["test"]
    st = state(run, step)
    if step != 0 and str(step) not in st["evals"]:
        sys.exit(f"{run} has no held-out evaluation at iteration {step} (it has: {', '.join(st['evals']) or 'none'})")
    evaluation = st["eval_before"] if step == 0 else st["evals"][str(step)]
    return evaluation["per_task"]["test"]


def warmstart_per_task(warmstart: Path, seed: int) -> dict:
    if seed == 0:
        return per_task(warmstart, 0)
    path = warmstart.parent / f"ws_seed{seed}.json"
    if not path.exists():
        sys.exit(f"{path} is missing: selfplay eval {warmstart} --suite heldout --seed {seed} --json {path}")
    return json.loads(path.read_text())["heldout"]["per_task"]["test"]


def heldout_levels(warmstart: Path) -> dict:
    """Held-out task id -> its level."""
    return {t.id: t.level for t in read_tasks(warmstart / "heldout.jsonl")}


def subsets(warmstart: Path, unseen: Path | None = None) -> list[tuple[str, set]]:
    """(name, held-out task ids) for each subset printed: SUBSETS by level, then with UNSEEN the tasks whose
    program is not in that file."""
    tasks = read_tasks(warmstart / "heldout.jsonl")
    out = [(name, {t.id for t in tasks if t.level in keep}) for name, keep in SUBSETS]
    if unseen is not None:
        old = {t.fingerprints["ast"] for t in read_tasks(unseen)}
        new = {t.id for t in tasks if t.fingerprints["ast"] not in old}
        if not new:
            sys.exit(f"UNSEEN: every held-out program of {warmstart} is in {unseen}: no new tasks")
        out.append(("new", new))
    return out


def main(warmstart: Path, step: int, runs: list[Path], against: list[Path] = (),
         unseen: Path | None = None, before_eval: Path | None = None) -> list[tuple]:
    """Prints the changes and returns them: (label, subset, metric name, change, ci low, ci high) per line."""
    rows = []
    groups = subsets(warmstart, unseen)
    controls = {run_seed(c, step): c for c in against}
    diffs = {(s, m): [] for s, _ in groups for _, m in METRICS}  # per run: {task: change}
    for run in runs:
        seed = run_seed(run, step)
        if against and seed not in controls:
            sys.exit(f"no control run of seed {seed} in AGAINST")
        before = (per_task(before_eval, 0) if before_eval else per_task(controls[seed], step) if against
                  else warmstart_per_task(warmstart, seed))
        after = per_task(run, step)
        for subset, keep in groups:
            ids = [i for i in before if i in keep]
            cells = []
            for name, metric in METRICS:  # paired over tasks, bootstrapped as selfplay.eval.compare.paired_delta does
                b = np.array([value(before[i], metric) for i in ids])
                a = np.array([value(after[i], metric) for i in ids])
                lo, hi = bootstrap_ci95(a - b)
                cells.append(f"{name} {b.mean():.3f} -> {a.mean():.3f} {(a - b).mean():+.3f} [{lo:+.3f}, {hi:+.3f}]")
                rows.append((f"seed {seed}", subset, name, float((a - b).mean()), lo, hi))
                diffs[subset, metric].append(dict(zip(ids, a - b)))
            print(f"{str(run):34s} seed {seed} @{step} {subset:10s} n={len(ids):3d}  " + "   ".join(cells))
    print(f"pooled over {len(runs)} runs (mean of each task's change; 95 % bootstrap over tasks; sd over seeds):")
    for subset, _ in groups:
        cells = []
        for name, metric in METRICS:
            per_run = diffs[subset, metric]
            ids = sorted(per_run[0])
            mean_per_task = np.array([statistics.mean(d[i] for d in per_run) for i in ids])
            lo, hi = bootstrap_ci95(mean_per_task)
            run_means = [statistics.mean(d.values()) for d in per_run]
            sd = statistics.stdev(run_means) if len(run_means) > 1 else 0.0
            cells.append(f"{name} {mean_per_task.mean():+.3f} [{lo:+.3f}, {hi:+.3f}] sd {sd:.3f}")
            rows.append((f"pooled ({len(runs)})", subset, name, float(mean_per_task.mean()), lo, hi))
        print(f"  {subset:10s} n={len(ids):3d}  " + "   ".join(cells))
    return rows


def forest(rows: list[tuple], title: str, out: Path) -> None:
    """A grid of panels, one row per metric and one column per subset: each seed's change and the pooled one
    (red), with 95 % intervals, and 0 marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    subsets = list(dict.fromkeys(r[1] for r in rows))
    metrics = list(dict.fromkeys(r[2] for r in rows))
    labels = list(dict.fromkeys(r[0] for r in rows))
    fig, axes = plt.subplots(len(metrics), len(subsets), squeeze=False, sharey=True,
                             figsize=(2.7 * len(subsets), (0.3 * len(labels) + 0.9) * len(metrics) + 0.6))
    for (i, metric), (j, subset) in itertools.product(enumerate(metrics), enumerate(subsets)):
        ax = axes[i, j]
        for label, _, _, mean, lo, hi in (r for r in rows if r[1:3] == (subset, metric)):
            pooled = label.startswith("pooled")
            ax.errorbar(mean, labels.index(label), xerr=[[mean - lo], [hi - mean]], fmt="D" if pooled else "o",
                        color="C3" if pooled else "C0", capsize=2)
        ax.axvline(0, color="grey", lw=0.8)
        ax.set_title(f"{subset}: {metric}", fontsize=9)
        ax.tick_params(labelsize=7)
    axes[0, 0].set_yticks(range(len(labels)), labels)
    axes[0, 0].invert_yaxis()
    fig.suptitle(title, fontsize=9)
    fig.supxlabel("held-out change [95 % CI]: greedy pass@1, sampled pass@1, any = pass@n", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


def plot(warmstart: Path, step: int, runs: list[Path], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from selfplay.runtime.tb import read_scalars

    levels = heldout_levels(warmstart)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    for run in runs:
        seed = int(state(run, step)["config"]["run"]["seed"])
        rates = [v for _, v in read_scalars(run)["solver/pass_rate"]][:step]
        smooth = [statistics.mean(rates[max(0, i - 9): i + 1]) for i in range(len(rates))]
        name = f"{run.parts[-3]} (seed {seed})" if len(run.parts) >= 3 else f"seed {seed}"  # runs/NAME/seed_K/fixed
        line, = left.plot(range(1, len(smooth) + 1), smooth, label=name)
        evals = state(run, step)["evals"]
        later = sorted((int(k), v["per_task"]["test"]) for k, v in evals.items() if int(k) <= step)
        points = [(0, warmstart_per_task(warmstart, seed))] + later
        xs = [x for x, _ in points]
        ys = [statistics.mean(float(pt[i][0]) for i in pt if levels[i] in (1, 2)) for _, pt in points]
        right.plot(xs, ys, marker="o", color=line.get_color(), label=name)
    left.set(title="training tasks: pass rate (sampled, 10-iteration mean)", xlabel="iteration", ylabel="pass rate")
    right.set(title="held-out test, levels 1-2: greedy pass@1", xlabel="iteration", ylabel="pass@1")
    for ax in (left, right):
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    against = [Path(p) for p in os.environ.get("AGAINST", "").split()]
    before_eval = Path(os.environ["BEFORE"]) if os.environ.get("BEFORE") else None
    changes = main(Path(sys.argv[1]), int(sys.argv[2]), [Path(p) for p in sys.argv[3:]], against,
                   Path(os.environ["UNSEEN"]) if os.environ.get("UNSEEN") else None, before_eval)
    if os.environ.get("FOREST"):
        versus = before_eval or ("its control (same seed)" if against else "the warm start")
        forest(changes, f"change at iteration {sys.argv[2]} against {versus}", Path(os.environ["FOREST"]))
    if os.environ.get("PLOT"):
        plot(Path(sys.argv[1]), int(sys.argv[2]), [Path(p) for p in sys.argv[3:]], Path(os.environ["PLOT"]))
