"""The rules on values and programs that a code_io task meets (generator/code_io.py), in a module of their own
because generator/validity.py applies them to the code_io family's tasks and generator/code_io.py builds on
generator/validity.py: plain values and their canonical text, the output limits, the stricter refusals and the
behaviour key. Imports nothing of the project."""

from __future__ import annotations

import ast
import hashlib
import math
from collections.abc import Sequence
from typing import Any

MAX_VALUE_CHARS = 1000  # repr length of one input's arguments or of one output: a solver must read or write it
MAX_DEPTH = 20  # nesting of containers in a value; deeper is not a value a solver should write

# Modules refused on top of generator.validity's (system interfaces, processes, files, time, introspection):
# - random, uuid: pseudo-random streams, seeded or not, cannot be followed by reading the program;
# - hashlib, hmac, zlib, binascii: digests and checksums are deterministic but not derivable by reasoning, so a
#   deduction task on them measures memorisation of bit mixing, not understanding of the program;
# - weakref, copyreg: behaviour tied to the garbage collector and pickling machinery, not to the program's text.
CODE_IO_BANNED_MODULES = frozenset({"random", "uuid", "hashlib", "hmac", "zlib", "binascii", "weakref", "copyreg"})
# Calls refused on top of generator.validity's BANNED_CALLS (open, exec, eval, compile, __import__, input, globals,
# getattr, ...): id() depends on memory layout and hash() on the interpreter's hash seed, neither on the program.
CODE_IO_BANNED_CALLS = frozenset({"id", "hash"})


def plain_problem(value: Any, depth: int = 0) -> str:
    """Why `value` is not a plain value (None, bool, int, finite float, str, and list, tuple, dict, set of those),
    or '' when it is. Exact types: a subclass of int or a custom object is not plain."""
    if depth > MAX_DEPTH:
        return f"nested deeper than {MAX_DEPTH}"
    kind = type(value)
    if value is None or kind in (bool, int, str):
        return ""
    if kind is float:
        return "" if math.isfinite(value) else "a non-finite float"
    if kind in (list, tuple, set):
        items = list(value)
    elif kind is dict:
        items = [x for pair in value.items() for x in pair]
    else:
        return f"a value of type {kind.__name__}"
    for item in items:
        bad = plain_problem(item, depth + 1)
        if bad:
            return bad
    return ""


def canonical_text(value: Any) -> str:
    """A text equal for equal plain values whatever the hash seed (sets and dicts sorted), distinct across types
    (1, 1.0, True and (1,) vs [1] differ). Used for determinism, triviality and behaviour keys."""
    kind = type(value)
    if kind in (list, tuple):
        inner = ", ".join(canonical_text(x) for x in value)
        return f"[{inner}]" if kind is list else f"({inner},)"
    if kind is set:
        return "{" + ", ".join(sorted(canonical_text(x) for x in value)) + "}"
    if kind is dict:
        return "{" + ", ".join(sorted(f"{canonical_text(k)}: {canonical_text(v)}" for k, v in value.items())) + "}"
    return f"{kind.__name__}:{value!r}"


def stricter_refusal(program: str | ast.AST) -> str:
    """'' or why: what code_io refuses on top of generator.validity.check_safe (CODE_IO_BANNED_MODULES, random
    included even when seeded; CODE_IO_BANNED_CALLS). check_safe runs it first on a task of the code_io family."""
    try:
        tree = ast.parse(program) if isinstance(program, str) else program
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return "the program does not parse"
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for name in names:
                if name.split(".")[0] in CODE_IO_BANNED_MODULES:
                    return f"imports banned module '{name.split('.')[0]}'"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in CODE_IO_BANNED_CALLS:
            return f"calls banned function '{node.func.id}'"
    return ""


def output_refusal(value: Any) -> str:
    """'' or why an output (as the sandbox returned it) is not one a code_io task may hold: not plain, or longer
    than MAX_VALUE_CHARS characters written out. generator.validity runs it on the code_io family's outputs."""
    bad = plain_problem(value)
    if bad:
        return f"returns {bad}, not a plain value"
    text = repr(value)
    return f"output of {len(text)} characters exceeds {MAX_VALUE_CHARS}" if len(text) > MAX_VALUE_CHARS else ""


def behaviour_key(inputs: Sequence[tuple], outputs: Sequence[Any]) -> str:
    """Hash of the (input, output) pairs: two programs that map the same inputs to the same outputs behave alike
    as far as any task built from them can tell."""
    text = "\n".join(f"{canonical_text(a)} -> {canonical_text(o)}" for a, o in zip(inputs, outputs))
    return hashlib.sha256(text.encode()).hexdigest()[:32]
