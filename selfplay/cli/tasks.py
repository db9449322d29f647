"""`selfplay tasks generate|sample`: procedural tasks into a run's corpus, and a readable look at them.

    selfplay tasks generate --n N [--level L] [--split S] [--seed K] --out RUN_DIR [--config FILE] [key=value ...]
    selfplay tasks sample RUN_DIR [--n N] [--family F] [--level L] [--split S] [--source SRC] [--seed K]

`generate` draws tasks (generator.build), runs every reference through the sandbox in parallel, validates,
and appends the valid ones to RUN_DIR/corpus.sqlite (duplicates of stored tasks are rejected), with a
progress bar and a summary of the rejection reasons.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from selfplay.runtime.errors import UserError

SPLIT_NAMES = ("train", "heldout_types", "heldout_compositions", "deeper", "noisy")  # = generator.splits.SPLITS
SOURCES = ("procedural", "generator", "import")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} must be > 0")
    return value


def level_arg(text: str) -> int:
    if text not in ("1", "2", "3", "4"):
        raise argparse.ArgumentTypeError(f"level {text!r} must be 1, 2, 3 or 4")
    return int(text)


def add_filters(p: argparse.ArgumentParser) -> None:
    p.add_argument("--family", help="only this family (e.g. list_int, string, record_pipeline)")
    p.add_argument("--level", type=level_arg, help="only this level (1..4)")
    p.add_argument("--split", choices=SPLIT_NAMES, help="only this split")
    p.add_argument("--source", choices=SOURCES, help="only tasks from this source")


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="tasks_command", metavar="ACTION")
    g = sub.add_parser("generate", help="generate valid procedural tasks into RUN_DIR/corpus.sqlite")
    g.add_argument("--n", type=positive_int, required=True, help="number of valid tasks to add")
    g.add_argument("--level", type=level_arg, help="curriculum level 1..4 (default: a mix of the split's levels)")
    g.add_argument("--split", choices=SPLIT_NAMES, default="train", help="train or a held-out split")
    g.add_argument("--seed", type=int, default=0, help="generation seed (same seed, same tasks)")
    g.add_argument("--out", required=True, help="run folder (corpus.sqlite is created or appended to)")
    g.add_argument("--config", help="config YAML for the tasks/sandbox sections (default configs/tiny.yaml)")
    g.add_argument("--batch-size", type=positive_int, default=64, help="tasks validated per sandbox batch")
    g.add_argument("overrides", nargs="*", help="config overrides key=value (e.g. sandbox.workers=2)")
    s = sub.add_parser("sample", help="print tasks from a corpus")
    s.add_argument("run_dir", metavar="RUN_DIR", help="run folder holding corpus.sqlite")
    s.add_argument("--n", type=positive_int, default=3, help="how many tasks to print")
    s.add_argument("--seed", type=int, default=0, help="which pseudo-random sample")
    s.add_argument("--hidden", action="store_true", help="also print the hidden tests")
    add_filters(s)


def run(args: argparse.Namespace) -> int:
    if args.tasks_command == "generate":
        return generate(args)
    if args.tasks_command == "sample":
        return sample(args)
    raise UserError("say what to do: `selfplay tasks generate ...` or `selfplay tasks sample RUN_DIR`")


def open_sandbox_from(cfg):
    """A sandbox from the config's sandbox section (shared by tasks generate and import)."""
    import sandbox

    options = {k: v for k, v in (("cache_path", cfg.sandbox.cache_path), ("trace_path", cfg.sandbox.trace_path)) if v}
    if cfg.sandbox.backend == "docker":
        options["image"] = cfg.sandbox.image
    try:
        return sandbox.open_sandbox(
            backend=cfg.sandbox.backend,
            workers=cfg.sandbox.workers or None,
            timeout_s=cfg.sandbox.timeout_s,
            memory_mb=cfg.sandbox.memory_mb,
            cache=cfg.sandbox.cache,
            **options,
        )
    except sandbox.SandboxError as exc:
        raise UserError(str(exc).splitlines()[0]) from exc


def generate(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from generator.build import BuildConfig, BuildStats, generate_tasks
    from generator.splits import SplitError
    from selfplay.runtime.config import load_config

    cfg = load_config(args.config, args.overrides)
    try:
        build_cfg = BuildConfig.from_config(cfg.tasks)
    except SplitError as exc:
        raise UserError(f"config tasks: {exc}") from exc
    corpus = open_for_writing(args.out)
    print(
        f"generating {args.n} {args.split} tasks (level {args.level or 'mix'}, seed {args.seed}) into {corpus.path}",
        flush=True,
    )
    stats = BuildStats()
    bar = tqdm(total=args.n, unit="task", dynamic_ncols=True)

    def on_batch(new, st):
        results = corpus.insert_many(new)
        for r in results:
            if not r.inserted:
                st.rejections["novel"] += 1
        bar.update(sum(r.inserted for r in results))
        bar.set_postfix(rejected=sum(st.rejections.values()))

    with corpus, open_sandbox_from(cfg) as sb:
        try:
            generate_tasks(
                args.n,
                level=args.level,
                split=args.split,
                seed=args.seed,
                sb=sb,
                corpus_index=corpus,
                cfg=build_cfg,
                batch_size=args.batch_size,
                stats=stats,
                on_batch=on_batch,
            )
        except SplitError as exc:
            raise UserError(str(exc)) from exc
        finally:
            bar.close()
        total = len(corpus)
    print(
        f"added {stats.valid} tasks ({stats.attempted} drawn) in {stats.seconds:.1f} s: "
        f"{stats.tasks_per_s:.1f} valid tasks/s; corpus now holds {total}"
    )
    for reason, count in stats.rejections.most_common():
        print(f"  rejected {count:5d}  {reason}: e.g. {stats.examples.get(reason, '')[:100]}")
    if stats.valid < args.n:
        print(f"warning: only {stats.valid} of {args.n} tasks found before the attempt limit", file=sys.stderr)
        return 1
    return 0


def format_task(task, hidden: bool = False) -> str:
    """A task as readable text: header, description, signature, reference, examples."""
    diff = "unmeasured" if task.difficulty is None else f"{task.difficulty:.2f}"
    lines = [
        f"=== {task.id}  family={task.family}  level={task.level}  split={task.split}  source={task.source}"
        f"  difficulty={diff}",
        "",
        task.description,
        "",
        task.signature,
        "",
        task.reference_solution.rstrip(),
        "",
        "visible tests:",
    ]
    tests = [("  ", t) for t in task.visible_tests]
    if hidden:
        tests += [("  (hidden) ", t) for t in task.hidden_tests]
    for prefix, t in tests:
        args = ", ".join(_short(a) for a in t["input"])
        lines.append(f"{prefix}{task.entry_point}({args}) -> {_short(t.get('output'))}")
    if not hidden:
        lines.append(f"  ... and {len(task.hidden_tests)} hidden tests (--hidden to show)")
    return "\n".join(lines)


def _short(value, limit: int = 100) -> str:
    import json

    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def open_existing(run_dir: str):
    from selfplay.data.corpus import Corpus, CorpusError, corpus_path

    path = Path(run_dir)
    if not path.exists():
        raise UserError(f"{run_dir}: no such run folder")
    if path.is_dir() and not corpus_path(path).exists():
        raise UserError(f"{run_dir} holds no corpus.sqlite (create one with `selfplay tasks generate --out ...`)")
    try:
        return Corpus(path, create=False)
    except CorpusError as exc:
        raise UserError(str(exc)) from exc


def open_for_writing(run_dir: str):
    """The corpus of a run folder, created if needed (generate, import)."""
    from selfplay.data.corpus import Corpus, CorpusError

    out = Path(run_dir)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; give a run folder")
    try:
        return Corpus(out)
    except CorpusError as exc:
        raise UserError(str(exc)) from exc


def filters_of(args: argparse.Namespace) -> dict:
    return {k: getattr(args, k) for k in ("split", "family", "level", "source") if getattr(args, k, None) is not None}


def sample(args: argparse.Namespace) -> int:
    with open_existing(args.run_dir) as corpus:
        tasks = corpus.query(limit=args.n, order="random", seed=args.seed, **filters_of(args))
        total = corpus.count(**filters_of(args))
    if not tasks:
        raise UserError(f"no tasks in {args.run_dir} match {filters_of(args) or 'the corpus'}")
    for task in tasks:
        print(format_task(task, hidden=args.hidden))
        print()
    print(f"{len(tasks)} of {total} matching tasks")
    return 0
