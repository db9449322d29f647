"""What the solver gets wrong on the held-out `test` split: its greedy answers, each failure classified by how far
its program is from the task's reference solution (round 6, lab/notes/ppo_fixed.md).

    python lab/notes/failure_kinds.py runs/fixed/warmstart [runs/fixed_u/seed_0/fixed ...]

Each run folder's latest checkpoint is evaluated on the first run's held-out tasks. Kinds, from the normalised ASTs
(docstrings dropped) of answer and reference:
  syntax     the answer does not parse (or has no function)
  constant   the same program but for literal values (`len(x) < 6` for `len(x) < 4`): a template recalled, the
             number or string in the description not copied
  name       the same shape but for names, attributes or operators too (`x.upper()` for `x.capitalize()`)
  other      a different program
"""

import ast
import json
import sys
from collections import Counter
from pathlib import Path

import sandbox
from generator.schema import Task
from selfplay.eval.load import config_of, load_solver
from selfplay.rollout.episodes import prompt_options, solver_rollouts
from solver.parse import extract_code

KINDS = ("solved", "syntax", "constant", "name", "other")


OPERATORS = (ast.operator, ast.cmpop, ast.boolop, ast.unaryop)


class _Mask(ast.NodeTransformer):
    """Literal values -> one placeholder; with `names`, identifiers, attributes and operators too."""

    def __init__(self, names: bool):
        self.names = names

    def visit(self, node):
        if self.names and isinstance(node, OPERATORS):
            return ast.Add()  # any operator (only dumped, never compiled)
        return super().visit(node)

    def visit_Constant(self, node):
        return ast.copy_location(ast.Constant(value="<c>"), node)

    def visit_Name(self, node):
        return ast.copy_location(ast.Name(id="<n>", ctx=node.ctx), node) if self.names else node

    def visit_Attribute(self, node):
        self.generic_visit(node)
        if self.names:
            node.attr = "<a>"
        return node


def shape(code: str, names: bool) -> str | None:
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    return ast.dump(_Mask(names).visit(tree))


def kind(answer: str, reference: str, solved: bool) -> str:
    if solved:
        return "solved"
    code = extract_code(answer).code or ""
    if shape(code, False) is None or "def " not in code:
        return "syntax"
    if shape(code, False) == shape(reference, False):
        return "constant"
    if shape(code, True) == shape(reference, True):
        return "name"
    return "other"


def latest(run: Path) -> Path:
    return max((run / "checkpoints").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))


def main(runs: list[Path]) -> None:
    first = latest(runs[0])
    cfg = config_of(json.loads((first / "state.json").read_text()), first)
    tasks = [Task.from_json(line) for line in (runs[0] / "heldout.jsonl").read_text().splitlines()]
    tasks = [t for t in tasks if t.params.get("eval_split", t.split) == "test"]
    kw = dict(
        greedy=True, max_prompt_tokens=cfg.warmstart.max_len, prompt_kw=prompt_options(cfg), reward_cfg=cfg.reward
    )
    print(f"{'checkpoint':48s} {'level':>5s} " + " ".join(f"{k:>8s}" for k in KINDS))
    with sandbox.open_sandbox("process", timeout_s=cfg.sandbox.timeout_s, memory_mb=cfg.sandbox.memory_mb) as sb:
        for run in runs:
            ckpt = latest(run)
            rollouts = solver_rollouts(load_solver(ckpt / "solver", cfg), tasks, 1, sb, **kw)
            by_level: dict[int, Counter] = {}
            for r in rollouts:
                found = kind(r.text, r.task.reference_solution, r.result.solved)
                by_level.setdefault(r.task.level, Counter())[found] += 1
            for level in sorted(by_level):
                c = by_level[level]
                print(f"{str(ckpt):48s} {level:>5d} " + " ".join(f"{c[k]:>8d}" for k in KINDS))


if __name__ == "__main__":
    main([Path(p) for p in sys.argv[1:]])
