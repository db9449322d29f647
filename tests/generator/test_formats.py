"""Proposal formats as objects (generator.formats): the registry, what each built-in format's object says, and a
third format (generator/family_format.py, the worked example of docs/extending.md) run end to end: prompt,
sampled answer, parse, compile, validity checks and grading in the sandbox."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from generator import agent as free
from generator import family_format, mutation
from generator.agent import ProposalError
from generator.build import BuildConfig, generate_tasks, materialise, sample_params
from generator.families import FAMILIES
from generator.formats import FORMATS, FREE, MUTATION, ProposalFormat, proposal_format, register
from generator.grammars import GRAMMARS
from generator.schema import Task
from generator.splits import SplitConfig


def test_the_registry_holds_free_and_mutation_in_step_with_the_config_and_the_grammars():
    """generator.format's names (agent.FORMATS, the config check reads them) are the registry's, and GRAMMARS
    (which generator.constrained compiles) holds each format's own grammar."""
    assert tuple(FORMATS) == (*free.FORMATS, "code_io") == ("free", "mutation", "code_io")  # generator/code_io_format
    assert FORMATS["free"] is FREE and FORMATS["mutation"] is MUTATION
    for name, fmt in FORMATS.items():
        assert fmt.name == name and GRAMMARS[name] is fmt.grammar
    # what replaced each `format == "mutation"` test
    assert (MUTATION.needs_program, MUTATION.weighted, MUTATION.sampling) == (True, True, "edits")
    assert (FREE.needs_program, FREE.weighted, FREE.sampling) == (False, False, "tied")
    assert MUTATION.max_answer_tokens == mutation.MAX_ANSWER_TOKENS and FREE.max_answer_tokens is None


def test_unknown_or_taken_names_are_refused_naming_them():
    with pytest.raises(ValueError, match="generator.format must be one of free, mutation, code_io, got 'fre'"):
        proposal_format("fre")
    with pytest.raises(ValueError, match="'free' is registered already"):
        register(FREE)
    with pytest.raises(ValueError, match="sampling must be one of"):
        ProposalFormat(**{**vars(family_format.FAMILY), "sampling": "beam"})


def test_only_tasks_with_a_program_can_be_a_mutations_reference():
    rng = random.Random(0)
    procedural = [materialise(sample_params(rng, 1), "train") for _ in range(3)]
    text_only = Task.from_dict({**procedural[0].to_dict(), "id": "t-free", "params": {}})
    pool = procedural + [text_only]
    assert MUTATION.reference_pool(pool) == procedural
    assert FREE.reference_pool(pool) == pool


def test_the_built_in_objects_prompt_and_parse_as_their_functions_do():
    """The objects refer to the format modules' functions: the same prompts, parses and instruction draws."""
    rng = random.Random(3)
    refs = [materialise(sample_params(rng, 2), "train") for _ in range(2)]
    for fmt, choose, prompt, parse in (
        (FREE, lambda r: free.choose_instruction(r, len(refs)), free.build_prompt, free.parse_proposal),
        (
            MUTATION,
            lambda r: mutation.choose_mutation_instruction(r, refs),
            mutation.build_mutation_prompt,
            mutation.parse_mutation,
        ),
    ):
        instruction = fmt.instruction(random.Random(7), refs, BuildConfig(), None)
        assert instruction == choose(random.Random(7))
        assert fmt.prompt(refs, instruction) == prompt(refs, instruction)
        assert fmt.parse is parse


@given(st.text(max_size=200))
def test_random_text_never_crashes_the_family_parser(text):
    parsed = family_format.parse(text)
    assert isinstance(parsed, (family_format.FamilyChoice, ProposalError))


@pytest.mark.parametrize(
    "answer, reason",
    [
        ("", "empty answer"),
        ("FAMILY list_int\nEND\n", "expected the lines"),
        ("FAMILY lists\nLEVEL 2\nEND\n", "unknown family 'lists'"),
        ("FAMILY list_int\nLEVEL 7\nEND\n", "level must be one of 1, 2, 3, 4, got 7"),
    ],
)
def test_malformed_family_answers_say_why(answer, reason):
    parsed = family_format.parse(answer)
    assert isinstance(parsed, ProposalError) and reason in parsed.reason


def test_every_family_and_level_round_trips_and_compiles_unless_held_out():
    refs = [materialise(sample_params(random.Random(1), 1), "train")]
    heldout = SplitConfig()
    for family in FAMILIES:
        for level in (1, 2, 3, 4):
            choice = family_format.FamilyChoice(family, level)
            assert family_format.parse(family_format.write(choice)) == choice
            task = family_format.compile_choice(choice, refs, step=5, checkpoint="step_4")
            if heldout.family_is_heldout(family):
                assert isinstance(task, family_format.ChoiceError) and "held-out split" in task.reason
            else:
                assert isinstance(task, Task) and task.params["family"] == family and task.level == level
                assert (task.source, task.family, task.split) == ("generator", f"generator/{family}", "train")
                assert task.parent_ids == [refs[0].id] and task.created_step == 5


@pytest.fixture
def family_registered():
    """The family format registered for one test, then taken out of FORMATS and GRAMMARS again."""
    register(family_format.FAMILY)
    try:
        yield family_format.FAMILY
    finally:
        FORMATS.pop("family")
        GRAMMARS.pop("family")


@pytest.mark.slow  # measured over 9 s (a tiny model's build and sampling): out of the fast subset
def test_a_third_format_runs_end_to_end_from_prompt_to_graded_tasks(family_registered, task_sb):
    """A random tiny generator under the family format's grammar (`LMAgent.constrain`, from GRAMMARS): every
    answer parses; `generator_rollouts` compiles each through the format object and validates the tasks in the
    sandbox; the valid tasks' reference solutions then pass their own hidden tests as a solver's answer."""
    xgr = pytest.importorskip("xgrammar")
    from selfplay.models.agent import LMAgent
    from selfplay.models.factory import ActorCritic, build_tiny_model, frozen_copy, train_tokenizer
    from selfplay.rollout.constrained import compile_constraint
    from selfplay.rollout.episodes import generator_rollouts
    from selfplay.runtime.config import PPOConfig
    from solver.episode import CodeEpisode
    from solver.prompts import answer_text

    tasks = generate_tasks(6, level=1, seed=2, sb=task_sb)
    pairs = family_registered.examples(tasks, 2, seed=0)
    assert len(pairs) == len(tasks) and all(
        isinstance(family_registered.parse(a), family_format.FamilyChoice) for _, a in pairs
    )
    tok = train_tokenizer([x for pair in pairs for x in pair] * 10, vocab_size=300, kind="bpe")
    torch.manual_seed(0)
    policy = build_tiny_model(tok, n_layer=1, n_embd=32, n_head=2, max_positions=160)
    gen = LMAgent(
        "generator",
        ActorCritic(policy),
        frozen_copy(policy),
        tok,
        PPOConfig(mini_batch_size=4, micro_batch_size=2, max_new_tokens=32, epochs=1),
        seed=0,
    )
    gen.constrain("family")  # its grammar, from GRAMMARS, where `register` put it
    compiled = compile_constraint(tok, "family", len(tok)).compiled
    for _, answer in pairs:  # the grammar accepts every warm-start target, to its end
        matcher = xgr.GrammarMatcher(compiled)
        assert matcher.accept_string(answer) and matcher.accept_token(tok.eos_token_id), answer
    rng = random.Random(4)
    rollouts = generator_rollouts(
        gen,
        [rng.sample(tasks, 2) for _ in range(12)],
        task_sb,
        step=1,
        rng=rng,
        max_prompt_tokens=100,
        fmt="family",
        checkpoint="step_0",
    )
    assert [r.parse_error for r in rollouts if not r.parsed] == []
    assert all(r.task is not None or r.rejection == "edit" for r in rollouts)  # edit: a held-out family
    valid = [r.task for r in rollouts if r.valid]
    assert valid and all(t.outputs_computed and t.generator_checkpoint == "step_0" for t in valid)
    for task in valid:
        episode = CodeEpisode(task, task_sb)
        episode.act(answer_text(task.reference_solution))
        assert episode.result.solved, task.id
