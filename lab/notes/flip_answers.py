"""Greedy answers of two checkpoints on the held-out `test` tasks of one level that the first solves and the second
does not: what a lost pass looks like (round 5, lab/notes/ppo_fixed.md).

    python lab/notes/flip_answers.py runs/fixed/warmstart runs/fixed_k/seed_0/fixed 1

Each run folder's latest checkpoint is used, with the first run's config and held-out tasks. Prints up to 6 lost
tasks (prompt, the first checkpoint's answer, the second's) and how many were lost and gained.
"""

import json
import sys
from pathlib import Path

import sandbox
from generator.schema import Task
from selfplay.eval.load import config_of, load_solver
from selfplay.rollout.episodes import prompt_options, solver_rollouts
from solver.prompts import task_prompt


def latest(run: Path) -> Path:
    return max((run / "checkpoints").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))


def main(before_run: Path, after_run: Path, level: int) -> None:
    before, after = latest(before_run), latest(after_run)
    cfg = config_of(json.loads((before / "state.json").read_text()), before)
    tasks = [Task.from_json(line) for line in (before_run / "heldout.jsonl").read_text().splitlines()]
    tasks = [t for t in tasks if t.level == level and t.params.get("eval_split", t.split) == "test"]
    kw = dict(
        greedy=True, max_prompt_tokens=cfg.warmstart.max_len, prompt_kw=prompt_options(cfg), reward_cfg=cfg.reward
    )
    with sandbox.open_sandbox("process", timeout_s=cfg.sandbox.timeout_s, memory_mb=cfg.sandbox.memory_mb) as sb:
        a = solver_rollouts(load_solver(before / "solver", cfg), tasks, 1, sb, **kw)
        b = solver_rollouts(load_solver(after / "solver", cfg), tasks, 1, sb, **kw)
    lost = [(x, y) for x, y in zip(a, b) if x.result.solved and not y.result.solved]
    for x, y in lost[:6]:
        print("=" * 100)
        print(task_prompt(x.task, **prompt_options(cfg)))
        print(f"--- {before} (solved):\n{x.text}\n--- {after}:\n{y.text}")
    gained = sum(1 for x, y in zip(a, b) if y.result.solved and not x.result.solved)
    print(
        f"level {level}, {len(tasks)} tasks: solved {sum(r.result.solved for r in a)} -> "
        f"{sum(r.result.solved for r in b)} (lost {len(lost)}, gained {gained})"
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))
