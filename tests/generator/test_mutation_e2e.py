"""The mutation format end to end: warm-start examples built from procedural tasks, and a smoke run of
`selfplay train` whose generator (warm-started on that format) puts valid tasks of its own into the corpus."""

from __future__ import annotations

import json
import sqlite3

import pytest

from generator.build import generate_tasks
from generator.families.grammar import check_pipeline, format_program, program_of
from generator.mutation import INSTRUCTIONS, Mutation, compile_mutation, parse_mutation
from generator.schema import Task
from generator.splits import split_of
from generator.validity import MemoryIndex, validate_many
from selfplay.train.warmstart import generator_examples
from tests.conftest import selfplay


def references_of(prompt: str, pool: dict) -> list[Task]:
    """The prompt's reference tasks, found by their program text ("Reference i: PROGRAM" up to the next line that
    starts a reference or the edit list)."""
    out, lines = [], []
    for line in prompt.splitlines() + ["Edits:"]:
        if (line.startswith("Reference ") or line.startswith("Edits:")) and lines:
            out.append(pool["\n".join(lines)])
            lines = []
        if line.startswith("Reference "):
            lines = [line.split(": ", 1)[1]]
        elif lines:
            lines.append(line)
    return out


def test_warm_start_examples_are_valid_mutations(task_sb):
    tasks = generate_tasks(40, split="train", seed=7, sb=task_sb)
    index = MemoryIndex(tasks)
    pairs = generator_examples(tasks, 2, seed=3, fmt="mutation", sb=task_sb, corpus_index=index)
    assert len(pairs) >= 10
    by_program = {format_program(*program_of(t)): t for t in tasks}
    compiled, instructions = [], set()
    for prompt, answer in pairs:
        mutation = parse_mutation(answer)
        assert isinstance(mutation, Mutation), answer
        instruction = next(n for n, (text, _) in INSTRUCTIONS.items() if f"Instruction: {text}." in prompt)
        assert mutation.edit.op in INSTRUCTIONS[instruction][1]
        instructions.add(instruction)
        task = compile_mutation(mutation, references_of(prompt, by_program))
        assert isinstance(task, Task), task
        check_pipeline(*program_of(task))
        assert split_of(task.params) == "train"
        compiled.append(task)
    assert len(instructions) >= 4
    # each target passes every check, novelty against the procedural tasks and the other targets included
    assert all(r.ok for r in validate_many(compiled, task_sb, MemoryIndex(tasks)))


@pytest.mark.slow
def test_smoke_run_puts_valid_mutation_tasks_into_the_corpus(tmp_path):
    run = tmp_path / "run"
    # configs/smoke.yaml as it is (40 generator SFT steps, 3 iterations of 2 proposals, generator.constrained: each
    # answer under its prompt's grammar), only the held-out evaluation shrunk
    selfplay("train", "configs/smoke.yaml", f"run.dir={run}", "eval.tasks_per_split=2", timeout=1500)
    with sqlite3.connect(run / "corpus.sqlite") as db:
        rows = [json.loads(r[0]) for r in db.execute("SELECT record FROM tasks WHERE source = 'generator'")]
    assert rows, "no generator-made task reached the corpus"
    for row in rows:
        task = Task.from_dict(row)
        assert task.checks and all(task.checks.values()), task.checks
        assert task.outputs_computed and program_of(task) is not None and task.parent_ids
