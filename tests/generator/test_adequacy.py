"""Test adequacy by mutation: each operator's mutants written out by hand, every mutant a parsing program that differs
from the original (Hypothesis), and the `adequacy` validity check in the real process sandbox: strong tests pass, one
weak test fails with the share and a survivor, degenerate programs are handled."""

import ast
import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from generator.adequacy import AdequacySettings, make_mutants, measure, measure_many
from generator.schema import Task
from generator.validity import ADEQUACY, CHECKS, validate, validate_many
from selfplay.runtime.config import load_config
from selfplay.runtime.errors import UserError


def bodies(source: str, k: int = 100) -> set[str]:
    """The mutants' texts, each reduced to its last line (the programs here put the edit there)."""
    return {m.source.strip().splitlines()[-1].strip() for m in make_mutants(source, k)}


def fn(body: str, args: str = "a, b") -> str:
    return f"def f({args}):\n    {body}\n"


# ---- the operators, by hand -------------------------------------------------------------------------------------
def test_arithmetic_swaps():
    assert bodies(fn("return a + b")) == {"return a - b"}
    assert bodies(fn("return a - b")) == {"return a + b"}
    assert bodies(fn("return a * b")) == {"return a // b", "return a + b"}
    assert bodies(fn("return a // b")) == {"return a * b", "return a % b"}
    assert bodies(fn("return a % b")) == {"return a // b"}
    augmented = "def f(a, b):\n    a += b\n    return a\n"
    assert {m.source.splitlines()[1].strip() for m in make_mutants(augmented, 9)} == {"a -= b"}


def test_comparison_swaps():
    assert bodies(fn("return a < b")) == {"return a <= b"}
    assert bodies(fn("return a <= b")) == {"return a < b"}
    assert bodies(fn("return a > b")) == {"return a >= b"}
    assert bodies(fn("return a >= b")) == {"return a > b"}
    assert bodies(fn("return a == b")) == {"return a != b"}
    assert bodies(fn("return a != b")) == {"return a == b"}
    assert bodies(fn("return a < b < 5")) == {"return a <= b < 5", "return a < b <= 5"} | {
        f"return a < b < {n}" for n in (6, 4, 0)
    }


def test_constant_changes():
    assert bodies(fn("return 5", "")) == {"return 6", "return 4", "return 0"}
    assert bodies(fn("return 0", "")) == {"return 1", "return -1"}
    assert bodies(fn("return 1", "")) == {"return 2", "return 0"}
    assert bodies(fn("return True", "")) == {"return False"}
    assert bodies(fn("return False", "")) == {"return True"}
    assert bodies(fn("return 'ab'", "")) == {"return ''", "return 'abx'"}
    assert bodies(fn("return ''", "")) == {"return 'a'"}
    assert bodies(fn("return 2.5", "")) == {"return 3.5", "return 0.0"}
    assert bodies(fn("return None", "")) == set()


def test_off_by_one_in_ranges_slices_and_indices():
    assert bodies(fn("return list(range(n))", "n")) == {"return list(range(n + 1))", "return list(range(n - 1))"}
    assert bodies(fn("return xs[i]", "xs, i")) == {"return xs[i + 1]", "return xs[i - 1]"}
    assert bodies(fn("return xs[:k]", "xs, k")) == {"return xs[:k + 1]", "return xs[:k - 1]"}
    assert bodies(fn("return xs[k:]", "xs, k")) == {"return xs[k + 1:]", "return xs[k - 1:]"}
    # a literal bound is the constant edits' (no `xs[:2 + 1]` beside `xs[:3]`)
    assert bodies(fn("return xs[:2]", "xs")) == {"return xs[:3]", "return xs[:1]", "return xs[:0]"}


def test_boolean_swaps():
    assert bodies(fn("return a and b")) == {"return a or b"}
    assert bodies(fn("return a or b")) == {"return a and b"}
    assert bodies(fn("return not a", "a")) == {"return a"}


def test_docstrings_annotations_and_fstring_parts_are_left_alone():
    source = 'def f(x: "int" = 1) -> "str":\n    """Doc 2."""\n    return f"{x:>3}"\n'
    mutants = make_mutants(source, 100)
    assert [m.operator for m in mutants] == ["constant", "constant"]  # the default 1 -> 2, 0
    assert all('"""Doc 2."""' in m.source or "'Doc 2.'" in m.source for m in mutants)
    assert all("-> 'str'" in m.source and ">3" in m.source for m in mutants)


def test_mutants_are_deterministic_bounded_and_spread_over_operators():
    source = fn("return [x * 2 for x in xs[:k] if x > 3 and x != 7]", "xs, k")
    assert make_mutants(source, 5, seed=1) == make_mutants(source, 5, seed=1)
    assert len(make_mutants(source, 5)) == 5
    every = make_mutants(source, 1000)
    assert len({m.source for m in every}) == len(every) > 5
    assert len({m.operator for m in make_mutants(source, 4)}) == 4  # one of four operators before a second of any
    assert {m.operator for m in make_mutants(source, 5)} == {
        "arithmetic",
        "comparison",
        "constant",
        "off_by_one",
        "boolean",
    }


def test_a_survivor_diff_is_one_short_line():
    long = "xs.append({'name': name, 'city': city, 'age': age, 'score': score, 'rank': 1234567})"
    (mutant,) = [
        m for m in make_mutants(f"def f(xs, name, city, age, score):\n    {long}\n", 100) if "1234568" in m.source
    ]
    assert "\n" not in mutant.diff and len(mutant.diff) < 160
    assert "1234567" in mutant.diff.split(" -> ")[0] and "1234568" in mutant.diff.split(" -> ")[1]


def test_programs_that_do_not_parse_or_offer_no_edit_have_no_mutant():
    assert make_mutants("def f(:\n", 8) == []
    assert make_mutants("def f(x):\n    return x\n", 8) == []
    assert make_mutants(fn("return sorted(xs)", "xs"), 8) == []


# ---- property: every mutant parses and differs from the original -------------------------------------------------
NAMES = st.sampled_from(["a", "b", "xs[i]", "len(xs)", "n"])
LITERALS = st.one_of(st.integers(-3, 9).map(str), st.sampled_from(["True", "False", "'s'", "''", "1.5"]))


EXPRESSIONS = st.recursive(
    st.one_of(NAMES, LITERALS),
    lambda inner: st.one_of(
        st.tuples(
            inner, st.sampled_from(["+", "-", "*", "//", "%", "<", "<=", ">", ">=", "==", "!=", "and", "or"]), inner
        ).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        inner.map(lambda e: f"(not {e})"),
        inner.map(lambda e: f"xs[{e}:]"),
        inner.map(lambda e: f"list(range({e}))"),
    ),
    max_leaves=8,
)


@st.composite
def programs(draw) -> str:
    lines = [f"    v{i} = {draw(EXPRESSIONS)}" for i in range(draw(st.integers(0, 3)))]
    if draw(st.booleans()):
        lines.append(f"    for i in range({draw(EXPRESSIONS)}):\n        n += {draw(EXPRESSIONS)}")
    lines.append(f"    return {draw(EXPRESSIONS)}")
    return "def f(a, b, xs, i, n):\n" + "\n".join(lines) + "\n"


@settings(max_examples=100, deadline=None)
@given(programs(), st.integers(0, 12), st.integers(0, 3))
def test_every_mutant_parses_and_differs_from_the_original(source, k, seed):
    original = ast.dump(ast.parse(source))
    mutants = make_mutants(source, k, seed)
    assert len(mutants) <= k
    dumps = [ast.dump(ast.parse(m.source)) for m in mutants]  # parses
    assert original not in dumps and len(set(dumps)) == len(dumps)
    assert all(m.diff and " -> " in m.diff for m in mutants)
    assert make_mutants(source, k, seed) == mutants


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_mutant_of_a_procedural_reference_parses_and_differs(task_pool, data):
    task = data.draw(st.sampled_from(task_pool))
    original = ast.dump(ast.parse(task.reference_solution))
    for m in make_mutants(task.reference_solution, 8, data.draw(st.integers(0, 5))):
        assert ast.dump(ast.parse(m.source)) != original


# ---- in the sandbox ---------------------------------------------------------------------------------------------
REFERENCE = """def solve(xs, k):
    total = 0
    for i in range(len(xs)):
        if xs[i] > k and not xs[i] % 2 == 1:
            total += xs[i] * 2
    return total
"""
STRONG = [
    [[4, 6, 3], 3],
    [[2, 4, 5, 8], 4],
    [[10], 9],
    [[10, 1], 10],
    [[0, 2, 4], -1],
    [[7, 9, 12, 6], 6],
    [[5, 3], 0],
    [[1, 2, 3, 4, 5, 6], 2],
    [[6], 5],
    [[-4, 8, 3], -5],
]


def task(hidden: list, visible: list | None = None, reference: str = REFERENCE, signature: str = "") -> Task:
    return Task(
        id="",
        family="generator",
        source="generator",
        split="train",
        level=1,
        description="Twice the sum of the even values above k.",
        entry_point="solve",
        signature=signature or "def solve(xs: list[int], k: int) -> int",
        reference_solution=reference,
        visible_tests=[{"input": x} for x in (visible or [[[8, 2], 1]])],
        hidden_tests=[{"input": x} for x in hidden],
    )


K8 = AdequacySettings(mutants=8, min_kill=0.8)


def test_strong_tests_pass_the_adequacy_check(task_sb):
    report = validate(task(STRONG), task_sb, adequacy=K8)
    assert report.ok, report.reason
    assert ADEQUACY in report.results and report.task.checks[ADEQUACY] is True
    assert list(report.results) == [*CHECKS[:-1], ADEQUACY, "novel"]
    result = measure(report.task, task_sb, K8)
    assert result.mutants == 8 and result.killed >= 7 and result.passed


def test_one_weak_test_fails_with_the_share_and_a_survivor(task_sb):
    strong = validate(task(STRONG), task_sb, adequacy=K8).task
    weak = dataclasses.replace(strong, hidden_tests=[{"input": [[], 0], "output": 0}])
    result = measure(weak, task_sb, K8)
    assert result.mutants == 8 and not result.passed and result.killed < 7
    assert f"{result.killed}/8 mutants" in result.reason and " -> " in result.reason and "\n" not in result.reason
    assert result.survivor is not None and result.survivor.diff in result.reason
    # through the validity checks: three weak hidden tests (diverse enough for the other checks) fail adequacy only
    three = task([[[], 0], [[1], 5], [[10], 0]], visible=[[[3], 1]])
    plain = validate(three, task_sb)
    assert plain.ok, plain.reason
    judged = validate(three, task_sb, adequacy=K8)
    assert not judged.ok and judged.rejection == ADEQUACY
    assert judged.reason.startswith("adequacy: the hidden tests kill ") and "one survives: " in judged.reason
    assert judged.task.checks["novel"] is False and judged.results["novel"].reason.startswith("not run")


def test_adequacy_is_off_unless_asked_for(task_sb):
    report = validate(task(STRONG), task_sb, adequacy=AdequacySettings(mutants=0))
    assert report.ok and ADEQUACY not in report.results and list(report.results) == list(CHECKS)


def test_degenerate_programs(task_sb):
    # a constant function: every constant edit changes every answer
    const = task([[1], [2], [3]], visible=[[4]], reference="def solve(x):\n    return 7\n", signature="def solve(x)")
    const.hidden_tests = [dict(t, output=7) for t in const.hidden_tests]
    result = measure(const, task_sb, K8)
    assert result.mutants == 3 and result.killed == 3 and result.passed
    # a one-liner no operator can edit: passes, and says nothing was measured
    plain = task(
        [[[3, 1, 2]], [[5, 4]], [[2, 9, 1, 1]]],
        visible=[[[2, 1]]],
        reference="def solve(xs):\n    return max(xs)\n",
        signature="def solve(xs: list[int]) -> int",
    )
    report = validate(plain, task_sb, adequacy=K8)
    assert report.ok, report.reason
    assert report.results[ADEQUACY].passed and "no mutant" in report.results[ADEQUACY].reason
    # a one-liner with one edit, batched with another task: each task gets its own mutants' verdicts
    one = task(
        [[[3, 1, 2]], [[5, 4]], [[2, 9, 1, 1]]],
        visible=[[[2, 1]]],
        reference="def solve(xs): return sorted(xs)[::-1]\n",
        signature="def solve(xs: list[int]) -> list[int]",
    )
    reports = validate_many([one, task(STRONG)], task_sb, adequacy=K8)
    assert [r.ok for r in reports] == [True, True], [r.reason for r in reports]
    one_result, strong_result = measure_many([r.task for r in reports], task_sb, K8)
    assert one_result.mutants == 2 and one_result.killed == 2  # [::-2] and [::-0] (a ValueError)
    assert strong_result.mutants == 8


def test_outputs_must_be_computed_first(task_sb):
    with pytest.raises(ValueError, match="not computed"):
        measure(task(STRONG), task_sb, K8)


# ---- settings ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("generator.adequacy_mutants=-1", "generator.adequacy_mutants"),
        ("generator.adequacy_min_kill=1.5", "generator.adequacy_min_kill"),
        ("generator.adequacy_min_kill=-0.1", "generator.adequacy_min_kill"),
    ],
)
def test_bad_settings_are_refused_naming_the_key(override, key):
    with pytest.raises(UserError, match=key) as info:
        load_config(None, [override])
    assert "\n" not in str(info.value)


def test_settings_from_the_config():
    cfg = load_config(None, ["generator.adequacy_mutants=6", "generator.adequacy_min_kill=0.5"])
    assert AdequacySettings.from_config(cfg.generator) == AdequacySettings(mutants=6, min_kill=0.5)
    assert not AdequacySettings.from_config(load_config(None, []).generator).on
    with pytest.raises(ValueError, match="generator.adequacy_mutants"):
        AdequacySettings(mutants=-2)


@pytest.mark.slow  # imports the training loop's stage (torch)
def test_a_proposal_path_runs_the_check_from_the_config(task_sb):
    """generator.source=random_edits' proposals (as the loop makes them) meet the adequacy check the config asks for:
    at a minimum of 1.0 some valid edits of procedural references are turned away for a surviving mutant."""
    import random

    from generator.build import generate_tasks
    from selfplay.train.proposals import random_edit_rollouts

    groups = [[t] for t in generate_tasks(12, level=3, seed=5, sb=task_sb)]
    cfg = load_config(None, ["generator.adequacy_mutants=8", "generator.adequacy_min_kill=1.0"])
    strict = AdequacySettings.from_config(cfg.generator)
    plain = random_edit_rollouts(groups, task_sb, step=1, rng=random.Random(0))
    judged = random_edit_rollouts(groups, task_sb, step=1, rng=random.Random(0), adequacy=strict)
    assert [ro.answer.text for ro in judged] == [ro.answer.text for ro in plain]
    assert all(ADEQUACY not in ro.task.checks for ro in plain if ro.task is not None)
    assert all(ro.task.checks[ADEQUACY] for ro in judged if ro.valid)
    turned_away = [ro for ro, p in zip(judged, plain) if p.valid and not ro.valid]
    assert turned_away and all(ro.rejection == ADEQUACY for ro in turned_away)
    assert all("one survives: " in ro.reasons["reason"] for ro in turned_away)
