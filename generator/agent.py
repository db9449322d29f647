"""The generator agent's side of the conversation: its prompt and the parsing of its answer.

The prompt shows K reference tasks from the corpus (chosen by the mixer near the solver's frontier) and one
instruction (mutate, compose, make harder, change the element type). The answer is a *proposal* in a small,
line-oriented format that a tiny model can learn and a large one can follow:

    DESCRIPTION: Keep the even numbers, then sort them in descending order.
    SIGNATURE: def solve(xs: list[int]) -> list[int]
    CODE:
    def solve(xs):
        return sorted([x for x in xs if x % 2 == 0], reverse=True)
    INPUTS:
    [[3, 8, 2, 5]]
    [[]]
    END

A proposal carries no outputs: those come from running the reference in the sandbox (the validity checks do it),
never from the model. `parse_proposal` never raises on model output: it returns a `Proposal` or a
`ProposalError` with the reason, which costs the generator the "unparsable" penalty (generator/rewards.py).
`format_proposal` writes a task in the same format, which is how the procedural corpus warm-starts the generator.

This is the "free" proposal format (its object: generator.formats.FREE); `generator.format=mutation`
(generator/mutation.py) has the generator name a reference and one edit of its program instead, which the
procedural families compile into a task.
"""

from __future__ import annotations

import ast
import json
import random
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from generator.fingerprint import ast_hash, task_id
from generator.schema import SchemaError, Task, check_json_value

INSTRUCTIONS = {
    "mutate": "Write a new task that changes one detail of a reference task (the key, the condition, the order, "
    "or an edge case) so that the old solution no longer works.",
    "compose": "Write a new task that chains the steps of two reference tasks into one pipeline.",
    "harder": "Write a harder version of a reference task: one more step or a trickier rule.",
    "change_type": "Write a reference task again for a different element type (float, str, tuple or record).",
}

# the names `generator.format` accepts, read here by the config check (selfplay/runtime/config.py): a whole task in
# text, or one edit of a reference's program; the format objects are generator.formats.FORMATS, which a test keeps
# in step with this tuple
FORMATS = ("free", "mutation")
MAX_INPUTS = 32  # more test inputs than this in one proposal is rejected (cost control)
MAX_CODE_CHARS = 4000  # longer reference solutions are rejected

_SECTION = re.compile(r"^(DESCRIPTION|SIGNATURE|CODE|INPUTS):\s*(.*)$|^(END)\s*$")  # headers start a line
_DEF = re.compile(r"^\s*def\s+([A-Za-z_]\w*)\s*\(")


@dataclass(frozen=True)
class Proposal:
    description: str
    signature: str
    entry_point: str
    code: str
    inputs: list[list]  # positional arguments of each test, JSON values

    def fingerprint(self) -> str:
        """Near-duplicate key: hash of the normalised AST (names, comments and layout dropped)."""
        return ast_hash(self.code) or ""


@dataclass(frozen=True)
class ProposalError:
    reason: str


def _example_lines(task: Task, n: int) -> list[str]:
    out = []
    for t in task.visible_tests[:n]:
        args = ", ".join(json.dumps(a) for a in t["input"])
        out.append(f"{task.entry_point}({args}) == {json.dumps(t.get('output'))}")
    return out


def format_proposal(task: Task, max_inputs: int = 6) -> str:
    """A task written as the generator would propose it (the target text of the generator's warm start)."""
    inputs = [t["input"] for t in task.tests][:max_inputs]
    lines = [
        f"DESCRIPTION: {' '.join(task.description.split())}",
        f"SIGNATURE: {task.signature}",
        "CODE:",
        task.reference_solution.rstrip("\n"),
        "INPUTS:",
    ]
    lines += [json.dumps(i) for i in inputs]
    lines.append("END")
    return "\n".join(lines) + "\n"


def build_prompt(references: Sequence[Task], instruction: str, n_examples: int = 1) -> str:
    """The generator's prompt: K reference tasks with code and examples, then the instruction."""
    if instruction not in INSTRUCTIONS:
        raise ValueError(f"unknown instruction {instruction!r}; one of {', '.join(INSTRUCTIONS)}")
    parts = ["You write programming tasks with a reference solution and test inputs.", ""]
    for i, task in enumerate(references, 1):
        parts.append(f"Reference task {i}:")
        parts.append(format_proposal(task, max_inputs=2).rstrip("\n"))
        parts += [f"# {line}" for line in _example_lines(task, n_examples)]
        parts.append("")
    parts.append(f"Instruction: {INSTRUCTIONS[instruction]}")
    parts.append("Answer in the same format, ending with END.")
    return "\n".join(parts) + "\n"


def free_examples(
    tasks: Sequence[Task], k_refs: int, seed: int, sb=None, corpus_index=None, build_cfg=None
) -> list[tuple[str, str]]:
    """The free format's warm-start pairs (prompt, answer text): for each task, K other tasks of its family as
    references, and the task written as a proposal; the instruction names what relates the target to its
    references (a deeper pipeline: harder, else mutate). `sb`, `corpus_index` and `build_cfg` are not needed: the
    targets are procedural tasks, valid already."""
    rng = random.Random(seed)
    by_family: dict[str, list[Task]] = defaultdict(list)
    for t in tasks:
        by_family[t.family].append(t)
    out = []
    for t in tasks:
        pool = [r for r in by_family[t.family] if r.id != t.id]
        refs = rng.sample(pool, min(k_refs, len(pool))) if pool else []
        deeper = refs and t.level > max(r.level for r in refs)
        out.append((build_prompt(refs, "harder" if deeper else "mutate"), format_proposal(t)))
    return out


def choose_instruction(rng: random.Random, n_references: int, instructions=INSTRUCTIONS) -> str:
    """One of `instructions` (names), "compose" only with two references or more."""
    names = [n for n in instructions if n != "compose" or n_references >= 2]
    return rng.choice(names)


def parse_proposal(text: str) -> Proposal | ProposalError:
    """Turn a model answer into a Proposal, or say why not. Never raises."""
    if not isinstance(text, str) or not text.strip():
        return ProposalError("empty answer")
    sections: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        m = _SECTION.match(line)
        if m:
            if m.group(3):  # END
                break
            name = m.group(1)
            if name in sections:
                return ProposalError(f"section {name} appears twice")
            current = name
            sections[name] = [m.group(2)] if m.group(2).strip() else []
        elif current is not None:
            sections[current].append(line)
    for name in ("DESCRIPTION", "SIGNATURE", "CODE", "INPUTS"):
        if name not in sections:
            return ProposalError(f"missing {name} section")

    description = " ".join(" ".join(sections["DESCRIPTION"]).split())
    if not description:
        return ProposalError("empty DESCRIPTION")
    signature = " ".join(sections["SIGNATURE"]).strip()
    m = _DEF.match(signature)
    if not m:
        return ProposalError(f"SIGNATURE is not a 'def name(...)' line: {signature[:60]!r}")
    entry_point = m.group(1)

    code_lines = [ln for ln in sections["CODE"] if not ln.strip().startswith("```")]
    code = "\n".join(code_lines).strip("\n") + "\n"
    if len(code) > MAX_CODE_CHARS:
        return ProposalError(f"CODE longer than {MAX_CODE_CHARS} characters")
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError) as exc:
        return ProposalError(f"CODE does not parse: {type(exc).__name__}: {exc}".split("\n")[0])
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    if entry_point not in defined:
        return ProposalError(f"CODE does not define {entry_point}() named in SIGNATURE")

    inputs = []
    for k, line in enumerate((ln for ln in sections["INPUTS"] if ln.strip()), 1):
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            return ProposalError(f"INPUTS line {k} is not JSON")
        if not isinstance(value, list):
            return ProposalError(f"INPUTS line {k} is not a list of arguments")
        try:
            check_json_value(value, f"INPUTS line {k}")
        except SchemaError as exc:
            return ProposalError(str(exc))
        inputs.append(value)
    if not inputs:
        return ProposalError("no INPUTS")
    if len(inputs) > MAX_INPUTS:
        return ProposalError(f"more than {MAX_INPUTS} INPUTS")
    return Proposal(description, signature, entry_point, code, inputs)


def proposal_to_task(
    proposal: Proposal, parents: Sequence[Task], step: int, n_visible: int = 3, generator_checkpoint: str | None = None
) -> Task:
    """A task record for the proposal, outputs not yet computed (validity computes them in the sandbox).
    The first `n_visible` inputs are the examples the solver sees; the rest are hidden tests."""
    tests = [{"input": i} for i in proposal.inputs]
    families = sorted({p.family for p in parents})
    return Task(
        id=task_id(proposal.code, proposal.entry_point, proposal.inputs),
        family="generator/" + "+".join(families) if families else "generator",
        source="generator",
        split="train",
        level=max([p.level for p in parents], default=1),
        description=proposal.description,
        entry_point=proposal.entry_point,
        signature=proposal.signature,
        reference_solution=proposal.code,
        visible_tests=tests[:n_visible],
        hidden_tests=tests[n_visible:],
        parent_ids=[p.id for p in parents],
        created_step=step,
        generator_checkpoint=generator_checkpoint,
        fingerprints={"ast": proposal.fingerprint()},
    )
