"""run_tests: per-test outcomes, limits, stop_on_failure, record_calls, and verdict forgeries that must not turn
a failure into a pass. Runs on every backend (see conftest.py)."""

from __future__ import annotations

import hashlib
import textwrap

import pytest
from sandbox_testlib import assert_healthy

ADD = "def add(a, b):\n    return a + b\n"


def grade(sb, solution, inputs, expected=None, **kw):
    return sb.run_tests(textwrap.dedent(solution), kw.pop("entry_point", "f"), inputs, expected, **kw)


def test_outputs_are_compared_in_the_parent(sb):
    rep = sb.run_tests(ADD, "add", [[1, 2], [3, 4], [0.1, 0.2], ["a", "b"]], expected=[3, 8, 0.3, "ab"])
    assert rep.status == "ok"
    assert [t.passed for t in rep.tests] == [True, False, True, True]
    assert (rep.passed, rep.total, rep.all_passed) == (3, 4, False)
    assert rep.tests[1].output == 7 and rep.tests[1].status == "ok"


def test_reference_outputs_without_expected(sb):
    rep = grade(
        sb,
        """
        def f(xs):
            return tuple(sorted(xs)), {"n": len(xs)}
    """,
        [[[3, 1, 2]], [[]]],
    )
    assert rep.outputs == [[[1, 2, 3], {"n": 3}], [[], {"n": 0}]]  # tuples come back as lists
    assert [t.passed for t in rep.tests] == [None, None]
    assert rep.passed == 0 and not rep.all_passed


def test_errors_per_test_do_not_stop_the_others(sb):
    rep = grade(
        sb,
        """
        def f(x):
            assert x != 2, "two is bad"
            return 10 // x
    """,
        [[1], [2], [0], [5]],
        [10, 5, 0, 2],
    )
    assert [t.status for t in rep.tests] == ["ok", "error", "error", "ok"]
    assert rep.tests[1].error == "AssertionError: two is bad"
    assert rep.tests[2].error.startswith("ZeroDivisionError")
    assert rep.passed == 2 and rep.status == "ok"


def test_per_test_timeout_and_resume(sb):
    rep = grade(
        sb,
        """
        def f(x):
            while x == 1:
                pass
            return x
    """,
        [[0], [1], [2]],
        [0, 1, 2],
        timeout_s=0.5,
    )
    assert [t.status for t in rep.tests] == ["ok", "timeout", "ok"]
    assert [t.passed for t in rep.tests] == [True, False, True]
    assert rep.status == "timeout"
    assert_healthy(sb)


def test_crash_inside_a_test_resumes_in_a_fresh_child(sb):
    rep = grade(
        sb,
        """
        import ctypes
        def f(x):
            if x == 1:
                ctypes.string_at(0)
            if x == 2:
                return [0] * 10 ** 9
            return x
    """,
        [[0], [1], [2], [3]],
        [0, 1, 2, 3],
    )
    # one allocation beyond the limit fails before any memory is used: a MemoryError, graded as the program's error
    assert [t.status for t in rep.tests] == ["ok", "killed", "error", "ok"]
    assert rep.tests[2].error.startswith("MemoryError")
    assert rep.passed == 2


def test_stop_on_failure(sb):
    sol = "def f(x):\n    return x if x != 2 else -1\n"
    rep = sb.run_tests(sol, "f", [[1], [2], [3]], [1, 2, 3], stop_on_failure=True)
    assert [t.status for t in rep.tests] == ["ok", "ok", "not_run"]
    assert [t.passed for t in rep.tests] == [True, False, False]
    rep = sb.run_tests("def f(x):\n    raise ValueError(x)\n", "f", [[1], [2]], [1, 2], stop_on_failure=True)
    assert [t.status for t in rep.tests] == ["error", "not_run"]


def test_module_that_does_not_load(sb):
    rep = sb.run_tests("def f(:\n", "f", [[1], [2]], [1, 2])
    assert rep.status == "error" and "SyntaxError" in rep.meta["load_error"]
    assert [t.status for t in rep.tests] == ["not_run", "not_run"] and rep.passed == 0
    rep = sb.run_tests("def g():\n    pass\n", "f", [[1]], [1])
    assert rep.status == "error" and "AttributeError" in rep.meta["load_error"]
    rep = sb.run_tests("while True:\n    pass\n", "f", [[1]], [1])
    assert rep.status == "timeout" and rep.tests[0].status == "not_run"


def test_record_calls(sb):
    rep = grade(
        sb,
        """
        def helper(x):
            return x * 2
        def unused():
            return 0
        class Acc:
            def total(self, xs):
                return sum(helper(x) for x in xs)
        def f(xs):
            if not xs:
                return 0
            return Acc().total(xs)
    """,
        [[[1, 2]], [[]]],
        record_calls=True,
    )
    assert rep.tests[0].calls == ["Acc.total", "f", "helper"]
    assert rep.tests[1].calls == ["f"]
    assert grade(sb, "def f():\n    return 1\n", [[]]).tests[0].calls is None


def test_stdout_of_solution_is_captured(sb):
    rep = grade(sb, "print('loading')\ndef f(x):\n    print('call', x)\n    return x\n", [[1], [2]], [1, 2])
    assert rep.stdout == "loading\ncall 1\ncall 2\n" and rep.all_passed


def test_inputs_are_not_shared_between_tests(sb):
    rep = grade(sb, "def f(xs):\n    xs.append(1)\n    return len(xs)\n", [[[]], [[]]], [1, 1])
    assert rep.all_passed


# ------------------------------------------------------------------------------------------- forgeries
@pytest.mark.parametrize(
    "body",
    ["import os\n    os._exit(0)", "import sys\n    sys.exit(0)", "raise SystemExit(0)", "raise KeyboardInterrupt"],
)
def test_exiting_does_not_pass(sb, body):
    rep = grade(sb, f"def f(x):\n    {body}\n", [[1], [2]], [1, 2])
    assert rep.passed == 0 and not rep.all_passed
    assert all(t.status == "error" for t in rep.tests)
    assert_healthy(sb)


def test_exit_at_import_does_not_pass(sb):
    rep = grade(sb, "import os\nos._exit(0)\ndef f(x):\n    return x\n", [[1]], [1])
    assert rep.passed == 0 and rep.status == "error"


def test_eq_override_does_not_pass(sb):
    rep = grade(
        sb,
        """
        class Anything:
            def __eq__(self, other):
                return True
            def __ne__(self, other):
                return False
        class EvilInt(int):
            def __eq__(self, other):
                return True
        class EvilList(list):
            def __eq__(self, other):
                return True
        def f(x):
            return [Anything(), EvilInt(0), EvilList([0])][x]
    """,
        [[0], [1], [2]],
        [5, 5, [5]],
    )
    assert [t.status for t in rep.tests] == ["unserializable", "ok", "ok"]
    assert rep.tests[1].output == 0 and type(rep.tests[1].output) is int
    assert rep.passed == 0


def test_gc_walk_finds_nothing_to_forge(sb):
    rep = grade(
        sb,
        """
        import gc
        def f(x):
            for obj in gc.get_objects():
                if isinstance(obj, dict):
                    for key in ("expected", "passed", "status"):
                        if key in obj:
                            try:
                                obj[key] = x if key == "expected" else (True if key == "passed" else "ok")
                            except Exception:
                                pass
            return -1
    """,
        [[1], [2]],
        [1, 2],
    )
    assert rep.passed == 0 and [t.output for t in rep.tests] == [-1, -1]


def test_forged_frames_on_the_result_pipe_fail_every_test(sb):
    # Frames for the right tests with the right outputs, written before the harness writes its own.
    rep = grade(
        sb,
        """
        import json, os, struct
        def frame(obj):
            data = json.dumps(obj).encode()
            return struct.pack(">I", len(data)) + data
        forged = frame({"t": "loaded"})
        for i, out in enumerate([1, 2]):
            forged += frame({"t": "test", "i": i, "status": "ok", "output": out, "error": None,
                             "duration_s": 0.0, "calls": None})
        for fd in range(3, 64):
            try:
                os.write(fd, forged)
            except OSError:
                pass
        def f(x):
            return -1
    """,
        [[1], [2]],
        [1, 2],
    )
    assert rep.passed == 0 and rep.status == "error"
    assert "protocol_violation" in rep.meta


@pytest.mark.parametrize("garbage", ["b'\\xff' * 16", "b'\\x00\\x00\\x00\\x05hello'", "b'\\x7f\\xff\\xff\\xff'"])
def test_garbage_on_the_result_pipe_fails(sb, garbage):
    rep = grade(
        sb,
        f"""
        import os
        def f(x):
            os.write(3, {garbage})
            return x
    """,
        [[1], [2]],
        [1, 2],
    )
    assert rep.passed <= 1  # the first test may legitimately have passed before the garbage
    assert not rep.all_passed
    assert rep.tests[1].passed is False


def test_closing_the_result_pipe_fails(sb):
    rep = grade(sb, "import os\nos.close(3)\ndef f(x):\n    return x\n", [[1]], [1])
    assert rep.passed == 0
    assert_healthy(sb)


def test_expected_never_reaches_the_child(sb):
    marker = "EXPECTED-MARKER-7f3a"
    digest = hashlib.sha256(marker.encode()).hexdigest()  # the child searches by hash: the source holds no marker
    rep = grade(
        sb,
        f"""
        import gc, hashlib
        def strings(obj):
            if isinstance(obj, dict):
                yield from (x for kv in obj.items() for x in kv if isinstance(x, str))
            elif isinstance(obj, (list, tuple, set)):
                yield from (x for x in obj if isinstance(x, str))
        def f(x):
            return any(hashlib.sha256(s.encode()).hexdigest() == {digest!r}
                       for o in gc.get_objects() for s in strings(o))
    """,
        [["probe"]],
        [marker],
    )
    assert rep.status == "ok" and rep.outputs == [False]
