"""Validity checks (docs/architecture.md), shared by procedural and generator-proposed tasks.

One function per check, each returning `CheckResult(passed, reason)`. `validate(task, sb, corpus_index)` runs
them all and returns a `ValidationReport` whose `task` has its test outputs computed by the reference in the
sandbox (when they were missing), its `checks` (name -> passed) and its fingerprints filled in.
`validate_many` does the same for a batch, sending the sandbox work of all tasks in parallel
(`run_tests_many`): per task one run for outputs (+ behaviour probes), a second fresh run for determinism, and
one run of the trivial-solution battery against the hidden tests.

Checks, in order (a failed static check skips the sandbox ones, which are then recorded as failed "not run"):
    parses, safe, signature, description, json_values (inputs)          static
    json_values (outputs), runs, outputs_match, deterministic, diverse, trivial_fail, novel   with the sandbox
    adequacy (only when asked for: `adequacy=AdequacySettings(mutants=k)`, `generator.adequacy_mutants`): the hidden
    tests kill at least a share of k mutants of the reference (generator/adequacy.py), before novel
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
from collections import Counter
from dataclasses import dataclass
from typing import Protocol

import sandbox
from generator.adequacy import AdequacyResult, AdequacySettings, measure_many
from generator.code_io_values import behaviour_key, output_refusal, stricter_refusal
from generator.families.values import ELEMENTS, probe_inputs
from generator.fingerprint import ast_hash, behaviour_hash, canonical_json, task_id
from generator.schema import SchemaError, Task, check_json_value

CHECKS = (
    "parses",
    "safe",
    "signature",
    "description",
    "json_values",
    "runs",
    "outputs_match",
    "deterministic",
    "diverse",
    "trivial_fail",
    "novel",
)
STATIC_CHECKS = CHECKS[:4]
ADEQUACY = "adequacy"  # the optional check, after trivial_fail (its place in `ValidationReport.results`)

BANNED_MODULES = frozenset(
    {
        "os",
        "sys",
        "subprocess",
        "socket",
        "threading",
        "multiprocessing",
        "time",
        "datetime",
        "shutil",
        "signal",
        "ctypes",
        "importlib",
        "pathlib",
        "io",
        "builtins",
        "gc",
        "inspect",
        "pickle",
        "marshal",
        "asyncio",
        "concurrent",
        "select",
        "selectors",
        "resource",
        "pty",
        "urllib",
        "http",
        "ftplib",
        "smtplib",
        "requests",
        "secrets",
        "tempfile",
        "glob",
        "fcntl",
        "mmap",
        "code",
        "codeop",
        "runpy",
        "sched",
        "_thread",
        "atexit",
        "webbrowser",
        "platform",
        "sysconfig",
        "faulthandler",
        "tracemalloc",
        "zipimport",
        "pdb",
        "trace",
    }
)
# The interpreter's system interfaces a task's reference has no reason to load: private modules (`_ctypes`,
# `_posixsubprocess`, `_socket`, ...: a leading underscore, `__future__` aside) reach what the banned public ones
# wrap, and these reach the process, the files or the kernel directly (`posix` is `os`).
SYSTEM_MODULES = frozenset(
    {
        "posix",
        "nt",
        "pwd",
        "grp",
        "spwd",
        "termios",
        "tty",
        "syslog",
        "sqlite3",
        "dbm",
        "shelve",
        "ssl",
        "socketserver",
        "xmlrpc",
        "mailbox",
        "logging",
    }
)
BANNED_CALLS = frozenset(
    {
        "eval",
        "exec",
        "compile",
        "open",
        "__import__",
        "input",
        "breakpoint",
        "globals",
        "locals",
        "vars",
        "exit",
        "quit",
        "getattr",
        "setattr",
        "delattr",
        "memoryview",
        "help",
    }
)
ALLOWED_DUNDERS = frozenset(
    {
        "__init__",
        "__name__",
        "__len__",
        "__repr__",
        "__str__",
        "__eq__",
        "__lt__",
        "__hash__",
        "__iter__",
        "__next__",
        "__getitem__",
        "__contains__",
    }
)
MIN_HIDDEN, MIN_VISIBLE = 3, 1
# The family of the code_io format's tasks (generator/code_io_format.py): a program `f` read by reasoning about it,
# held to generator/code_io.py's stricter rules on top of these (no random even seeded, no digests, no id()/hash();
# outputs of at most code_io.MAX_VALUE_CHARS characters; behaviour keyed on its own input/output pairs)
CODE_IO_FAMILY = "generator/code_io"
_ERROR = {"__trivial_error__": True}  # what a trivial program "returns" when it raises
NOT_RUN = "not run"  # reason prefix of checks skipped after an earlier failure
# Every sandbox run of the checks counts its timeouts in the child's CPU time (sandbox clock "cpu", with a wall-clock
# cap of 10 x the limit, 10 s at least), so whether a task is valid, and so the corpus a seed draws, does not depend
# on the machine's load; a solver's answer is still graded on the wall clock (a time-out there is a failure:
# docs/sandbox.md, "Timeouts").
CLOCK = "cpu"


@dataclass(frozen=True)
class CheckResult:
    passed: bool
    reason: str = ""  # why it failed ("" when it passed, but for a note such as adequacy's "no mutant")


OK = CheckResult(True)


def fail(reason: str) -> CheckResult:
    return CheckResult(False, reason)


@dataclass
class ValidationReport:
    task: Task  # outputs computed, checks and fingerprints filled in
    results: dict[str, CheckResult]

    @property
    def ok(self) -> bool:
        return all(r.passed for r in self.results.values())

    @property
    def failed(self) -> list[str]:
        """Failed checks, the ones that ran first (checks skipped after a failure come last)."""
        ran = [n for n, r in self.results.items() if not r.passed and not r.reason.startswith(NOT_RUN)]
        return ran + [n for n, r in self.results.items() if not r.passed and n not in ran]

    @property
    def reason(self) -> str:
        """'check: reason' of the first failed check, or ''."""
        failed = self.failed
        return f"{failed[0]}: {self.results[failed[0]].reason}" if failed else ""

    @property
    def rejection(self) -> str:
        """The first failed check's name (for histograms), or ''."""
        failed = self.failed
        return failed[0] if failed else ""


class CorpusIndex(Protocol):
    def find_duplicate(self, task_id: str, ast_hash: str | None, behaviour_hash: str | None) -> str | None:
        """The id of a stored task that this one duplicates (same id, program or behaviour), else None."""


class MemoryIndex:
    """An in-memory CorpusIndex (also used within a batch)."""

    def __init__(self, tasks=()) -> None:
        self.ids: set[str] = set()
        self.by_ast: dict[str, str] = {}
        self.by_behaviour: dict[str, str] = {}
        for t in tasks:
            self.add(t)

    def add(self, task: Task) -> None:
        self.ids.add(task.id)
        if task.fingerprints.get("ast"):
            self.by_ast.setdefault(task.fingerprints["ast"], task.id)
        if task.fingerprints.get("behaviour"):
            self.by_behaviour.setdefault(task.fingerprints["behaviour"], task.id)

    def find_duplicate(self, task_id, ast_hash, behaviour_hash):
        if task_id in self.ids:
            return task_id
        return self.by_ast.get(ast_hash) or self.by_behaviour.get(behaviour_hash)


# ================================================================================ static checks
def _parse(task: Task):
    try:
        return ast.parse(task.reference_solution)
    except (SyntaxError, ValueError):
        return None


def check_parses(task: Task) -> CheckResult:
    try:
        ast.parse(task.reference_solution)
    except SyntaxError as exc:
        return fail(f"reference does not parse: {exc.msg} (line {exc.lineno})")
    except ValueError as exc:
        return fail(f"reference does not parse: {exc}")
    return OK


def _is_fixed_seed(call: ast.Call) -> bool:
    return len(call.args) == 1 and isinstance(call.args[0], ast.Constant) and not call.keywords


def check_safe(task: Task) -> CheckResult:
    """No banned imports (BANNED_MODULES, SYSTEM_MODULES, any private module such as `_ctypes`) or calls, no
    dunder attribute tricks, `random` only with a fixed seed; a task of CODE_IO_FAMILY also code_io's refusals."""
    tree = _parse(task)
    if tree is None:
        return fail("reference does not parse")
    if task.family == CODE_IO_FAMILY:
        why = stricter_refusal(tree)
        if why:
            return fail(why)
    uses_random, seeded = False, False
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for name in names:
                top = name.split(".")[0]
                if top in BANNED_MODULES:
                    return fail(f"imports banned module '{top}'")
                if (top.startswith("_") and top != "__future__") or top in SYSTEM_MODULES:
                    return fail(
                        f"imports banned module '{top}': a reference has no reason to load the interpreter's "
                        f"private or system interfaces"
                    )
                if top == "random":
                    uses_random = True
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if isinstance(func, ast.Name) and name in BANNED_CALLS:
                return fail(f"calls banned function '{name}'")
            if name in ("seed", "Random") and _is_fixed_seed(node):
                seeded = True
        elif isinstance(node, ast.Attribute):
            if node.attr.startswith("__") and node.attr not in ALLOWED_DUNDERS:
                return fail(f"uses dunder attribute '{node.attr}'")
        elif isinstance(node, ast.Name):
            if node.id in ("__builtins__", "__import__", "__loader__", "__spec__"):
                return fail(f"uses '{node.id}'")
    if uses_random and not seeded:
        return fail("uses random without a fixed seed")
    return OK


def parse_signature(signature: str) -> ast.FunctionDef:
    """The signature string as a function node. Raises ValueError when it is not `def name(args) [-> T]`."""
    text = signature.strip().rstrip(":")
    try:
        tree = ast.parse(text + ":\n    pass\n")
    except SyntaxError as exc:
        raise ValueError(f"signature does not parse: {exc.msg}") from exc
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.FunctionDef):
        raise ValueError("signature must be a single 'def name(args) -> type'")
    return tree.body[0]


def _arity(fn: ast.FunctionDef) -> tuple[int, int, bool]:
    """(required positional args, total positional args, has *args)."""
    args = fn.args.posonlyargs + fn.args.args
    return len(args) - len(fn.args.defaults), len(args), fn.args.vararg is not None


def check_signature(task: Task) -> CheckResult:
    """The signature names the entry point, the reference defines it with the same parameters, and every
    test passes a number of arguments it accepts."""
    try:
        sig = parse_signature(task.signature)
    except ValueError as exc:
        return fail(str(exc))
    if sig.name != task.entry_point:
        return fail(f"signature names '{sig.name}' but the entry point is '{task.entry_point}'")
    tree = _parse(task)
    if tree is None:
        return fail("reference does not parse")
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == task.entry_point]
    if not defs:
        return fail(f"reference defines no top-level function '{task.entry_point}'")
    sig_args = [a.arg for a in sig.args.posonlyargs + sig.args.args]
    ref_args = [a.arg for a in defs[-1].args.posonlyargs + defs[-1].args.args]
    if sig_args != ref_args:
        return fail(f"signature parameters ({', '.join(sig_args)}) differ from the reference's ({', '.join(ref_args)})")
    lo, hi, star = _arity(defs[-1])
    for i, test in enumerate(task.tests):
        n = len(test["input"]) if isinstance(test.get("input"), list) else -1
        if n < lo or (n > hi and not star):
            return fail(f"test {i} passes {n} argument(s); '{task.entry_point}' takes {lo}..{hi}")
    return OK


def check_description(task: Task) -> CheckResult:
    if not task.description.strip():
        return fail("description is empty")
    return OK


# ============================================================================== sandbox checks
def check_runs(task: Task, report) -> CheckResult:
    """The reference ran within limits on every input (report: its TestReport on the task's tests)."""
    for i, outcome in enumerate(report.tests[: len(task.tests)]):
        if outcome.status == "unserializable":
            continue  # json_values says why
        if outcome.status != "ok":
            detail = f" ({outcome.error})" if outcome.error else ""
            if outcome.status == "not_run" and report.status != "ok":  # the module did not load: why
                detail = f" ({_ended(report)})"
            return fail(f"{_test_name(task, i)}: {outcome.status}{detail}")
    if len(report.tests) < len(task.tests):
        return fail(f"reference ran {len(report.tests)} of {len(task.tests)} tests ({report.status})")
    return OK


def check_json_values(task: Task, outputs: list | None) -> CheckResult:
    """Inputs and outputs are plain JSON and survive a JSON round trip."""
    for i, test in enumerate(task.tests):
        try:
            check_json_value(test["input"], f"{_test_name(task, i)} input")
            if json.loads(canonical_json(test["input"])) != test["input"]:
                return fail(f"{_test_name(task, i)} input does not round-trip through JSON")
        except (SchemaError, TypeError, ValueError) as exc:
            return fail(str(exc))
    for i, out in enumerate(outputs or []):
        if out is _UNSERIALIZABLE:
            return fail(f"{_test_name(task, i)}: output is not JSON-serialisable")
        try:
            check_json_value(out, f"{_test_name(task, i)} output")
        except SchemaError as exc:
            return fail(str(exc))
        why = output_refusal(out) if task.family == CODE_IO_FAMILY else ""
        if why:
            return fail(f"{_test_name(task, i)}: {why}")
    return OK


def check_outputs_match(task: Task, outputs: list) -> CheckResult:
    """Stored outputs (if the record came with them) equal what the reference computes now."""
    for i, (test, out) in enumerate(zip(task.tests, outputs)):
        if "output" in test and not sandbox.outputs_equal(out, test["output"]):  # the stored one is expected
            return fail(
                f"{_test_name(task, i)}: stored output {_short(test['output'])} but the reference returns {_short(out)}"
            )
    return OK


def check_deterministic(task: Task, first: list, second: list) -> CheckResult:
    """Two fresh runs (no cache) give identical outputs (the second calls the inputs in reverse order: an output
    that depends on the calls before it is not one a task can show alone)."""
    for i, (a, b) in enumerate(zip(first, second)):
        if not sandbox.outputs_equal(a, b):
            return fail(f"{_test_name(task, i)}: {_short(a)} on one run, {_short(b)} on another")
    return OK


def check_diverse(task: Task, outputs: list) -> CheckResult:
    """Enough tests, inputs not all alike, and the hidden outputs not all equal."""
    if len(task.visible_tests) < MIN_VISIBLE or len(task.hidden_tests) < MIN_HIDDEN:
        return fail(
            f"needs >= {MIN_VISIBLE} visible and >= {MIN_HIDDEN} hidden tests, has "
            f"{len(task.visible_tests)} and {len(task.hidden_tests)}"
        )
    inputs = {canonical_json(t["input"]) for t in task.tests}
    need = max(2, math.ceil(0.75 * len(task.tests)))
    if len(inputs) < need:
        return fail(f"only {len(inputs)} distinct inputs among {len(task.tests)} tests (need {need})")
    hidden_out = {canonical_json(o) for o in outputs[len(task.visible_tests) :]}
    if len(hidden_out) < 2:
        return fail("every hidden test has the same output")
    return OK


def trivial_battery(task: Task, outputs: list) -> tuple[list[str], str]:
    """(names, program): a program whose entry point returns, for its input, the answers of every trivial
    solution (identity, constants, most common output, empty values, sorted/reversed input, a lookup table
    of the visible examples); run once per hidden input, each column is compared with the expected output."""
    visible = {canonical_json(t["input"]): o for t, o in zip(task.visible_tests, outputs)}
    hidden = outputs[len(task.visible_tests) :]
    counts = Counter(canonical_json(o) for o in hidden)
    common = counts.most_common(1)[0][0] if counts else "null"
    names = [
        "identity",
        "most_common_output",
        "empty_list",
        "empty_str",
        "zero",
        "none",
        "sorted_input",
        "reversed_input",
        "visible_lookup",
    ]
    program = f"""import json

COMMON = json.loads({common!r})
TABLE = json.loads({canonical_json(visible)!r})


def _key(args):
    return json.dumps(list(args), sort_keys=True, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


TRIVIAL = [
    lambda *a: a[0],
    lambda *a: COMMON,
    lambda *a: [],
    lambda *a: "",
    lambda *a: 0,
    lambda *a: None,
    lambda *a: sorted(a[0]),
    lambda *a: a[0][::-1],
    lambda *a: TABLE.get(_key(a), COMMON),
]


def {task.entry_point}(*args):
    answers = []
    for fn in TRIVIAL:
        try:
            answer = fn(*args)
            json.dumps(answer, allow_nan=False)
        except Exception:
            answer = {_ERROR!r}
        answers.append(answer)
    return answers
"""
    return names, program


def check_trivial_fail(task: Task, outputs: list, report) -> CheckResult:
    """No trivial program passes every hidden test (report: the battery's TestReport on the hidden inputs)."""
    names, _ = trivial_battery(task, outputs)
    hidden = outputs[len(task.visible_tests) :]
    if report.status != "ok" or any(t.status != "ok" for t in report.tests):
        return fail(f"the trivial battery did not run ({report.status})")
    passing = [
        n
        for j, n in enumerate(names)
        if all(sandbox.outputs_equal(t.output[j], exp) for t, exp in zip(report.tests, hidden))
    ]
    if passing:
        return fail(f"trivial solution passes every hidden test: {', '.join(passing)}")
    return OK


def check_novel(task: Task, index: CorpusIndex | None) -> CheckResult:
    """Not a duplicate (same id), nor a near-duplicate (same normalised AST or behaviour) of the corpus."""
    if index is None:
        return OK
    fp = task.fingerprints
    dup = index.find_duplicate(task.id, fp.get("ast"), fp.get("behaviour"))
    if dup is None:
        return OK
    if dup == task.id:
        return fail(f"duplicate of task {dup} (same id)")
    return fail(f"near-duplicate of task {dup} (same normalised program or behaviour on probe inputs)")


def check_adequacy(result: AdequacyResult) -> CheckResult:
    """The hidden tests kill at least the stated share of the reference's mutants (a reference no mutant can be made
    of passes, and says so)."""
    if result.mutants == 0:
        return CheckResult(True, result.reason)  # passed, with the note that nothing was measured
    return OK if result.passed else fail(result.reason)


# ==================================================================================== running
_UNSERIALIZABLE = object()
_NOT_RUN = object()  # a test the second run of the determinism check did not reach


def _test_name(task: Task, i: int) -> str:
    nv = len(task.visible_tests)
    return f"visible test {i}" if i < nv else f"hidden test {i - nv}"


def _short(value, limit: int = 60) -> str:
    if value is _UNSERIALIZABLE or value is _NOT_RUN:
        return "<not JSON>" if value is _UNSERIALIZABLE else "<not run>"
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _with_outputs(task: Task, outputs: list, *, copy: bool = True) -> Task:
    """The task with its tests' outputs set to `outputs` (visible first): a copy, or the task itself changed."""
    nv = len(task.visible_tests)
    task = dataclasses.replace(task) if copy else task
    task.visible_tests = [{"input": t["input"], "output": o} for t, o in zip(task.visible_tests, outputs)]
    task.hidden_tests = [{"input": t["input"], "output": o} for t, o in zip(task.hidden_tests, outputs[nv:])]
    return task


def _ended(report) -> str:
    """How a run that did not finish ended: its status and the sandbox's reason (that of its first unfinished test)."""
    why = report.meta.get("reason") or next((t.error for t in report.tests if t.status != "ok" and t.error), "")
    return f"{report.status} ({why})" if why else report.status


def _outputs(report, n: int) -> list:
    return [(_UNSERIALIZABLE if t.status == "unserializable" else t.output) for t in report.tests[:n]]


def probe_kind(task: Task) -> str | None:
    """The input kind to draw behaviour probes from: the task's params, or a one-argument signature."""
    if task.params.get("input"):
        return task.params["input"]
    try:
        sig = parse_signature(task.signature)
    except ValueError:
        return None
    args = sig.args.posonlyargs + sig.args.args
    if len(args) != 1 or args[0].annotation is None:
        return None
    ann = ast.unparse(args[0].annotation).replace(" ", "")
    return {**{f"list[{e.annotation}]": e.kind for e in ELEMENTS}, "str": "text"}.get(ann)


def _behaviour(report, start: int) -> str | None:
    """Behaviour hash from the probe outcomes (None when too few probes ran to say anything)."""
    probes = report.tests[start:]
    answers = [t.output if t.status == "ok" else f"!{t.status}:{(t.error or '').split(':')[0]}" for t in probes]
    ok = [canonical_json(t.output) for t in probes if t.status == "ok"]
    if len(ok) < 3 or len(set(ok)) < 2:
        return None
    return behaviour_hash(answers)


def validate(
    task: Task,
    sb,
    corpus_index: CorpusIndex | None = None,
    *,
    timeout_s: float | None = None,
    adequacy: AdequacySettings | None = None,
) -> ValidationReport:
    """Run every check on one task (see validate_many)."""
    return validate_many([task], sb, corpus_index, timeout_s=timeout_s, adequacy=adequacy)[0]


def validate_many(
    tasks: list[Task],
    sb,
    corpus_index: CorpusIndex | None = None,
    *,
    timeout_s: float | None = None,
    adequacy: AdequacySettings | None = None,
) -> list[ValidationReport]:
    """Validate a batch. Tasks are judged for novelty in order, against `corpus_index` and the earlier valid
    tasks of the batch, as if each valid one had been inserted before the next. With `adequacy` on, the tasks that
    pass every check up to trivial_fail also meet the `adequacy` check (all their mutants in one sandbox batch)."""
    names = CHECKS[:-1] + (ADEQUACY, CHECKS[-1]) if adequacy is not None and adequacy.on else CHECKS
    results: list[dict[str, CheckResult]] = []
    work: list[Task] = []
    for task in tasks:
        res = {"parses": check_parses(task)}
        res["safe"] = check_safe(task) if res["parses"].passed else fail("reference does not parse")
        res["signature"] = check_signature(task)
        res["description"] = check_description(task)
        inputs_json = check_json_values(task, None)  # inputs must be JSON before they can be sent to run
        if not inputs_json.passed:
            res["json_values"] = inputs_json
        results.append(res)
        work.append(
            dataclasses.replace(
                task,
                visible_tests=[dict(t) for t in task.visible_tests],
                hidden_tests=[dict(t) for t in task.hidden_tests],
                checks={},
            )
        )
        if all(r.passed for r in res.values()):
            t = work[-1]
            if not t.id:
                t.id = task_id(t.reference_solution, t.entry_point, [test["input"] for test in t.tests])
            t.fingerprints = {"ast": ast_hash(t.reference_solution), "behaviour": None}
            if corpus_index is not None:  # a stored copy of the same program: no need to run anything
                early = check_novel(t, corpus_index)
                if not early.passed:
                    res["novel"] = early

    # 1. outputs (+ probes) and a second fresh run, for every task that passed the static checks
    live = [i for i, res in enumerate(results) if all(r.passed for r in res.values())]
    probes = {}
    jobs = []
    for i in live:
        t = work[i]
        kind = probe_kind(t)
        probes[i] = probe_inputs(kind) if kind else []
        inputs = [test["input"] for test in t.tests]
        jobs.append(
            dict(
                solution=t.reference_solution,
                entry_point=t.entry_point,
                inputs=inputs + probes[i],
                timeout_s=timeout_s,
                use_cache=False,
                clock=CLOCK,
            )
        )
        jobs.append(
            dict(
                solution=t.reference_solution,
                entry_point=t.entry_point,
                inputs=inputs[::-1],
                timeout_s=timeout_s,
                use_cache=False,
                clock=CLOCK,
            )
        )
    reports = sb.run_tests_many(jobs) if jobs else []
    outputs: dict[int, list] = {}
    for n, i in enumerate(live):
        t, res = work[i], results[i]
        first, second = reports[2 * n], reports[2 * n + 1]
        count = len(t.tests)
        res["runs"] = check_runs(t, first)
        outs = _outputs(first, count)
        res["json_values"] = check_json_values(t, outs if res["runs"].passed else None)
        if not (res["runs"].passed and res["json_values"].passed):
            continue
        res["outputs_match"] = check_outputs_match(t, outs)
        back = _outputs(second, count)[::-1]  # the second run called the inputs in reverse order
        res["deterministic"] = check_deterministic(t, outs, [_NOT_RUN] * (count - len(back)) + back)
        if not res["deterministic"].passed and second.status in ("timeout", "sandbox_error"):
            res["deterministic"] = fail(f"the second run did not finish: {_ended(second)}")  # not a changed output
        res["diverse"] = check_diverse(t, outs)
        outputs[i] = outs
        behaviour = _behaviour(first, count)
        if t.family == CODE_IO_FAMILY:  # no probes: its own calls, which the generator chose
            behaviour = behaviour_key([tuple(x["input"]) for x in t.tests], outs)
        t.fingerprints = {"ast": ast_hash(t.reference_solution), "behaviour": behaviour}

    # 2. the trivial battery against the hidden tests
    live = [i for i in outputs if all(r.passed for r in results[i].values())]
    jobs = []
    for i in live:
        t = work[i]
        _, program = trivial_battery(t, outputs[i])
        jobs.append(
            dict(
                solution=program,
                entry_point=t.entry_point,
                inputs=[h["input"] for h in t.hidden_tests],
                timeout_s=timeout_s,
                clock=CLOCK,
            )
        )
    for i, report in zip(live, sb.run_tests_many(jobs) if jobs else []):
        results[i]["trivial_fail"] = check_trivial_fail(work[i], outputs[i], report)
    if ADEQUACY in names:  # 2b. the hidden tests against the reference's mutants
        live = [i for i in outputs if all(r.passed for r in results[i].values())]
        graded = [_with_outputs(work[i], outputs[i]) for i in live]
        for i, result in zip(live, measure_many(graded, sb, adequacy, timeout_s=timeout_s)):
            results[i][ADEQUACY] = check_adequacy(result)

    # 3. novelty, in order; then fill outputs, ids and check results
    batch = MemoryIndex()
    out = []
    for i, (task, res) in enumerate(zip(work, results)):
        if i in outputs:
            _with_outputs(task, outputs[i], copy=False)
        if all(r.passed for r in res.values()) and "trivial_fail" in res:
            res["novel"] = check_novel(task, corpus_index)
            if res["novel"].passed:
                res["novel"] = check_novel(task, batch)
            if res["novel"].passed:
                batch.add(task)
        first_failure = next((f"{n}: {r.reason}" for n in names for r in [res.get(n)] if r and not r.passed), "")
        full = {name: res.get(name, fail(f"{NOT_RUN} ({first_failure})")) for name in names}
        task.checks = {name: r.passed for name, r in full.items()}
        out.append(ValidationReport(task, full))
    return out
