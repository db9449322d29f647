"""The mutation proposal format (`generator.format=mutation`): the generator names one reference task and one edit
of its program, and the procedural families compile the edited program into a complete task.

The prompt shows each reference's program in the grammar of generator.families.grammar (input kind, one numbered
step per line). The answer is three lines:

    REF 1
    EDIT const 2 k=5
    END

Edits (I, J: step numbers, 1-based; STEP: a step in the grammar's syntax; T: an input name):

    const I NAME=VALUE        change one constant of step I (an expression's placeholder, or K of take/top_k, W of
                              window)
    key I KEY [ARG=VALUE ...] change the key of a sort, top_k or group step
    expr I NAME [ARG=VALUE ...]  change a filter's condition (its comparison), a map or a sink; for window and group
                              the aggregate
    order I                   flip a sort (asc/desc), a top_k (largest/smallest) or a take (first/last)
    type T                    run the program on another input: int, str, rec, text, csv (float, tup); every step
                              keeps its names, constants move to the nearest value the new type offers
    add I STEP                insert STEP before step I (I = number of steps + 1 appends)
    drop I                    remove step I
    swap I J                  exchange steps I and J
    set I STEP                replace step I by STEP
    splice I R J              insert step J of reference R before step I

`parse_mutation` is strict and never raises: any text is a `Mutation` or a `ProposalError` (unparsable).
`compile_mutation` turns a parsed mutation into a task (description, signature, reference solution and test
inputs from the families, outputs left to the validity checks) or a `MutationError` naming why the edit is
impossible (a missing reference or step, a name the element type lacks, a constant outside the catalogue, a
sink before the end, a held-out program, an edit that changes nothing). `format_mutation` writes a mutation;
`random_mutation` draws a possible one (the generator's warm-start targets, `mutation_examples`); `random_proposal`
draws one in place of a generator's answer (`generator.source=random_edits`, the baseline without a generator).
The format's object is generator.formats.MUTATION.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from generator.agent import ProposalError, choose_instruction
from generator.build import BuildConfig, materialise, pipeline_params
from generator.families import FAMILIES, level_depths, render_reference
from generator.families.catalogue import AGGREGATES, GROUP_KEYS, GROUP_VALUES, KEYS
from generator.families.grammar import (
    EXPR_TABLES,
    INPUT_NAMES,
    INPUT_SHORT,
    KEY_TABLES,
    MAX_STEP_K,
    MAX_STEP_W,
    ORDERS,
    WINDOW_AGGS,
    GrammarError,
    allowed_values,
    check_pipeline,
    find_expr,
    format_args,
    format_program,
    format_step,
    parse_assignment,
    parse_int,
    parse_name,
    parse_step,
    program_of,
)
from generator.families.steps import applicable_kinds, output_type, sample_step
from generator.families.values import input_etype
from generator.fingerprint import ast_hash
from generator.schema import Task
from generator.splits import split_of
from generator.validity import validate_many

OPS = ("const", "key", "expr", "order", "type", "add", "drop", "swap", "set", "splice")
# instruction -> (prompt text, the edits that follow it)
INSTRUCTIONS = {
    "mutate": ("change one constant, key, condition or order", ("const", "key", "expr", "order", "set")),
    "harder": ("add a step", ("add",)),
    "simpler": ("drop a step", ("drop",)),
    "reorder": ("swap two steps", ("swap",)),
    "change_type": ("change the input type", ("type",)),
    "compose": ("splice in a step of another reference", ("splice",)),
}
EDIT_HELP = (
    "const I NAME=V | key I KEY | expr I NAME | order I | type T | add I STEP | drop I | swap I J | "
    "set I STEP | splice I R J"
)
MAX_ANSWER_TOKENS = 64  # a mutation is short: sampling stops here
# the range the drawn edits' constants come from: every value `check_pipeline` accepts (narrow and wide), whatever
# `tasks.literals` the procedural corpus used, so that an edit of a constant rarely lands on a program the corpus holds
EDIT_LITERALS = "wide"
_REF = re.compile(r"^REF (\d{1,3})$")


@dataclass(frozen=True)
class MutationError:
    """A parsed edit that cannot be compiled: an invalid proposal, with its reason."""

    reason: str


@dataclass(frozen=True)
class Edit:
    op: str
    at: int | None = None  # the step (1-based) it edits; add/splice: the position it inserts before
    to: int | None = None  # swap: the other step; splice: the step of the second reference
    ref: int | None = None  # splice: the second reference (1-based)
    name: str | None = None  # const: the constant; key/expr: the new name; type: the input name
    value: object = None  # const: the new value
    args: dict = field(default_factory=dict)  # key/expr: the new constants
    step: dict | None = None  # add/set: the new step


@dataclass(frozen=True)
class Mutation:
    ref: int  # 1-based index into the prompt's references
    edit: Edit


# ---- text -----------------------------------------------------------------------------------------------------
def format_edit(edit: Edit) -> str:
    op = edit.op
    if op == "const":
        return f"const {edit.at} {' '.join(format_args({edit.name: edit.value}))}"
    if op in ("key", "expr"):
        return " ".join([op, str(edit.at), edit.name, *format_args(edit.args)])
    if op in ("order", "drop"):
        return f"{op} {edit.at}"
    if op == "type":
        return f"type {edit.name}"
    if op in ("add", "set"):
        return f"{op} {edit.at} {format_step(edit.step)}"
    if op == "swap":
        return f"swap {edit.at} {edit.to}"
    if op == "splice":
        return f"splice {edit.at} {edit.ref} {edit.to}"
    raise GrammarError(f"unknown edit {op!r}")


def format_mutation(mutation: Mutation) -> str:
    return f"REF {mutation.ref}\nEDIT {format_edit(mutation.edit)}\nEND\n"


def _arity(tokens: list[str], n: int, op: str) -> None:
    if len(tokens) != n:
        raise GrammarError(f"{op} takes {n} operand{'s' if n != 1 else ''}, got {len(tokens)}")


def parse_edit(tokens: list[str]) -> Edit:
    """The edit written by `tokens` (after EDIT). Raises GrammarError."""
    if not tokens:
        raise GrammarError("EDIT names no edit")
    op, rest = tokens[0], tokens[1:]
    if op not in OPS:
        raise GrammarError(f"unknown edit {op[:20]!r} (one of {', '.join(OPS)})")
    if op == "type":
        _arity(rest, 1, op)
        return Edit(op, name=parse_name(rest[0], "the input type"))
    if not rest:
        raise GrammarError(f"{op} needs a step number")
    at = parse_int(rest[0], "a step number")
    rest = rest[1:]
    if op == "const":
        _arity(rest, 1, op)
        name, value = parse_assignment(rest[0])
        return Edit(op, at=at, name=name, value=value)
    if op in ("key", "expr"):
        if not rest:
            raise GrammarError(f"{op} needs a name")
        name, args = parse_name(rest[0], f"the new {op}"), {}
        for token in rest[1:]:
            key, value = parse_assignment(token)
            if key in args:
                raise GrammarError(f"constant {key} given twice")
            args[key] = value
        return Edit(op, at=at, name=name, args=args)
    if op in ("order", "drop"):
        _arity(rest, 0, op)
        return Edit(op, at=at)
    if op in ("add", "set"):
        return Edit(op, at=at, step=parse_step(rest))
    if op == "swap":
        _arity(rest, 1, op)
        return Edit(op, at=at, to=parse_int(rest[0], "a step number"))
    _arity(rest, 2, op)  # splice
    return Edit(op, at=at, ref=parse_int(rest[0], "a reference number"), to=parse_int(rest[1], "a step number"))


def parse_mutation(text) -> Mutation | ProposalError:
    """`REF n`, `EDIT ...`, `END` (blank lines and text after END ignored), or why not. Never raises."""
    if not isinstance(text, str) or not text.strip():
        return ProposalError("empty answer")
    lines = []
    for line in text.splitlines():
        line = " ".join(line.split())
        if line == "END":
            break
        if line:
            lines.append(line)
    else:
        return ProposalError("no END line")
    if len(lines) != 2:
        return ProposalError(f"expected a REF line and an EDIT line before END, got {len(lines)} line(s)")
    m = _REF.match(lines[0])
    if not m:
        return ProposalError(f"the first line is not 'REF n': {lines[0][:40]!r}")
    if not lines[1].startswith("EDIT "):
        return ProposalError(f"the second line is not 'EDIT ...': {lines[1][:40]!r}")
    try:
        edit = parse_edit(lines[1].split()[1:])
    except (GrammarError, ValueError, KeyError, TypeError) as exc:
        return ProposalError(f"EDIT: {exc}")
    return Mutation(int(m.group(1)), edit)


# ---- prompt ---------------------------------------------------------------------------------------------------
def build_mutation_prompt(references: Sequence[Task], instruction: str) -> str:
    """K reference programs, an instruction and the answer's shape."""
    if instruction not in INSTRUCTIONS:
        raise ValueError(f"unknown instruction {instruction!r}; one of {', '.join(INSTRUCTIONS)}")
    parts = ["Edit one reference task's program."]
    for i, task in enumerate(references, 1):
        program = program_of(task)
        parts.append(f"Reference {i}: " + (format_program(*program) if program else "(no program)"))
    parts.append(f"Edits: {EDIT_HELP}")
    parts.append(f"Instruction: {INSTRUCTIONS[instruction][0]}.")
    parts.append("Answer: REF n, EDIT, END.")
    return "\n".join(parts) + "\n"


def feasible_instructions(references: Sequence[Task], cfg: BuildConfig = BuildConfig()) -> list[str]:
    """The instructions some edit of these references can follow (no drop or swap for one-step programs, no
    compose with one reference, no type change that no step survives, ...): found by drawing edits."""
    rng = random.Random(0)
    names = [n for n in INSTRUCTIONS if n != "compose" or len(references) >= 2]
    return [n for n in names if random_mutation(rng, references, n, cfg=cfg, tries=12) is not None]


def choose_mutation_instruction(
    rng: random.Random,
    references: Sequence[Task],
    cfg: BuildConfig = BuildConfig(),
    weights: Callable[[list[str]], Sequence[float] | None] | None = None,
) -> str:
    """An instruction the references allow, "mutate" when none is found: uniformly among those, or by
    `weights(names)` (one positive weight per allowed name; None falls back to the uniform draw)."""
    names = feasible_instructions(references, cfg) or ["mutate"]
    w = weights(names) if weights is not None else None
    if w is None:
        return choose_instruction(rng, len(references), names)
    if len(w) != len(names) or not all(x > 0 for x in w):
        raise ValueError(f"instruction weights must be one positive number per name of {names}, got {list(w)}")
    return rng.choices(names, weights=w)[0]


# ---- edits ----------------------------------------------------------------------------------------------------
class MutationFailure(Exception):
    """An edit that cannot be made on this program (becomes a MutationError)."""


def _step_at(steps: list[dict], at, what: str = "step") -> int:
    if not isinstance(at, int) or not 1 <= at <= len(steps):
        raise MutationFailure(f"{what} {at} does not exist (the program has {len(steps)} steps)")
    return at - 1


def _etype_before(kind: str, steps: list[dict], i: int) -> str:
    etype = input_etype(kind)
    for step in steps[:i]:
        etype, _ = output_type(step, etype)
    return etype


def _nearest(value, choices: tuple):
    """`value` if the new expression offers it, else the offered value nearest to it (the first for strings)."""
    if any(type(value) is type(c) and value == c for c in choices):
        return value
    numbers = [c for c in choices if isinstance(c, (int, float)) and not isinstance(c, bool)]
    if isinstance(value, (int, float)) and not isinstance(value, bool) and numbers:
        return min(numbers, key=lambda c: (abs(c - value), c))
    return choices[0]


def _retype_args(old_args: dict, expr) -> dict:
    names = sorted(set(expr.args) | set(expr.wide))
    out = {}
    for name in names:
        if name in old_args:
            value = old_args[name]
        elif len(old_args) == 1:
            value = next(iter(old_args.values()))
        else:
            value = None
        out[name] = _nearest(value, allowed_values(expr, name))
    return out


def _fill_args(given: dict, expr, old: dict) -> dict:
    """The constants of `expr` read from an edit: each one the edit gives, else the step's old value of that name,
    else (one constant given under another name, one missing) the given value, else the catalogue's first; every
    value moved to the nearest one the catalogue offers. Constants the expression does not take are ignored."""
    names = sorted(set(expr.args) | set(expr.wide))
    missing = [n for n in names if n not in given and n not in old]
    stray = [v for n, v in given.items() if n not in names]
    out = {}
    for name in names:
        value = given.get(name, old.get(name))
        if value is None and len(missing) == 1 and len(stray) == 1:
            value = stray[0]
        out[name] = _nearest(value, allowed_values(expr, name))
    return out


def _clamp(value, lo: int, hi: int):
    """An integer moved into lo..hi (anything else is left for check_pipeline to name)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return min(max(value, lo), hi)
    return value


def _lookup(table: dict, etype: str, name):
    return next((e for e in table.get(etype, ()) if e.name == name), None)


def _normalise(step: dict, etype: str, old: dict | None = None) -> dict:
    """`step` (written by an edit, met by `etype` elements) with its constants read as the catalogue offers them:
    an expression's or key's constants filled and moved to the nearest offered value (`_fill_args`, `old`: the
    constants of the step it replaces), K of take/top_k and W of window moved into their ranges. A name the element
    type lacks is left as it is: `check_pipeline` rejects it."""
    step = dict(step)
    kind = step.get("kind")
    if kind in EXPR_TABLES or kind in ("sort", "top_k"):
        expr = _lookup(EXPR_TABLES.get(kind, KEYS), etype, step.get("expr") if kind in EXPR_TABLES else step.get("key"))
        if expr is not None and isinstance(step.get("args"), dict):
            step["args"] = _fill_args(step["args"], expr, old or {})
    if kind in ("take", "top_k"):
        step["k"] = _clamp(step.get("k"), 1, MAX_STEP_K)
    if kind == "window":
        step["w"] = _clamp(step.get("w"), 2, MAX_STEP_W)
    return step


def _retype(kind: str, steps: list[dict]) -> list[dict]:
    """The steps on input `kind`: the same names, constants moved to what the new element type offers."""
    etype, out = input_etype(kind), []
    for i, step in enumerate(steps, 1):
        step = dict(step)
        where = f"step {i}"
        try:
            if step["kind"] not in applicable_kinds(etype):
                raise GrammarError(f"{where}: {step['kind']} does not apply to {etype} elements")
            if step["kind"] in EXPR_TABLES:
                step["args"] = _retype_args(
                    step["args"], find_expr(EXPR_TABLES[step["kind"]], etype, step["expr"], where)
                )
            elif step["kind"] in ("sort", "top_k"):
                step["args"] = _retype_args(step["args"], find_expr(KEYS, etype, step["key"], where))
            elif step["kind"] == "group":
                find_expr(GROUP_KEYS, etype, step["key"], where)
                find_expr(GROUP_VALUES, etype, step["val"], where)
        except GrammarError as exc:
            raise MutationFailure(f"type {INPUT_SHORT[kind]}: {exc}") from None
        out.append(step)
        etype, _ = output_type(step, etype)
    return out


def apply_edit(kind: str, steps: list[dict], edit: Edit, references: Sequence[Task] = ()) -> tuple[str, list[dict]]:
    """(input kind, steps) after the edit. Raises MutationFailure when the edit cannot be made (a missing step,
    a field the step lacks); the result still has to pass `check_pipeline`."""
    steps = [dict(s, args=dict(s["args"])) if "args" in s else dict(s) for s in steps]
    op = edit.op
    if op == "type":
        if edit.name not in INPUT_NAMES:
            raise MutationFailure(f"unknown input type {edit.name!r} (one of {', '.join(INPUT_NAMES)})")
        new_kind = INPUT_NAMES[edit.name]
        if new_kind == kind:
            raise MutationFailure(f"the input is already {edit.name}")
        return new_kind, _retype(new_kind, steps)
    if op in ("add", "splice"):
        if not isinstance(edit.at, int) or not 1 <= edit.at <= len(steps) + 1:
            raise MutationFailure(f"position {edit.at} does not exist (1..{len(steps) + 1})")
        if op == "add":
            new = dict(edit.step)
        else:
            if not isinstance(edit.ref, int) or not 1 <= edit.ref <= len(references):
                raise MutationFailure(f"reference {edit.ref} does not exist (1..{len(references)})")
            other = program_of(references[edit.ref - 1])
            if other is None:
                raise MutationFailure(f"reference {edit.ref} has no program")
            new = dict(other[1][_step_at(other[1], edit.to, f"reference {edit.ref}'s step")])
        new = _normalise(new, _etype_before(kind, steps, edit.at - 1))
        return kind, steps[: edit.at - 1] + [new] + steps[edit.at - 1 :]
    i = _step_at(steps, edit.at)
    step = steps[i]
    etype = _etype_before(kind, steps, i)
    if op == "const":
        names = _constants(step)
        name = names[0] if edit.name not in names and len(names) == 1 else edit.name  # a step's one constant
        if name in step.get("args", {}):
            expr = _lookup(EXPR_TABLES.get(step["kind"], KEYS), etype, step.get("expr") or step.get("key"))
            step["args"][name] = _nearest(edit.value, allowed_values(expr, name)) if expr else edit.value
        elif name == "k" and step["kind"] in ("take", "top_k"):
            step["k"] = _clamp(edit.value, 1, MAX_STEP_K)
        elif name == "w" and step["kind"] == "window":
            step["w"] = _clamp(edit.value, 2, MAX_STEP_W)
        else:
            names = (
                sorted(step.get("args", {}))
                + (["k"] if step["kind"] in ("take", "top_k") else [])
                + (["w"] if step["kind"] == "window" else [])
            )
            raise MutationFailure(
                f"step {edit.at} ({step['kind']}) has no constant {edit.name!r} (it has: {', '.join(names) or 'none'})"
            )
    elif op == "key":
        if step["kind"] not in KEY_TABLES:
            raise MutationFailure(f"step {edit.at} ({step['kind']}) has no key")
        step["key"] = edit.name  # a group key takes no constants: any given are ignored
        if step["kind"] != "group":
            step = steps[i] = _normalise(dict(step, args=dict(edit.args)), etype, step["args"])
    elif op == "expr":
        if step["kind"] in EXPR_TABLES:
            steps[i] = _normalise(dict(step, expr=edit.name, args=dict(edit.args)), etype, step["args"])
        elif step["kind"] in ("window", "group"):
            step["agg"] = edit.name  # an aggregate takes no constants: any given are ignored
        else:
            raise MutationFailure(f"step {edit.at} ({step['kind']}) has no expression")
    elif op == "order":
        if step["kind"] not in ORDERS:
            raise MutationFailure(f"step {edit.at} ({step['kind']}) has no order (sort, top_k and take do)")
        name, (first, second) = ORDERS[step["kind"]]
        if step["kind"] == "take":
            step[name] = second if step[name] == first else first
        else:
            step[name] = not step[name]
    elif op == "drop":
        if len(steps) == 1:
            raise MutationFailure("cannot drop the only step")
        del steps[i]
    elif op == "swap":
        j = _step_at(steps, edit.to)
        if i == j:
            raise MutationFailure("swap needs two different steps")
        steps[i], steps[j] = steps[j], steps[i]
    elif op == "set":
        steps[i] = _normalise(dict(edit.step), etype, step.get("args"))
    return kind, steps


def _level(ref_level: int, depth: int, max_depth: int) -> int:
    """The reference's level when the new depth fits it, else the lowest level whose depths hold it."""
    lo, hi = level_depths(ref_level, max_depth)
    if lo <= depth <= hi:
        return ref_level
    for level in (2, 3, 4) if depth == 1 else (3, 4):
        lo, hi = level_depths(level, max_depth)
        if lo <= depth <= hi:
            return level
    return 4


def _edited(mutation: Mutation, references: Sequence[Task], cfg: BuildConfig):
    """(parent, new input kind, new steps, family) of a mutation whose program the families can build in the
    training split, or the MutationError saying why not. Never raises on a parsed mutation."""
    if not 1 <= mutation.ref <= len(references):
        return MutationError(f"reference {mutation.ref} does not exist (1..{len(references)})")
    parent = references[mutation.ref - 1]
    program = program_of(parent)
    if program is None:
        return MutationError(f"reference {mutation.ref} has no program in the grammar")
    kind, steps = program
    try:
        new_kind, new_steps = apply_edit(kind, steps, mutation.edit, references)
        check_pipeline(new_kind, new_steps)
    except (MutationFailure, GrammarError) as exc:
        return MutationError(str(exc))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:  # a malformed step the checks did not foresee
        return MutationError(f"malformed edit: {type(exc).__name__}: {exc}")
    if (new_kind, _copying(new_steps)) == (kind, _copying(steps)):  # sorting in place or not: the same outputs
        return MutationError("the edit changes nothing" + (" but how a sort is written" if new_steps != steps else ""))
    if outputs_form(new_kind, new_steps) == outputs_form(kind, steps):
        return MutationError(
            "the edit changes nothing the outputs show (an order nothing after it sees, or steps that commute)"
        )
    family = next(f for f, k in FAMILIES.items() if k == new_kind)
    split = split_of({"family": family, "steps": new_steps}, cfg.splits)
    if split != "train":
        return MutationError(f"the edited program belongs to the held-out split {split}")
    return parent, new_kind, new_steps, family


def compile_mutation(
    mutation: Mutation,
    references: Sequence[Task],
    *,
    cfg: BuildConfig = BuildConfig(),
    step: int = 0,
    generator_checkpoint: str | None = None,
) -> Task | MutationError:
    """The task the mutation describes (test outputs not yet computed), or why it cannot be made. Never raises
    on a parsed mutation."""
    edited = _edited(mutation, references, cfg)
    if isinstance(edited, MutationError):
        return edited
    parent, new_kind, new_steps, family = edited
    level = _level(int(parent.params.get("level", parent.level)), len(new_steps), cfg.splits.train_max_depth)
    text = format_program(new_kind, new_steps)
    digest = hashlib.sha256(f"{parent.id}\n{text}".encode()).digest()
    params = pipeline_params(
        family, new_steps, level, cfg=cfg, size=4 + digest[4] % 3, seed=int.from_bytes(digest[:4], "big")
    )
    split = split_of(params, cfg.splits)
    if split != "train":
        return MutationError(f"the edited program belongs to the held-out split {split}")
    task = materialise(params, "train", created_step=step)
    parents = [parent] + ([references[mutation.edit.ref - 1]] if mutation.edit.op == "splice" else [])
    return dataclasses.replace(
        task,
        source="generator",
        family=f"generator/{family}",
        parent_ids=list(dict.fromkeys(p.id for p in parents)),
        generator_checkpoint=generator_checkpoint,
    )


# ---- every possible edit (the prompt's grammar) ---------------------------------------------------------------
def _arg_products(expr) -> list[dict]:
    """Every assignment of the catalogue's values (narrow and wide) to an expression's constants."""
    out = [{}]
    for name in sorted(set(expr.args) | set(expr.wide)):
        out = [dict(a, **{name: v}) for a in out for v in allowed_values(expr, name)]
    return out


def candidate_steps(etype: str) -> list[dict]:
    """Every step the program grammar can write for `etype` elements, constants from the catalogue's values."""
    out = []
    for kind in applicable_kinds(etype):
        if kind in EXPR_TABLES:
            out += [
                {"kind": kind, "expr": e.name, "args": a}
                for e in EXPR_TABLES[kind].get(etype, ())
                for a in _arg_products(e)
            ]
        elif kind == "sort":
            out += [
                {"kind": kind, "key": e.name, "args": a, "desc": d, "in_place": p}
                for e in KEYS[etype]
                for a in _arg_products(e)
                for d in (False, True)
                for p in (False, True)
            ]
        elif kind == "top_k":
            out += [
                {"kind": kind, "key": e.name, "args": a, "k": k, "largest": g}
                for e in KEYS[etype]
                for a in _arg_products(e)
                for k in range(1, MAX_STEP_K + 1)
                for g in (False, True)
            ]
        elif kind == "take":
            out += [{"kind": kind, "k": k, "end": end} for end in ("first", "last") for k in range(1, MAX_STEP_K + 1)]
        elif kind == "window":
            out += [{"kind": kind, "w": w, "agg": a} for w in range(2, MAX_STEP_W + 1) for a in WINDOW_AGGS]
        elif kind == "group":
            out += [
                {"kind": kind, "key": k.name, "val": v.name, "agg": a}
                for k in GROUP_KEYS[etype]
                for v in GROUP_VALUES[etype]
                for a in AGGREGATES
            ]
        else:
            out.append({"kind": kind})
    return out


def _candidate_edits(kind: str, steps: list[dict], references: Sequence[Task]):
    n = len(steps)
    for j, step in enumerate(steps):
        etype = _etype_before(kind, steps, j)
        for name in _constants(step):
            for value in _const_choices(kind, steps, j, name):
                yield Edit("const", at=j + 1, name=name, value=value)
        if step["kind"] in ("sort", "top_k"):
            yield from (Edit("key", at=j + 1, name=e.name, args=a) for e in KEYS[etype] for a in _arg_products(e))
        elif step["kind"] == "group":
            yield from (Edit("key", at=j + 1, name=e.name) for e in GROUP_KEYS[etype])
        if step["kind"] in EXPR_TABLES:
            yield from (
                Edit("expr", at=j + 1, name=e.name, args=a)
                for e in EXPR_TABLES[step["kind"]][etype]
                for a in _arg_products(e)
            )
        elif step["kind"] in ("window", "group"):
            yield from (
                Edit("expr", at=j + 1, name=a) for a in (WINDOW_AGGS if step["kind"] == "window" else AGGREGATES)
            )
        if step["kind"] in ORDERS:
            yield Edit("order", at=j + 1)
        yield Edit("drop", at=j + 1)
        yield from (Edit("swap", at=j + 1, to=i + 1) for i in range(n) if i != j)
        yield from (Edit("set", at=j + 1, step=s) for s in candidate_steps(etype))
    for name in INPUT_NAMES:
        yield Edit("type", name=name)
    for at in range(n + 1):
        yield from (Edit("add", at=at + 1, step=s) for s in candidate_steps(_etype_before(kind, steps, at)))
        for r, other in enumerate(references, 1):
            program = program_of(other)
            for j in range(len(program[1]) if program else 0):
                yield Edit("splice", at=at + 1, ref=r, to=j + 1)


# steps whose adjacent order never changes the outputs (filters keep the relative order and depend on the element
# alone; a stable sort, a reverse and a first-occurrence dedup commute with them; a map with a reverse)
COMMUTING = {
    frozenset(p)
    for p in (("filter",), ("filter", "reverse"), ("filter", "sort"), ("filter", "dedup"), ("map", "reverse"))
}
ORDER_ONLY = ("sort", "reverse")  # steps that only reorder the list
ORDER_BLIND = ("filter", "map", "dedup", "sort", "reverse")  # steps whose output multiset ignores the input's order
ORDER_BLIND_SINKS = {
    ("int", "sum"),
    ("int", "max"),
    ("int", "min"),
    ("int", "len"),
    ("str", "len"),
    ("rec", "len"),
    ("tup", "len"),
    ("tup", "total"),
    ("float", "max"),
    ("float", "len"),
}  # (element type, sink)


def outputs_form(kind: str, steps: list[dict]) -> list[str]:
    """A form of the program that two programs share when their outputs are equal on every input for one of these
    reasons: a sort or reverse whose order nothing after it can see (only order-blind steps, then an order-blind
    sink), a sort written in place or not, adjacent steps that commute (put in one order)."""
    etypes, etype = [], input_etype(kind)
    for step in steps:
        etypes.append(etype)
        etype, _ = output_type(step, etype)
    last = steps[-1]
    blind_end = last["kind"] == "sink" and (etypes[-1], last["expr"]) in ORDER_BLIND_SINKS
    kept = []
    for i, step in enumerate(steps):
        dead = blind_end and step["kind"] in ORDER_ONLY and all(s["kind"] in ORDER_BLIND for s in steps[i + 1 : -1])
        if not dead:
            kept.append(dict(step, in_place=False) if step["kind"] == "sort" else step)
    form = [format_step(s) for s in kept]
    kinds = [s["kind"] for s in kept]
    changed = True
    while changed:  # adjacent commuting steps out of order are swapped: one order for each class
        changed = False
        for i in range(len(form) - 1):
            if frozenset((kinds[i], kinds[i + 1])) in COMMUTING and form[i] > form[i + 1]:
                form[i], form[i + 1], kinds[i], kinds[i + 1] = form[i + 1], form[i], kinds[i + 1], kinds[i]
                changed = True
    return [INPUT_SHORT[kind]] + form


def _copying(steps: list[dict]) -> list[dict]:
    """The steps with every sort written as a copy (`in_place` changes the code, not the outputs)."""
    return [dict(s, in_place=False) if s.get("kind") == "sort" else s for s in steps]


def known_program(kind: str, steps: list[dict], index) -> bool:
    """Whether `index` (a validity CorpusIndex) holds this program already, its sorts in place or not: the same
    normalised reference solution as the families write it (a compiled task's novelty check would reject it)."""
    variants = [steps] + (
        [_copying(steps), [dict(s, in_place=True) if s.get("kind") == "sort" else s for s in steps]]
        if any(s.get("kind") == "sort" for s in steps)
        else []
    )
    return any(
        index.find_duplicate("", ast_hash(render_reference({"input": kind, "steps": v})), None) is not None
        for v in variants
    )


def possible_edits(references: Sequence[Task], cfg: BuildConfig = BuildConfig(), index=None) -> dict[int, list[Edit]]:
    """Reference number -> every edit (constants from the catalogue's values) that compiles to a program of the
    training split different from the reference's and, given a corpus `index`, not already held by it (the same
    program; a different one with the same behaviour is left to the novelty check): what the prompt's grammar
    offers (generator.grammars)."""
    out = {}
    for ref, task in enumerate(references, 1):
        program = program_of(task)
        if program is None:
            continue
        kind, steps = program
        ok = []
        for edit in _candidate_edits(kind, steps, references):
            edited = _edited(Mutation(ref, edit), references, cfg)
            if not isinstance(edited, MutationError) and (index is None or not known_program(*edited[1:3], index)):
                ok.append(edit)
        if ok:
            out[ref] = ok
    return out


# ---- random edits (warm-start targets) ------------------------------------------------------------------------
def _constants(step: dict) -> list[str]:
    names = sorted(step.get("args", {}))
    if step["kind"] in ("take", "top_k"):
        names.append("k")
    if step["kind"] == "window":
        names.append("w")
    return names


def _const_choices(kind: str, steps: list[dict], i: int, name: str) -> tuple:
    step, etype = steps[i], _etype_before(kind, steps, i)
    if name == "k" and step["kind"] in ("take", "top_k") and name not in step.get("args", {}):
        return tuple(range(1, MAX_STEP_K + 1))
    if name == "w" and step["kind"] == "window":
        return tuple(range(2, MAX_STEP_W + 1))
    table = EXPR_TABLES.get(step["kind"]) or KEYS
    return allowed_values(find_expr(table, etype, step.get("expr") or step["key"], ""), name)


def _random_args(rng: random.Random, expr, literals: str) -> dict:
    return {name: rng.choice(tuple(c)) for name, c in expr.choices(literals).items()}


def _random_edit(
    rng: random.Random, op: str, kind: str, steps: list[dict], references: Sequence[Task], ref: int, literals: str
) -> Edit:
    n = len(steps)
    i = rng.randrange(n)
    etype = _etype_before(kind, steps, i)
    step = steps[i]
    if op == "const":
        options = [(j, name) for j, s in enumerate(steps) for name in _constants(s)]
        if not options:
            raise MutationFailure("no constant")
        j, name = rng.choice(options)
        return Edit(op, at=j + 1, name=name, value=rng.choice(_const_choices(kind, steps, j, name)))
    if op == "key":
        options = [j for j, s in enumerate(steps) if s["kind"] in KEY_TABLES]
        if not options:
            raise MutationFailure("no key")
        j = rng.choice(options)
        e = _etype_before(kind, steps, j)
        expr = rng.choice(KEY_TABLES[steps[j]["kind"]][e])
        return Edit(
            op, at=j + 1, name=expr.name, args={} if steps[j]["kind"] == "group" else _random_args(rng, expr, literals)
        )
    if op == "expr":
        if step["kind"] in EXPR_TABLES:
            expr = rng.choice(EXPR_TABLES[step["kind"]][etype])
            return Edit(op, at=i + 1, name=expr.name, args=_random_args(rng, expr, literals))
        if step["kind"] in ("window", "group"):
            return Edit(op, at=i + 1, name=rng.choice(WINDOW_AGGS if step["kind"] == "window" else list(AGGREGATES)))
        raise MutationFailure("no expression")
    if op == "order":
        options = [j for j, s in enumerate(steps) if s["kind"] in ORDERS]
        if not options:
            raise MutationFailure("no order")
        return Edit(op, at=rng.choice(options) + 1)
    if op == "type":
        return Edit(op, name=rng.choice([name for name in INPUT_NAMES if INPUT_NAMES[name] != kind]))
    if op in ("add", "set"):
        at = rng.randrange(n + 1) if op == "add" else i
        e = _etype_before(kind, steps, at)
        last = at == n if op == "add" else at == n - 1
        kinds = [k for k in applicable_kinds(e) if k != "sink" or last]
        return Edit(op, at=at + 1, step=sample_step(rng, rng.choice(kinds), e, literals))
    if op == "drop":
        return Edit(op, at=i + 1)
    if op == "swap":
        if n < 2:
            raise MutationFailure("one step")
        a, b = rng.sample(range(n), 2)
        return Edit(op, at=a + 1, to=b + 1)
    if op == "splice":
        others = [r for r in range(1, len(references) + 1) if r != ref and program_of(references[r - 1])]
        if not others:
            raise MutationFailure("no second reference")
        r = rng.choice(others)
        other_steps = program_of(references[r - 1])[1]
        return Edit(op, at=rng.randint(1, n + 1), ref=r, to=rng.randint(1, len(other_steps)))
    raise MutationFailure(f"unknown edit {op!r}")


def random_mutation(
    rng: random.Random,
    references: Sequence[Task],
    instruction: str,
    *,
    cfg: BuildConfig = BuildConfig(),
    tries: int = 30,
) -> tuple[Mutation, Task] | None:
    """A mutation that follows `instruction` and compiles, with its task, or None after `tries` draws."""
    ops = INSTRUCTIONS[instruction][1]
    candidates = [i for i, r in enumerate(references, 1) if program_of(r)]
    if not candidates:
        return None
    for _ in range(tries):
        ref = rng.choice(candidates)
        kind, steps = program_of(references[ref - 1])
        try:
            edit = _random_edit(rng, rng.choice(ops), kind, steps, references, ref, EDIT_LITERALS)
        except MutationFailure:
            continue
        mutation = Mutation(ref, edit)
        task = compile_mutation(mutation, references, cfg=cfg)
        if isinstance(task, Task):
            return mutation, task
    return None


def mutation_examples(
    tasks: Sequence[Task], k_refs: int, seed: int, sb, corpus_index=None, build_cfg=None, per_task: int = 3
) -> list[tuple[str, str]]:
    """The mutation format's warm-start pairs (prompt, answer text): `per_task` draws per task, each K references
    (the task and K - 1 others), an instruction they allow and a random edit that follows it (several per task: a
    tiny model memorises a few hundred answers instead of learning the grammar); kept when the edited task passes
    every validity check in the sandbox, novelty against `corpus_index` and the earlier kept ones included (what a
    proposal must pass)."""
    build_cfg = build_cfg or BuildConfig()
    rng = random.Random(f"mutation-examples:{seed}")
    pool = [t for t in tasks if program_of(t) is not None]
    drawn = []
    for _ in range(per_task):
        for t in pool:
            others = [r for r in rng.sample(pool, min(len(pool), k_refs + 1)) if r.id != t.id][: k_refs - 1]
            refs = others + [t]
            rng.shuffle(refs)
            instruction = choose_mutation_instruction(rng, refs, build_cfg)
            found = random_mutation(rng, refs, instruction, cfg=build_cfg)
            if found is not None:
                drawn.append((build_mutation_prompt(refs, instruction), format_mutation(found[0]), found[1]))
    reports = validate_many([task for *_, task in drawn], sb, corpus_index)
    return [(prompt, answer) for (prompt, answer, _), report in zip(drawn, reports) if report.ok]


RANDOM_EDITS = "random_edits"  # the generator_checkpoint of a task a random edit made (generator.source)


def random_proposal(
    rng: random.Random,
    references: Sequence[Task],
    *,
    cfg: BuildConfig = BuildConfig(),
    weights: Callable[[list[str]], Sequence[float] | None] | None = None,
    step: int = 0,
) -> tuple[str, str, Task | MutationError]:
    """A proposal made without a generator (`generator.source=random_edits`): the instruction drawn as a mutation
    prompt draws it (`choose_mutation_instruction`, with the same `weights`), then a random edit that follows it
    (`random_mutation`, as the warm start draws its targets). Returns the instruction, the answer's text (empty when
    no edit was found) and the task compiled as an answer's is, at `step` (or why none could be made); the validity
    checks are the caller's, as for a generator's answer."""
    instruction = choose_mutation_instruction(rng, references, cfg, weights)
    found = random_mutation(rng, references, instruction, cfg=cfg)
    if found is None:
        return instruction, "", MutationError(f"no random edit of these references follows {instruction!r}")
    return (
        instruction,
        format_mutation(found[0]),
        compile_mutation(found[0], references, cfg=cfg, step=step, generator_checkpoint=RANDOM_EDITS),
    )
