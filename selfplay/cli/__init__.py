"""The `selfplay` command line.

    selfplay train [CONFIG] [key=value ...]          train on CONFIG (default configs/first_run.yaml, the first run)
    selfplay warmstart [CONFIG] [key=value ...]      behaviour cloning of both agents only
    selfplay plan CONFIG [key=value ...] [--gpus-per-node N] [--nodes M] [--gpu-mem GB] [--json OUT]
                                                     memory per GPU and phase before launch (exit 1: does not fit)
    selfplay eval RUN_DIR_OR_CHECKPOINT [--suite heldout|humaneval|generator|all] [--json OUT]
    selfplay tasks generate|sample ...               procedural tasks into / out of a corpus
    selfplay export RUN_DIR --out FILE.jsonl|FILE.parquet
    selfplay import FILE --out RUN_DIR
    selfplay compare [CONFIG] [--seeds 0 1 2] [--out DIR]  self-play vs warm start vs curriculum, per seed
    selfplay analyze paired WARMSTART RUN ... --step N  held-out change of RL runs from their warm start
    selfplay bench sandbox|tasks|ppo ...             benchmarks that print measured ratios
    selfplay sandbox build-image                     build the Docker sandbox image (offline capable)

Each sub-command lives in its own module under `selfplay/cli/`, exposing `configure(parser)` and
`run(args) -> int`. Modules import heavy dependencies (torch, transformers) inside `run`, so that
`selfplay bench sandbox` or `selfplay --help` start fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings

from selfplay.runtime.errors import UserError

# name -> (module, one-line help). Order is the order `selfplay --help` shows.
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("selfplay.cli.train", "run self-play (resumes when run.dir holds a checkpoint)"),
    "warmstart": ("selfplay.cli.warmstart", "behaviour-clone the agents on procedural tasks"),
    "plan": ("selfplay.cli.plan", "memory per GPU and phase of a config before launch (exit 1: it does not fit)"),
    "eval": ("selfplay.cli.eval", "evaluate a checkpoint: held-out splits, HumanEval, the generator's side"),
    "tasks": ("selfplay.cli.tasks", "generate or inspect procedural tasks"),
    "export": ("selfplay.cli.export", "export a run's task corpus as a dataset"),
    "import": ("selfplay.cli.import_", "import (and re-validate) a task dataset into a corpus"),
    "compare": ("selfplay.cli.compare", "self-play vs warm start vs curriculum over seeds (the research claim)"),
    "analyze": ("selfplay.cli.analyze", "analyse finished runs (paired: held-out change from the warm start)"),
    "bench": ("selfplay.cli.bench", "benchmarks (sandbox, tasks, ppo)"),
    "sandbox": ("selfplay.cli.sandbox", "sandbox utilities (build-image)"),
    "model": ("selfplay.cli.model", "model utilities (import a GGUF file as a Hugging Face folder)"),
}


def _load(module_name: str):
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            return None  # command not built yet
        raise


class OneLineErrorParser(argparse.ArgumentParser):
    """Bad arguments give one stderr line naming the problem and exit 2 (no usage block). Sub-command parsers
    (and theirs) are made from this class too, since argparse builds subparsers with the parent's class."""

    def error(self, message: str):
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(prog="selfplay", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        module = _load(module_name)
        if module is None:
            continue
        p = sub.add_parser(name, help=help_text, description=help_text)
        module.configure(p)
        p.set_defaults(_module=module)
    return parser


def quiet_model_code() -> None:
    """Model-written code is parsed in this process (`ast.parse`, filename "<unknown>"); the SyntaxWarnings its
    oddities raise ("invalid decimal literal", ...) are about the model's answer, which the parse judges anyway,
    not about this program: keep them off the console. Warnings from the project's own code still show."""
    warnings.filterwarnings("ignore", category=SyntaxWarning, module="<unknown>")


def main(argv: list[str] | None = None) -> int:
    quiet_model_code()
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # key=value overrides may also follow a command's options (`selfplay compare --seeds 0 1 train.steps=5`)
        overrides_only = all("=" in e and not e.startswith("-") for e in extra)
        if isinstance(getattr(args, "overrides", None), list) and overrides_only:
            args.overrides += extra
        else:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if getattr(args, "_module", None) is None:
        parser.print_help()
        return 2
    try:
        code = int(args._module.run(args) or 0)
    except UserError as exc:
        print(f"selfplay {args.command}: error: {exc}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        print(f"selfplay {args.command}: interrupted", file=sys.stderr)
        code = 130
    except Exception:
        if not _distributed():
            raise
        sys.excepthook(*sys.exc_info())  # the heartbeat's hook names a rank that stopped responding
        code = 1
    return _finish(code)


def _distributed() -> bool:
    """Whether this process joined a torch.distributed group (without importing torch for light commands)."""
    dist = sys.modules.get("torch.distributed")
    return bool(dist is not None and dist.is_available() and dist.is_initialized())


def _finish(code: int) -> int:
    """The exit code; a process of a distributed run ends with os._exit instead. Left to interpreter shutdown, torch's
    C++ store and process-group threads can abort it ("terminate called without an active exception", exit -6)
    while the heartbeat thread still talks to the store. Everything of ours is closed by then (the loop closes its
    sandbox, corpus and TensorBoard writer), so only output needs flushing."""
    if not _distributed():
        return code
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    raise SystemExit(main())
