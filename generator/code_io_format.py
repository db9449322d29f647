"""The code_io proposal format (`generator.format=code_io`): the generator writes a function `f` and the inputs to
call it on, as Absolute Zero Reasoner proposes; the outputs come from running `f` in the sandbox.

This module turns generator/code_io.py's proposal (its answer text, `parse_proposal`, `format_proposal`,
`generator_prompt`) into the project's `Task`, so that the loop, the warm start, the rollouts and the generator
probe use it as they use `free` and `mutation` (its object: generator.formats.CODE_IO):

    prompt      `generator_prompt` over K reference tasks, each shown as `f` (its entry point renamed) with a few
                of its calls and outputs; the instruction is a task kind of code_io.KINDS, drawn uniformly
    parse       `parse_proposal`, then what a task needs of it: a program that parses and defines `f`, inputs
                that are JSON values (lists, dicts with string keys: a task's values are JSON), a one-line message
    compile     a Task of family CODE_IO_FAMILY: reference_solution the program, entry point `f`, tests the
                inputs `[{"input": [args]}]` (outputs not yet computed), at least three of them hidden; its
                description the neutral induction message (`describe`) with the generator's message as a hint
    examples    the warm start's (prompt, answer) pairs: a procedural task's reference renamed `f`, its test
                inputs, its description as the message; other procedural tasks as the references

The outputs are computed in one place, the project's validity checks (generator.validity.validate_many), which
hold a task of CODE_IO_FAMILY to code_io's stricter rules as well: no `random` even seeded, no digests, no `id()`
or `hash()`, outputs of at most code_io.MAX_VALUE_CHARS characters; the second run of the determinism check calls
the inputs in reverse order. Every rejection is named by its check with its reason, as for any task.
"""

from __future__ import annotations

import ast
import random
import re
from collections.abc import Sequence

from generator.agent import ProposalError
from generator.build import BuildConfig
from generator.code_io import (
    ENTRY_POINT,
    KINDS,
    MAX_INPUTS,
    MAX_MESSAGE_CHARS,
    AcceptedProposal,
    Proposal,
    canonical_text,
    check_parses,
    entry_def,
    format_args,
    format_proposal,
    generator_prompt,
    output_refusal,
    parse_proposal,
    rename_entry,
    stricter_refusal,
)
from generator.fingerprint import ast_hash, task_id
from generator.schema import SchemaError, Task, check_json_value
from generator.validity import CODE_IO_FAMILY, MIN_HIDDEN, MIN_VISIBLE, validate_many

N_INPUTS = 6  # inputs a prompt asks for: three shown to the solver, three hidden (tasks.n_visible = 3)
# what a prompt shows of each reference: two calls, each value cut to 80 characters (the warm start's prompts with
# one reference, as the tiny world's train.references, take 365 tokens (median) and 477 (90th percentile))
PROMPT_PAIRS, PROMPT_CHARS = 2, 80
TARGET_ARGS_CHARS = 80  # a warm-start target's inputs: the calls of its task whose arguments are this short
# the cap of one answer's budget (agents.generator.max_new_tokens is capped by it): the warm-start targets take
# 195 tokens (median) and 276 (90th percentile) of the tiny world's tokenizer
MAX_ANSWER_TOKENS = 512
DESCRIPTION = "Write a Python function `f` that gives, for each call shown in the examples, the output shown."
HINT = " Hint: "


# ============================================================================================ tasks
def describe(message: str) -> str:
    """The task's description: the neutral induction message, with the generator's message as a hint."""
    message = " ".join(message.split())
    return DESCRIPTION + (f"{HINT}{message}" if message else "")


def message_of(task: Task) -> str:
    """The one-line message a reference task is shown with: a code_io task's hint, another task's description
    with its entry point called `f` ('' when longer than code_io.MAX_MESSAGE_CHARS)."""
    if task.family == CODE_IO_FAMILY:
        return task.description.split(HINT, 1)[1] if HINT in task.description else ""
    text = " ".join(task.description.split())
    if task.entry_point != ENTRY_POINT:
        text = re.sub(rf"\b{re.escape(task.entry_point)}\b", ENTRY_POINT, text)
    return text if len(text) <= MAX_MESSAGE_CHARS else ""


def renamed_program(task: Task) -> str | None:
    """The task's reference solution with its entry point called `f` (code_io.rename_entry), or None when it has
    no top-level entry point to rename."""
    return rename_entry(task.reference_solution, task.entry_point)


def reference_of(task: Task) -> AcceptedProposal | None:
    """A corpus task as the generator's prompt shows a reference: its program as `f`, its calls with their outputs,
    its message; None when its program cannot be shown as `f`."""
    program = renamed_program(task)
    if program is None:
        return None
    pairs = [(tuple(t["input"]), t["output"]) for t in task.tests if "output" in t and isinstance(t["input"], list)]
    return AcceptedProposal(
        program=program, inputs=tuple(a for a, _ in pairs), outputs=tuple(o for _, o in pairs), message=message_of(task)
    )


def signature_of(program: str) -> str:
    """The `def f(...)` line of the program's (last top-level) `f`, without its colon."""
    fn = entry_def(program)
    if fn is None:
        return f"def {ENTRY_POINT}()"
    returns = f" -> {ast.unparse(fn.returns)}" if fn.returns is not None else ""
    return f"def {ENTRY_POINT}({ast.unparse(fn.args)}){returns}"


# ============================================================================================ format
def choose_instruction(rng: random.Random, references: Sequence[Task], build_cfg: BuildConfig, weights=None) -> str:
    """A task kind of code_io.KINDS, drawn uniformly (the format's instructions are not weighed)."""
    return rng.choice(KINDS)


def build_prompt(references: Sequence[Task], instruction: str) -> str:
    """code_io.generator_prompt over the references that can be shown as `f`, asking for N_INPUTS inputs."""
    shown = [r for r in (reference_of(t) for t in references) if r is not None]
    return generator_prompt(shown, instruction, n_inputs=N_INPUTS, max_pairs=PROMPT_PAIRS, max_chars=PROMPT_CHARS)


def json_problem(args: tuple) -> str:
    """Why the arguments of one call cannot stand in a task's test (tuples and sets are not JSON, nor dicts with
    other keys than strings), or ''."""
    try:
        for j, arg in enumerate(args, 1):
            check_json_value(arg, f"argument {j}")
    except SchemaError as exc:
        return str(exc)
    return ""


def parse(text: str) -> Proposal | ProposalError:
    """code_io.parse_proposal, then what a task needs of the proposal: a program that parses and defines `f` (of
    at most code_io.MAX_PROGRAM_CHARS characters), inputs whose arguments are JSON values, a one-line message of at
    most code_io.MAX_MESSAGE_CHARS characters. Never raises."""
    parsed = parse_proposal(text)
    if isinstance(parsed, ProposalError):
        return parsed
    why = check_parses(parsed.program)
    if why:
        return ProposalError(f"the program {why}" if why.startswith(("does", "defines")) else why)
    for i, args in enumerate(parsed.inputs, 1):
        bad = json_problem(args)
        if bad:
            return ProposalError(f"input {i}: {bad} (a task's values are JSON: lists, dicts with string keys)")
    if len(parsed.message) > MAX_MESSAGE_CHARS:
        return ProposalError(f"message of {len(parsed.message)} characters exceeds {MAX_MESSAGE_CHARS}")
    return parsed


def compile_proposal(
    parsed: Proposal,
    references: Sequence[Task],
    *,
    step: int = 0,
    n_visible: int = 3,
    build_cfg: BuildConfig | None = None,
    checkpoint: str | None = None,
) -> Task:
    """The proposal as a task of CODE_IO_FAMILY, outputs not yet computed: the first inputs visible (`n_visible`,
    fewer when that would leave under validity.MIN_HIDDEN hidden, at least MIN_VISIBLE), the rest hidden."""
    inputs = [list(args) for args in parsed.inputs]
    tests = [{"input": x} for x in inputs]
    shown = max(MIN_VISIBLE, min(n_visible, len(tests) - MIN_HIDDEN))
    return Task(
        id=task_id(parsed.program, ENTRY_POINT, inputs),
        family=CODE_IO_FAMILY,
        source="generator",
        split="train",
        level=max([r.level for r in references], default=1),
        description=describe(parsed.message),
        entry_point=ENTRY_POINT,
        signature=signature_of(parsed.program),
        reference_solution=parsed.program,
        visible_tests=tests[:shown],
        hidden_tests=tests[shown:],
        parent_ids=[r.id for r in references],
        created_step=step,
        generator_checkpoint=checkpoint,
        fingerprints={"ast": ast_hash(parsed.program)},
    )


def target_of(task: Task, n_inputs: int = N_INPUTS) -> Proposal | None:
    """A procedural task written as a code_io proposal (the warm start's target): its reference renamed `f`, its
    first `n_inputs` distinct test inputs of at most TARGET_ARGS_CHARS characters, its description as the message;
    None when it makes no proposal a code_io task accepts (a program it refuses, an output too long, fewer than
    MIN_VISIBLE + MIN_HIDDEN such inputs)."""
    program = renamed_program(task)
    if program is None or stricter_refusal(program):
        return None
    inputs, seen = [], set()
    for test in task.tests:
        args = tuple(test["input"])
        key = canonical_text(args)
        if key in seen or len(format_args(args)) > TARGET_ARGS_CHARS:
            continue
        if "output" in test and output_refusal(test["output"]):
            return None
        seen.add(key)
        inputs.append(args)
        if len(inputs) == min(n_inputs, MAX_INPUTS):
            break
    if len(inputs) < MIN_VISIBLE + MIN_HIDDEN:
        return None
    return Proposal(program=program.strip("\n") + "\n", inputs=tuple(inputs), message=message_of(task))


def examples(
    tasks: Sequence[Task], k_refs: int, seed: int, sb=None, corpus_index=None, build_cfg=None
) -> list[tuple[str, str]]:
    """The warm start's (prompt, answer text) pairs: for each task that makes a target (`target_of`), K other
    tasks of its family as references and a task kind drawn as the instruction. With a sandbox `sb`, only the
    targets whose task passes every validity check but novelty are kept (the corpus holds their programs: a target
    is a procedural task written in this format, not a new one)."""
    rng = random.Random(f"code_io-examples:{seed}")
    by_family: dict[str, list[Task]] = {}
    for t in tasks:
        by_family.setdefault(t.family, []).append(t)
    pairs, compiled = [], []
    for t in tasks:
        target = target_of(t)
        if target is None:
            continue
        pool = [r for r in by_family[t.family] if r.id != t.id]
        refs = rng.sample(pool, min(k_refs, len(pool))) if pool else []
        pairs.append((build_prompt(refs, rng.choice(KINDS)), format_proposal(target)))
        compiled.append(compile_proposal(target, refs))
    if sb is None:
        return pairs
    return [pair for pair, report in zip(pairs, validate_many(compiled, sb)) if report.ok]
