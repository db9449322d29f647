"""Test adequacy by mutation: a task's hidden tests must tell its reference solution from small edits of it.

`make_mutants(source, k, seed)` writes up to k mutants of a reference program with `ast`, each one edit:

    arithmetic   + <-> -, * -> // or +, // -> * or %, % -> //, / -> *, ** -> * (in expressions and augmented
                 assignments)
    comparison   < <-> <=, > <-> >=, == <-> !=, in <-> not in, is <-> is not
    constant     an int n -> n + 1, n - 1, 0; a float x -> x + 1, 0.0; True <-> False; a string s -> "" and s + "x"
                 (an empty string -> "a")
    off_by_one   an argument of range(...), a slice bound or an index that is not a literal -> e + 1, e - 1 (literal
                 ones are the constant edits')
    boolean      and <-> or, `not e` -> e

Docstrings, f-string parts and annotations are left alone (editing them changes nothing a test can see). The
candidates are drawn in turn from each kind (an order and a shuffle within each kind that depend only on the seed
and the program), and a candidate whose text does not parse, or whose AST equals the original's or an earlier
mutant's, is skipped: the same program and seed give the same mutants.

`measure_many(tasks, sb, settings)` grades every mutant of every task against its hidden tests in one sandbox batch
(`Sandbox.run_tests_many`, stopping each mutant at its first failure). A mutant is killed when any test fails,
raises, times out or cannot run; the kill share is killed / mutants made. A task passes when the share is at least
`settings.min_kill`, or when no mutant can be made (the reason says so). `generator.validity` runs it as its
`adequacy` check when `generator.adequacy_mutants` > 0.
"""

from __future__ import annotations

import ast
import difflib
import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from generator.schema import Task

OPERATORS = ("arithmetic", "comparison", "constant", "off_by_one", "boolean")
ARITHMETIC: dict[type, tuple[type, ...]] = {
    ast.Add: (ast.Sub,),
    ast.Sub: (ast.Add,),
    ast.Mult: (ast.FloorDiv, ast.Add),
    ast.FloorDiv: (ast.Mult, ast.Mod),
    ast.Mod: (ast.FloorDiv,),
    ast.Div: (ast.Mult,),
    ast.Pow: (ast.Mult,),
}
COMPARISON: dict[type, type] = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}
SKIPPED_FIELDS = frozenset({"annotation", "returns", "type_comment", "type_params"})  # annotations change nothing
DIFF_CHARS = 70  # each side of a survivor's diff in a reason
SKIP_STATUSES = frozenset({"sandbox_error"})  # the sandbox's fault, not the tests' merit: the mutant is not counted


@dataclass(frozen=True)
class AdequacySettings:
    """`generator.adequacy_mutants` (k; 0 = off) and `generator.adequacy_min_kill` (the share of mutants the hidden
    tests must kill); `seed` picks which mutants of a program are drawn."""

    mutants: int = 0
    min_kill: float = 0.8
    seed: int = 0

    def __post_init__(self) -> None:
        problem = settings_problem(self.mutants, self.min_kill)
        if problem:
            raise ValueError(problem)

    @property
    def on(self) -> bool:
        return self.mutants > 0

    @classmethod
    def from_config(cls, gen_cfg) -> AdequacySettings:
        """From the `generator:` section (its adequacy_mutants and adequacy_min_kill)."""
        return cls(mutants=int(gen_cfg.adequacy_mutants), min_kill=float(gen_cfg.adequacy_min_kill))


def settings_problem(mutants, min_kill) -> str:
    """The one-line refusal of bad adequacy settings, naming the key, or '' when they are fine."""
    if isinstance(mutants, bool) or not isinstance(mutants, int) or mutants < 0:
        return f"generator.adequacy_mutants must be an integer >= 0 (mutants per task; 0 = off), got {mutants!r}"
    if (
        isinstance(min_kill, bool)
        or not isinstance(min_kill, (int, float))
        or not math.isfinite(min_kill)
        or not 0.0 <= min_kill <= 1.0
    ):
        return f"generator.adequacy_min_kill must be a number in [0, 1] (share of mutants killed), got {min_kill!r}"
    return ""


@dataclass(frozen=True)
class Mutant:
    source: str  # the mutated program (ast.unparse)
    operator: str  # one of OPERATORS
    diff: str  # one line: `old line -> new line`


@dataclass(frozen=True)
class AdequacyResult:
    mutants: int  # mutants made and graded (those the sandbox could not run are left out)
    killed: int
    min_kill: float
    survivors: tuple[Mutant, ...] = ()  # the mutants every hidden test let through, in the order they were made
    operators: tuple[tuple[str, bool], ...] = ()  # (operator, killed) of every graded mutant

    @property
    def survivor(self) -> Mutant | None:
        return self.survivors[0] if self.survivors else None

    @property
    def share(self) -> float | None:
        return self.killed / self.mutants if self.mutants else None

    @property
    def passed(self) -> bool:
        return self.mutants == 0 or self.killed >= self.min_kill * self.mutants - 1e-9

    @property
    def reason(self) -> str:
        """Why it failed, or (when it passed without mutants) that none could be made; '' otherwise."""
        if self.mutants == 0:
            return "no mutant could be made of the reference: adequacy not measured"
        if self.passed:
            return ""
        head = f"the hidden tests kill {self.killed}/{self.mutants} mutants ({self.share:.0%} < {self.min_kill:.0%})"
        return f"{head}; one survives: {self.survivor.diff}" if self.survivor else head


# ================================================================================ making mutants
@dataclass(frozen=True)
class _Site:
    operator: str
    index: int  # position of the node in _nodes' order
    variant: int


def _nodes(tree: ast.AST) -> Iterator[tuple[ast.AST, ast.AST | None, str, int | None]]:
    """(node, parent, field, index in the field's list) in a fixed pre-order, without annotations, docstrings and
    f-string parts."""
    stack: list[tuple[ast.AST, ast.AST | None, str, int | None]] = [(tree, None, "", None)]
    while stack:
        node, parent, field, idx = stack.pop()
        yield node, parent, field, idx
        if isinstance(node, ast.JoinedStr):
            children = [(v.value, v, "value", None) for v in node.values if isinstance(v, ast.FormattedValue)]
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            children = []  # a docstring or a bare literal: no behaviour to change
        else:
            children = []
            for name, value in ast.iter_fields(node):
                if name in SKIPPED_FIELDS:
                    continue
                if isinstance(value, ast.AST):
                    children.append((value, node, name, None))
                elif isinstance(value, list):
                    children += [(v, node, name, i) for i, v in enumerate(value) if isinstance(v, ast.AST)]
        stack.extend(reversed(children))


def _constant_values(value) -> list:
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [v for v in dict.fromkeys((value + 1, value - 1, 0)) if v != value]
    if isinstance(value, float):
        return [v for v in dict.fromkeys((value + 1.0, 0.0)) if v != value]
    if isinstance(value, str):
        return ["", value + "x"] if value else ["a"]
    return []


def _is_literal(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) or (
        isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant)
    )


def _off_by_one_target(node: ast.AST, parent: ast.AST | None, field: str) -> bool:
    """An expression that is a range argument, a slice bound or an index, and not a literal."""
    if not isinstance(node, ast.expr) or _is_literal(node) or isinstance(node, (ast.Slice, ast.Tuple, ast.Starred)):
        return False
    if isinstance(parent, ast.Call) and field == "args":
        return isinstance(parent.func, ast.Name) and parent.func.id == "range"
    if isinstance(parent, ast.Slice):
        return field in ("lower", "upper")
    return isinstance(parent, ast.Subscript) and field == "slice" and isinstance(parent.ctx, ast.Load)


def _variants(node: ast.AST, parent: ast.AST | None, field: str) -> list[tuple[str, int]]:
    """(operator, variant) of every edit possible at this node."""
    out: list[tuple[str, int]] = []
    if isinstance(node, (ast.BinOp, ast.AugAssign)):
        out += [("arithmetic", v) for v in range(len(ARITHMETIC.get(type(node.op), ())))]
    elif isinstance(node, ast.Compare):
        out += [("comparison", j) for j, op in enumerate(node.ops) if type(op) in COMPARISON]
    elif isinstance(node, ast.BoolOp):
        out.append(("boolean", 0))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not) and parent is not None:
        out.append(("boolean", 0))
    elif isinstance(node, ast.Constant):
        out += [("constant", v) for v in range(len(_constant_values(node.value)))]
    if parent is not None and _off_by_one_target(node, parent, field):
        out += [("off_by_one", 0), ("off_by_one", 1)]
    return out


def _replace(parent: ast.AST, field: str, idx: int | None, new: ast.AST) -> None:
    if idx is None:
        setattr(parent, field, new)
    else:
        getattr(parent, field)[idx] = new


def _apply(tree: ast.AST, site: _Site) -> None:
    node, parent, field, idx = list(_nodes(tree))[site.index]
    if site.operator == "arithmetic":
        node.op = ARITHMETIC[type(node.op)][site.variant]()
    elif site.operator == "comparison":
        node.ops[site.variant] = COMPARISON[type(node.ops[site.variant])]()
    elif site.operator == "boolean":
        if isinstance(node, ast.BoolOp):
            node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        else:
            _replace(parent, field, idx, node.operand)
    elif site.operator == "constant":
        node.value = _constant_values(node.value)[site.variant]
    else:  # off_by_one
        op = ast.Add() if site.variant == 0 else ast.Sub()
        _replace(parent, field, idx, ast.BinOp(left=node, op=op, right=ast.Constant(1)))


def mutation_sites(tree: ast.AST) -> list[_Site]:
    """Every single edit the operators can make to this tree, in the tree's order."""
    return [
        _Site(operator, i, variant)
        for i, (node, parent, field, _) in enumerate(_nodes(tree))
        for operator, variant in _variants(node, parent, field)
    ]


def _diff(before: str, after: str) -> str:
    """`old -> new` of the lines that differ, each side cut to DIFF_CHARS around the first changed character."""
    old = before.splitlines()
    new = after.splitlines()
    removed, added = [], []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=old, b=new, autojunk=False).get_opcodes():
        if tag != "equal":
            removed += old[i1:i2]
            added += new[j1:j2]
    a, b = " / ".join(s.strip() for s in removed), " / ".join(s.strip() for s in added)
    same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    start = max(0, min(same - DIFF_CHARS // 3, max(len(a), len(b)) - DIFF_CHARS))
    return f"{_cut(a, start)} -> {_cut(b, start)}"


def _cut(text: str, start: int) -> str:
    """DIFF_CHARS of `text` from `start`, with '...' where it was cut."""
    head = "..." if start > 0 else ""
    body = text[start:]
    return head + (body if len(body) <= DIFF_CHARS else body[: DIFF_CHARS - 3] + "...")


def _order(sites: list[_Site], rng: random.Random) -> list[_Site]:
    """The candidates in turn from each operator (operators in a seeded order, each operator's sites shuffled)."""
    groups = {op: [s for s in sites if s.operator == op] for op in OPERATORS}
    ops = [op for op in OPERATORS if groups[op]]
    rng.shuffle(ops)
    for op in ops:
        rng.shuffle(groups[op])
    out = []
    while any(groups[op] for op in ops):
        out += [groups[op].pop() for op in ops if groups[op]]
    return out


def make_mutants(source: str, k: int, seed: int = 0) -> list[Mutant]:
    """Up to k mutants of `source`, each one edit, each parsing and each different by AST from the original and from
    one another; [] for a program that does not parse or offers no edit. Deterministic in (source, k, seed)."""
    try:
        original = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    base = ast.unparse(original)
    seen = {ast.dump(ast.parse(base))}
    rng = random.Random(f"adequacy:{seed}")
    out: list[Mutant] = []
    for site in _order(mutation_sites(original), rng):
        if len(out) >= k:
            break
        tree = ast.parse(source)
        _apply(tree, site)
        try:
            text = ast.unparse(ast.fix_missing_locations(tree))
            dump = ast.dump(ast.parse(text))
        except (SyntaxError, ValueError, RecursionError, AttributeError, TypeError):
            continue
        if dump in seen:
            continue
        seen.add(dump)
        out.append(Mutant(text, site.operator, _diff(base, text)))
    return out


# ================================================================================ grading
def measure_many(
    tasks: Sequence[Task], sb, settings: AdequacySettings, *, timeout_s: float | None = None
) -> list[AdequacyResult]:
    """The adequacy of each task's hidden tests (outputs computed) against `settings.mutants` mutants of its
    reference, every mutant of every task graded in one `run_tests_many` batch."""
    jobs, owners, made = [], [], []
    for n, task in enumerate(tasks):
        if any("output" not in t for t in task.hidden_tests):
            raise ValueError(f"task {task.id or n}: hidden test outputs are not computed (validate it first)")
        mutants = make_mutants(task.reference_solution, settings.mutants, settings.seed)
        made.append(mutants)
        for mutant in mutants:
            jobs.append(
                dict(
                    solution=mutant.source,
                    entry_point=task.entry_point,
                    inputs=[t["input"] for t in task.hidden_tests],
                    expected=[t["output"] for t in task.hidden_tests],
                    timeout_s=timeout_s,
                    stop_on_failure=True,
                    clock="cpu",  # as the reference's runs (generator.validity.CLOCK): not the machine's load
                )
            )
            owners.append(n)
    reports = sb.run_tests_many(jobs) if jobs else []
    graded: list[list[tuple[Mutant, bool]]] = [[] for _ in tasks]
    counters = [0] * len(tasks)
    for n, report in zip(owners, reports):
        mutant = made[n][counters[n]]
        counters[n] += 1
        if report.status in SKIP_STATUSES:
            continue
        graded[n].append((mutant, not report.all_passed))
    results = []
    for pairs in graded:
        survivors = tuple(m for m, killed in pairs if not killed)
        results.append(
            AdequacyResult(
                mutants=len(pairs),
                killed=len(pairs) - len(survivors),
                min_kill=settings.min_kill,
                survivors=survivors,
                operators=tuple((m.operator, killed) for m, killed in pairs),
            )
        )
    return results


def measure(task: Task, sb, settings: AdequacySettings, *, timeout_s: float | None = None) -> AdequacyResult:
    """One task's adequacy (see measure_many)."""
    return measure_many([task], sb, settings, timeout_s=timeout_s)[0]
