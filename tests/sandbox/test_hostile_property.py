"""A property over hostile programs: hostile fragments (early exits, exit codes and signals, frame and descriptor
games, profile and trace hooks, builtin subclasses in answers, monkeypatched builtins) placed around a correct or
a wrong solution. Every verdict — a run, a grading, a trusted check, and an incremental grading after an edit —
must equal the ground truth known from the construction: a fragment that ends the program or breaks the
harness's channel fails everything it reaches; a neutral one changes nothing, so the solution's correctness
decides. Runs on both backends (conftest.py); the example count is kept small so each takes seconds."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandbox.incremental import IncrementalRunner

# (code, ends): `ends` when executing it ends the program or breaks the harness's channels
FRAGMENTS = [
    ("import sys; sys.exit(0)", True),
    ("raise SystemExit", True),
    ("import os; os._exit(0)", True),
    ("import os; os._exit(114)", True),
    ("import os; os._exit(113)", True),
    ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", True),
    ("import os, signal; os.kill(os.getpid(), signal.SIGXCPU)", True),
    ("import os; os.abort()", True),
    ("import os; os.write(3, b'\\x00\\x00\\x00\\x02{}')", True),
    ("import os; os.close(3)", True),
    ("import sys; _f = sys._getframe(); _f = _f.f_back or _f; _l = dict(_f.f_locals)", False),
    ("import os; os.fstat(1)", False),
    ("import sys; getattr(sys, 'setprofile')(None)", False),
    ("import sys; sys.settrace(lambda *a: None)", False),
    ("import builtins; builtins.len = lambda *a: 0", False),
    ("import builtins; builtins.print = lambda *a, **k: None", False),
    ("import builtins; builtins.sorted = lambda *a, **k: []", False),
    ("import gc; gc.collect()", False),
]
INPUTS = [[1], [2], [3]]
EXPECTED = [2, 5, 10]  # x * x + 1


def solution(fragment: str, where: str, correct: bool, wrapped: bool) -> str:
    """solve(x) = helper(x) + 1 with helper x * x (correct) or x * x + 1 (wrong); the fragment at the top of the
    module, at the top of solve's body, or after the definitions; the answer optionally an int subclass whose
    __eq__ says yes to everything (it is graded as the plain int it is)."""
    helper = "x * x" if correct else "x * x + 1"
    inner = f"    {fragment}\n" if where == "body" else ""
    answer = "Yes(helper(x) + 1)" if wrapped else "helper(x) + 1"
    lines = [
        f"{fragment}\n" if where == "top" else "",
        "class Yes(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\n\n",
        f"def helper(x):\n    return {helper}\n\n",
        f"def solve(x):\n{inner}    return {answer}\n",
        f"\n{fragment}\n" if where == "end" else "",
    ]
    return "".join(lines)


hostile = st.tuples(st.sampled_from(FRAGMENTS), st.sampled_from(["top", "body", "end"]), st.booleans(), st.booleans())


@settings(max_examples=24, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(hostile)
def test_hostile_verdicts_equal_the_ground_truth(sb, case):
    (fragment, ends), where, correct, wrapped = case
    module = solution(fragment, where, correct, wrapped)
    passes = correct and not ends

    program = module + "".join(f"\nassert solve({x[0]}) + 0 == {y}" for x, y in zip(INPUTS, EXPECTED)) + "\n"
    run = sb.run(program)
    assert (run.status == "ok") is passes, (module, run)

    report = sb.run_tests(module, "solve", INPUTS, EXPECTED)
    assert [t.passed for t in report.tests] == [passes] * len(INPUTS), (module, report)

    check = "def check(candidate):\n" + "".join(
        f"    assert candidate({x[0]}) == {y}\n" for x, y in zip(INPUTS, EXPECTED)
    )
    assert (sb.run_check(module, "solve", check).status == "ok") is passes, module

    # incremental: grade a version, edit the helper to be wrong, grade again: the same verdict as a fresh run
    runner = IncrementalRunner(sb)
    runner.run_tests(module, "solve", INPUTS, EXPECTED)
    edited = module.replace("    return x * x\n", "    return -1\n").replace(
        "    return x * x + 1\n", "    return -1\n"
    )
    again = runner.run_tests(edited, "solve", INPUTS, EXPECTED)
    fresh = sb.run_tests(edited, "solve", INPUTS, EXPECTED)
    assert [t.passed for t in again.tests] == [t.passed for t in fresh.tests] == [False] * len(INPUTS), (
        edited,
        again.meta,
    )
