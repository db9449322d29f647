"""A task family as an extension point (docs/extending.md "A task family"): the worked example of the docs,
docs/examples/select_family.py, registered with `register_family`, is drawn by the procedural draw that
`generate_tasks` makes, keeps to its own step kinds, and its tasks pass the validity checks in the sandbox with
references that pass their own tests."""

import random
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from docs.examples import select_family as example
from generator.build import materialise, sample_params
from generator.families import (
    FAMILIES,
    FAMILY_STEPS,
    FAMILY_WEIGHTS,
    final_type,
    kinds_of,
    register_family,
    sample_pipeline,
)
from generator.validity import validate_many
from solver.episode import CodeEpisode
from solver.prompts import answer_text

TABLES = (FAMILIES, FAMILY_WEIGHTS, FAMILY_STEPS)


@pytest.fixture
def registered():
    """The example family registered for one test, the tables as they were afterwards (a family changes every draw
    of the default world)."""
    saved = [dict(table) for table in TABLES]
    example.register()
    yield
    for table, old in zip(TABLES, saved):
        table.clear()
        table.update(old)


def drawn_params(n: int, seed: int = 0) -> list[dict]:
    """The params of `n` train tasks at every level, drawn as generate_tasks draws them."""
    rng = random.Random(seed)
    return [sample_params(rng, level, "train") for _ in range(n) for level in (1, 2, 3, 4)]


def test_the_family_is_drawn_beside_the_others_with_its_own_steps(registered):
    params = drawn_params(150)
    mine = [p for p in params if p["family"] == example.NAME]
    assert len(mine) > 5 and {p["level"] for p in mine} == {1, 2, 3, 4}
    assert all(p["input"] == example.KIND and set(kinds_of(p["steps"])) <= set(example.STEPS) for p in mine)
    list_int = [k for p in params if p["family"] == "list_int" for k in kinds_of(p["steps"])]
    assert {"map", "sink"} <= set(list_int)  # the family sharing its input kind still draws every kind


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), depth=st.integers(1, 4))
def test_its_pipelines_keep_to_its_steps_and_return_a_list_of_ints(seed, depth):
    steps = sample_pipeline(random.Random(seed), example.KIND, depth, steps=example.STEPS)
    assert len(steps) == depth and set(kinds_of(steps)) <= set(example.STEPS)
    assert final_type(example.KIND, steps) == ("int", False)


def test_its_tasks_are_valid_and_their_references_pass_their_tests(registered, task_sb):
    """Validated in the real sandbox (every check of generator/validity.py), then each valid task's reference
    graded as a solver's answer; every output is a sub-list of its input, as the family promises."""
    params = [p for p in drawn_params(150, seed=1) if p["family"] == example.NAME][:12]
    reports = validate_many([materialise(p, "train") for p in params], task_sb)
    valid = [r.task for r in reports if r.ok]
    assert len(valid) >= 0.75 * len(reports), Counter(r.rejection for r in reports if not r.ok)
    for task in valid:
        for test in task.visible_tests + task.hidden_tests:
            assert not Counter(test["output"]) - Counter(test["input"][0]), (task.id, test)
        episode = CodeEpisode(task, task_sb)
        episode.act(answer_text(task.reference_solution))
        assert episode.result.solved, task.id


@pytest.mark.parametrize(
    ("name", "kind", "weight", "steps", "message"),
    [
        ("list_int", "list:int", 1.0, None, "task family 'list_int' is taken"),
        ("list_x", "list:bytes", 1.0, None, "unknown input kind 'list:bytes'"),
        ("list_x", "list:int", 1.0, ("filter", "zip"), "steps must be some of filter, map"),
        ("list_x", "list:int", 1.0, (), "steps must be some of"),
        ("list_x", "list:int", 0.0, None, "weight must be > 0, got 0.0"),
    ],
)
def test_a_bad_family_is_refused_naming_what_is_wrong(name, kind, weight, steps, message):
    before = [dict(table) for table in TABLES]
    with pytest.raises(ValueError, match=message):
        register_family(name, kind, weight, steps)
    assert [dict(table) for table in TABLES] == before  # nothing half-registered


def guide_block(heading: str) -> tuple[str, str]:
    """(the first Python block of docs/extending.md's section `heading`, up to the next section; the text of the
    module under docs/examples/ that the section links to first)."""
    root = Path(__file__).resolve().parents[2]
    guide = (root / "docs" / "extending.md").read_text()
    start = guide.index(heading)
    end = guide.find("\n## ", start + 1)  # the next section, or the end of the page
    section = guide[start : end if end >= 0 else None]
    example = section.split("](examples/", 1)[1].split(")", 1)[0]
    return section.split("```python\n", 1)[1].split("```", 1)[0], (root / "docs" / "examples" / example).read_text()


def test_docs_example_is_the_module_the_test_runs():
    """docs/extending.md shows docs/examples/select_family.py as it is, not a copy that could drift."""
    block, module = guide_block("## 3. A task family")
    assert block.startswith("NAME = ") and block in module and "NAME = " in module
