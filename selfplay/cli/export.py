"""`selfplay export RUN_DIR --out FILE.jsonl|FILE.parquet [filters]`: a run's task corpus as a dataset.

Writes one task record per row and a dataset card (README.md with counts by family, level, source and split)
beside the file; loadable with `datasets.load_dataset("json" | "parquet", data_files=FILE)`.
"""

from __future__ import annotations

import argparse

from selfplay.cli.tasks import add_filters, filters_of, open_existing
from selfplay.runtime.errors import UserError


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{value} is not in [0, 1]")
    return value


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="run folder holding corpus.sqlite")
    parser.add_argument("--out", required=True, help="output file: .jsonl or .parquet")
    add_filters(parser)
    parser.add_argument("--min-difficulty", type=_fraction, help="only tasks with measured difficulty >= this")
    parser.add_argument("--max-difficulty", type=_fraction, help="only tasks with measured difficulty <= this")


def run(args: argparse.Namespace) -> int:
    from selfplay.data.export import ExportError, export_tasks, file_format

    try:
        file_format(args.out)
    except ExportError as exc:
        raise UserError(str(exc)) from exc
    filters = filters_of(args)
    for name in ("min_difficulty", "max_difficulty"):
        if getattr(args, name) is not None:
            filters[name] = getattr(args, name)
    with open_existing(args.run_dir) as corpus:
        total = corpus.count(**filters)
        print(f"exporting {total} tasks from {corpus.path} to {args.out}", flush=True)
        summary = export_tasks(corpus.iter_tasks(**filters), args.out)
    print(f"wrote {summary.count} tasks to {summary.path} and a dataset card to {summary.card}")
    for name in ("family", "level", "source", "split"):
        print(f"  by {name}: " + ", ".join(f"{k}={v}" for k, v in summary.counts[name].items()))
    return 0
