"""Fingerprints of a task: a hash of its normalised reference (AST with local names renamed, docstrings dropped)
and the deterministic task id. Two references that differ only in variable names or comments hash equal, so the
corpus can reject near-duplicates."""

from __future__ import annotations

import ast
import builtins
import hashlib
import json

_BUILTINS = set(dir(builtins))


class _Renamer(ast.NodeTransformer):
    """Renames every function, argument and variable name (not builtins, not attributes) to v0, v1, ..."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}

    def _new(self, name: str) -> str:
        if name in _BUILTINS and name not in self.names:
            return name
        return self.names.setdefault(name, f"v{len(self.names)}")

    def visit_Name(self, node: ast.Name) -> ast.AST:
        node.id = self._new(node.id)
        return node

    def visit_arg(self, node: ast.arg) -> ast.AST:
        node.arg = self._new(node.arg)
        node.annotation = None
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        node.name = self._new(node.name)
        node.returns = None
        body = node.body
        if (
            body
            and isinstance(body[0], ast.Expr)
            and isinstance(getattr(body[0], "value", None), ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
        self.generic_visit(node)
        return node


def normalized_source(source: str) -> str:
    """The normalised AST dump of `source`. Raises SyntaxError when it does not parse."""
    tree = ast.parse(source)
    tree = _Renamer().visit(tree)
    return ast.dump(tree, annotate_fields=False, include_attributes=False)


def ast_hash(source: str) -> str | None:
    """Hash of the normalised AST, or None when the source does not parse."""
    try:
        return hashlib.sha256(normalized_source(source).encode()).hexdigest()[:32]
    except (SyntaxError, ValueError, RecursionError):
        return None


def canonical_json(value) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def task_id(reference: str, entry_point: str, inputs: list) -> str:
    """Deterministic id: the same program (up to names) on the same inputs is the same task."""
    try:
        code = normalized_source(reference)
    except (SyntaxError, ValueError, RecursionError):
        code = reference
    digest = hashlib.sha256(f"{code}\n{entry_point}\n{canonical_json(inputs)}".encode()).hexdigest()
    return f"t{digest[:20]}"


def behaviour_hash(outputs: list) -> str:
    """Hash of a reference's outputs on a fixed list of probe inputs (errors included as strings)."""
    return hashlib.sha256(canonical_json(outputs).encode()).hexdigest()[:32]
