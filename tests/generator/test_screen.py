"""The behaviour screen (generator.screen): a catalogue program's behaviour computed in-process is the sandbox's,
and its screen passes a compiled mutation only when the novelty check would."""

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from generator.families.grammar import program_of
from generator.mutation import choose_mutation_instruction, random_mutation
from generator.screen import Screen, program_behaviour
from generator.validity import NOT_RUN, MemoryIndex, validate_many


def test_in_process_behaviour_is_the_sandboxs(task_pool, task_sb):
    # procedural tasks of every split (their fingerprints came from the sandbox) and edits of them
    tasks = list(task_pool)
    rng = random.Random(3)
    train = [t for t in task_pool if t.split == "train"]
    while len(tasks) < len(task_pool) + 40:
        refs = rng.sample(train, 2)
        found = random_mutation(rng, refs, choose_mutation_instruction(rng, refs))
        if found is not None:
            tasks.append(found[1])
    reports = validate_many(tasks, task_sb)
    compared = 0
    for report in reports:
        if report.results["runs"].passed:
            kind, steps = program_of(report.task)
            assert program_behaviour(kind, steps) == report.task.fingerprints["behaviour"], report.task.params
            compared += 1
    assert compared >= len(tasks) * 0.8


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 10_000))
def test_the_screen_passes_what_the_novelty_check_passes(task_pool, task_sb, seed):
    # compiled mutations judged one after another, by the screen and by validate_many against the same corpus and
    # the earlier passed ones: what the screen passes the novelty check passes; what the novelty check rejects
    # the screen rejects (it also rejects programs with too little behaviour to judge)
    rng = random.Random(seed)
    train = [t for t in task_pool if t.split == "train"]
    corpus = MemoryIndex(train[:16])
    drawn = []
    while len(drawn) < 20:
        refs = rng.sample(train, 2)
        found = random_mutation(rng, refs, choose_mutation_instruction(rng, refs))
        if found is not None:
            drawn.append(found[1])
    drawn += drawn[:3]  # repeats of earlier ones: rejected as the batch's
    screen = Screen(corpus)
    verdicts = [screen.reject(t) for t in drawn]
    reports = validate_many(drawn, task_sb, corpus)
    judged = []
    for verdict, report in zip(verdicts, reports):
        novel = report.results["novel"]
        if not novel.reason.startswith(NOT_RUN):  # the novelty check ran: it rejects only what the screen rejects
            judged.append(novel.passed)
            assert novel.passed or verdict is not None, (novel.reason, report.task.params)
    assert all(v is not None for v in verdicts[-3:])
    assert set(judged) == {True, False}  # the check passed some and rejected others: both verdicts were compared
