"""The pipelines' text form and type checks: a procedural program written one step per line, and the rules an
edited program must keep.

A program is an input kind and a list of steps (the `input` and `steps` of a task's params). Its text form:

    int                              the input kind: int, str, rec, float, tup (lists), text, csv
    1 filter gt k=3                  filter|map|sink NAME [ARG=VALUE ...]
    2 sort abs desc                  sort KEY [ARG=VALUE ...] asc|desc [inplace]
    3 top_k mod m=3 2 largest        top_k KEY [ARG=VALUE ...] K largest|smallest
                                     take first|last K;  window W sum|max|min;  group KEY VALUE AGG;  reverse;  dedup

Values are JSON-like literals without spaces: integers (`-3`), decimals (`2.5`) and double-quoted strings with no
space, quote or backslash (`"a"`, `"_x"`). `format_step` and `parse_step` are exact inverses on every step the
syntax can express; `check_pipeline` says whether a program is one the families can build: every name exists for
the element type it meets, every constant is one the catalogue offers (narrow or wide range), and a sink ends it.
"""

from __future__ import annotations

import re

from generator.families.catalogue import AGGREGATES, GROUP_KEYS, GROUP_VALUES, KEYS, MAPS, PREDICATES, SINKS, Expr
from generator.families.steps import KINDS, MAX_K, MAX_WINDOW, applicable_kinds, output_type
from generator.families.values import ELEMENTS, input_etype

# short input names <-> the families' input kinds
INPUT_NAMES = {**{e.tag: e.kind for e in ELEMENTS}, "text": "text", "csv": "csv"}
INPUT_SHORT = {kind: name for name, kind in INPUT_NAMES.items()}
EXPR_TABLES = {"filter": PREDICATES, "map": MAPS, "sink": SINKS}
KEY_TABLES = {"sort": KEYS, "top_k": KEYS, "group": GROUP_KEYS}
WINDOW_AGGS = ("sum", "max", "min")
ORDERS = {
    "sort": ("desc", ("asc", "desc")),
    "top_k": ("largest", ("smallest", "largest")),
    "take": ("end", ("first", "last")),
}  # kind -> (field, (value of False/first, value of True/second))
MAX_STEP_K = max(MAX_K.values())
MAX_STEP_W = max(MAX_WINDOW.values())

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_INT = re.compile(r"^-?\d{1,6}$")
_DEC = re.compile(r"^-?\d{1,6}\.\d{1,6}$")
_STR = re.compile(r'^"[^"\\\s]{0,16}"$')


class GrammarError(ValueError):
    """Text that is not a step, or a program the families cannot build. The message says why."""


# ---- values ---------------------------------------------------------------------------------------------------
def format_value(value) -> str:
    if isinstance(value, bool):
        raise GrammarError(f"{value!r} is not a grammar value")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        text = repr(value)
        if not _DEC.match(text):
            raise GrammarError(f"{value!r} is not a grammar decimal")
        return text
    if isinstance(value, str):
        text = f'"{value}"'
        if not _STR.match(text):
            raise GrammarError(f"{value!r} is not a grammar string")
        return text
    raise GrammarError(f"{value!r} is not a grammar value")


def parse_value(token: str):
    if _INT.match(token):
        return int(token)
    if _DEC.match(token):
        return float(token)
    if _STR.match(token):
        return token[1:-1]
    raise GrammarError(f"{token[:20]!r} is not a value (an integer, a decimal or a quoted string)")


def parse_int(token: str, what: str) -> int:
    if not _INT.match(token):
        raise GrammarError(f"{what} must be an integer, got {token[:20]!r}")
    return int(token)


def parse_name(token: str, what: str) -> str:
    if not _NAME.match(token) or len(token) > 24:
        raise GrammarError(f"{what} must be a name, got {token[:20]!r}")
    return token


def format_args(args: dict) -> list[str]:
    return [f"{name}={format_value(value)}" for name, value in args.items()]


def parse_assignment(token: str) -> tuple[str, object]:
    name, sep, value = token.partition("=")
    if not sep:
        raise GrammarError(f"{token[:20]!r} is not NAME=VALUE")
    return parse_name(name, "a constant's name"), parse_value(value)


def _named_with_args(tokens: list[str], what: str) -> tuple[str, dict, list[str]]:
    """NAME [ARG=VALUE ...] at the start of tokens; returns the rest."""
    if not tokens:
        raise GrammarError(f"missing {what}")
    name = parse_name(tokens[0], what)
    args, i = {}, 1
    while i < len(tokens) and "=" in tokens[i]:
        key, value = parse_assignment(tokens[i])
        if key in args:
            raise GrammarError(f"constant {key} given twice")
        args[key] = value
        i += 1
    return name, args, tokens[i:]


# ---- steps ----------------------------------------------------------------------------------------------------
def format_step(step: dict) -> str:
    kind = step["kind"]
    if kind in EXPR_TABLES:
        return " ".join([kind, step["expr"], *format_args(step["args"])])
    if kind == "sort":
        return " ".join(
            ["sort", step["key"], *format_args(step["args"]), "desc" if step["desc"] else "asc"]
            + (["inplace"] if step.get("in_place") else [])
        )
    if kind == "top_k":
        return " ".join(
            [
                "top_k",
                step["key"],
                *format_args(step["args"]),
                str(step["k"]),
                "largest" if step["largest"] else "smallest",
            ]
        )
    if kind == "take":
        return f"take {step['end']} {step['k']}"
    if kind == "window":
        return f"window {step['w']} {step['agg']}"
    if kind == "group":
        return f"group {step['key']} {step['val']} {step['agg']}"
    if kind in ("reverse", "dedup"):
        return kind
    raise GrammarError(f"unknown step kind {kind!r}")


def _expect_end(rest: list[str], kind: str) -> None:
    if rest:
        raise GrammarError(f"unexpected {rest[0][:20]!r} after the {kind} step")


def parse_step(tokens: list[str]) -> dict:
    """The step dict (generator.families.steps) written by `tokens`. Raises GrammarError (syntax only; names and
    constants are checked against the element type by `check_pipeline`)."""
    if not tokens:
        raise GrammarError("missing step")
    kind, rest = tokens[0], tokens[1:]
    if kind not in KINDS:
        raise GrammarError(f"unknown step kind {kind[:20]!r} (one of {', '.join(KINDS)})")
    if kind in EXPR_TABLES:
        name, args, rest = _named_with_args(rest, f"the {kind}'s name")
        _expect_end(rest, kind)
        return {"kind": kind, "expr": name, "args": args}
    if kind == "sort":
        key, args, rest = _named_with_args(rest, "the sort key")
        if not rest or rest[0] not in ("asc", "desc"):
            raise GrammarError("sort needs asc or desc after its key")
        in_place = rest[1:2] == ["inplace"]
        _expect_end(rest[2 if in_place else 1 :], kind)
        return {"kind": kind, "key": key, "args": args, "desc": rest[0] == "desc", "in_place": in_place}
    if kind == "top_k":
        key, args, rest = _named_with_args(rest, "the top_k key")
        if len(rest) < 2 or rest[1] not in ("largest", "smallest"):
            raise GrammarError("top_k needs K and largest or smallest after its key")
        _expect_end(rest[2:], kind)
        return {
            "kind": kind,
            "key": key,
            "args": args,
            "k": parse_int(rest[0], "top_k's K"),
            "largest": rest[1] == "largest",
        }
    if kind == "take":
        if len(rest) < 2 or rest[0] not in ("first", "last"):
            raise GrammarError("take needs first or last, then K")
        _expect_end(rest[2:], kind)
        return {"kind": kind, "k": parse_int(rest[1], "take's K"), "end": rest[0]}
    if kind == "window":
        if len(rest) < 2:
            raise GrammarError("window needs its width and sum, max or min")
        _expect_end(rest[2:], kind)
        return {
            "kind": kind,
            "w": parse_int(rest[0], "window's width"),
            "agg": parse_name(rest[1], "window's aggregate"),
        }
    if kind == "group":
        if len(rest) < 3:
            raise GrammarError("group needs KEY VALUE AGGREGATE")
        _expect_end(rest[3:], kind)
        return {
            "kind": kind,
            "key": parse_name(rest[0], "group's key"),
            "val": parse_name(rest[1], "group's value"),
            "agg": parse_name(rest[2], "group's aggregate"),
        }
    _expect_end(rest, kind)
    return {"kind": kind}


def format_program(kind: str, steps: list[dict]) -> str:
    """The program's text: its input name, then one numbered step per line."""
    return "\n".join([INPUT_SHORT[kind]] + [f"{i} {format_step(s)}" for i, s in enumerate(steps, 1)])


def program_of(task) -> tuple[str, list[dict]] | None:
    """(input kind, steps) of a task built by the families (procedural or compiled from an edit), else None."""
    params = getattr(task, "params", None) or {}
    kind, steps = params.get("input"), params.get("steps")
    if kind not in INPUT_SHORT or not isinstance(steps, list) or not steps:
        return None
    try:
        check_pipeline(kind, steps)
    except GrammarError:
        return None
    return kind, steps


# ---- type checks ----------------------------------------------------------------------------------------------
def allowed_values(expr: Expr, name: str) -> tuple:
    """Every value the catalogue offers a placeholder, narrow and wide ranges together."""
    return tuple(dict.fromkeys([*expr.args.get(name, ()), *expr.wide.get(name, ())]))


def _check_value(value, choices: tuple, where: str) -> None:
    if not any(type(value) is type(c) and value == c for c in choices):
        shown = ", ".join(format_value(c) if not isinstance(c, str) else repr(c) for c in choices[:12])
        raise GrammarError(f"{where} must be one of {shown}{', ...' if len(choices) > 12 else ''}; got {value!r}")


def find_expr(table: dict, etype: str, name: str, where: str) -> Expr:
    for expr in table.get(etype, ()):
        if expr.name == name:
            return expr
    names = ", ".join(e.name for e in table.get(etype, ())) or "none"
    raise GrammarError(f"{where}: no {name!r} for {etype} elements (there: {names})")


def check_args(expr: Expr, args: dict, where: str) -> None:
    wanted = set(expr.args) | set(expr.wide)
    if set(args) != wanted:
        need = " ".join(f"{n}=..." for n in sorted(wanted)) or "no constants"
        raise GrammarError(f"{where}: {expr.name} takes {need}, got {' '.join(sorted(args)) or 'none'}")
    for name, value in args.items():
        _check_value(value, allowed_values(expr, name), f"{where}: {name}")


def _int_in(value, lo: int, hi: int, where: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise GrammarError(f"{where} must be an integer {lo}..{hi}, got {value!r}")


def check_step(step: dict, etype: str, where: str) -> None:
    kind = step.get("kind")
    if kind not in applicable_kinds(etype):
        raise GrammarError(f"{where}: {kind} does not apply to {etype} elements")
    if kind in EXPR_TABLES:
        check_args(find_expr(EXPR_TABLES[kind], etype, step["expr"], where), step["args"], where)
    elif kind in ("sort", "top_k"):
        check_args(find_expr(KEYS, etype, step["key"], where), step["args"], where)
        if kind == "top_k":
            _int_in(step["k"], 1, MAX_STEP_K, f"{where}: top_k's K")
    elif kind == "take":
        _int_in(step["k"], 1, MAX_STEP_K, f"{where}: take's K")
    elif kind == "window":
        _int_in(step["w"], 2, MAX_STEP_W, f"{where}: window's width")
        if step["agg"] not in WINDOW_AGGS:
            raise GrammarError(f"{where}: window's aggregate must be one of {', '.join(WINDOW_AGGS)}")
    elif kind == "group":
        find_expr(GROUP_KEYS, etype, step["key"], where)
        find_expr(GROUP_VALUES, etype, step["val"], where)
        if step["agg"] not in AGGREGATES:
            raise GrammarError(f"{where}: group's aggregate must be one of {', '.join(AGGREGATES)}")


def check_pipeline(kind: str, steps: list[dict]) -> str:
    """Raise GrammarError unless the families can build this program; returns the final element type."""
    if kind not in INPUT_SHORT:
        raise GrammarError(f"unknown input {kind!r}")
    if not steps:
        raise GrammarError("a program needs at least one step")
    etype = input_etype(kind)
    for i, step in enumerate(steps, 1):
        check_step(step, etype, f"step {i}")
        etype, scalar = output_type(step, etype)
        if scalar and i < len(steps):
            raise GrammarError(f"step {i}: a sink must be the last step")
    return etype
