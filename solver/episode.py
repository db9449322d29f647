"""Solver episodes: single-turn (write, graded) and multi-turn with a hybrid action space.

Multi-turn: each turn the solver answers with one action,

    ACTION: write      followed by code: defines or replaces functions in its working module
    ACTION: run        runs the visible tests on the working module; the results come back as the next observation
    ACTION: check      static check (parses, entry point defined, banned APIs, cyclomatic complexity)
    ACTION: submit     grades the working module on the hidden tests and ends the episode

An answer without an ACTION line but with code counts as `write` (then `submit` in single-turn mode). When the turn
limit is reached the working module is submitted. `run` goes through the sandbox's incremental runner, so a test
whose reachable code did not change since the previous `run` is not executed again (sandbox/incremental.py).

The episode works on text: the caller turns prompts and observations into tokens and samples answers
(selfplay/rollout/episodes.py), which keeps this module free of models. Rewards come from solver/rewards.py.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from dataclasses import dataclass, field

from generator.schema import Task
from generator.validity import check_safe
from solver.parse import extract_code
from solver.prompts import feedback_text
from solver.rewards import RewardConfig, RewardInputs, reward_terms, total_reward

ACTIONS = ("write", "run", "check", "submit")
_ACTION = re.compile(r"^\s*ACTION:\s*(\w+)\s*$", re.IGNORECASE | re.MULTILINE)


def parse_action(text: str) -> tuple[str, str | None]:
    """(action, code or None) from a solver answer. Unknown or missing ACTION with code -> write."""
    m = _ACTION.search(text or "")
    action = m.group(1).lower() if m else None
    rest = text[m.end() :] if m else (text or "")
    parsed = extract_code(rest)
    # code that does not parse is still the answer: the static check then flags (and penalises) the syntax error
    code = parsed.code if parsed.code is not None else (parsed.candidate or None)
    if action not in ACTIONS:
        action = "write" if code else "submit"
    return action, code


def merge_module(current: str, new_code: str) -> str:
    """The working module after `write`: functions/classes of new_code replace same-named ones of current (in
    place) or are appended; other top-level statements (imports, constants) are kept once each."""
    try:
        old_tree = ast.parse(current) if current.strip() else ast.Module(body=[], type_ignores=[])
        new_tree = ast.parse(new_code)
    except SyntaxError:
        return new_code  # nothing sensible to merge with: the new code replaces the module, errors included
    old_lines, new_lines = current.splitlines(), new_code.splitlines()

    def segment(lines, node):
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
        return "\n".join(lines[start : node.end_lineno])

    named = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    new_defs = {n.name: segment(new_lines, n) for n in new_tree.body if isinstance(n, named)}
    new_other = [segment(new_lines, n) for n in new_tree.body if not isinstance(n, named)]
    parts, used = [], set()
    for node in old_tree.body:
        text = segment(old_lines, node)
        if isinstance(node, named) and node.name in new_defs:
            parts.append(new_defs[node.name])
            used.add(node.name)
        else:
            parts.append(text)
    for stmt in new_other:
        if stmt not in parts:
            parts.insert(0, stmt) if stmt.startswith(("import ", "from ")) else parts.append(stmt)
    parts += [text for name, text in new_defs.items() if name not in used]
    return "\n\n".join(parts).strip("\n") + "\n"


def static_report(task: Task, code: str) -> tuple[str, set[str]]:
    """Text of a static check and the penalty flags it implies."""
    flags: set[str] = set()
    if not code.strip():
        return "no code yet", {"empty_answer"}
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        return f"syntax error line {exc.lineno}: {exc.msg}", {"syntax_error"}
    lines = ["parses: yes"]
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    lines.append(f"defines {task.entry_point}: {'yes' if task.entry_point in defined else 'no'}")
    safe = check_safe(dataclasses.replace(task, reference_solution=code))
    if not safe.passed:
        flags.add("banned_api")
        lines.append(f"banned: {safe.reason}")
    try:
        from radon.complexity import cc_visit

        lines.append(f"complexity: {sum(b.complexity for b in cc_visit(code))}")
    except (SyntaxError, ValueError):
        pass
    return "\n".join(lines), flags


@dataclass
class EpisodeResult:
    code: str  # the submitted module
    actions: list[str]  # one per turn
    reward: float  # weighted total (solver/rewards.py)
    terms: dict[str, float]  # every reward term, unweighted
    hidden_passed: int
    hidden_total: int
    status: str  # sandbox status of the hidden-test run
    turns_to_success: int | None = None  # first turn after which all visible tests passed (multi-turn)
    visible_progress: list[int] = field(default_factory=list)  # visible tests passing after each `run`

    @property
    def solved(self) -> bool:
        return self.hidden_total > 0 and self.hidden_passed == self.hidden_total


class CodeEpisode:
    """One task, one solver, up to `max_turns` turns. Drive it with `observe()` / `act(answer_text)`."""

    def __init__(self, task: Task, sb, *, max_turns: int = 1, reward_cfg: RewardConfig | None = None, runner=None):
        if max_turns < 1:
            raise ValueError("max_turns must be >= 1")
        self.task, self.sb, self.max_turns = task, sb, max_turns
        self.reward_cfg = reward_cfg or RewardConfig()
        self.runner = runner  # sandbox.incremental.IncrementalRunner for `run` across turns (optional)
        self.module = ""
        self.actions: list[str] = []
        self.flags: set[str] = set()
        self.visible_passed = 0
        self.visible_progress: list[int] = []
        self.turns_to_success: int | None = None
        self.result: EpisodeResult | None = None
        self._progress = 0.0

    @property
    def done(self) -> bool:
        return self.result is not None

    def act(self, answer: str) -> str | None:
        """Apply one answer; returns the next observation text, or None when the episode has ended."""
        if self.done:
            raise RuntimeError("episode already finished")
        action, code = parse_action(answer)
        self.actions.append(action)
        ends = len(self.actions) >= self.max_turns  # the last turn, or an action that submits (below)
        if action == "write":
            if code is None:
                observation = "no code found in the answer"
            else:
                self.module = merge_module(self.module, code)
                observation = "module updated"
        elif action == "run":
            observation = self._run_visible()
        elif action == "check":
            observation, _ = static_report(self.task, self.module)
        else:
            ends = True
        if ends:
            self._submit()
            return None
        return feedback_text(observation)

    def _run_visible(self) -> str:
        tests = self.task.visible_tests
        inputs = [t["input"] for t in tests]
        expected = [t["output"] for t in tests]
        if self.runner is not None:
            report = self.runner.run_tests(self.module, self.task.entry_point, inputs, expected)
        else:
            report = self.sb.run_tests(self.module, self.task.entry_point, inputs, expected)
        before, self.visible_passed = self.visible_passed, report.passed
        self._progress += (report.passed - before) / max(1, len(tests))
        self.visible_progress.append(report.passed)
        if report.passed == len(tests) and self.turns_to_success is None:
            self.turns_to_success = len(self.actions)
        lines = [f"{report.passed}/{len(tests)} visible tests pass"]
        for i, outcome in enumerate(report.tests):
            if not outcome.passed:
                got = outcome.error or repr(outcome.output)
                lines.append(f"test {i + 1}: input {tests[i]['input']!r} expected {expected[i]!r} got {got[:200]}")
        return "\n".join(lines)

    def _submit(self) -> None:
        task = self.task
        _, flags = static_report(task, self.module)
        self.flags |= flags
        hidden = task.hidden_tests
        if "syntax_error" in flags or "empty_answer" in flags:
            passed, status = 0, "error" if "syntax_error" in flags else "empty"
        else:
            report = self.sb.run_tests(
                self.module, task.entry_point, [t["input"] for t in hidden], [t["output"] for t in hidden]
            )
            passed, status = report.passed, report.status
            if report.status == "timeout":
                self.flags.add("timeout")
        sol_s = ref_s = None
        if self.reward_cfg.efficiency and hidden and passed == len(hidden):
            # runtime of the module load and the hidden tests against the reference's (cached after its first
            # run), as the sandbox's server measured them (TestReport.compute_s): nothing the program writes or
            # does (forged frames, work moved into import time) shortens it, and process start-up does not count
            ref = self.sb.run_tests(task.reference_solution, task.entry_point, [t["input"] for t in hidden])
            sol_s, ref_s = report.compute_s, ref.compute_s
        inputs = RewardInputs(
            hidden_passed=passed,
            hidden_total=len(hidden),
            flags=set(self.flags),
            solution_time_s=sol_s,
            reference_time_s=ref_s,
        )
        terms = reward_terms(inputs)
        terms["progress"] = self._progress
        if self.reward_cfg.quality:
            from solver.rewards import quality

            terms["quality"] = quality(self.module, task.reference_solution)
        self.result = EpisodeResult(
            code=self.module,
            actions=self.actions,
            reward=total_reward(terms, self.reward_cfg),
            terms=terms,
            hidden_passed=passed,
            hidden_total=len(hidden),
            status=status,
            turns_to_success=self.turns_to_success,
            visible_progress=self.visible_progress,
        )
        return None
