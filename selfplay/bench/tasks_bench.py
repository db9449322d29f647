"""`selfplay bench tasks`: how fast valid procedural tasks are made, and why candidates are rejected.

    selfplay bench tasks [--n 300] [--level L] [--split S] [--repeats 3] [--workers W] [--json OUT]

For each repeat (a different seed) it times `generator.build.generate_tasks(n)` end to end (draw, write,
run the reference and the trivial battery in the process sandbox, validate, dedup) and, separately, drawing and
writing the same number of candidates without the sandbox. It prints the median valid tasks/s, the
candidates/s of the pure part, their ratio (the sandbox's share of the cost), the acceptance rate, and the
histogram of rejection reasons (the first failed check of each rejected candidate).

Registered in `selfplay/cli/bench.py` BENCHES as ("selfplay.bench.tasks_bench", ...): `configure` and `run`
(also exported as `configure_tasks` and `run_bench_tasks`).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections import Counter

from selfplay.runtime.errors import UserError

SPLIT_NAMES = ("train", "heldout_types", "heldout_compositions", "deeper", "noisy")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--n", type=int, default=300, help="valid tasks to make per repeat (default 300)")
    parser.add_argument("--level", type=int, choices=[1, 2, 3, 4], help="one level (default: the split's mix)")
    parser.add_argument("--split", choices=SPLIT_NAMES, default="train", help="split to generate (default train)")
    parser.add_argument("--repeats", type=int, default=3, help="repeats with different seeds (median reported)")
    parser.add_argument("--workers", type=int, default=0, help="sandbox workers (0 = one per CPU core)")
    parser.add_argument("--json", metavar="OUT", help="also write the figures as JSON")


def run(args: argparse.Namespace) -> int:
    import sandbox
    from generator.build import BuildConfig, BuildStats, generate_tasks, levels_for, materialise, sample_params

    if args.n <= 0 or args.repeats <= 0:
        raise UserError("--n and --repeats must be > 0")
    cfg = BuildConfig()
    rates, pure_rates, accept = [], [], []
    rejections: Counter = Counter()
    examples: dict = {}
    with sandbox.open_sandbox(workers=args.workers or None, timeout_s=2.0, cache=False) as sb:
        generate_tasks(8, seed=10_000, sb=sb, split=args.split)  # warm the workers
        for r in range(args.repeats):
            stats = BuildStats()
            generate_tasks(args.n, level=args.level, split=args.split, seed=r, sb=sb, cfg=cfg, stats=stats)
            rates.append(stats.tasks_per_s)
            accept.append(stats.valid / max(1, stats.attempted))
            rejections.update(stats.rejections)
            for k, v in stats.examples.items():
                examples.setdefault(k, v)
            rng = random.Random(r)
            levels = [args.level] if args.level else levels_for(args.split)
            start = time.perf_counter()
            for _ in range(stats.attempted):
                materialise(sample_params(rng, rng.choice(levels), args.split, cfg), args.split)
            pure_rates.append(stats.attempted / (time.perf_counter() - start))
            print(
                f"repeat {r}: {stats.valid} valid of {stats.attempted} drawn in {stats.seconds:.2f} s "
                f"-> {stats.tasks_per_s:.1f} valid tasks/s",
                flush=True,
            )
        workers = sb.stats().get("workers", args.workers or "auto")
    median, pure = statistics.median(rates), statistics.median(pure_rates)
    total_rejected = sum(rejections.values())
    print(f"\nvalid tasks/s (median of {args.repeats}, split={args.split}, level={args.level or 'mix'}): {median:.1f}")
    print(
        f"candidates drawn and written without the sandbox: {pure:.0f}/s "
        f"(sandbox validation makes generation {pure / median:.0f}x slower than drawing alone)"
    )
    print(f"acceptance rate: {statistics.median(accept):.1%}")
    print("rejection reasons (first failed check):")
    for reason, count in rejections.most_common():
        print(f"  {reason:14s} {count:6d}  {count / max(1, total_rejected):6.1%}  e.g. {examples[reason][:90]}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                {
                    "valid_tasks_per_s": rates,
                    "median_valid_tasks_per_s": median,
                    "pure_candidates_per_s": pure_rates,
                    "acceptance": accept,
                    "rejections": dict(rejections),
                    "n": args.n,
                    "split": args.split,
                    "level": args.level,
                    "workers": workers,
                },
                fh,
                indent=2,
            )
        print(f"wrote {args.json}")
    return 0


configure_tasks = configure
run_bench_tasks = run
