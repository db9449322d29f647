"""A third proposal format, the worked example of docs/extending.md ("A proposal format"): the generator names a
procedural task family and a curriculum level, and the families draw a task of that family at that level.

    FAMILY list_str
    LEVEL 2
    END

The generator chooses only what kind of task comes next, not its program: a toy that shows every part of a
`ProposalFormat` in one small module. It is not registered by default; `register(FAMILY)` (generator.formats)
adds it, after which `generator_rollouts(..., fmt="family")` and `LMAgent.constrain("family")` take it
(tests/generator/test_formats.py runs it end to end, from the prompt to tasks graded in the sandbox).
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

from generator.agent import ProposalError
from generator.build import BuildConfig, materialise, pipeline_params
from generator.families import FAMILIES, FAMILY_STEPS, LEVELS, PipelineError, level_depths, sample_pipeline
from generator.formats import ProposalFormat
from generator.schema import Task
from generator.splits import split_of

INSTRUCTIONS = {"another": "a task of another family", "harder": "a task one level harder"}
_ANSWER = re.compile(r"^FAMILY (\w+)\nLEVEL (\d)\nEND$")


@dataclass(frozen=True)
class FamilyChoice:
    """A parsed answer: which family, at which level."""

    family: str
    level: int


@dataclass(frozen=True)
class ChoiceError:
    """A parsed answer whose task cannot be drawn (a held-out family, no pipeline of that depth)."""

    reason: str


def choose(rng: random.Random, references: Sequence[Task], build_cfg: BuildConfig, weights=None) -> str:
    return rng.choice(list(INSTRUCTIONS))


def build(references: Sequence[Task], instruction: str) -> str:
    """The references' families and levels, the families to choose from, the instruction and the answer's shape."""
    parts = ["Choose the family and level of a new task."]
    parts += [f"Reference {i}: {t.family}, level {t.level}" for i, t in enumerate(references, 1)]
    parts.append(f"Families: {', '.join(FAMILIES)}")
    parts.append(f"Instruction: {INSTRUCTIONS[instruction]}.")
    parts.append("Answer: FAMILY name, LEVEL n, END.")
    return "\n".join(parts) + "\n"


def parse(text) -> FamilyChoice | ProposalError:
    """`FAMILY f`, `LEVEL n`, `END` (surrounding blank space ignored), or why not. Never raises."""
    if not isinstance(text, str) or not text.strip():
        return ProposalError("empty answer")
    m = _ANSWER.match("\n".join(line.strip() for line in text.strip().splitlines()))
    if not m:
        return ProposalError("expected the lines 'FAMILY name', 'LEVEL n' and 'END'")
    family, level = m.group(1), int(m.group(2))
    if family not in FAMILIES:
        return ProposalError(f"unknown family {family!r}")
    if level not in LEVELS:
        return ProposalError(f"level must be one of {', '.join(map(str, LEVELS))}, got {level}")
    return FamilyChoice(family, level)


def compile_choice(
    choice: FamilyChoice,
    references: Sequence[Task],
    *,
    step: int = 0,
    n_visible: int = 3,
    build_cfg: BuildConfig = BuildConfig(),
    checkpoint: str | None = None,
) -> Task | ChoiceError:
    """A task of the chosen family and level (test outputs not yet computed), drawn from a seed that the
    references and the choice fix, or why none can be made."""
    digest = hashlib.sha256("\n".join([*(t.id for t in references), choice.family, str(choice.level)]).encode())
    rng = random.Random(digest.hexdigest())
    try:
        steps = sample_pipeline(
            rng,
            FAMILIES[choice.family],
            rng.randint(*level_depths(choice.level, build_cfg.splits.train_max_depth)),
            forbid_pairs=build_cfg.splits.pairs,
            literals=build_cfg.literals,
            steps=FAMILY_STEPS.get(choice.family),
        )
    except PipelineError as exc:
        return ChoiceError(str(exc))
    params = pipeline_params(
        choice.family, steps, choice.level, cfg=build_cfg, size=rng.randint(4, 6), seed=rng.getrandbits(32)
    )
    split = split_of(params, build_cfg.splits)
    if split != "train":
        return ChoiceError(f"family {choice.family} belongs to the held-out split {split}")
    task = materialise(params, "train", created_step=step)
    return dataclasses.replace(
        task,
        source="generator",
        family=f"generator/{choice.family}",
        parent_ids=[t.id for t in references],
        generator_checkpoint=checkpoint,
    )


def write(choice: FamilyChoice) -> str:
    return f"FAMILY {choice.family}\nLEVEL {choice.level}\nEND\n"


def examples(
    tasks: Sequence[Task], k_refs: int, seed: int, sb=None, corpus_index=None, build_cfg=None
) -> list[tuple[str, str]]:
    """Warm-start pairs: K random other tasks as references, the instruction "another", and a procedural task's own
    family and level as the answer."""
    rng = random.Random(f"family-examples:{seed}")
    out = []
    for t in tasks:
        family = (t.params or {}).get("family")
        others = [r for r in tasks if r.id != t.id]
        if family in FAMILIES and others:
            refs = rng.sample(others, min(k_refs, len(others)))
            out.append((build(refs, "another"), write(FamilyChoice(family, t.level))))
    return out


def grammar() -> str:
    """EBNF of an answer: exactly what `parse` accepts (and `write` writes)."""
    families = " | ".join(f'"{f}"' for f in sorted(FAMILIES, key=lambda f: (-len(f), f)))
    levels = " | ".join(f'"{lv}"' for lv in LEVELS)
    return f'root ::= "FAMILY " family "\\nLEVEL " level "\\nEND\\n"\nfamily ::= {families}\nlevel ::= {levels}\n'


FAMILY = ProposalFormat(
    name="family",
    instruction=choose,
    prompt=build,
    parse=parse,
    compile=compile_choice,
    target=write,
    examples=examples,
    grammar=grammar,
    max_answer_tokens=32,
)
