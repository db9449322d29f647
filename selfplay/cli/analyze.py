"""`selfplay analyze paired WARMSTART RUN [RUN ...] --step N [...]`: the held-out change of RL runs (one per seed)
from their shared warm start, per run and pooled over seeds, built on selfplay/eval/compare.py.

    selfplay analyze paired runs/ppo/warmstart runs/ppo/seed_*/fixed --step 80
    selfplay analyze paired WS RUN ... --step 80 --against CONTROL ...   # each run against its seed's control run
    selfplay analyze paired WS RUN ... --step 80 --unseen OLD/heldout.jsonl  # also: tasks whose program OLD lacks
    selfplay analyze paired WS RUN ... --step 80 --forest forest.png --plot curves.png --json changes.json
    selfplay analyze paired WS EVAL.json ... --before WS_EVAL.json       # two `selfplay eval --json` files

For each run: the paired change on the warm start's held-out `test` split at iteration STEP (the checkpoint's
state.json), on all tasks, on levels 1-2 (those the fixed-mode runs train on) and on level 3, in greedy pass@1,
sampled pass@1 and "any" (pass@n: solved by at least one of the n samples). A run of seed k is paired with the warm
start evaluated with the same sampling seed, read from WARMSTART/../ws_seed{k}.json (`selfplay eval WARMSTART
--suite heldout --seed k --json WARMSTART/../ws_seed{k}.json`; seed 0 is the warm start's own evaluation), so the
sampled changes are on common random numbers. The pooled line is the mean change over every (run, task) cell with
the interval of `selfplay.eval.stats.paired_interval`: the runs share the warm start's tasks, so runs (seeds) and
tasks are resampled together (crossed), covering both; the spread of the runs' means is printed beside it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from pathlib import Path

from selfplay.runtime.checkpoint import STATE_FILE
from selfplay.runtime.errors import UserError
from selfplay.runtime.paths import RunPaths

METRICS = (("greedy", "pass@1_greedy"), ("sampled", "pass@1"), ("any", "pass@n"))
SUBSETS = (("levels 1-2", {1, 2}), ("level 3", {3}), ("all", {1, 2, 3, 4}))


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="analyze_command", metavar="ANALYSIS")
    p = sub.add_parser("paired", help="held-out change of RL runs from their warm start, per seed and pooled")
    p.add_argument("warmstart", metavar="WARMSTART", help="the warm start's run folder (its heldout.jsonl)")
    p.add_argument("runs", metavar="RUN", nargs="+", help="RL run folders (or `selfplay eval --json` files)")
    p.add_argument("--step", type=int, required=True, help="the iteration to read (a held-out evaluation there)")
    p.add_argument(
        "--against",
        metavar="RUN",
        nargs="+",
        default=[],
        help="control runs: each run is paired with the control of its seed at --step instead",
    )
    p.add_argument("--before", metavar="EVAL.json", help="pair every run with this evaluation instead")
    p.add_argument(
        "--unseen", metavar="TASKS.jsonl", help="one more subset: held-out tasks whose program is not in this file"
    )
    p.add_argument("--forest", metavar="PNG", help="a figure of every change with its 95 %% interval")
    p.add_argument("--plot", metavar="PNG", help="training pass rate beside held-out greedy pass@1, per run")
    p.add_argument("--json", metavar="FILE", help="write the changes as JSON rows")
    p.add_argument(
        "--evaluate",
        action="store_true",
        help="run the warm start's missing seeded evaluations (WARMSTART/../ws_seedK.json) first",
    )


def run(args) -> int:
    if args.analyze_command != "paired":
        raise UserError("say what to analyse: `selfplay analyze paired WARMSTART RUN ... --step N`")
    warmstart, runs = Path(args.warmstart), [Path(r) for r in args.runs]
    if args.evaluate and not args.before and not args.against:
        for seed in sorted({run_seed(r, args.step) for r in runs} - {0}):
            evaluate_warmstart(warmstart, seed)
    rows = paired(
        warmstart,
        args.step,
        runs,
        [Path(c) for c in args.against],
        Path(args.unseen) if args.unseen else None,
        Path(args.before) if args.before else None,
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                [dict(zip(("run", "subset", "metric", "change", "ci_low", "ci_high"), r)) for r in rows], indent=1
            )
        )
        print(f"wrote {args.json}")
    if args.forest:
        versus = args.before or ("its control (same seed)" if args.against else "the warm start")
        forest(rows, f"change at iteration {args.step} against {versus}", Path(args.forest))
    if args.plot:
        plot(warmstart, args.step, runs, Path(args.plot))
    return 0


def value(row, metric: str) -> float:
    """One task's value: `outcome_value`'s greedy outcome or sampled share, or for "pass@n" whether any of the n
    samples solved it."""
    from selfplay.eval.stats import outcome_value

    return float(row[2] > 0) if metric == "pass@n" else outcome_value(row, metric)


def state(run: Path, step: int) -> dict:
    path = RunPaths(run).checkpoints / f"step_{step}" / STATE_FILE
    if not path.exists():
        raise UserError(f"--step {step}: {run} has no checkpoint at iteration {step} ({path} is missing)")
    return json.loads(path.read_text())


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
        raise UserError(
            f"--step {step}: {run} has no held-out evaluation at iteration {step} "
            f"(it has: {', '.join(st['evals']) or 'none'})"
        )
    evaluation = st["eval_before"] if step == 0 else st["evals"][str(step)]
    return evaluation["per_task"]["test"]


def warmstart_per_task(warmstart: Path, seed: int) -> dict:
    if seed == 0:
        return per_task(warmstart, 0)
    path = warmstart.parent / f"ws_seed{seed}.json"
    if not path.exists():
        raise UserError(f"{path} is missing: selfplay eval {warmstart} --suite heldout --seed {seed} --json {path}")
    return json.loads(path.read_text())["heldout"]["per_task"]["test"]


def evaluate_warmstart(warmstart: Path, seed: int) -> None:
    """WARMSTART/../ws_seed{seed}.json, by `selfplay eval` with that sampling seed, unless it exists."""
    import subprocess
    import sys

    path = warmstart.parent / f"ws_seed{seed}.json"
    if path.exists():
        return
    tmp = path.with_name(f".{path.name}.partial")
    print(f"evaluating {warmstart} with sampling seed {seed} -> {path}", flush=True)
    cmd = [
        sys.executable,
        "-m",
        "selfplay",
        "eval",
        str(warmstart),
        "--suite",
        "heldout",
        "--seed",
        str(seed),
        "--json",
        str(tmp),
        "--plot",
        str(path.with_suffix(".png")),
    ]
    if subprocess.run(cmd).returncode != 0:
        raise UserError(f"--evaluate: `{' '.join(cmd[2:])}` failed")
    tmp.replace(path)


def subsets(warmstart: Path, unseen: Path | None = None) -> list[tuple[str, set]]:
    """(name, held-out task ids) for each subset printed: SUBSETS by level, then with --unseen the tasks whose
    program is not in that file."""
    from selfplay.eval.evaluate import read_tasks

    path = RunPaths(warmstart).heldout
    if not path.exists():
        raise UserError(f"WARMSTART: {path} is missing (is {warmstart} a warm-started run folder?)")
    tasks = read_tasks(path)
    out = [(name, {t.id for t in tasks if t.level in keep}) for name, keep in SUBSETS]
    if unseen is not None:
        old = {t.fingerprints["ast"] for t in read_tasks(unseen)}
        new = {t.id for t in tasks if t.fingerprints["ast"] not in old}
        if not new:
            raise UserError(f"--unseen: every held-out program of {warmstart} is in {unseen}: no new tasks")
        out.append(("new", new))
    return out


def paired(
    warmstart: Path,
    step: int,
    runs: list[Path],
    against: list[Path] = (),
    unseen: Path | None = None,
    before_eval: Path | None = None,
) -> list[tuple]:
    """Prints the changes and returns them: (label, subset, metric name, change, ci low, ci high) per line."""
    import numpy as np

    from selfplay.eval import stats
    from selfplay.eval.stats import bootstrap_ci95

    rows = []
    groups = subsets(warmstart, unseen)
    controls = {run_seed(c, step): c for c in against}
    diffs = {(s, m): [] for s, _ in groups for _, m in METRICS}  # per run: {task: change}
    for run in runs:
        seed = run_seed(run, step)
        if against and seed not in controls:
            raise UserError(f"--against: no control run of seed {seed}")
        before = (
            per_task(before_eval, 0)
            if before_eval
            else per_task(controls[seed], step)
            if against
            else warmstart_per_task(warmstart, seed)
        )
        after = per_task(run, step)
        for subset, keep in groups:
            ids = [i for i in before if i in keep]
            if not ids:  # e.g. a held-out set with no level-3 task
                print(f"{str(run):34s} seed {seed} @{step} {subset:10s} n=  0  (no task)")
                continue
            cells = []
            for name, metric in METRICS:  # paired over tasks, bootstrapped as stats.paired_delta does
                b = np.array([value(before[i], metric) for i in ids])
                a = np.array([value(after[i], metric) for i in ids])
                lo, hi = bootstrap_ci95(a - b)
                cells.append(f"{name} {b.mean():.3f} -> {a.mean():.3f} {(a - b).mean():+.3f} [{lo:+.3f}, {hi:+.3f}]")
                rows.append((f"seed {seed}", subset, name, float((a - b).mean()), lo, hi))
                diffs[subset, metric].append(dict(zip(ids, a - b)))
            print(f"{str(run):34s} seed {seed} @{step} {subset:10s} n={len(ids):3d}  " + "   ".join(cells))
    resamples = ""
    for subset, _ in groups:
        if not diffs[subset, METRICS[0][1]] or not diffs[subset, METRICS[0][1]][0]:
            continue
        cells = []
        for name, metric in METRICS:
            per_run = diffs[subset, metric]
            # every run's change on the tasks, as (0, change) pairs: the interval its design calls for (the runs
            # share the warm start's tasks, so seeds and tasks are resampled together)
            d = stats.paired_interval({i: (dict.fromkeys(run, 0.0), run) for i, run in enumerate(per_run)}, float)
            lo, hi = d["ci"]
            resamples = d["resamples"]
            run_means = [statistics.mean(d.values()) for d in per_run]
            sd = statistics.stdev(run_means) if len(run_means) > 1 else 0.0
            cells.append(f"{name} {d['delta']:+.3f} [{lo:+.3f}, {hi:+.3f}] sd {sd:.3f}")
            rows.append((f"pooled ({len(runs)})", subset, name, d["delta"], lo, hi))
        print(f"  {subset:10s} n={len(per_run[0]):3d}  " + "   ".join(cells))
    print(f"pooled over {len(runs)} runs above: 95 % bootstrap over {resamples}; sd of the runs' means")
    return rows


def forest(rows: list[tuple], title: str, out: Path) -> None:
    """A grid of panels, one row per metric and one column per subset: each seed's change and the pooled one
    (red), with 95 % intervals, and 0 marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r[1] for r in rows))
    metrics = list(dict.fromkeys(r[2] for r in rows))
    labels = list(dict.fromkeys(r[0] for r in rows))
    fig, axes = plt.subplots(
        len(metrics),
        len(names),
        squeeze=False,
        sharey=True,
        figsize=(2.7 * len(names), (0.3 * len(labels) + 0.9) * len(metrics) + 0.6),
    )
    for (i, metric), (j, subset) in itertools.product(enumerate(metrics), enumerate(names)):
        ax = axes[i, j]
        for label, _, _, mean, lo, hi in (r for r in rows if r[1:3] == (subset, metric)):
            pooled = label.startswith("pooled")
            ax.errorbar(
                mean,
                labels.index(label),
                xerr=[[mean - lo], [hi - mean]],
                fmt="D" if pooled else "o",
                color="C3" if pooled else "C0",
                capsize=2,
            )
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
    """Each run's training pass rate (TensorBoard `solver/pass_rate`, 10-iteration mean) beside its held-out greedy
    pass@1 on levels 1-2 at every evaluation up to STEP."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from selfplay.eval.evaluate import read_tasks
    from selfplay.runtime.tb import read_scalars

    levels = {t.id: t.level for t in read_tasks(RunPaths(warmstart).heldout)}
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    for run in runs:
        seed = run_seed(run, step)
        rates = [v for _, v in read_scalars(run)["solver/pass_rate"]][:step]
        smooth = [statistics.mean(rates[max(0, i - 9) : i + 1]) for i in range(len(rates))]
        name = f"{run.parts[-3]} (seed {seed})" if len(run.parts) >= 3 else f"seed {seed}"  # OUT/NAME/seed_K/fixed
        (line,) = left.plot(range(1, len(smooth) + 1), smooth, label=name)
        evals = state(run, step)["evals"]
        later = sorted((int(k), v["per_task"]["test"]) for k, v in evals.items() if int(k) <= step)
        points = [(0, warmstart_per_task(warmstart, seed))] + later
        ys = [statistics.mean(float(pt[i][0]) for i in pt if levels[i] in (1, 2)) for _, pt in points]
        right.plot([x for x, _ in points], ys, marker="o", color=line.get_color(), label=name)
    left.set(title="training tasks: pass rate (sampled, 10-iteration mean)", xlabel="iteration", ylabel="pass rate")
    right.set(title="held-out test, levels 1-2: greedy pass@1", xlabel="iteration", ylabel="pass@1")
    for ax in (left, right):
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")
