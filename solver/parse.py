"""Code extraction from a model's answer, robust to whatever the model wraps around its code.

Accepted: fenced blocks (```python, ```py, ``` or ~~~, the first block that parses wins; an unclosed fence runs to
the end), or bare code with prose before/after (the longest run of lines starting at a `def`/`import`/`class`/
`from` line that parses, trimmed line by line from the end until it does), or truncated code (a trailing partial
line or block is dropped). Never raises: an answer with no usable code is `ParsedAnswer(code=None, reason=...)`,
which the episode penalises as an empty answer.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

_FENCE = re.compile(r"(```|~~~)[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:\1|\Z)", re.DOTALL)
_CODE_START = re.compile(r"^(def |async def |class |import |from \S+ import |@)")


@dataclass(frozen=True)
class ParsedAnswer:
    code: str | None  # the extracted program, ending with a newline; None when there is none
    reason: str = ""  # why there is none ("empty answer", "no code found", ...)


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
        return True
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False


def _trim_to_parse(lines: list[str]) -> str | None:
    """The longest prefix of lines that parses and defines something (drops truncated or prose tails)."""
    for end in range(len(lines), 0, -1):
        code = "\n".join(lines[:end]).strip("\n")
        if code and _parses(code):
            return code + "\n"
    return None


def extract_code(text: str) -> ParsedAnswer:
    if not isinstance(text, str) or not text.strip():
        return ParsedAnswer(None, "empty answer")
    for m in _FENCE.finditer(text):
        lang = m.group(2).lower()
        if lang and lang not in ("python", "py", "python3"):
            continue
        code = _trim_to_parse(m.group(3).splitlines())
        if code and code.strip():
            return ParsedAnswer(code)
    lines = text.splitlines()
    for start, line in enumerate(lines):
        if _CODE_START.match(line):
            code = _trim_to_parse(lines[start:])
            if code:
                return ParsedAnswer(code)
    return ParsedAnswer(None, "no code found")
