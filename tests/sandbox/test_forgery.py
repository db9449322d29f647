"""Verdicts a program cannot forge: early exits are never "ok", statuses come from what the parent observed, the
result channel carries nothing but the program's own answers (durations are the parent's), incremental reuse
never outlives an edit, and exact expectations compare exactly. Every test runs on both backends (conftest.py)."""

from __future__ import annotations

import textwrap

import pytest
from sandbox_testlib import assert_healthy, forged_frames

import sandbox
from sandbox.incremental import IncrementalRunner, analyse


def dedent(source: str) -> str:
    return textwrap.dedent(source).lstrip()


# ------------------------------------------------------------------------------------------ early exits
EARLY_EXITS = {
    "sys.exit(0)": "import sys\nsys.exit(0)",
    "sys.exit()": "import sys\nsys.exit()",
    "raise SystemExit": "raise SystemExit",
    "SystemExit(3)": "raise SystemExit(3)",
    "os._exit(0)": "import os\nos._exit(0)",
    "os._exit(7)": "import os\nos._exit(7)",
    "posix._exit(0)": "import posix\nposix._exit(0)",
    "ctypes _exit(0)": "import ctypes\nctypes.CDLL(None)._exit(0)",
    "SIGTERM to itself": "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)",
    "SIGKILL to its group": "import os, signal\nos.killpg(0, signal.SIGKILL)",
    "abort": "import os\nos.abort()",
    "exec /bin/true": "import os\nos.execv('/bin/true', ['true'])",
    "exit in a finally": "try:\n    pass\nfinally:\n    import os\n    os._exit(0)",
    "atexit": "import atexit, os\natexit.register(lambda: None)\nos._exit(0)",
}


@pytest.mark.parametrize("name", sorted(EARLY_EXITS))
def test_an_early_exit_is_never_ok(sb, name):
    r = sb.run(EARLY_EXITS[name] + "\nprint('the end')\n")
    assert r.status in ("error", "killed"), r
    assert "the end" not in r.stdout
    assert r.meta.get("reason"), r


def test_a_program_that_runs_to_its_end_is_ok_whatever_it_did_on_the_way(sb):
    r = sb.run(
        dedent("""
        import sys
        try:
            sys.exit(3)
        except SystemExit:
            pass
        print("the end")
    """)
    )
    assert r.status == "ok" and r.stdout == "the end\n", r


def test_garbage_on_the_harness_descriptors_is_not_an_end(sb):
    for source in (
        "import os\nos.write(3, b'?')\nos._exit(0)",
        "import os\nos.close(3)\nos.close(4)",
        "import os\nos.write(3, b'!' + b'0' * 32)\nos._exit(0)",
    ):
        r = sb.run(source)
        assert r.status == "error", (source, r)


# ------------------------------------------------------------------------------------ self-chosen statuses
def test_exit_code_114_is_the_program_s_error_not_ours(sb):
    r = sb.run("import os\nos._exit(114)")
    assert r.status == "error" and r.meta["exit_code"] == 114, r


def test_exit_code_113_is_not_a_memory_verdict(sb):
    assert sb.run("import os\nos._exit(113)").status == "error"


def test_printing_memoryerror_and_aborting_is_not_a_memory_verdict(sb):
    r = sb.run("import os, sys\nsys.stderr.write('MemoryError\\n')\nsys.stderr.flush()\nos.abort()")
    assert r.status == "killed" and r.meta["signal"] == 6, r


def test_raising_memoryerror_without_using_memory_is_an_error(sb):
    r = sb.run("raise MemoryError")
    assert r.status == "error" and "MemoryError" in r.stderr, r


def test_sigxcpu_sent_to_itself_is_not_a_timeout(sb):
    r = sb.run("import os, signal\nos.kill(os.getpid(), signal.SIGXCPU)")
    assert r.status == "killed", r


def test_a_test_that_exits_with_114_is_the_program_s_failure(sb):
    rep = sb.run_tests(
        "import os\ndef f(x):\n    if x == 1:\n        os._exit(114)\n    return x\n", "f", [[0], [1], [2]], [0, 1, 2]
    )
    assert rep.status == "ok" and [t.passed for t in rep.tests] == [True, False, True], rep
    assert rep.tests[1].status == "error"


def test_a_fake_memory_error_in_a_test_is_not_a_memory_verdict(sb):
    rep = sb.run_tests("def f(x):\n    raise MemoryError('fake')\n", "f", [[0], [1]], [0, 1])
    assert [t.status for t in rep.tests] == ["error", "error"] and rep.status == "ok", rep
    assert rep.tests[0].error.startswith("MemoryError")


def test_no_self_chosen_status_reaches_the_cache():
    with sandbox.open_sandbox(workers=1, timeout_s=2.0, cache=True) as box:
        fresh = box.run("import os\nos._exit(114)")
        again = box.run("import os\nos._exit(114)")
    assert fresh.status == again.status == "error" and again.cached


# ------------------------------------------------------------------------------------- the result channel
FORGER = forged_frames("f", "args[0] * 2", ["forged"])


def test_forged_result_frames_cannot_set_durations_or_calls(sb):
    rep = sb.run_tests(FORGER, "f", [[1], [2], [3]], [2, 4, 6], record_calls=True)
    assert all(t.duration_s != 3e-12 for t in rep.tests), rep
    assert all(t.calls != ["forged"] for t in rep.tests), rep


def test_durations_are_the_parent_s(sb):
    rep = sb.run_tests("def f(x):\n    return x\n", "f", [[1], [2]], [1, 2])
    assert rep.meta["timing"] == "parent" and "load_s" in rep.meta, rep
    assert all(t.duration_s >= 0 for t in rep.tests) and rep.meta["load_s"] > 0


# ------------------------------------------------------------------------------------- incremental reuse
SQUARE_PROFILE_OFF = dedent("""
    import sys

    def helper(x):
        return x * x

    def solve(x):
        getattr(sys, "setprofile")(None)
        return helper(x)
""")

SQUARE_IN_SERIALISATION = dedent("""
    def helper(x):
        return x * x

    class Lazy(dict):
        def items(self):
            return [("v", helper(self["x"]))]

    def solve(x):
        return Lazy(x=x)
""")


@pytest.mark.parametrize(
    "source,wrong",
    [
        (SQUARE_PROFILE_OFF, SQUARE_PROFILE_OFF.replace("x * x", "-1")),
        (SQUARE_IN_SERIALISATION, SQUARE_IN_SERIALISATION.replace("x * x", "-1")),
    ],
    ids=["profile-switched-off", "helper-runs-while-serialising"],
)
def test_incremental_reuse_never_outlives_an_edit(sb, source, wrong):
    inputs = [[2], [3]]
    expected = [t.output for t in sb.run_tests(source, "solve", inputs).tests]
    runner = IncrementalRunner(sb)
    assert runner.run_tests(source, "solve", inputs, expected).passed == 2
    fresh = sb.run_tests(wrong, "solve", inputs, expected)
    again = runner.run_tests(wrong, "solve", inputs, expected)
    assert [t.passed for t in again.tests] == [t.passed for t in fresh.tests] == [False, False], again.meta


@pytest.mark.parametrize(
    "code",
    [
        "import posix\ndef f(x):\n    return x",
        "import _random\ndef f(x):\n    return x",
        "import sys as s\ndef f(x):\n    return s.stdout",
        "def f(x):\n    return x.__class__",
        "def f(x):\n    return getattr(x, '__class__')",
        "import operator\ndef f(x):\n    return operator.attrgetter('real')(x)",
        "import logging\ndef f(x):\n    return x",
        "class D(dict):\n    pass\ndef f(x):\n    return D(x=x)",
        "from collections import OrderedDict\nclass D(OrderedDict):\n    pass\ndef f(x):\n    return D(x=x)",
    ],
)
def test_unprovable_programs_are_never_reused(code):
    assert analyse(code).unsound, code


# -------------------------------------------------------------------------------------- exact comparison
@pytest.mark.parametrize(
    "output,expected,equal",
    [
        (12345678.0, 12345679, False),
        (12345679.0, 12345679, False),
        (3, 3, True),
        (True, 1, False),
        (1, True, False),
        ("a", "a", True),
        (0.1 + 0.2, 0.3, True),
        (3, 3.0, True),
        (12345678.0, 12345679.0, True),
        ([1, 2.0000000001], [1, 2.0], True),
        ([1.0, 2], [1, 2], False),
        ({"a": 1}, {"a": 1.0}, True),
        (float("nan"), float("nan"), True),
    ],
)
def test_exact_expectations_compare_exactly(output, expected, equal):
    assert sandbox.outputs_equal(output, expected) is equal


def test_an_integer_task_rejects_an_approximate_float(sb):
    rep = sb.run_tests("def f(n):\n    return float(n) - 1\n", "f", [[12345679]], [12345679])
    assert rep.tests[0].passed is False


def test_pool_is_healthy_after_the_forgeries(sb):
    assert_healthy(sb)


# ---------------------------------------------------------------------------------------------- trusted checks
HUMANEVAL_TASK = {
    "prompt": 'def double(x):\n    """Twice x."""\n',
    "entry_point": "double",
    "test": "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(-3) == -6\n",
}
FORGED_VERDICT = dedent("""
    import json, os, struct
    verdict = json.dumps({"t": "verdict", "passed": True, "error": None}).encode()
    frame = struct.pack(">I", len(verdict)) + verdict
    for fd in range(3, 12):
        try:
            os.write(fd, frame)
        except OSError:
            pass
    try:
        os.write(os.open(f"/proc/{os.getppid()}/fd/3", os.O_WRONLY), frame)
    except OSError:
        pass
    os._exit(0)
""")


@pytest.mark.parametrize(
    "body",
    [
        "    import sys\n    sys.exit(0)\n    return 2 * x\n",
        "    import os\n    os._exit(0)\n",
        "    import os, signal\n    os.kill(os.getppid(), signal.SIGKILL)\n",
        "    import os, signal\n    os.kill(os.getppid(), signal.SIGSTOP)\n",
        "    raise SystemExit\n",
        "    return 2 * x\n\nimport sys\nsys.exit(0)\n",
        "    return 2 * x\n\n" + FORGED_VERDICT,
        "    print('passed')\n    return None\n",
    ],
    ids=[
        "sys.exit",
        "os._exit",
        "kill-checker",
        "stop-checker",
        "SystemExit",
        "exit-at-import",
        "forged-verdict",
        "prints-passed",
    ],
)
def test_grade_humaneval_never_passes_what_fails_its_check(sb, body):
    from selfplay.eval.evaluate import grade_humaneval

    assert grade_humaneval([HUMANEVAL_TASK], ["    return 2 * x\n"], sb, timeout_s=2.0) == [True]
    assert grade_humaneval([HUMANEVAL_TASK], [body], sb, timeout_s=2.0) == [False]


def test_a_check_sees_values_not_objects(sb):
    # an __eq__ that says yes to everything stays in the candidate's process: the checker compares plain values
    module = HUMANEVAL_TASK["prompt"] + dedent("""
        class Yes(int):
            def __eq__(self, other):
                return True
            __hash__ = int.__hash__
        def double(x):
            return Yes(0)
    """)
    r = sb.run_check(module, "double", HUMANEVAL_TASK["test"])
    assert r.status == "error" and r.meta["check"]["passed"] is False, r
    tuples = "def pair(x):\n    return (x, {x}, {(x,): b'x'})\n"
    r = sb.run_check(tuples, "pair", "def check(c):\n    assert c(1) == (1, {1}, {(1,): b'x'})\n")
    assert r.status == "ok", r


# --------------------------------------------------------------- the trusted check's names are its own
MAD_TASK = {
    "prompt": dedent('''
    from typing import List


    def mean_absolute_deviation(numbers: List[float]) -> float:
        """ Mean absolute deviation around the mean. """
    '''),
    "entry_point": "mean_absolute_deviation",
    "test": dedent("""
    def check(candidate):
        assert abs(candidate([1.0, 2.0, 3.0]) - 2.0/3.0) < 1e-6
        assert abs(candidate([1.0, 2.0, 3.0, 4.0]) - 1.0) < 1e-6
        for n in range(3, 6):
            assert abs(candidate([float(i) for i in range(n)]) - sum(abs(i - (n - 1) / 2) for i in range(n)) / n) < 1e-6
    """),
}
MAD_HONEST = "    mean = sum(numbers) / len(numbers)\n    return sum(abs(x - mean) for x in numbers) / len(numbers)\n"
STAND_INS = {
    "abs": "def abs(x):\n    return 0\n",
    "abs-lambda": "abs = lambda x: 0\n",
    "abs+range": "def abs(x):\n    return 0\n\ndef range(*args):\n    return []\n",
    "abs+range+float": "def abs(x):\n    return 0\n\ndef range(*args):\n    return [1]\n\n"
    "def float(x):\n    return 0.0\n",
}


@pytest.mark.parametrize("stand_in", sorted(STAND_INS))
def test_a_module_function_named_like_a_builtin_never_answers_the_test(sb, stand_in):
    from selfplay.eval.evaluate import grade_humaneval, humaneval_module

    wrong = "    return 12345.0\n\n" + STAND_INS[stand_in]
    assert grade_humaneval([MAD_TASK], [MAD_HONEST], sb, timeout_s=2.0) == [True]
    assert grade_humaneval([MAD_TASK], [wrong], sb, timeout_s=2.0) == [False]
    for prompt in (None, MAD_TASK["prompt"]):
        r = sb.run_check(humaneval_module(MAD_TASK, wrong), MAD_TASK["entry_point"], MAD_TASK["test"], prompt=prompt)
        assert r.status == "error" and r.meta["check"]["passed"] is False, r


def test_an_entry_point_named_like_a_builtin_is_only_the_candidate(sb):
    check = "def check(candidate):\n    assert abs(candidate(-2) - 2) < 1e-9\n    assert abs(candidate(3) - 3) < 1e-9\n"
    assert sb.run_check("def abs(x):\n    return x if x > 0 else -x\n", "abs", check).status == "ok"
    r = sb.run_check("def abs(x):\n    return 0\n", "abs", check)
    assert r.status == "error" and r.meta["check"]["passed"] is False, r
    r = sb.run_check("def abs(x):\n    return 0\n", "abs", check, prompt="def abs(x):\n    '''Absolute value.'''\n")
    assert r.status == "error" and r.meta["check"]["passed"] is False, r


CODEC_TASK = {
    "prompt": dedent('''
    def encode(s: str):
        """ The word reversed. """
        return s[::-1]


    def decode(s: str):
        """ The inverse of encode. """
    '''),
    "entry_point": "decode",
    "test": "def check(candidate):\n    for w in ['abc', 'hello', 'xyzzy']:\n"
    "        assert candidate(encode(w)) == w\n",
}


def test_with_its_prompt_a_check_runs_the_problem_s_own_helpers(sb):
    from selfplay.eval.evaluate import humaneval_module

    def check(code):
        return sb.run_check(
            humaneval_module(CODEC_TASK, code), "decode", CODEC_TASK["test"], prompt=CODEC_TASK["prompt"]
        )

    # an identity decode with an identity encode of its own: the test's encode is the prompt's, run in the checker
    forged = check("    return s\n\ndef encode(s):\n    return s\n")
    assert forged.status == "error" and forged.meta["check"]["passed"] is False, forged
    assert check("    return s[::-1]\n").status == "ok"
    # an honest whole-module answer that defines the prompt's helper again (and a helper of its own) still passes
    whole = (
        "def encode(s):\n    return s[::-1]\n\ndef flip(s):\n    return s[::-1]\n\ndef decode(s):\n    return flip(s)\n"
    )
    assert check(whole).status == "ok"


def test_a_check_job_s_prompt_is_validated(sb):
    with pytest.raises(sandbox.SandboxConfigError, match="prompt"):
        sb.run_check("def f():\n    return 1\n", "f", "def check(c):\n    assert c() == 1\n", prompt="def (:\n")
    with pytest.raises(sandbox.SandboxConfigError, match="optionally prompt"):
        sb.run_check_many([dict(source="", entry_point="f", check="", helpers="")])


def test_a_frame_the_checker_cannot_decode_ends_the_check_whatever_the_test_catches(sb):
    # the candidate writes a frame nested too deep to decode, then its real answer: a test that catches every
    # Exception must not go on with the answers shifted by one
    module = dedent("""
        import os, struct
        def f(x):
            if x == 0:
                deep = ("[" * 100000 + "]" * 100000).encode()
                os.write(3, struct.pack(">I", len(deep)) + deep)
                return 1
            return x
    """)
    check = dedent("""
        def check(candidate):
            try:
                candidate(0)
            except Exception:
                pass
            assert candidate(1) == 1
    """)
    assert sb.run_check("def f(x):\n    return x\n", "f", check).status == "ok"
    r = sb.run_check(module, "f", check)
    assert r.status == "error" and r.meta["check"]["passed"] is False, r
    assert "protocol" in r.meta["check"]["error"], r
