"""Solver task kinds: the ways of asking the solver about a task that has a reference program and tests.

    program     the description (and visible examples) -> the function      today's episode (solver/episode.py)
    deduction   the program + one input                 -> its output        graded by typed comparison
    abduction   the program + one output                -> an input for it   graded by running the program on it
    induction   the visible pairs + the description     -> the function      graded on the hidden tests' inputs

The last three are solver/code_io.py's kinds, asked about any `generator.schema.Task` (procedural or
generator-made): `code_io_tasks` turns tasks into code_io's `CodeIOTask`s, and `KindEpisode` is their one-turn
episode, graded by code_io's verifiers in the sandbox and rewarded by the run's reward config (solver/rewards.py).

The conversion: the reference's entry point is renamed to code_io's `f` (generator.code_io.rename_entry: by token,
so its text is kept; a name `f` it already uses is renamed first), and the renamed program is run on every test's
input in the sandbox, which gives each output with its Python type (a tuple stays a tuple: a JSON test output
would read as a list). A pair is kept only where that output, seen as JSON, equals the test's stored output.
Deduction and abduction ask about one kept pair, chosen by a hash of the task's id and the kind (the same for every
sample and every rank); induction shows the kept visible pairs with the description (one line, cut to code_io's
message length) and grades on the kept hidden ones. A task that cannot be asked in a kind (no pair kept, no
visible or no hidden pair for induction, no top-level entry point to rename) gives None: the caller asks it as a
program task instead.

The warm start teaches the kinds on the procedural tasks (`kind_examples`): each task asked in its kind gives the
kind's prompt and its right answer (`kind_answer`: the output as a literal, the call `f(...)` of the task's own
input, the reference renamed `f`, each in a python fence, as code_io's parsers read them); the program kind, and a
task that cannot be asked in its kind, give the program pair (the description's prompt, the reference solution).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import sandbox
from generator.code_io import ENTRY_POINT, MAX_MESSAGE_CHARS, AcceptedProposal, call_many, format_args, rename_entry
from generator.code_io import KINDS as CODE_IO_KINDS
from generator.schema import Task
from solver.code_io import CodeIOTask, abduction_tasks, deduction_tasks, induction_task, task_prompt, verify
from solver.episode import EpisodeResult
from solver.prompts import answer_text
from solver.prompts import task_prompt as program_prompt
from solver.rewards import PENALTY_KINDS, RewardConfig, RewardInputs, reward_terms, total_reward

PROGRAM = "program"
KINDS = (PROGRAM, *CODE_IO_KINDS)  # program, deduction, abduction, induction
MAX_KEPT_ANSWER_CHARS = 2000  # of an answer's text kept as the episode's `code` (for logs)


# ======================================================================================== conversion
def _message(description: str) -> str:
    """The description on one line, cut to code_io's message length."""
    text = " ".join(description.split())
    return text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 3].rstrip() + "..."


def _pick(task_id: str, kind: str, n: int) -> int:
    """A pair index in range(n), a function of the task's id and the kind only."""
    return int.from_bytes(hashlib.sha256(f"{task_id}:{kind}".encode()).digest()[:8], "big") % n


def _agrees(outcome, stored) -> bool:
    """The typed output equals the test's stored (JSON) output."""
    if outcome.status != "ok":
        return False
    try:
        return sandbox.outputs_equal(sandbox.normalize(outcome.value), stored)
    except sandbox.SandboxError:  # a set: no JSON test output can stand for it
        return False


def code_io_tasks(
    tasks: Sequence[Task], kinds: Sequence[str], sb, *, timeout_s: float | None = None
) -> list[CodeIOTask | None]:
    """For each task and the kind it is asked in: its code_io task, or None for the program kind and for a task that
    cannot be asked in its kind (see the module docstring). The references run in one sandbox batch (cached)."""
    if len(tasks) != len(kinds):
        raise ValueError(f"{len(kinds)} kinds for {len(tasks)} tasks")
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise ValueError(f"unknown task kind(s) {unknown}; use {', '.join(KINDS)}")
    jobs, where = [], []
    for i, (task, kind) in enumerate(zip(tasks, kinds)):
        program = rename_entry(task.reference_solution, task.entry_point) if kind != PROGRAM else None
        if program is not None and task.outputs_computed and task.tests:
            jobs.append((program, [tuple(t["input"]) for t in task.tests]))
            where.append(i)
    out: list[CodeIOTask | None] = [None] * len(tasks)
    for i, (program, inputs), outcomes in zip(where, jobs, call_many(sb, jobs, timeout_s=timeout_s)):
        task, kind = tasks[i], kinds[i]
        kept = [
            (args, o.value, n < len(task.visible_tests))
            for n, (args, o, test) in enumerate(zip(inputs, outcomes, task.tests))
            if _agrees(o, test["output"])
        ]
        if kind == "induction":
            kept.sort(key=lambda x: not x[2])  # visible first (a stable sort keeps each part's order)
        proposal = AcceptedProposal(
            program, tuple(a for a, _, _ in kept), tuple(v for _, v, _ in kept), _message(task.description)
        )
        if kind == "induction":
            shown = sum(visible for _, _, visible in kept)
            if 1 <= shown < len(kept):
                out[i] = induction_task(proposal, n_shown=shown)
        elif kept:
            asked = deduction_tasks(proposal) if kind == "deduction" else abduction_tasks(proposal)
            out[i] = asked[_pick(task.id, kind, len(asked))]
    return out


def kind_prompt(task: CodeIOTask) -> str:
    """What the solver sees for a code_io task (code_io's prompt)."""
    return task_prompt(task)


# ========================================================================================== examples
def kind_answer(task: CodeIOTask) -> str:
    """The right answer to a code_io task, as its parser reads it: deduction the output as a literal, abduction the
    call of the task's own input, induction the program; each in a python fence."""
    if task.kind == "deduction":
        ((_, output),) = task.pairs
        return answer_text(repr(output))
    if task.kind == "abduction":
        ((args, _),) = task.pairs
        return answer_text(f"{ENTRY_POINT}({format_args(args)})")
    if task.kind == "induction":
        return answer_text(task.program)
    raise ValueError(f"unknown task kind {task.kind!r}")


@dataclass(frozen=True)
class KindExample:
    """One (prompt, answer) pair of the solver's warm start and how it was asked."""

    kind: str  # the kind asked: the one drawn, or program where the task cannot be asked in it
    prompt: str
    answer: str
    asked: CodeIOTask | None  # the code_io task (None for the program kind)


def kind_examples(
    tasks: Sequence[Task], kinds: Sequence[str], sb, *, prompt_kw: dict | None = None, timeout_s: float | None = None
) -> list[KindExample]:
    """One example per task, asked in its kind (kinds[i] for tasks[i]): a code_io kind's prompt (`kind_prompt`)
    and right answer (`kind_answer`); the program kind, and a task that cannot be asked in its kind, the program
    prompt (solver.prompts.task_prompt with `prompt_kw`) and the reference solution. The references run in `sb`."""
    out = []
    for task, asked in zip(tasks, code_io_tasks(tasks, kinds, sb, timeout_s=timeout_s)):
        if asked is None:
            prompt = program_prompt(task, **(prompt_kw or {}))
            out.append(KindExample(PROGRAM, prompt, answer_text(task.reference_solution), None))
        else:
            out.append(KindExample(asked.kind, kind_prompt(asked), kind_answer(asked), asked))
    return out


# ========================================================================================== episodes
class KindEpisode:
    """One task asked in a code_io kind: one answer, graded when given. The interface of solver.episode.CodeEpisode
    (`done`, `act`, `result`, `task`), so that the rollouts drive both alike. The reward is the run's reward config
    over the terms a program episode has: the held-back inputs stand for the hidden tests (one for deduction and
    abduction), and the verdict's penalty kind (an empty answer, a syntax error, a refused import, a timeout) for the
    static check's."""

    def __init__(self, task: Task, asked: CodeIOTask, sb, *, reward_cfg: RewardConfig | None = None):
        self.task, self.asked, self.sb = task, asked, sb
        self.kind = asked.kind
        self.reward_cfg = reward_cfg or RewardConfig()
        self.result: EpisodeResult | None = None

    @property
    def done(self) -> bool:
        return self.result is not None

    def act(self, answer: str) -> None:
        """Grade the answer in the sandbox; the episode ends (no observation)."""
        if self.done:
            raise RuntimeError("episode already finished")
        verdict = verify(self.asked, answer, self.sb, partial_credit=True)
        total = len(self.asked.pairs)
        passed = round(verdict.reward * total)
        flags = {verdict.flag} & set(PENALTY_KINDS)
        terms = reward_terms(RewardInputs(hidden_passed=passed, hidden_total=total, flags=flags))
        terms["progress"] = 0.0
        text = answer if isinstance(answer, str) else ""
        self.result = EpisodeResult(
            code=text[-MAX_KEPT_ANSWER_CHARS:],
            actions=[self.kind],
            reward=total_reward(terms, self.reward_cfg),
            terms=terms,
            hidden_passed=passed,
            hidden_total=total,
            status=verdict.status,
        )
        return None
