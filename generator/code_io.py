"""The code_io proposal format: a program (one function `f`) with inputs, as Absolute Zero Reasoner proposes them.

The generator writes a program and one or more inputs; the outputs come from running the program in the sandbox.
One accepted proposal gives three solver task kinds (solver/code_io.py): deduction (program + input -> output),
abduction (program + output -> an input) and induction (input/output pairs + message -> program). docs/code_io.md
describes the format, the checks and the reward.

The answer the generator writes:

    ```python
    def f(xs, k):
        return sorted(xs)[:k]
    ```
    input: [3, 1, 2], 2
    input: [5, 4, 9, 1], 3
    message: the k smallest values, in increasing order

Each `input:` line holds the arguments of one call as they would stand between the parentheses of `f(...)`, each
a Python literal (ast.literal_eval: None, bool, int, float, str, list, tuple, dict, set built from those).

`parse_proposal` never raises: any text is a `Proposal` or a `ProposalError`. `validate_proposals` runs the checks
(CHECKS) in the sandbox and returns per proposal a `ProposalCheck` with a one-line reason or the `AcceptedProposal`
(outputs computed, fingerprints for novelty). `NoveltyIndex` holds the accepted ones; `generator_prompt` conditions
the generator on K of them; `proposer_reward` is the proposer's reward from the solver's solve rate.

Values stay typed end to end: arguments travel to the sandbox as literal text and come back as the repr of the
result, read with ast.literal_eval here, so tuples, sets and int dict keys survive (JSON would turn them into lists
and strings).
"""

from __future__ import annotations

import ast
import hashlib
import io
import re
import tokenize
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from generator.agent import ProposalError
from generator.code_io_values import (  # noqa: F401 - re-exported: code_io's rules, as generator/validity.py reads them
    CODE_IO_BANNED_CALLS,
    CODE_IO_BANNED_MODULES,
    MAX_DEPTH,
    MAX_VALUE_CHARS,
    behaviour_key,
    canonical_text,
    output_refusal,
    plain_problem,
    stricter_refusal,
)
from generator.fingerprint import ast_hash
from generator.schema import Task
from generator.validity import CLOCK, CODE_IO_FAMILY, check_safe

ENTRY_POINT = "f"
KINDS = ("deduction", "abduction", "induction")
MAX_INPUTS = 10  # inputs per proposal: enough to show a behaviour, few enough to run fast
MAX_PROGRAM_CHARS = 5000  # a longer program is not something a solver can reason through in one answer
MAX_MESSAGE_CHARS = 300  # the message is a one-line hint, not a specification


CHECKS = (
    "parses",
    "safe",
    "inputs",
    "message",
    "novel_program",
    "runs",
    "outputs",
    "deterministic",
    "nontrivial",
    "novel_behaviour",
)

# Appended to the program when it runs: called once per input with the arguments' literal text, it checks the
# result is a plain value of bounded size and answers its repr, which the parent reads back with literal_eval (and
# checks again: nothing the child says is trusted beyond being a literal). Its helpers are bound at definition, so
# a program that rebinds module names while it runs does not change them.
HARNESS = """

def __code_io_plain(value, _type=type, _scalars=(bool, int, str), _float=float, _seqs=(list, tuple, set),
                    _dict=dict, _inf=(float("inf"), float("-inf"))):
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > {max_depth}:
            return "nested deeper than {max_depth}"
        kind = _type(item)
        if item is None or kind in _scalars:
            continue
        if kind is _float:
            if item != item or item in _inf:
                return "a non-finite float"
            continue
        if kind in _seqs:
            stack.extend((x, depth + 1) for x in item)
        elif kind is _dict:
            stack.extend((x, depth + 1) for pair in _dict.items(item) for x in pair)
        else:
            return "a value of type " + kind.__name__
    return ""


def __code_io_call(args_text, _plain=__code_io_plain, _repr=repr, _len=len, _str=str):
    import ast as _ast
    result = {entry}(*_ast.literal_eval(args_text))
    bad = _plain(result)
    if bad:
        return ["bad", "returns " + bad + ", not a plain value"]
    text = _repr(result)
    if _len(text) > {max_chars}:
        return ["bad", "output of " + _str(_len(text)) + " characters exceeds {max_chars}"]
    return ["ok", text]
"""
HARNESS_ENTRY = "__code_io_call"


# ============================================================================================ values
def format_args(args: tuple) -> str:
    """The arguments of one call as they stand between the parentheses of `f(...)`."""
    return ", ".join(repr(a) for a in args)


def parse_args(text: str) -> tuple | str:
    """The argument tuple written in `text` (the inside of a call's parentheses, e.g. "[1, 2], 'a'"), or a reason
    string when it is not a list of plain literal arguments. Never raises."""
    if not isinstance(text, str):
        return "arguments are not text"
    text = text.strip()
    if len(text) > 4 * MAX_VALUE_CHARS:
        return f"arguments of {len(text)} characters"
    try:
        call = ast.parse(f"{ENTRY_POINT}(\n{text}\n)", mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return "arguments do not parse"
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name) or call.func.id != ENTRY_POINT:
        return "arguments do not parse"
    if call.keywords or any(isinstance(a, ast.Starred) for a in call.args):
        return "arguments must be positional literals (no name=value, no *)"
    try:
        args = tuple(ast.literal_eval(a) for a in call.args)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return "arguments are not Python literals"
    bad = plain_problem(args)
    return f"an argument is {bad}" if bad else args


def parse_value(text: str) -> tuple[bool, Any]:
    """(True, value) for the plain literal in `text`, else (False, reason). Never raises."""
    try:
        value = ast.literal_eval(text.strip())
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, "not a Python literal"
    bad = plain_problem(value)
    return (False, f"{bad}, not a plain value") if bad else (True, value)


# ========================================================================================= proposals
@dataclass(frozen=True)
class Proposal:
    """What the generator wrote: a program defining `f`, the argument tuples of one or more calls, a message."""

    program: str  # Python source defining f (and possibly helpers)
    inputs: tuple  # argument tuples, one per call of f
    message: str = ""  # one line describing the behaviour (shown to the solver in induction)


@dataclass(frozen=True)
class AcceptedProposal:
    """A proposal that passed every check: its outputs, computed in the sandbox, and its novelty keys."""

    program: str
    inputs: tuple  # argument tuples
    outputs: tuple  # f(*inputs[i]) for each i, typed as the program returned it
    message: str = ""
    program_key: str = ""  # hash of the normalised program (names renamed, docstrings dropped)
    behaviour_key: str = ""  # hash of the (inputs, outputs) pairs

    @property
    def pairs(self) -> tuple:
        return tuple(zip(self.inputs, self.outputs))

    def to_dict(self) -> dict:
        """As plain JSON: values as literal text, so types survive a JSON round trip."""
        return {
            "program": self.program,
            "inputs": [format_args(a) for a in self.inputs],
            "outputs": [repr(o) for o in self.outputs],
            "message": self.message,
            "program_key": self.program_key,
            "behaviour_key": self.behaviour_key,
        }

    @classmethod
    def from_dict(cls, d: dict) -> AcceptedProposal:
        inputs = tuple(parse_args(t) for t in d["inputs"])
        outputs = tuple(ast.literal_eval(t) for t in d["outputs"])
        if any(isinstance(a, str) for a in inputs):
            raise ValueError("a stored input does not parse")
        return cls(
            program=d["program"],
            inputs=inputs,
            outputs=outputs,
            message=d.get("message", ""),
            program_key=d.get("program_key", ""),
            behaviour_key=d.get("behaviour_key", ""),
        )


_FENCE = re.compile(r"```[ \t]*(python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_FIELD = re.compile(r"^[ \t]*(?:[-*][ \t]*)?(input|message)[ \t]*:(.*)$", re.IGNORECASE | re.MULTILINE)


def format_proposal(proposal: Proposal) -> str:
    """The text the generator is asked to write (parse_proposal reads it back)."""
    lines = ["```python", proposal.program.strip("\n"), "```"]
    lines += [f"input: {format_args(args)}" for args in proposal.inputs]
    if proposal.message:
        lines.append(f"message: {proposal.message}")
    return "\n".join(lines) + "\n"


def parse_proposal(text: str) -> Proposal | ProposalError:
    """Read a generator's answer (format_proposal's form). The program is the first python fence that defines
    `f`; `input:` and `message:` lines are read outside fences. Strict about what it keeps (every input must parse),
    lenient about what surrounds it (prose, bullets, backticks around a value). Never raises."""
    if not isinstance(text, str) or not text.strip():
        return ProposalError("empty answer")
    fences = list(_FENCE.finditer(text))
    if not fences:
        return ProposalError("no ```python block with the program")
    program = next((m.group(2) for m in fences if _defines_f(m.group(2))), fences[0].group(2))
    program = program.strip("\n") + "\n"
    outside = _FENCE.sub("\n", text)
    inputs, message = [], ""
    for m in _FIELD.finditer(outside):
        name, value = m.group(1).lower(), m.group(2).strip()
        if name == "message":
            message = message or value.strip("`").strip()
            continue
        value = value[1:-1].strip() if len(value) > 1 and value[0] == value[-1] == "`" else value
        args = parse_args(value)
        if isinstance(args, str):
            return ProposalError(f"input {len(inputs) + 1}: {args}")
        inputs.append(args)
    if not inputs:
        return ProposalError("no 'input:' line")
    if len(inputs) > MAX_INPUTS:
        return ProposalError(f"{len(inputs)} inputs, at most {MAX_INPUTS}")
    return Proposal(program=program, inputs=tuple(inputs), message=message)


def _defines_f(program: str) -> bool:
    return entry_def(program) is not None


def _names(program: str) -> list[tokenize.TokenInfo] | None:
    """The program's NAME tokens that are not attributes (`x.name`), or None when it does not tokenize."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(program).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError, ValueError, RecursionError, MemoryError):
        return None
    return [t for i, t in enumerate(tokens) if t.type == tokenize.NAME and (i == 0 or tokens[i - 1].string != ".")]


def _replace(program: str, tokens: Sequence[tokenize.TokenInfo], new: str) -> str:
    """`program` with each of `tokens` (one-line NAME tokens) replaced by `new`, the text otherwise unchanged."""
    lines = program.splitlines(keepends=True)
    for tok in sorted(tokens, key=lambda t: t.start, reverse=True):  # from the end: earlier columns stay in place
        (row, start), (_, end) = tok.start, tok.end
        lines[row - 1] = lines[row - 1][:start] + new + lines[row - 1][end:]
    return "".join(lines)


def rename_entry(program: str, entry_point: str) -> str | None:
    """`program` with its function `entry_point` called `f` (ENTRY_POINT) wherever the name stands (attributes
    aside), the text otherwise unchanged; a name `f` the program already uses is renamed first (to `f_0`, or the
    first free `f_<n>`). None when the program does not tokenize or defines no top-level `entry_point`."""
    names = _names(program)
    try:
        tree = ast.parse(program)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    if names is None or not any(isinstance(n, ast.FunctionDef) and n.name == entry_point for n in tree.body):
        return None
    if entry_point == ENTRY_POINT:
        return program
    used = {t.string for t in names}
    if ENTRY_POINT in used:
        free = next(f"{ENTRY_POINT}_{i}" for i in range(len(used) + 1) if f"{ENTRY_POINT}_{i}" not in used)
        program = _replace(program, [t for t in names if t.string == ENTRY_POINT], free)
        names = _names(program) or []
    return _replace(program, [t for t in names if t.string == entry_point], ENTRY_POINT)


def entry_def(program: str) -> ast.FunctionDef | None:
    """The last top-level `def f` of the program (the one a call reaches), or None."""
    try:
        tree = ast.parse(program)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == ENTRY_POINT]
    return defs[-1] if defs else None


# ============================================================================================ checks
@dataclass(frozen=True)
class ProposalCheck:
    """The verdict on one proposal: `accepted` when every check passed, else the failed check and why."""

    accepted: AcceptedProposal | None
    check: str = ""  # the failed check (one of CHECKS), '' when accepted
    reason: str = ""  # one line: why it failed

    @property
    def ok(self) -> bool:
        return self.accepted is not None


def _reject(check: str, reason: str) -> ProposalCheck:
    return ProposalCheck(None, check, " ".join(f"{check}: {reason}".split()))


def check_parses(program: str) -> str:
    """'' when the program parses and defines a top-level `f`, else why not."""
    if len(program) > MAX_PROGRAM_CHARS:
        return f"program of {len(program)} characters exceeds {MAX_PROGRAM_CHARS}"
    try:
        ast.parse(program)
    except SyntaxError as exc:
        return f"does not parse: {exc.msg} (line {exc.lineno})"
    except (ValueError, MemoryError, RecursionError) as exc:
        return f"does not parse: {type(exc).__name__}"
    if entry_def(program) is None:
        return f"defines no top-level function '{ENTRY_POINT}'"
    return ""


def check_program_safe(program: str) -> str:
    """'' when the program imports and calls nothing refused, else why: generator.validity.check_safe on a task of
    the code_io family, which refuses first what `stricter_refusal` names, then what it refuses for every task
    (system and private modules, open/exec/eval/__import__/input/getattr..., dunder attributes)."""
    shell = Task(
        id="",
        family=CODE_IO_FAMILY,
        source="generator",
        split="train",
        level=1,
        description="",
        entry_point=ENTRY_POINT,
        signature="",
        reference_solution=program,
    )
    result = check_safe(shell)
    return "" if result.passed else result.reason


def check_inputs(program: str, inputs: Sequence[tuple]) -> str:
    """'' when there are 1..MAX_INPUTS distinct inputs, each plain, short and with as many arguments as `f`
    accepts; else why not."""
    if not isinstance(inputs, (list, tuple)):
        return "inputs must be a sequence of argument tuples"
    if not inputs:
        return "no inputs"
    if len(inputs) > MAX_INPUTS:
        return f"{len(inputs)} inputs, at most {MAX_INPUTS}"
    fn = entry_def(program)
    args = fn.args.posonlyargs + fn.args.args
    lo, hi = len(args) - len(fn.args.defaults), len(args)
    required_kw = [a.arg for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults) if d is None]
    if required_kw:
        return f"f has keyword-only parameters without defaults ({', '.join(required_kw)})"
    seen: dict[str, int] = {}
    for i, call in enumerate(inputs):
        if not isinstance(call, tuple):
            return f"input {i}: not an argument tuple"
        bad = plain_problem(call)
        if bad:
            return f"input {i}: an argument is {bad}"
        text = format_args(call)
        if len(text) > MAX_VALUE_CHARS:
            return f"input {i}: {len(text)} characters exceeds {MAX_VALUE_CHARS}"
        if len(call) < lo or (len(call) > hi and fn.args.vararg is None):
            return f"input {i}: {len(call)} argument(s), f takes {lo}..{hi}"
        key = canonical_text(call)
        if key in seen:
            return f"input {i} repeats input {seen[key]}"
        seen[key] = i
    return ""


def program_key(program: str) -> str:
    """Hash of the normalised program (generator.fingerprint: names renamed, annotations and docstrings dropped)."""
    return ast_hash(program) or hashlib.sha256(program.encode()).hexdigest()[:32]


class NoveltyIndex:
    """The accepted proposals, by program key and by behaviour key (a proposal matching either is not novel)."""

    def __init__(self, accepted: Sequence[AcceptedProposal] = ()) -> None:
        self.by_program: dict[str, AcceptedProposal] = {}
        self.by_behaviour: dict[str, AcceptedProposal] = {}
        self.items: list[AcceptedProposal] = []
        for p in accepted:
            self.add(p)

    def __len__(self) -> int:
        return len(self.items)

    def add(self, proposal: AcceptedProposal) -> None:
        self.items.append(proposal)
        self.by_program.setdefault(proposal.program_key, proposal)
        self.by_behaviour.setdefault(proposal.behaviour_key, proposal)

    def same_program(self, key: str) -> AcceptedProposal | None:
        return self.by_program.get(key)

    def same_behaviour(self, key: str) -> AcceptedProposal | None:
        return self.by_behaviour.get(key)


@dataclass(frozen=True)
class CallOutcome:
    """One call f(*args) in the sandbox: status "ok" with its typed value, else why not."""

    status: str  # "ok", "bad_output" (not plain, too long), or a sandbox test status ("error", "timeout")
    value: Any = None
    reason: str = ""  # one line, '' when ok


def _outcome(test, report) -> CallOutcome:
    if test.status == "not_run":  # the module did not load (it raised or ran out of time at import)
        why = report.meta.get("load_error" if report.status == "error" else "reason") or "no reason given"
        text = f"the program did not load ({report.status}: {why})"
        return CallOutcome("not_run", reason=" ".join(text.split())[:200])
    if test.status != "ok":
        detail = f": {test.error}" if test.error else ""
        return CallOutcome(test.status, reason=" ".join(f"{test.status}{detail}".split())[:200])
    out = test.output
    if not (isinstance(out, list) and len(out) == 2 and all(isinstance(x, str) for x in out)):
        return CallOutcome("bad_output", reason="the harness answered no value")
    if out[0] != "ok":
        return CallOutcome("bad_output", reason=out[1][:200])
    ok, value = parse_value(out[1])
    return CallOutcome("ok", value) if ok else CallOutcome("bad_output", reason=f"output is {value}")


def harnessed(program: str) -> str:
    """The program with the harness appended (its entry point is HARNESS_ENTRY)."""
    return (
        program.rstrip("\n") + "\n" + HARNESS.format(entry=ENTRY_POINT, max_chars=MAX_VALUE_CHARS, max_depth=MAX_DEPTH)
    )


def call_many(
    sb,
    jobs: Sequence[tuple[str, Sequence[tuple]]],
    *,
    timeout_s: float | None = None,
    use_cache: bool = True,
    clock: str = "wall",
) -> list[list[CallOutcome]]:
    """Run each (program, argument tuples) job in the sandbox, all jobs in parallel: per job, per input, the typed
    result of f(*args). The arguments travel as literal text and the result comes back as its repr. `clock`: what
    `timeout_s` limits (the sandbox's run_tests): "wall" for grading a solver's answer, "cpu" where a verdict must
    not depend on the machine's load (a proposal's validity, a suite's expected outputs: generator.validity.CLOCK)."""
    if not jobs:
        return []
    reports = sb.run_tests_many(
        [
            dict(
                solution=harnessed(program),
                entry_point=HARNESS_ENTRY,
                inputs=[[repr(tuple(a))] for a in inputs],
                timeout_s=timeout_s,
                use_cache=use_cache,
                clock=clock,
            )
            for program, inputs in jobs
        ]
    )
    out = []
    for (_, inputs), report in zip(jobs, reports):
        outcomes = [_outcome(t, report) for t in report.tests[: len(inputs)]]
        outcomes += [CallOutcome("not_run", reason=f"not run ({report.status})")] * (len(inputs) - len(outcomes))
        out.append(outcomes)
    return out


def _static(proposal: Proposal) -> ProposalCheck | None:
    """The first failed static check, or None."""
    if not isinstance(proposal.program, str):
        return _reject("parses", "the program is not text")
    why = check_parses(proposal.program)
    if why:
        return _reject("parses", why)
    why = check_program_safe(proposal.program)
    if why:
        return _reject("safe", why)
    why = check_inputs(proposal.program, proposal.inputs)
    if why:
        return _reject("inputs", why)
    if (
        not isinstance(proposal.message, str)
        or "\n" in proposal.message.strip()
        or len(proposal.message) > MAX_MESSAGE_CHARS
    ):
        return _reject("message", f"the message must be one line of at most {MAX_MESSAGE_CHARS} characters")
    return None


def _judge(proposal: Proposal, first: list[CallOutcome], second: list[CallOutcome]) -> ProposalCheck | AcceptedProposal:
    """The sandbox checks on two fresh runs: runs, outputs, deterministic, nontrivial."""
    for i, o in enumerate(first):
        if o.status not in ("ok", "bad_output"):
            return _reject("runs", f"input {i}: {o.reason}")
    for i, o in enumerate(first):
        if o.status == "bad_output":
            return _reject("outputs", f"input {i}: {o.reason}")
    for i, (a, b) in enumerate(zip(first, second)):
        if b.status != "ok" or canonical_text(a.value) != canonical_text(b.value):
            shown = repr(b.value)[:60] if b.status == "ok" else b.reason
            return _reject("deterministic", f"input {i}: {repr(a.value)[:60]} on one run, {shown} on another")
    outputs = tuple(o.value for o in first)
    if len(outputs) > 1 and len({canonical_text(o) for o in outputs}) < 2:
        return _reject("nontrivial", f"every input gives the same output {repr(outputs[0])[:60]}")
    return AcceptedProposal(
        program=proposal.program,
        inputs=tuple(proposal.inputs),
        outputs=outputs,
        message=proposal.message.strip(),
        program_key=program_key(proposal.program),
        behaviour_key=behaviour_key(proposal.inputs, outputs),
    )


def validate_proposals(
    proposals: Sequence[Proposal], sb, index: NoveltyIndex | None = None, *, timeout_s: float | None = None
) -> list[ProposalCheck]:
    """Check a batch (CHECKS, in order; the first failure is the verdict). Static checks first; then two fresh
    runs per proposal (no cache), all in parallel, the second calling f on the inputs in reverse order (a program
    whose outputs depend on earlier calls is not deterministic: a task shows one call alone). Novelty is judged
    in order against `index` and the batch's earlier accepted proposals; `index` itself is not changed (add the
    accepted ones to it)."""
    verdicts: list[ProposalCheck | None] = []
    for p in proposals:
        verdict = _static(p)
        if verdict is None and index is not None:
            same = index.same_program(program_key(p.program))
            if same is not None:
                verdict = _reject("novel_program", "same program (up to names) as an accepted proposal")
        verdicts.append(verdict)
    live = [i for i, v in enumerate(verdicts) if v is None]
    jobs = []
    for i in live:  # the second run calls f in reverse order: state kept between calls changes some output
        jobs += [(proposals[i].program, tuple(proposals[i].inputs)), (proposals[i].program, proposals[i].inputs[::-1])]
    runs = call_many(sb, jobs, timeout_s=timeout_s, use_cache=False, clock=CLOCK)  # the load cannot change a verdict
    batch = NoveltyIndex(index.items if index is not None else ())
    for n, i in enumerate(live):
        judged = _judge(proposals[i], runs[2 * n], runs[2 * n + 1][::-1])
        if isinstance(judged, ProposalCheck):
            verdicts[i] = judged
        elif batch.same_program(judged.program_key) is not None:
            verdicts[i] = _reject("novel_program", "same program (up to names) as an accepted proposal")
        elif batch.same_behaviour(judged.behaviour_key) is not None:
            verdicts[i] = _reject("novel_behaviour", "same inputs and outputs as an accepted proposal")
        else:
            batch.add(judged)
            verdicts[i] = ProposalCheck(judged)
    return verdicts


def validate_proposal(
    proposal: Proposal, sb, index: NoveltyIndex | None = None, *, timeout_s: float | None = None
) -> ProposalCheck:
    """Check one proposal (see validate_proposals)."""
    return validate_proposals([proposal], sb, index, timeout_s=timeout_s)[0]


# ============================================================================================ reward
def solve_rate(rewards: Sequence[float]) -> float:
    """The solver's mean reward over its attempts at the tasks of one proposal (each in [0, 1])."""
    if not rewards:
        raise ValueError("no solver attempts")
    if any(not 0.0 <= r <= 1.0 for r in rewards):
        raise ValueError("solver rewards must lie in [0, 1]")
    return sum(rewards) / len(rewards)


def proposer_reward(rate: float) -> float:
    """Absolute Zero's learnability reward: 1 - rate when the solver sometimes succeeds, 0 when it never does
    (too hard, or wrong) or always does (too easy): the most reward for tasks solved rarely but not never."""
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"a solve rate lies in [0, 1], got {rate}")
    return 0.0 if rate in (0.0, 1.0) else 1.0 - rate


# ============================================================================================ prompt
MAX_REFERENCE_PAIRS = 3  # input/output pairs shown per reference proposal
MAX_SHOWN_CHARS = 200  # a longer value is cut in the prompt
DEFAULT_INPUTS = {"deduction": 2, "abduction": 2, "induction": 6}

_AIMS = {
    "deduction": "Its output on each input should take careful step-by-step reasoning to predict from the code.",
    "abduction": "Recovering an input from an output should take careful reasoning: the function should not simply "
    "be inverted at a glance.",
    "induction": "Its behaviour should be learnable from a few input/output examples plus your one-line message, "
    "and the inputs should together show that behaviour, edge cases included.",
}


def _cut(text: str, limit: int = MAX_SHOWN_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def reference_text(
    proposal: AcceptedProposal, max_pairs: int = MAX_REFERENCE_PAIRS, max_chars: int = MAX_SHOWN_CHARS
) -> str:
    """One accepted proposal as the generator sees it: its program, some `f(args) == output` lines (each value cut
    to `max_chars`), its message."""
    lines = ["```python", proposal.program.strip("\n"), "```"]
    lines += [
        f"{ENTRY_POINT}({_cut(format_args(a), max_chars)}) == {_cut(repr(o), max_chars)}"
        for a, o in proposal.pairs[:max_pairs]
    ]
    if proposal.message:
        lines.append(f"message: {proposal.message}")
    return "\n".join(lines)


def generator_prompt(
    references: Sequence[AcceptedProposal],
    kind: str,
    n_inputs: int | None = None,
    *,
    max_pairs: int = MAX_REFERENCE_PAIRS,
    max_chars: int = MAX_SHOWN_CHARS,
) -> str:
    """The generator's prompt, conditioned on K earlier accepted proposals, asking for a new one suited to a task
    kind (KINDS). `n_inputs`: how many inputs to ask for (DEFAULT_INPUTS by kind); `max_pairs` calls shown per
    reference, each value cut to `max_chars` (reference_text)."""
    if kind not in KINDS:
        raise ValueError(f"unknown task kind {kind!r}; use one of {', '.join(KINDS)}")
    n = DEFAULT_INPUTS[kind] if n_inputs is None else n_inputs
    if not 1 <= n <= MAX_INPUTS:
        raise ValueError(f"n_inputs={n}: ask for 1..{MAX_INPUTS} inputs")
    article = "an" if kind[0] in "aeiou" else "a"
    parts = [
        f"Write a new Python function `{ENTRY_POINT}` for {article} {kind} task, with {n} input(s) to call it on.",
        _AIMS[kind],
        "",
    ]
    if references:
        parts += [
            f"Earlier functions ({len(references)}); write one that differs from all of them in what it computes:",
            "",
        ]
        for i, ref in enumerate(references, 1):
            parts += [f"Reference {i}:", reference_text(ref, max_pairs, max_chars), ""]
    parts += [
        "Rules: the function must be deterministic, finish quickly, return plain values (None, bool, int, "
        "float, str, list, tuple, dict, set), and import nothing but pure computation modules (no random, "
        "time, os, sys, files or I/O). Inputs must give different outputs.",
        "",
        "Answer in this form:",
        "```python",
        f"def {ENTRY_POINT}(...):",
        "    ...",
        "```",
        "input: <the arguments of one call, as Python literals, e.g. [3, 1, 2], 'abc'>",
        "(one input line per call)",
        "message: <one line that hints at what the function does>",
    ]
    return "\n".join(parts)
