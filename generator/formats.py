"""Proposal formats (`generator.format`): how the generator is asked for a task and how its answer becomes one.

A format is one `ProposalFormat` object; the rollouts (selfplay/rollout/episodes.py), the warm start, the
training loop and the generator probe ask it, never its name, what to do:

    instruction -> prompt -> the model's answer -> parse -> compile -> a Task (the validity checks then run it)

`FORMATS` holds the three built in: `free` (the whole task in text, generator/agent.py), `mutation` (one reference
and one edit of its program, generator/mutation.py) and `code_io` (a function `f` and the inputs to call it on, as
Absolute Zero proposes, generator/code_io_format.py); their objects refer to those modules' functions. A new format
is a module that builds a `ProposalFormat` and passes it to `register` (generator/family_format.py is a worked
example, run end to end by tests/generator/test_formats.py).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from generator import agent, code_io_format, mutation
from generator.build import BuildConfig
from generator.families.grammar import program_of
from generator.grammars import GRAMMARS, code_io_grammar, free_grammar, mutation_grammar
from generator.schema import Task

# the mixer's instruction weights: names -> one positive weight each, or None for a uniform draw
Weights = Callable[[list[str]], Sequence[float] | None]
SAMPLINGS = ("grammar", "edits", "tied")  # how a constrained answer is drawn (ProposalFormat.sampling)


@dataclass(frozen=True)
class ProposalFormat:
    """One proposal format: what the generator is shown and how its answer becomes a task.

    Every callable is pure but for `examples` (which may grade in the sandbox); `parse` never raises."""

    name: str  # its `generator.format` value
    # (rng, references, build_cfg, weights) -> the instruction of one prompt
    instruction: Callable[[random.Random, Sequence[Task], BuildConfig, Weights | None], str]
    prompt: Callable[[Sequence[Task], str], str]  # (references, instruction) -> the prompt's text
    parse: Callable[[str], object]  # answer text -> the parsed proposal, or a ProposalError with its reason
    # (parsed, references, *, step, n_visible, build_cfg, checkpoint) -> a Task (outputs not yet computed), or an
    # object with a `reason` saying why the parsed proposal names no possible task (rejected as "edit")
    compile: Callable[..., object]
    target: Callable[[object], str]  # what the format proposes -> its answer text (the inverse of `parse`)
    # (tasks, k_refs, seed, sb, corpus_index, build_cfg) -> the warm start's (prompt, answer text) pairs
    examples: Callable[..., list[tuple[str, str]]]
    grammar: Callable[[], str] | None = None  # EBNF of a whole answer (generator.constrained); None: none
    needs_program: bool = False  # a reference must have a program (program_of), as an edit needs one
    # `instruction` draws by the mixer's weights (Mixer.instruction_weights), which the loop trains on each
    # instruction's outcomes (iteration_stats)
    weighted: bool = False
    max_answer_tokens: int | None = None  # an answer never needs more tokens than this (None: no cap)
    # how a constrained answer is drawn: "grammar" (under `grammar`), "edits" (each prompt under the grammar of its
    # references' possible edits, with novelty redraws) or "tied" (in two stages, generator.tie_signature)
    sampling: str = "grammar"

    def __post_init__(self) -> None:
        if self.sampling not in SAMPLINGS:
            raise ValueError(
                f"format {self.name!r}: sampling must be one of {', '.join(SAMPLINGS)}, got {self.sampling!r}"
            )

    def reference_pool(self, tasks: Sequence[Task]) -> list[Task]:
        """The tasks this format's prompts can show as references."""
        return [t for t in tasks if program_of(t) is not None] if self.needs_program else list(tasks)


def _free_instruction(
    rng: random.Random, references: Sequence[Task], build_cfg: BuildConfig, weights: Weights | None
) -> str:
    return agent.choose_instruction(rng, len(references))  # uniform: the free format's instructions are not weighed


def _free_compile(
    parsed: agent.Proposal,
    references: Sequence[Task],
    *,
    step: int,
    n_visible: int,
    build_cfg: BuildConfig,
    checkpoint: str | None,
) -> Task:
    return agent.proposal_to_task(parsed, references, step, n_visible=n_visible, generator_checkpoint=checkpoint)


def _mutation_compile(
    parsed: mutation.Mutation,
    references: Sequence[Task],
    *,
    step: int,
    n_visible: int,
    build_cfg: BuildConfig,
    checkpoint: str | None,
) -> Task | mutation.MutationError:
    return mutation.compile_mutation(parsed, references, cfg=build_cfg, step=step, generator_checkpoint=checkpoint)


FREE = ProposalFormat(
    name="free",
    instruction=_free_instruction,
    prompt=agent.build_prompt,
    parse=agent.parse_proposal,
    compile=_free_compile,
    target=agent.format_proposal,
    examples=agent.free_examples,
    grammar=free_grammar,
    sampling="tied",
)
MUTATION = ProposalFormat(
    name="mutation",
    instruction=mutation.choose_mutation_instruction,
    prompt=mutation.build_mutation_prompt,
    parse=mutation.parse_mutation,
    compile=_mutation_compile,
    target=mutation.format_mutation,
    examples=mutation.mutation_examples,
    grammar=mutation_grammar,
    needs_program=True,
    weighted=True,
    max_answer_tokens=mutation.MAX_ANSWER_TOKENS,
    sampling="edits",
)
CODE_IO = ProposalFormat(
    name="code_io",
    instruction=code_io_format.choose_instruction,
    prompt=code_io_format.build_prompt,
    parse=code_io_format.parse,
    compile=code_io_format.compile_proposal,
    target=code_io_format.format_proposal,
    examples=code_io_format.examples,
    grammar=code_io_grammar,
    max_answer_tokens=code_io_format.MAX_ANSWER_TOKENS,
)
FORMATS: dict[str, ProposalFormat] = {f.name: f for f in (FREE, MUTATION, CODE_IO)}


def register(fmt: ProposalFormat) -> ProposalFormat:
    """Add a format to `FORMATS` (and its grammar to `GRAMMARS`, which `generator.constrained` compiles); a taken
    name is refused. `generator.format` accepts the names in `FORMATS` (the config check reads them here)."""
    if fmt.name in FORMATS:
        raise ValueError(f"a proposal format named {fmt.name!r} is registered already")
    FORMATS[fmt.name] = fmt
    if fmt.grammar is not None:
        GRAMMARS[fmt.name] = fmt.grammar
    return fmt


def proposal_format(name: str) -> ProposalFormat:
    """The format named `name`, or a ValueError naming the key and the registered names."""
    if name not in FORMATS:
        raise ValueError(f"generator.format must be one of {', '.join(FORMATS)}, got {name!r}")
    return FORMATS[name]
