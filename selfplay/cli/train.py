"""`selfplay train [CONFIG] [key=value ...]`: self-play, resuming when run.dir holds a checkpoint."""

from __future__ import annotations

from selfplay.runtime.errors import UserError


def configure(parser) -> None:
    parser.add_argument(
        "config",
        nargs="?",
        default=None,
        help="YAML config (default configs/first_run.yaml: RL on a fixed task set raising a pretrained model, about "
        "40 min on 2 cores); key=value overrides may follow",
    )
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. run.dir=runs/x train.steps=50")


def split_args(args) -> tuple[str | None, list[str]]:
    """`selfplay train run.dir=x` has no config file: the first word is an override."""
    config, overrides = args.config, list(args.overrides)
    if config is not None and "=" in config and not config.endswith((".yaml", ".yml")):
        config, overrides = None, [config] + overrides
    return config, overrides


def train_args(args) -> tuple[str, list[str]]:
    """The config file `selfplay train` and `selfplay warmstart` run, and the overrides: with none named, the
    first run's (FIRST_RUN_CONFIG)."""
    from selfplay.runtime.config import FIRST_RUN_CONFIG

    config, overrides = split_args(args)
    return config if config is not None else str(FIRST_RUN_CONFIG), overrides


def run(args) -> int:
    from selfplay.runtime.config import load_config
    from selfplay.runtime.memory_plan import refuse_if_it_cannot_fit

    config, overrides = train_args(args)
    cfg = load_config(config, overrides)
    refuse_if_it_cannot_fit(cfg)  # GPU only (a no-op on a CPU): a plan that does not fit stops here, naming the key
    from selfplay.train.loop import train

    summary = train(cfg)
    if summary.get("stopped"):
        return 0
    if summary["steps"] < cfg.train.steps:
        raise UserError(f"run stopped at step {summary['steps']} of {cfg.train.steps}")
    return 0
