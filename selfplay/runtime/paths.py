"""The run folder's layout: every file and folder a run writes under `run.dir`, named here once.

    RUN_DIR/
      corpus.sqlite              every task with its checks and measured difficulty (selfplay/data/corpus.py)
      heldout.jsonl              the held-out tasks, drawn first (selfplay/eval/evaluate.py)
      generator_snapshot.jsonl   a frozen sample of generated tasks (selfplay/eval/evaluate.py)
      reserved_tasks.jsonl       train.fixed_source=reserved: the pool the warm start kept out of SFT
      fixed_tasks.jsonl          train.mode=fixed: the task set, chosen on first use (selfplay/train/sources.py)
      checkpoints/step_N/, checkpoints/latest   (selfplay/runtime/checkpoint.py)
      tb/                        TensorBoard event files (selfplay/runtime/tb.py)
      eval/step_N.json           `selfplay eval` results
      models/tiny/               the tiny default world's locally built base model (selfplay/models/factory.py)
      summary.json               the closing summary of a finished run

Modules ask `RunPaths(run_dir)` (or use the names below) instead of spelling file names.
"""

from __future__ import annotations

from pathlib import Path

CORPUS = "corpus.sqlite"
HELDOUT = "heldout.jsonl"
GENERATOR_SNAPSHOT = "generator_snapshot.jsonl"
RESERVED_TASKS = "reserved_tasks.jsonl"
FIXED_TASKS = "fixed_tasks.jsonl"
CHECKPOINTS = "checkpoints"
TB = "tb"
EVAL = "eval"
MODELS = "models"
SUMMARY = "summary.json"


class RunPaths:
    """The paths of one run folder."""

    def __init__(self, run_dir):
        self.root = Path(run_dir)

    @property
    def corpus(self) -> Path:
        return self.root / CORPUS

    @property
    def heldout(self) -> Path:
        return self.root / HELDOUT

    @property
    def generator_snapshot(self) -> Path:
        return self.root / GENERATOR_SNAPSHOT

    @property
    def reserved_tasks(self) -> Path:
        return self.root / RESERVED_TASKS

    @property
    def fixed_tasks(self) -> Path:
        return self.root / FIXED_TASKS

    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINTS

    @property
    def tb(self) -> Path:
        return self.root / TB

    @property
    def models(self) -> Path:
        return self.root / MODELS

    @property
    def summary(self) -> Path:
        return self.root / SUMMARY

    def eval_json(self, step: int) -> Path:
        return self.root / EVAL / f"step_{step}.json"

    def __repr__(self) -> str:
        return f"RunPaths({str(self.root)!r})"
