"""Incremental re-execution: hashing and closure logic on ASTs, then end to end against the process sandbox,
including a property: for random edits, incremental verdicts equal a full fresh run's."""

import ast
import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sandbox
from sandbox.incremental import IncrementalRunner, analyse, owner


def src(text: str) -> str:
    return textwrap.dedent(text).lstrip()


BASE = src("""
    import math
    LIMIT = 5

    def helper_a(x):
        return x * 2

    def helper_b(x):
        return x + 100

    def solve(x):
        if x < 0:
            return helper_b(x)
        return helper_a(x) + LIMIT
""")


def fp(source, roots):
    return analyse(source).fingerprint(roots)


# ------------------------------------------------------------------------------------------ pure AST
def test_formatting_comments_and_function_order_do_not_matter():
    reordered = src('''
        import math
        LIMIT = 5   # the limit

        def solve(x):
            if x < 0:
                return helper_b(x)   # negative
            return (helper_a(x) + LIMIT)


        def helper_b(x): return x + 100
        def helper_a(x):
            """Doubles."""
            return x * 2
    ''').replace('    """Doubles."""\n', "")
    a, b = analyse(BASE), analyse(reordered)
    assert a.module_hash == b.module_hash and a.binders == b.binders
    assert fp(BASE, {"solve", "helper_a"}) == fp(reordered, {"solve", "helper_a"})
    assert fp(BASE, {"solve"}) == fp(ast.unparse(ast.parse(BASE)), {"solve"})


def test_editing_a_helper_changes_only_fingerprints_that_ran_it():
    edited = BASE.replace("x + 100", "x + 101")
    assert analyse(edited).module_hash == analyse(BASE).module_hash
    assert fp(edited, {"solve", "helper_b"}) != fp(BASE, {"solve", "helper_b"})
    assert fp(edited, {"solve", "helper_a"}) == fp(BASE, {"solve", "helper_a"})


def test_signature_of_a_directly_called_helper_counts_even_when_not_run():
    edited = BASE.replace("def helper_b(x):", "def helper_b(x, y=0):")
    assert fp(edited, {"solve", "helper_a"}) != fp(BASE, {"solve", "helper_a"})
    generator = BASE.replace("return x + 100", "yield x + 100")
    assert fp(generator, {"solve", "helper_a"}) != fp(BASE, {"solve", "helper_a"})


def test_a_helper_used_other_than_by_a_call_is_followed_in_full():
    passed = BASE.replace("return helper_b(x)", "return list(map(helper_b, [x]))[0]")
    edited = passed.replace("x + 100", "x + 101")
    assert fp(edited, {"solve", "helper_a"}) != fp(passed, {"solve", "helper_a"})


def test_classes_are_followed_in_full_even_when_only_called():
    base = src("""
        class Box:
            size = 2
        def solve(x):
            return Box().size * x if x > 0 else 0
    """)
    assert fp(base.replace("size = 2", "size = 3"), {"solve"}) != fp(base, {"solve"})


def test_module_constants_imports_and_decorators_change_the_module_hash():
    h = analyse(BASE).module_hash
    assert analyse(BASE.replace("LIMIT = 5", "LIMIT = 6")).module_hash != h
    assert analyse(BASE.replace("import math", "import math, heapq")).module_hash != h
    decorated = BASE.replace("def helper_a", "@functools.lru_cache(maxsize=None)\ndef helper_a")
    assert analyse(decorated).module_hash != h
    assert analyse(decorated.replace("maxsize=None", "maxsize=9")).module_hash != analyse(decorated).module_hash


def test_adding_an_unrelated_helper_changes_nothing_but_shadowing_a_builtin_does():
    added = BASE + "\ndef unused(y: int) -> int:\n    return y\n"
    assert analyse(added).module_hash == analyse(BASE).module_hash
    assert fp(added, {"solve", "helper_a"}) == fp(BASE, {"solve", "helper_a"})
    uses_sorted = BASE.replace("return x * 2", "return sorted([x * 2])[0]")
    shadowed = uses_sorted + "\ndef sorted(v):\n    return v[::-1]\n"
    assert fp(shadowed, {"solve", "helper_a"}) != fp(uses_sorted, {"solve", "helper_a"})


def test_functions_called_at_import_are_part_of_the_module_hash():
    base = src("""
        def build():
            return [i * i for i in range(5)]
        TABLE = tuple(build())
        def solve(i):
            return TABLE[i]
    """)
    assert analyse(base.replace("i * i", "i + i")).module_hash != analyse(base).module_hash


def test_moving_a_definition_across_module_code_that_uses_it_matters():
    before = "def f():\n    return 1\nX = f()\ndef solve():\n    return X\n"
    after = "X = f()\ndef f():\n    return 1\ndef solve():\n    return X\n"
    assert analyse(before).module_hash != analyse(after).module_hash
    # but not across module code that does not use it
    a = "import math\ndef f():\n    return 1\nY = 2\n"
    b = "import math\nY = 2\ndef f():\n    return 1\n"
    assert analyse(a).module_hash == analyse(b).module_hash


def test_annotation_naming_something_defined_later_is_import_time_code():
    ok = "class Node:\n    pass\ndef f(n: Node):\n    return 1\n"
    bad = "def f(n: Node):\n    return 1\nclass Node:\n    pass\n"
    assert analyse(ok).module_hash != analyse(bad).module_hash


def test_duplicate_definitions_order_matters():
    a = "def f():\n    return 1\ndef f():\n    return 2\n"
    b = "def f():\n    return 2\ndef f():\n    return 1\n"
    assert analyse(a).fingerprint({"f"}) != analyse(b).fingerprint({"f"})


def test_closure_follows_names_and_attributes():
    d = analyse(
        src("""
        def a():
            return b(1) + c
        def b(x):
            return k.helper(x)
        def helper(x):
            return x
        def k():
            pass
        c = 3
    """)
    )
    assert d.closure({"a"}) >= {"a", "b", "c", "k", "helper"}
    full, light = d.test_closure({"a"})
    assert "b" in light and "b" not in full and "helper" not in full


def test_unparseable_source_has_no_digest():
    assert analyse("def f(:\n") is None


@pytest.mark.parametrize(
    "code,reason",
    [
        ("import random\ndef f(x):\n    return random.random()", "imports random"),
        ("from time import time\ndef f(x):\n    return time()", "imports time"),
        ("def f(x):\n    return eval('x')", "eval"),
        ("def f(x):\n    return getattr(x, 'a' + 'b')", "computed name"),
        ("def f(x):\n    return globals()", "globals"),
        ("from math import *\ndef f(x):\n    return x", "star import"),
        ("import sys\ndef f(x):\n    sys.setprofile(None)\n    return x", "setprofile"),
        ("N = 0\ndef f(x):\n    global N\n    N += 1\n    return N", "global"),
        ("MEMO = {}\ndef f(x):\n    MEMO[x] = 1\n    return len(MEMO)", "MEMO"),
        ("SEEN = []\ndef f(x):\n    SEEN.append(x)\n    return x", "SEEN"),
        ("SEEN = [1, 2]\ndef f(x):\n    s = SEEN\n    s.append(x)\n    return x", "SEEN"),
        ("def f(x, acc=[]):\n    acc.append(x)\n    return acc", "default"),
        ("class A:\n    items = []\n    def f(self):\n        self.items.append(1)", "class attribute"),
        ("class A:\n    n = 0\n    @classmethod\n    def f(cls):\n        cls.n += 1", "stores"),
        ("def f(x):\n    f.calls = x\n    return x", "stores"),
        ("class A:\n    pass\ndef f(x):\n    type(x).y = 1", "stores"),
        (
            "DATA = [1]\ndef f(x):\n    def g():\n        DATA = 0\n"
            "        return DATA\n    DATA[0] = x\n    return g()",
            "stores",
        ),  # a nested function's local does not hide the module name
    ],
)
def test_unsound_constructs_are_detected(code, reason):
    assert reason in (analyse(code).unsound or "")


@pytest.mark.parametrize(
    "code",
    [
        "import math\nMOD = 10 ** 9 + 7\ndef f(x):\n    return math.sqrt(x) % MOD",
        "DIRS = [(0, 1), (1, 0)]\ndef f(x):\n    return [x + d[0] for d in DIRS] + [len(DIRS), DIRS[0][1]]",
        "from functools import lru_cache\n@lru_cache(maxsize=None)\ndef f(n):\n"
        "    return n if n < 2 else f(n - 1) + f(n - 2)",
        "class P:\n    def __init__(self, v):\n        self.v = v\n        self.seen = []\n    def add(self, x):\n"
        "        self.seen.append(x)\n        return self\ndef f(x):\n    return P(x).add(1).seen",
        "from collections import Counter\ndef f(xs):\n"
        "    c = Counter(xs)\n    c.update(xs)\n    return c.most_common(1)",
        "def f(x, key=len):\n    return key(x)",
        "def f(o):\n    return getattr(o, 'real', 0)",
        "DIRS = [1]\ndef f(x):\n    DIRS = []\n    DIRS.append(x)\n    return DIRS",  # a local shadows the module name
    ],
)
def test_ordinary_solutions_are_sound(code):
    assert analyse(code).unsound is None


@pytest.mark.parametrize(
    "name,expected", [("f", "f"), ("A.f", "A"), ("f.<locals>.g", "f"), ("A.f.<locals>.<lambda>", "A")]
)
def test_owner(name, expected):
    assert owner(name) == expected


# ----------------------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def sb():
    with sandbox.open_sandbox("process", workers=1, timeout_s=5.0, cache=False) as box:
        yield box


INPUTS = [[-3], [-1], [0], [2], [7]]


def expected_of(sb, source):
    return [t.output for t in sb.run_tests(source, "solve", INPUTS).tests]


def info(report):
    return report.meta["incremental"]


def test_editing_one_helper_reruns_only_the_tests_that_reached_it(sb):
    runner = IncrementalRunner(sb)
    expected = expected_of(sb, BASE)
    first = runner.run_tests(BASE, "solve", INPUTS, expected)
    assert info(first)["rerun"] == 5 and first.all_passed
    second = runner.run_tests(BASE.replace("x + 100", "x + 101"), "solve", INPUTS, expected)
    assert info(second) == {"rerun": 2, "reused": 3, "reused_tests": [2, 3, 4], "fallback": None}
    assert [t.passed for t in second.tests] == [False, False, True, True, True]
    assert runner.totals == {"rerun": 7, "reused": 3}


def test_editing_a_module_constant_reruns_all(sb):
    runner = IncrementalRunner(sb)
    runner.run_tests(BASE, "solve", INPUTS)
    report = runner.run_tests(BASE.replace("LIMIT = 5", "LIMIT = 6"), "solve", INPUTS)
    assert info(report)["rerun"] == 5 and [t.output for t in report.tests][2:] == [6, 10, 20]


def test_reordering_and_reformatting_reruns_none(sb):
    runner = IncrementalRunner(sb)
    expected = expected_of(sb, BASE)
    runner.run_tests(BASE, "solve", INPUTS, expected)
    body = ast.parse(BASE).body
    shuffled = "\n\n# reordered\n".join(ast.unparse(s) for s in body[:2] + body[2:][::-1])
    report = runner.run_tests(shuffled, "solve", INPUTS, expected)
    assert info(report)["rerun"] == 0 and report.all_passed and report.status == "ok"
    report = runner.run_tests(shuffled + "\ndef spare(q):\n    return q\n", "solve", INPUTS, expected)
    assert info(report)["rerun"] == 0


def test_changed_expected_values_are_regraded_without_running(sb):
    runner = IncrementalRunner(sb)
    expected = expected_of(sb, BASE)
    runner.run_tests(BASE, "solve", INPUTS, expected)
    report = runner.run_tests(BASE, "solve", INPUTS, expected[:-1] + [0])
    assert info(report)["rerun"] == 0 and [t.passed for t in report.tests] == [True] * 4 + [False]


def test_a_signature_fix_reruns_every_test_that_could_call_it(sb):
    broken = BASE.replace("def helper_b(x):", "def helper_b(x, y):")
    runner = IncrementalRunner(sb)
    first = runner.run_tests(broken, "solve", INPUTS, expected_of(sb, BASE))
    assert [t.status for t in first.tests] == ["error", "error", "ok", "ok", "ok"]
    fixed = runner.run_tests(BASE, "solve", INPUTS, expected_of(sb, BASE))
    # tests 2-4 never ran helper_b, but solve calls it by name, so its signature was visible to them
    assert info(fixed)["rerun"] == 5 and fixed.all_passed


def test_bad_calls_raise_config_errors(sb):
    runner = IncrementalRunner(sb)
    with pytest.raises(sandbox.SandboxConfigError, match="2 expected outputs for 5 inputs"):
        runner.run_tests(BASE, "solve", INPUTS, [1, 2])
    with pytest.raises(sandbox.SandboxConfigError, match="JSON"):
        runner.run_tests(BASE, "solve", [[object()]])


def test_unsound_solutions_rerun_everything(sb):
    code = "CALLS = []\ndef solve(x):\n    CALLS.append(x)\n    return len(CALLS)\n"
    runner = IncrementalRunner(sb)
    runner.run_tests(code, "solve", INPUTS)
    report = runner.run_tests(code, "solve", INPUTS)
    assert info(report)["rerun"] == 5 and "CALLS" in info(report)["fallback"]
    assert [t.output for t in report.tests] == [1, 2, 3, 4, 5]


def test_unclean_outcomes_are_never_reused(sb):
    code = "def solve(x):\n    while x > 5:\n        pass\n    return x\n"
    runner = IncrementalRunner(sb, timeout_s=0.5)
    first = runner.run_tests(code, "solve", INPUTS)
    assert first.tests[4].status == "timeout"
    again = runner.run_tests(code, "solve", INPUTS)
    assert info(again)["reused_tests"] == [0, 1, 2, 3] and again.tests[4].status == "timeout"
    crashing = "raise SystemExit(3)\n" + code
    runner.run_tests(crashing, "solve", INPUTS[:2])
    assert info(runner.run_tests(crashing, "solve", INPUTS[:2]))["rerun"] == 2


# A multi-function solution whose parts each come in a few versions; each turn picks versions, an order and a
# layout. Versions include wrong answers, a raise, a wrong signature, a generator and a class.
ORDER = ["norm", "small", "big", "acc", "solve"]
PARTS = {
    "header": ["import math\nLIMIT = 4", "import math\nLIMIT = 2"],
    "norm": ["def norm(x):\n    return abs(x)", "def norm(x):\n    return x * x", "def norm(x, y):\n    return x"],
    "small": [
        "def small(x):\n    return x + LIMIT - 3",
        "def small(x):\n    return x - 1 if x > 1 else x",
        "def small(x):\n    yield x",
    ],
    "big": [
        "def big(x):\n    return x // 2",
        "def big(x):\n    return Acc(3).add(x)",
        "def big(x):\n    raise ValueError('no')",
    ],
    "acc": [
        "class Acc:\n    def __init__(self, k):\n        self.k = k\n    def add(self, x):\n        return x + self.k",
        "class Acc:\n    def __init__(self, k):\n        self.k = k * 2\n"
        "    def add(self, x):\n        return x - self.k",
    ],
    "solve": [
        "def solve(x):\n    n = norm(x)\n    return small(n) if n < LIMIT else big(n)",
        "def solve(x):\n    return small(x) if x < 0 else big(norm(x)) + math.floor(0.5)",
    ],
}
# a turn edits one part (sometimes also the order of the definitions and the layout), as a solver does
EDIT = st.tuples(st.sampled_from(sorted(PARTS)), st.integers(0, 2), st.none() | st.permutations(ORDER), st.booleans())


def build(choice: dict, order: list, unparse: bool) -> str:
    code = "\n\n".join([PARTS["header"][choice["header"]]] + [PARTS[k][choice[k]] for k in order]) + "\n"
    return ast.unparse(ast.parse(code)) if unparse else code


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.fixed_dictionaries({k: st.integers(0, len(v) - 1) for k, v in PARTS.items()}),
    st.lists(EDIT, min_size=1, max_size=5),
)
def test_incremental_verdicts_equal_a_fresh_run(sb, start, edits):
    inputs = [[-3], [-1], [0], [1], [3], [6]]
    expected = [t.output for t in sb.run_tests(build({k: 0 for k in PARTS}, ORDER, False), "solve", inputs).tests]
    runner, choice, order = IncrementalRunner(sb), dict(start), ORDER
    for part, version, new_order, unparse in [(None, 0, None, False)] + edits:
        if part is not None:
            choice[part] = version % len(PARTS[part])
        order = new_order or order
        code = build(choice, order, unparse)
        inc = runner.run_tests(code, "solve", inputs, expected)
        fresh = sb.run_tests(code, "solve", inputs, expected, use_cache=False)
        assert [(t.status, t.output, t.passed) for t in inc.tests] == [
            (t.status, t.output, t.passed) for t in fresh.tests
        ], code


# ------------------------------------------------------------ a call record with a gap is never reused
# Deep recursion (caught) reaches the recursion limit inside the call-recording profile function, and CPython then
# drops it: every call after that goes unrecorded. Such a test's record must not be used for reuse.
DEEP = src("""
    def deep(n):
        return deep(n + 1)

    def helper(x):
        return x + 1

    def solve(x):
        try:
            deep(0)
        except RecursionError:
            pass
        return helper(x)
""")


def test_a_record_with_a_gap_is_no_record(sb):
    fresh = sb.run_tests(DEEP, "solve", [[1], [2]], [2, 3], record_calls=True, use_cache=False)
    assert fresh.all_passed and [t.calls for t in fresh.tests] == [None, None]
    whole = sb.run_tests(DEEP.replace("deep(0)", "pass"), "solve", [[1]], record_calls=True, use_cache=False)
    assert whole.tests[0].calls == ["helper", "solve"]


def test_an_edit_after_deep_recursion_is_graded_fresh(sb):
    runner = IncrementalRunner(sb)
    first = runner.run_tests(DEEP, "solve", [[1], [2], [3]], [2, 3, 4])
    assert first.all_passed
    wrong = DEEP.replace("return x + 1", "return x + 2")
    second = runner.run_tests(wrong, "solve", [[1], [2], [3]], [2, 3, 4])
    assert info(second)["reused"] == 0 and [t.passed for t in second.tests] == [False] * 3
    assert second.passed == sb.run_tests(wrong, "solve", [[1], [2], [3]], [2, 3, 4], use_cache=False).passed == 0


GAP_PARTS = {
    "deep": ["def deep(n):\n    return deep(n + 1)", "def deep(n):\n    return n if n > 20 else deep(n + 1)"],
    "guard": [
        "def guard(x):\n    try:\n        deep(0)\n    except RecursionError:\n        return 0\n    return 1",
        "def guard(x):\n    if x > 0:\n        try:\n            deep(x)\n        except RecursionError:\n"
        "            return 0\n    return 1",
        "def guard(x):\n    return 1",
    ],
    "helper": [
        "def helper(x):\n    return x + 1",
        "def helper(x):\n    return x + 2",
        "def helper(x):\n    return -x",
        "def helper(x):\n    raise ValueError(x)",
    ],
    "other": [
        "def other(x):\n    return helper(x) * 2",
        "def other(x):\n    return x * 2",
        "def other(x):\n    return helper(helper(x))",
    ],
    "solve": [
        "def solve(x):\n    g = guard(x)\n    return helper(x) + g",
        "def solve(x):\n    g = guard(x)\n    return other(x) - g",
        "def solve(x):\n    return other(x) + guard(x) + helper(x)",
    ],
}
GAP_ORDER = ["deep", "guard", "helper", "other", "solve"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.fixed_dictionaries({k: st.integers(0, len(v) - 1) for k, v in GAP_PARTS.items()}),
    st.lists(
        st.tuples(st.sampled_from(["helper", "other", "helper", "guard", "deep", "solve"]), st.integers(0, 3)),
        min_size=1,
        max_size=4,
    ),
)
def test_edits_of_unrecorded_helpers_equal_a_fresh_run(sb, start, edits):
    inputs = [[-2], [0], [1], [5]]
    expected = [x + 1 for (x,) in inputs]
    runner, choice = IncrementalRunner(sb), dict(start)
    for part, version in [(None, 0)] + edits:
        if part is not None:
            choice[part] = version % len(GAP_PARTS[part])
        code = "\n\n".join(GAP_PARTS[k][choice[k]] for k in GAP_ORDER) + "\n"
        inc = runner.run_tests(code, "solve", inputs, expected)
        fresh = sb.run_tests(code, "solve", inputs, expected, use_cache=False)
        assert [(t.status, t.output, t.passed) for t in inc.tests] == [
            (t.status, t.output, t.passed) for t in fresh.tests
        ], code


def test_an_int_too_large_for_a_float_is_graded_not_raised_on_reuse(sb):
    code = "def solve(x):\n    return 10 ** 400 if x > 0 else 0.5\n"
    runner = IncrementalRunner(sb)
    for _ in range(2):
        report = runner.run_tests(code, "solve", [[1], [0]], [1.5, 0.5])
        assert [t.passed for t in report.tests] == [False, True]
    assert info(report)["reused"] == 2
    assert [t.passed for t in runner.run_tests(code, "solve", [[1], [0]], [10**400, 1.5]).tests] == [True, False]
