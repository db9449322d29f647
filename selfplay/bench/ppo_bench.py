"""`selfplay bench ppo`: tokens/s of batched generation and of one PPO update on the tiny default shape.

Runs `selfplay.rl.ppo.bench` once per `--threads` value and prints the medians; with several values it also prints the
speed ratio against the first. Same as `python -m selfplay.rl.ppo --bench`.
"""

from __future__ import annotations

import argparse
import json


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch", type=int, default=16, help="sequences per rollout batch")
    parser.add_argument("--prompt-len", type=int, default=64, help="prompt tokens per sequence")
    parser.add_argument("--response-len", type=int, default=64, help="sampled tokens per sequence")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats (medians are reported)")
    parser.add_argument(
        "--threads", type=int, nargs="+", default=[0], help="torch intra-op threads to compare (0 = torch's default)"
    )
    parser.add_argument("--json", metavar="OUT", help="write the results as JSON")


def run(args: argparse.Namespace) -> int:
    from selfplay.rl.ppo import bench
    from selfplay.runtime.errors import UserError

    if min(args.batch, args.prompt_len, args.response_len, args.repeats) < 1 or args.batch < 2:
        raise UserError("--batch must be >= 2 and --prompt-len, --response-len, --repeats >= 1")
    results = []
    for threads in args.threads:
        print(f"== threads={threads or 'default'}")
        results.append(bench(args.batch, args.prompt_len, args.response_len, args.repeats, threads=threads))
    for r in results[1:]:
        ratio = r["ppo_step_tokens_per_s"] / results[0]["ppo_step_tokens_per_s"]
        print(f"ppo step speed, threads={r['threads']} vs threads={results[0]['threads']}: {ratio:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0
