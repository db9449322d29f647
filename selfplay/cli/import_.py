"""`selfplay import FILE --out RUN_DIR [--mark-import]`: re-validate a task dataset and add it to a corpus.

Every row is decoded and run through all validity checks (the reference re-run in the sandbox, stored
outputs compared with recomputed ones, duplicates of the target corpus rejected). Rejected rows are listed with
their row number and reason; valid ones are appended to RUN_DIR/corpus.sqlite. The source stays as in the file
unless --mark-import sets it to "import".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from selfplay.cli.tasks import open_for_writing, open_sandbox_from
from selfplay.runtime.errors import UserError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="dataset file (.jsonl or .parquet) written by selfplay export")
    parser.add_argument("--out", required=True, help="run folder (corpus.sqlite is created or appended to)")
    parser.add_argument("--mark-import", action="store_true", help='set every imported task\'s source to "import"')
    parser.add_argument("--config", help="config YAML for the sandbox section (default configs/tiny.yaml)")
    parser.add_argument("--show", type=int, default=20, help="rejected rows to list (default 20)")
    parser.add_argument("overrides", nargs="*", help="config overrides key=value")


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from selfplay.data.export import ExportError, file_format, import_rows
    from selfplay.runtime.config import load_config

    path = Path(args.file)
    try:
        file_format(path)
    except ExportError as exc:
        raise UserError(str(exc)) from exc
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    cfg = load_config(args.config, args.overrides)
    corpus = open_for_writing(args.out)
    print(f"importing {path} into {corpus.path} (re-validating every row)", flush=True)
    bar = tqdm(unit="row", dynamic_ncols=True)
    with corpus, open_sandbox_from(cfg) as sb:
        try:
            summary = import_rows(
                path,
                corpus,
                sb,
                mark_import=args.mark_import,
                on_batch=lambda n, s: (bar.update(n), bar.set_postfix(rejected=len(s.rejected))),
            )
        except ExportError as exc:
            raise UserError(str(exc)) from exc
        finally:
            bar.close()
    print(f"imported {summary.accepted} tasks; rejected {len(summary.rejected)}")
    for reason, count in summary.reasons.most_common():
        print(f"  rejected {count:5d}  {reason}")
    for row_no, task_id, reason in summary.rejected[: args.show]:
        print(f"  row {row_no} {task_id or '(no id)'}: {reason}")
    if len(summary.rejected) > args.show:
        print(f"  ... {len(summary.rejected) - args.show} more")
    if summary.rejected:
        print(f"warning: {len(summary.rejected)} row(s) rejected", file=sys.stderr)
    return 0
