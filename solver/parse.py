"""Code extraction from a model's answer, robust to whatever the model wraps around its code.

Accepted: fenced blocks (```python, ```py, ``` or ~~~; a closed block must parse whole, an unclosed one runs to the
end and loses its partial tail; the block that defines the entry point wins, else the first block that parses), or
bare code with prose before/after (the longest run of lines starting at a `def`/`import`/`class`/`from`/`@` line that
parses, trimmed line by line from the end until it does, trailing bare words such as "Done" dropped), or truncated
code (a trailing partial line or block is dropped).

Never raises. The outcome is typed: `ParsedAnswer.status` is "ok" (code found and parses), "empty" (blank answer),
"no_code" (nothing that looks like code) or "syntax_error" (code-like text that does not parse; `candidate` holds
it so the episode can report the error). `code` is None unless the status is "ok".
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

_FENCE = re.compile(r"(```|~~~)[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:\1|\Z)", re.DOTALL)
_CODE_START = re.compile(r"^(def |async def |class |import |from \S+ import |@)")
_PYTHON_TAGS = ("", "python", "py", "python3", "py3")
MAX_LINES = 400  # longer answers are cut before parsing (bounds the line-by-line trimming)
MAX_STARTS = 8  # bare code: at most this many `def`/`import`/... lines are tried as the start of the program
STATUSES = ("ok", "empty", "no_code", "syntax_error")


@dataclass(frozen=True)
class ParsedAnswer:
    code: str | None  # the extracted program, ending with a newline; None unless status == "ok"
    reason: str = ""  # why there is no code ("empty answer", "no code found", "syntax error line 3: ...")
    status: str = "ok"  # one of STATUSES
    candidate: str = ""  # with status "syntax_error": the code-like text that failed to parse

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def _parse(code: str) -> ast.Module | None:
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError, OverflowError):
        return None


def _syntax_error(code: str) -> str:
    try:
        ast.parse(code)
    except SyntaxError as exc:
        return f"syntax error line {exc.lineno}: {exc.msg}"
    except Exception as exc:  # noqa: BLE001 - ValueError (null bytes), RecursionError, ...
        return f"cannot parse: {type(exc).__name__}"
    return ""


def _drop_bare_words(code: str, tree: ast.Module) -> str:
    """Remove trailing top-level statements that are a bare name or constant (prose like "Done" after code)."""
    body = list(tree.body)
    while len(body) > 1 and isinstance(body[-1], ast.Expr) and isinstance(body[-1].value, (ast.Name, ast.Constant)):
        body.pop()
    if len(body) == len(tree.body):
        return code
    return "\n".join(code.splitlines()[: body[-1].end_lineno])


def _trim_to_parse(lines: list[str]) -> str | None:
    """The longest prefix of lines that parses (drops truncated or prose tails), without trailing bare words."""
    lines = lines[:MAX_LINES]
    for end in range(len(lines), 0, -1):
        code = "\n".join(lines[:end]).strip("\n")
        tree = _parse(code) if code.strip() else None
        if tree is not None and tree.body:
            return _drop_bare_words(code, tree).rstrip() + "\n"
    return None


def _defines(code: str, name: str | None) -> bool:
    """Does `code` define `name` at top level (any function or class when name is None)?"""
    tree = _parse(code)
    return tree is not None and any(
        isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and name in (None, n.name)
        for n in tree.body
    )


def _pick(candidates: list[str], entry_point: str | None) -> str | None:
    """The first candidate defining the entry point, else the first defining anything, else the first."""
    for name in ([entry_point] if entry_point else []) + [None]:
        for code in candidates:
            if _defines(code, name):
                return code
    return candidates[0] if candidates else None


def extract_code(text: str, entry_point: str | None = None) -> ParsedAnswer:
    """The program in a model's answer (see the module docstring). `entry_point` prefers the block defining it."""
    if not isinstance(text, str) or not text.strip():
        return ParsedAnswer(None, "empty answer", "empty")
    fenced, failed = [], []
    for m in _FENCE.finditer(text):
        if m.group(2).lower() not in _PYTHON_TAGS:
            continue
        body = m.group(3)
        closed = text[m.end() - len(m.group(1)) : m.end()] == m.group(1)
        if closed:  # a finished block must parse whole: a syntax error inside it is the answer's, not truncation
            stripped = body.strip("\n")
            tree = _parse(stripped) if stripped.strip() else None
            code = _drop_bare_words(stripped, tree).rstrip() + "\n" if tree is not None and tree.body else None
        else:  # an unclosed fence ran out of tokens: drop the partial tail
            code = _trim_to_parse(body.splitlines())
        if code and code.strip():
            fenced.append(code)
        elif body.strip():
            failed.append(body)
    picked = _pick(fenced, entry_point)
    if picked:
        return ParsedAnswer(picked)
    lines = text.splitlines()
    bare = []
    starts = [i for i, line in enumerate(lines[:MAX_LINES]) if _CODE_START.match(line)][:MAX_STARTS]
    for start in starts:
        code = _trim_to_parse(lines[start:])
        if code is None:
            failed.append("\n".join(lines[start : start + MAX_LINES]))
            continue
        bare.append(code)
        if not entry_point or _defines(code, entry_point):
            break
    picked = _pick(bare, entry_point)
    if picked:
        return ParsedAnswer(picked)
    if failed:
        candidate = failed[0].strip("\n") + "\n"
        return ParsedAnswer(None, _syntax_error(candidate) or "no code found", "syntax_error", candidate)
    return ParsedAnswer(None, "no code found", "no_code")
