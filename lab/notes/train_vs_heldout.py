"""Greedy pass@1 on a fixed-mode run's own training tasks beside the held-out `test` split, before and after RL:
is a rise of the training pass rate a skill that transfers, or specific to the tasks trained on? (round 7)

    python lab/notes/train_vs_heldout.py RUN_DIR WARMSTART_DIR [STEP]

RUN_DIR is a fixed-mode run (its tasks in RUN_DIR/fixed_tasks.jsonl); the warm start's step_0 and the run's
step_STEP (default: the latest) answer both task sets greedily; prints each pass rate by level and the paired change
with a bootstrap 95 % interval over tasks (`selfplay.eval.stats.paired_delta`).
"""

import json
import sys
from pathlib import Path

import sandbox
from generator.schema import Task
from selfplay.eval.evaluate import per_task_outcomes, read_tasks
from selfplay.eval.load import config_of, load_solver
from selfplay.eval.stats import paired_delta
from selfplay.rollout.episodes import prompt_options, solver_rollouts
from selfplay.runtime.checkpoint import CheckpointManager


def checkpoint(run: Path, step: int | None) -> Path:
    return run / "checkpoints" / f"step_{step}" if step is not None else CheckpointManager(run).latest_checkpoint()


def main(run: Path, warmstart: Path, step: int | None) -> None:
    after_ckpt, before_ckpt = checkpoint(run, step), checkpoint(warmstart, 0)
    cfg = config_of(json.loads((after_ckpt / "state.json").read_text()), after_ckpt)
    heldout = [
        t
        for t in map(Task.from_json, (warmstart / "heldout.jsonl").read_text().splitlines())
        if t.params.get("eval_split", t.split) == "test" and t.level in cfg.train.fixed_levels
    ]
    sets = {"training tasks": read_tasks(run / "fixed_tasks.jsonl"), "held-out (same levels)": heldout}
    kw = dict(
        greedy=True, max_prompt_tokens=cfg.warmstart.max_len, prompt_kw=prompt_options(cfg), reward_cfg=cfg.reward
    )
    with sandbox.open_sandbox("process", timeout_s=cfg.sandbox.timeout_s, memory_mb=cfg.sandbox.memory_mb) as sb:
        outcome = {}
        for name, ckpt in (("before", before_ckpt), ("after", after_ckpt)):
            solver = load_solver(ckpt / "solver", cfg)
            for label, tasks in sets.items():
                rollouts = solver_rollouts(solver, tasks, 1, sb, **kw)
                outcome[name, label] = per_task_outcomes(rollouts, rollouts)
    print(f"{before_ckpt} -> {after_ckpt}, greedy pass@1")
    for label in sets:
        d = paired_delta(outcome["before", label], outcome["after", label], "pass@1_greedy")
        print(
            f"  {label:24s} n={d['tasks']:3d}  {d['before']:.3f} -> {d['after']:.3f}  {d['delta']:+.3f} "
            f"[{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]"
        )


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else None)
