"""`selfplay plan CONFIG [key=value ...] [--gpus-per-node N] [--nodes M] [--gpu-mem GB] [--json OUT]`: the memory a
run of CONFIG needs per GPU in each phase (warm start, load, rollout, update, evaluation), against the GPUs' memory,
before launching it (selfplay/runtime/memory_plan.py). Exit code 0 when every phase fits, 1 when one does not."""

from __future__ import annotations

import json

from selfplay.cli.train import split_args


def configure(parser) -> None:
    parser.description = (__doc__ or "").split("\n\n")[0].replace("\n", " ") + (
        " Prints GB per GPU for each phase and part (policy, references, critic, gradients, optimiser states, "
        "activations, Hugging Face generation, vLLM engines, a fixed reserve) and one verdict line per phase "
        "naming the keys that would make it fit. A bad config or option exits 2."
    )
    parser.add_argument(
        "config",
        nargs="?",
        default=None,
        help="YAML config (default configs/tiny.yaml); key=value overrides may follow",
    )
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. ppo.micro_batch_size=1")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node, one rank each (default 8)")
    parser.add_argument("--nodes", type=int, default=1, help="nodes (default 1)")
    parser.add_argument("--gpu-mem", type=float, default=80.0, help="memory of one GPU in GB, 1e9 bytes (default 80)")
    parser.add_argument(
        "--prompt-len",
        type=int,
        default=0,
        help="prompt tokens to plan for (default: the config's bound, warmstart.max_len); the "
        "SFT sequences are then this plus the longer answer budget",
    )
    parser.add_argument(
        "--partition-references",
        action="store_true",
        help="plan as if the references were ZeRO-3 partitioned (they are not today)",
    )
    parser.add_argument("--json", default="", help="also write the plan here as JSON")


def run(args) -> int:
    from selfplay.runtime.config import load_config
    from selfplay.runtime.errors import UserError
    from selfplay.runtime.memory_plan import Cluster, PlanOptions, format_table, plan_memory

    for name in ("gpus_per_node", "nodes"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be >= 1")
    if args.gpu_mem <= 0 or args.prompt_len < 0:
        raise UserError("--gpu-mem must be > 0 and --prompt-len >= 0")
    config, overrides = split_args(args)
    cfg = load_config(config, overrides)
    cluster = Cluster(args.gpus_per_node, args.nodes, args.gpu_mem)
    options = PlanOptions(prompt_tokens=args.prompt_len, partition_references=args.partition_references)
    plan = plan_memory(cfg, cluster, options, config_name=" ".join([config or "configs/tiny.yaml", *overrides]))
    print(format_table(plan))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(plan.to_dict(), f, indent=1)
    return 0 if plan.fits else 1
