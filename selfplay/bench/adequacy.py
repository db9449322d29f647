"""`selfplay bench adequacy`: the share of tasks whose hidden tests tell their reference from its mutants.

    selfplay bench adequacy [--n 200] [--levels 1 2 3 4] [--mutants 8] [--min-kill 0.8] [--seed 0]
                            [--run PATH [PATH ...]] [--corpus-limit 200] [--workers W] [--timeout 2.0] [--json OUT]

It makes `--n` valid procedural tasks (an equal share of each level, `generator.build.generate_tasks`), measures
each one's hidden tests against `--mutants` mutants of its reference in the process sandbox, and prints the share of
tasks that pass (kill share >= `--min-kill`, or no mutant possible) with its 95 % Wilson interval, per family and
level, the distribution of kill shares and the kill rate of each mutation operator. With `--run`, it measures the
same way the generator-made tasks (source `generator`) of one or more corpora, each given as a run folder or a
corpus file: pooled, each task once (by id), up to `--corpus-limit` of them (a seeded sample). `--json` writes the
summaries and one line per task (its kill share and one surviving mutant).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from collections import defaultdict

from selfplay.runtime.errors import UserError

CHUNK = 25  # tasks measured per sandbox batch (one progress line each)
Z95 = 1.959963984540054  # the normal quantile of a two-sided 95 % interval
BINS = ((0.0, 0.5), (0.5, 0.8), (0.8, 1.0), (1.0, 1.0))  # kill-share bins, [lo, hi); the last is exactly 1


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--n", type=int, default=200, help="procedural tasks to measure (default 200; 0 = none)")
    parser.add_argument(
        "--levels", type=int, nargs="+", choices=[1, 2, 3, 4], default=[1, 2, 3, 4], help="levels (default 1-4)"
    )
    parser.add_argument("--mutants", type=int, default=8, help="mutants per task, k (default 8)")
    parser.add_argument("--min-kill", type=float, default=0.8, help="share of mutants to kill to pass (default 0.8)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the procedural tasks and the corpus sample")
    parser.add_argument(
        "--run",
        metavar="PATH",
        nargs="+",
        help="also measure the generator-made tasks of these corpora (run folders or corpus.sqlite files), pooled",
    )
    parser.add_argument("--corpus-limit", type=int, default=200, help="corpus tasks to sample at most (default 200)")
    parser.add_argument("--workers", type=int, default=0, help="sandbox workers (0 = one per usable CPU)")
    parser.add_argument("--timeout", type=float, default=2.0, help="seconds per test of a mutant (default 2)")
    parser.add_argument("--json", metavar="OUT", help="also write the figures and per-task lines as JSON")


def _bin_name(lo: float, hi: float) -> str:
    return "1.0" if lo == hi else f"[{lo:.1f}, {hi:.1f})"


def wilson(passed: int, n: int, z: float = Z95) -> tuple[float, float] | None:
    """The Wilson score interval of a share `passed`/`n` (95 % with the default z); None for n = 0."""
    if n <= 0:
        return None
    p = passed / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def summarise(rows: list[dict]) -> dict:
    """Pass share, kill-share distribution, per family/level and per operator figures of measured rows (each with
    family, level, mutants, killed, passed, operators: {operator: [made, killed]})."""
    shares = sorted(r["killed"] / r["mutants"] for r in rows if r["mutants"])
    histogram = {
        _bin_name(lo, hi): sum(1 for s in shares if (s == 1.0 if lo == hi else lo <= s < hi)) for lo, hi in BINS
    }
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        groups[f"{r['family']}/L{r['level']}"].append(r)
    operators: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in rows:
        for op, (made, killed) in r["operators"].items():
            operators[op][0] += made
            operators[op][1] += killed
    return {
        "tasks": len(rows),
        "passed": sum(r["passed"] for r in rows),
        "pass_share": sum(r["passed"] for r in rows) / len(rows) if rows else None,
        "pass_share_wilson95": wilson(sum(r["passed"] for r in rows), len(rows)),
        "no_mutant": sum(1 for r in rows if not r["mutants"]),
        "mutants": sum(r["mutants"] for r in rows),
        "kill_share": {
            "mean": statistics.fmean(shares) if shares else None,
            "median": statistics.median(shares) if shares else None,
            "p10": shares[int(0.1 * (len(shares) - 1))] if shares else None,
            "min": shares[0] if shares else None,
            "histogram": histogram,
        },
        "by_family_level": {
            name: {
                "tasks": len(g),
                "passed": sum(r["passed"] for r in g),
                "pass_share": sum(r["passed"] for r in g) / len(g),
                "mean_kill_share": statistics.fmean(s)
                if (s := [r["killed"] / r["mutants"] for r in g if r["mutants"]])
                else None,
            }
            for name, g in sorted(groups.items())
        },
        "operators": {
            op: {"made": made, "killed": killed, "kill_share": killed / made if made else None}
            for op, (made, killed) in sorted(operators.items())
        },
    }


def measure_tasks(tasks: list, sb, settings, timeout_s: float, label: str) -> list[dict]:
    """One row per task (see summarise), measured CHUNK tasks per sandbox batch with a progress line each."""
    from generator.adequacy import measure_many

    rows = []
    start = time.perf_counter()
    for lo in range(0, len(tasks), CHUNK):
        chunk = tasks[lo : lo + CHUNK]
        for task, res in zip(chunk, measure_many(chunk, sb, settings, timeout_s=timeout_s)):
            ops: dict[str, list[int]] = defaultdict(lambda: [0, 0])
            for op, killed in res.operators:
                ops[op][0] += 1
                ops[op][1] += int(killed)
            rows.append(
                {
                    "id": task.id,
                    "family": task.family,
                    "level": task.level,
                    "mutants": res.mutants,
                    "killed": res.killed,
                    "passed": res.passed,
                    "survivor": res.survivor.diff if res.survivor else None,
                    "operators": dict(ops),
                }
            )
        print(f"{label}: {len(rows)}/{len(tasks)} tasks measured ({time.perf_counter() - start:.0f} s)", flush=True)
    return rows


def _print(name: str, summary: dict) -> None:
    if not summary["tasks"]:
        print(f"\n{name}: no task")
        return
    ks = summary["kill_share"]
    lo, hi = summary["pass_share_wilson95"]
    print(
        f"\n{name}: {summary['passed']}/{summary['tasks']} pass ({summary['pass_share']:.1%}, 95 % Wilson "
        f"{lo:.1%}-{hi:.1%}); "
        f"{summary['no_mutant']} without a possible mutant; {summary['mutants']} mutants"
    )
    if ks["mean"] is not None:
        print(
            f"  kill share: mean {ks['mean']:.3f}, median {ks['median']:.3f}, p10 {ks['p10']:.3f}, min {ks['min']:.3f}"
        )
        print("  histogram: " + ", ".join(f"{k}: {v}" for k, v in ks["histogram"].items()))
    print(f"  {'family/level':28s} {'tasks':>5s} {'pass':>6s} {'kill':>6s}")
    for group, g in summary["by_family_level"].items():
        kill = f"{g['mean_kill_share']:.2f}" if g["mean_kill_share"] is not None else "-"
        print(f"  {group:28s} {g['tasks']:5d} {g['pass_share']:6.0%} {kill:>6s}")
    print("  operators: " + ", ".join(f"{op} {o['killed']}/{o['made']}" for op, o in summary["operators"].items()))


def _corpus_tasks(paths: list[str], limit: int, seed: int) -> list:
    """The generator-made tasks with computed hidden outputs of the corpora at `paths` (run folders or corpus files),
    each once (by id) in the order found, then a seeded sample of `limit` of them when there are more."""
    from selfplay.data.corpus import Corpus, CorpusError

    found: dict = {}
    for path in paths:
        try:
            with Corpus(path, create=False) as corpus:
                tasks = corpus.query(source="generator")
        except CorpusError as exc:
            raise UserError(f"--run {path}: {exc}") from exc
        for t in tasks:
            if t.hidden_tests and all("output" in h for h in t.hidden_tests):
                found.setdefault(t.id, t)
    tasks = list(found.values())
    return random.Random(f"adequacy-corpus:{seed}").sample(tasks, limit) if len(tasks) > limit else tasks


def _procedural_tasks(n: int, levels: list[int], seed: int, sb) -> list:
    from generator.build import generate_tasks

    tasks = []
    for j, level in enumerate(levels):
        count = n // len(levels) + (1 if j < n % len(levels) else 0)
        tasks += generate_tasks(count, level=level, seed=seed, sb=sb)
    return tasks


def run(args: argparse.Namespace) -> int:
    import sandbox
    from generator.adequacy import AdequacySettings, settings_problem

    problem = settings_problem(args.mutants, args.min_kill)
    if problem:
        raise UserError(
            problem.replace("generator.adequacy_mutants", "--mutants").replace(
                "generator.adequacy_min_kill", "--min-kill"
            )
        )
    if args.n < 0 or args.corpus_limit < 0 or args.timeout <= 0:
        raise UserError("--n and --corpus-limit must be >= 0 and --timeout > 0")
    settings = AdequacySettings(mutants=args.mutants, min_kill=args.min_kill)
    corpus_tasks = _corpus_tasks(args.run, args.corpus_limit, args.seed) if args.run else []
    record: dict = {
        "command": " ".join(["selfplay", *sys.argv[1:]]),
        "n": args.n,
        "levels": args.levels,
        "mutants": args.mutants,
        "min_kill": args.min_kill,
        "seed": args.seed,
        "timeout_s": args.timeout,
    }
    start = time.perf_counter()
    with sandbox.open_sandbox(workers=args.workers or None, timeout_s=args.timeout) as sb:
        tasks = _procedural_tasks(args.n, args.levels, args.seed, sb) if args.n else []
        print(f"{len(tasks)} procedural tasks made ({time.perf_counter() - start:.0f} s)", flush=True)
        rows = measure_tasks(tasks, sb, settings, args.timeout, "procedural")
        record["procedural"] = summarise(rows)
        record["procedural_tasks"] = rows
        if args.run:
            corpus_rows = measure_tasks(corpus_tasks, sb, settings, args.timeout, "corpus")
            record["corpus"] = {"runs": [str(p) for p in args.run], **summarise(corpus_rows)}
            record["corpus_tasks"] = corpus_rows
    record["seconds"] = round(time.perf_counter() - start, 1)
    _print(f"procedural tasks (levels {', '.join(map(str, args.levels))}, k={args.mutants})", record["procedural"])
    if args.run:
        where = args.run[0] if len(args.run) == 1 else f"{len(args.run)} corpora"
        _print(f"generator-made tasks of {where}", record["corpus"])
    print(f"\n{record['seconds']:.0f} s in all")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(record, fh, indent=1)
        print(f"wrote {args.json}")
    return 0
