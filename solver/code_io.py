"""The three solver tasks of a code_io proposal (generator/code_io.py; docs/code_io.md):

    deduction   program + input   -> the output        graded by exact typed comparison (sandbox.outputs_equal)
    abduction   program + output  -> an input           graded by running the program on that input in the sandbox
    induction   pairs + message   -> the program        graded by running it on the held-back inputs in the sandbox

`tasks_from_proposal` builds them from an accepted proposal; `task_prompt` writes what the solver sees;
`parse_output`, `parse_input` and `extract_code` (solver/parse.py) read its answer; `verify` / `verify_many` grade
answers with a reward in [0, 1], a short status and, where one applies, the reward's penalty kind (`Verdict.flag`,
solver/rewards.py). An induction answer that imports or calls something refused (generator.code_io's
`check_program_safe`) is graded 0 without running. Parsers and verifiers never raise on a model's text.
solver/kinds.py asks these three kinds about any task with a reference program and tests.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard, cast

import sandbox
from generator.code_io import (
    ENTRY_POINT,
    KINDS,
    MAX_VALUE_CHARS,
    AcceptedProposal,
    call_many,
    check_program_safe,
    format_args,
    parse_args,
    parse_value,
)
from solver.parse import ParsedAnswer, extract_code

STATUSES = ("correct", "wrong", "no_answer", "error")
MAX_ANSWER_CHARS = 20_000  # longer answers are read from their end (where the final answer stands)


@dataclass(frozen=True)
class CodeIOTask:
    """One solver task from an accepted proposal."""

    kind: str  # one of KINDS
    program: str  # the proposal's program: shown in deduction and abduction, hidden in induction
    pairs: tuple  # graded (argument tuple, output) pairs: one in deduction and abduction, the
    # held-back pairs in induction
    shown: tuple = ()  # induction: the (argument tuple, output) pairs the solver sees
    message: str = ""  # induction: the proposal's one-line description


@dataclass(frozen=True)
class ParsedValue:
    """A literal read from a solver's answer: the output (deduction) or the argument tuple (abduction)."""

    ok: bool
    value: Any = None
    reason: str = ""  # why there is no value ('' when ok)


@dataclass(frozen=True)
class Verdict:
    reward: float  # in [0, 1]
    status: str  # one of STATUSES
    detail: str = ""  # one line: what was compared or what went wrong
    # the answer's penalty kind (solver.rewards.PENALTY_KINDS: syntax_error, banned_api, timeout, empty_answer) or ''
    flag: str = ""


# ============================================================================================ tasks
def deduction_tasks(p: AcceptedProposal) -> list[CodeIOTask]:
    """One deduction task per (input, output) pair."""
    return [CodeIOTask("deduction", p.program, (pair,)) for pair in p.pairs]


def abduction_tasks(p: AcceptedProposal) -> list[CodeIOTask]:
    """One abduction task per (input, output) pair (the input is the known answer, never shown)."""
    return [CodeIOTask("abduction", p.program, (pair,)) for pair in p.pairs]


def induction_task(p: AcceptedProposal, n_shown: int | None = None) -> CodeIOTask | None:
    """The pairs split into shown (the first `n_shown`, default half, at least one) and held back (the rest, at
    least one), with the message; None when the proposal has fewer than two pairs."""
    pairs = p.pairs
    if len(pairs) < 2:
        return None
    n = max(1, len(pairs) // 2) if n_shown is None else n_shown
    if not 1 <= n < len(pairs):
        raise ValueError(f"n_shown={n}: show 1..{len(pairs) - 1} of {len(pairs)} pairs")
    return CodeIOTask("induction", p.program, pairs[n:], shown=pairs[:n], message=p.message)


def tasks_from_proposal(p: AcceptedProposal, kinds: Sequence[str] = KINDS) -> list[CodeIOTask]:
    """The tasks of the given kinds one accepted proposal gives (induction only with two pairs or more)."""
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown task kind(s) {sorted(unknown)}; use {', '.join(KINDS)}")
    tasks: list[CodeIOTask] = []
    if "deduction" in kinds:
        tasks += deduction_tasks(p)
    if "abduction" in kinds:
        tasks += abduction_tasks(p)
    if "induction" in kinds:
        task = induction_task(p)
        tasks += [task] if task is not None else []
    return tasks


# =========================================================================================== prompts
def _call(args: tuple) -> str:
    return f"{ENTRY_POINT}({format_args(args)})"


def task_prompt(task: CodeIOTask) -> str:
    """What the solver sees for a task: short, plain text, ending with the form of the answer."""
    if task.kind == "deduction":
        ((args, _),) = task.pairs
        return "\n".join(
            [
                "Here is a Python function:",
                "",
                "```python",
                task.program.strip("\n"),
                "```",
                "",
                f"What does {_call(args)} return?",
                "Reason as you need, then give the returned value as a Python literal in a ```python "
                "block at the end of your answer.",
            ]
        )
    if task.kind == "abduction":
        ((_, output),) = task.pairs
        return "\n".join(
            [
                "Here is a Python function:",
                "",
                "```python",
                task.program.strip("\n"),
                "```",
                "",
                f"Find arguments for which {ENTRY_POINT} returns {output!r}.",
                f"Reason as you need, then give the call, e.g. {ENTRY_POINT}(1, [2, 3]), with literal "
                f"arguments in a ```python block at the end of your answer.",
            ]
        )
    if task.kind == "induction":
        lines = [f"Write a Python function `{ENTRY_POINT}` that behaves like this:", ""]
        lines += [f"{_call(args)} == {output!r}" for args, output in task.shown]
        if task.message:
            lines += ["", f"Hint: {task.message}"]
        lines += ["", f"It will be tested on other inputs. Give the function `{ENTRY_POINT}` in a ```python block."]
        return "\n".join(lines)
    raise ValueError(f"unknown task kind {task.kind!r}")


# =========================================================================================== parsers
_FENCE = re.compile(r"```[ \t]*[A-Za-z0-9_+-]*[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


def _candidates(text: str) -> list[str]:
    """Texts that may hold the final answer, most likely first: fenced blocks from the last, then the last
    non-empty line (without a leading 'answer:' or 'output:' label)."""
    text = text[-MAX_ANSWER_CHARS:]
    blocks = [m.group(1).strip() for m in _FENCE.finditer(text)][::-1]
    lines = [line.strip().strip("`").strip() for line in text.splitlines() if line.strip()]
    last = (
        re.sub(
            r"^(?:the\s+)?(?:final\s+)?(?:answer|output|input|result|returns?)\s*(?:is)?\s*[:=]?\s*",
            "",
            lines[-1],
            flags=re.IGNORECASE,
        )
        if lines
        else ""
    )
    return [b for b in blocks if b] + ([last] if last and not blocks else [])


def _expression(text: str) -> ast.expr | None:
    try:
        return ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None


def _is_call_of_f(node: ast.expr | None) -> TypeGuard[ast.Call]:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == ENTRY_POINT


def _compared(node: ast.expr | None) -> tuple[ast.expr | None, ast.expr | None]:
    """(left, right) of `left == right`, else (node, None)."""
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.Eq):
        return node.left, node.comparators[0]
    return node, None


def parse_output(text: str) -> ParsedValue:
    """A deduction answer: the plain literal in the last ```python block (or on the last line), also written as
    `f(...) == VALUE`. Never raises."""
    if not isinstance(text, str) or not text.strip():
        return ParsedValue(False, reason="empty answer")
    reason = "no answer found"
    for candidate in _candidates(text):
        left, right = _compared(_expression(candidate))
        if right is not None and _is_call_of_f(left):
            candidate = ast.get_source_segment(candidate, right) or ""
        ok, value = parse_value(candidate)
        if ok and len(repr(value)) <= 4 * MAX_VALUE_CHARS:
            return ParsedValue(True, value)
        reason = f"answer is {value}" if not ok else "answer is too long"
    return ParsedValue(False, reason=reason)


def parse_input(text: str) -> ParsedValue:
    """An abduction answer: the argument tuple of the call `f(ARGS)` in the last ```python block (or on the last
    line); bare arguments `ARGS` are read too. Never raises."""
    if not isinstance(text, str) or not text.strip():
        return ParsedValue(False, reason="empty answer")
    reason = "no answer found"
    for candidate in _candidates(text):
        lines = [line for line in candidate.splitlines() if line.strip() and not line.lstrip().startswith("#")]
        for line in (["\n".join(lines)] + lines[::-1]) if len(lines) > 1 else lines:
            left, _ = _compared(_expression(line))
            if _is_call_of_f(left) and left.keywords:
                reason = "input: arguments must be positional literals (no name=value)"
                continue
            inner = ", ".join(ast.get_source_segment(line, a) or "" for a in left.args) if _is_call_of_f(left) else line
            args = parse_args(inner)
            if isinstance(args, tuple):
                return ParsedValue(True, args)
            reason = f"input: {args}"
    return ParsedValue(False, reason=reason)


# ========================================================================================= verifiers
def verify_deduction(task: CodeIOTask, answer: str) -> Verdict:
    """1 when the answer's value equals the output, typed (sandbox.outputs_equal: a tuple is not a list, True is
    not 1; a float within a relative 1e-6), else 0."""
    parsed = parse_output(answer)
    if not parsed.ok:
        return Verdict(0.0, "no_answer", parsed.reason, _no_answer_flag(answer))
    ((_, expected),) = task.pairs
    if sandbox.outputs_equal(parsed.value, expected):
        return Verdict(1.0, "correct")
    return Verdict(0.0, "wrong", f"answered {repr(parsed.value)[:60]}")


def verify_many(
    tasks: Sequence[CodeIOTask],
    answers: Sequence[str],
    sb,
    *,
    timeout_s: float | None = None,
    partial_credit: bool = False,
) -> list[Verdict]:
    """Grade answers, one per task, the sandbox work of all of them in parallel. Deduction compares values here;
    abduction runs the task's program on the answer's arguments; induction runs the answer's program on the
    held-back inputs (reward 1 when every one is right, or with `partial_credit` the fraction right)."""
    if len(tasks) != len(answers):
        raise ValueError(f"{len(answers)} answers for {len(tasks)} tasks")
    verdicts: list[Verdict | None] = [None] * len(tasks)
    jobs, where = [], []
    parsed: ParsedValue | ParsedAnswer  # abduction's arguments, induction's program
    for i, (task, answer) in enumerate(zip(tasks, answers)):
        if task.kind == "deduction":
            verdicts[i] = verify_deduction(task, answer)
        elif task.kind == "abduction":
            parsed = parse_input(answer)
            if not parsed.ok:
                verdicts[i] = Verdict(0.0, "no_answer", parsed.reason, _no_answer_flag(answer))
            else:
                jobs.append((task.program, (parsed.value,)))
                where.append(i)
        elif task.kind == "induction":
            parsed = extract_code(answer if isinstance(answer, str) else "", entry_point=ENTRY_POINT)
            refused = _refused(cast(str, parsed.code)) if parsed.ok else ""  # ok: its code is a str
            if not parsed.ok:
                flag = "syntax_error" if parsed.status == "syntax_error" else _no_answer_flag(answer)
                verdicts[i] = Verdict(0.0, "no_answer", parsed.reason, flag)
            elif refused:
                verdicts[i] = Verdict(0.0, "error", f"refused: {refused}", "banned_api")
            else:
                jobs.append((cast(str, parsed.code), tuple(args for args, _ in task.pairs)))  # ok, as above
                where.append(i)
        else:
            raise ValueError(f"unknown task kind {task.kind!r}")
    for i, outcomes in zip(where, call_many(sb, jobs, timeout_s=timeout_s)):
        verdicts[i] = _graded(tasks[i], outcomes, partial_credit)
    return cast(list[Verdict], verdicts)  # each task has its verdict: at once, or from its sandbox job


def verify(
    task: CodeIOTask, answer: str, sb=None, *, timeout_s: float | None = None, partial_credit: bool = False
) -> Verdict:
    """Grade one answer (see verify_many); `sb` may be None for deduction."""
    if task.kind == "deduction":
        return verify_deduction(task, answer)
    if sb is None:
        raise ValueError(f"{task.kind} needs a sandbox to grade")
    return verify_many([task], [answer], sb, timeout_s=timeout_s, partial_credit=partial_credit)[0]


def _no_answer_flag(answer) -> str:
    """The penalty kind of an answer with nothing to grade: empty_answer for no text, else none."""
    return "empty_answer" if not isinstance(answer, str) or not answer.strip() else ""


def _refused(code: str) -> str:
    """Why an induction answer's program is not run (a refused import or call), or ''."""
    try:
        return check_program_safe(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return "does not parse"


def _flag(outcomes) -> str:
    """timeout when a run ran out of time, else ''."""
    return "timeout" if any(o.status == "timeout" for o in outcomes) else ""


def _graded(task: CodeIOTask, outcomes, partial_credit: bool) -> Verdict:
    """Compare the sandbox outcomes with the task's outputs."""
    if task.kind == "abduction":
        ((_, expected),) = task.pairs
        o = outcomes[0]
        if o.status != "ok":
            return Verdict(0.0, "error", o.reason, _flag(outcomes))
        if sandbox.outputs_equal(o.value, expected):
            return Verdict(1.0, "correct")
        return Verdict(0.0, "wrong", f"f returns {repr(o.value)[:60]} on that input")
    right = [
        o.status == "ok" and sandbox.outputs_equal(o.value, expected) for o, (_, expected) in zip(outcomes, task.pairs)
    ]
    n, total = sum(right), len(task.pairs)
    if n == total:
        return Verdict(1.0, "correct", f"{n}/{total} held-back inputs")
    failed = next(o for o, r in zip(outcomes, right) if not r)
    status = "error" if failed.status != "ok" else "wrong"
    detail = f"{n}/{total} held-back inputs" + (f"; {failed.reason}" if failed.reason else "")
    return Verdict(n / total if partial_credit else 0.0, status, detail, _flag(outcomes))
