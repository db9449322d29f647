"""What the solver sees: the task prompt, observations between turns, and the form of its answer.

The prompt is the task's description, its signature and its visible examples (input -> output, produced by the
reference in the sandbox), so a task is defined by its examples even when its text is vague. It is sent as one user
message through the tokenizer's chat template (selfplay/models/agent.py), so the tiny model and a pretrained instruct
model see the same content; later turns add the solver's answer and the observation that came back (`conversation`).
`render` turns messages into text with a tokenizer's chat template, or plain "### Role:" headers without one.
The expected answer is the function in a ```python fence (solver/parse.py reads it).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from generator.schema import Task

MAX_EXAMPLE_CHARS = 300  # longer example values are cut in the prompt (the solver still sees their start)

MULTI_TURN_HELP = (
    "Answer with one action per turn: 'ACTION: write' followed by code, 'ACTION: run' to run the "
    "examples, 'ACTION: check' for a static check, or 'ACTION: submit'."
)


def _short(value, max_chars: int = MAX_EXAMPLE_CHARS) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= max_chars else text[: max(1, max_chars - 3)] + "..."


def examples_text(task: Task, max_examples: int | None = None, max_chars: int = MAX_EXAMPLE_CHARS) -> str:
    lines = []
    for t in task.visible_tests[:max_examples]:
        args = ", ".join(_short(a, max_chars) for a in t["input"])
        lines.append(f"{task.entry_point}({args}) == {_short(t.get('output'), max_chars)}")
    return "\n".join(lines)


def task_prompt(
    task: Task, multi_turn: bool = False, max_examples: int | None = None, max_chars: int = MAX_EXAMPLE_CHARS
) -> str:
    """Description, signature, the visible examples (at most `max_examples`, each value cut at `max_chars`: a
    small model's context is short), and what to answer."""
    parts = [task.description.strip(), "", f"Signature: {task.signature}"]
    if task.visible_tests:
        parts += ["Examples:", examples_text(task, max_examples, max_chars)]
    if multi_turn:
        parts += ["", MULTI_TURN_HELP]
    else:
        parts += ["", "Write the function in Python."]
    return "\n".join(parts)


def answer_text(code: str) -> str:
    """The answer the solver is taught to give: the code in a python fence."""
    return f"```python\n{code.rstrip()}\n```"


def feedback_text(observation: str) -> str:
    """An observation between turns (test results, static check, ...)."""
    return f"Result:\n{observation.strip()}"


def humaneval_prompt(prompt: str) -> str:
    """A HumanEval problem (signature + docstring) as a solver prompt."""
    return f"Complete this function.\n\n```python\n{prompt.rstrip()}\n```\n\nWrite the function in Python."


def conversation(task: Task, turns: Sequence[tuple[str, str]] = (), multi_turn: bool = False) -> list[dict]:
    """Chat messages for a task: the task prompt, then per earlier turn the solver's answer and the observation."""
    messages = [{"role": "user", "content": task_prompt(task, multi_turn=multi_turn)}]
    for answer, observation in turns:
        messages.append({"role": "assistant", "content": answer})
        messages.append({"role": "user", "content": feedback_text(observation)})
    return messages


def render(messages: Sequence[dict], tokenizer=None, add_generation_prompt: bool = True) -> str:
    """The text a model sees: the tokenizer's chat template when it has one, else plain headers
    ("### User:\n...\n\n### Assistant:\n", an assistant message closed by the tokenizer's eos token)."""
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=add_generation_prompt
        )
    eos = getattr(tokenizer, "eos_token", None) or ""
    parts = []
    for m in messages:
        closing = eos if m["role"] == "assistant" else ""
        parts.append(f"### {m['role'].capitalize()}:\n{m['content']}{closing}\n\n")
    if add_generation_prompt:
        parts.append("### Assistant:\n")
    return "".join(parts)
