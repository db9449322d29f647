"""Procedural task families: a skill library of parameterised components composed into pipelines.

A task's `params` (plain JSON) say everything needed to rebuild it:
    {"family": "list_int", "input": "list:int", "steps": [{"kind": "filter", ...}, ...],
     "level": 3, "sizes": [0, 10], "edge_cases": true, "noise": [], "seed": 1234}
`sample_pipeline` draws the steps (each step's output type feeds the next), `render_reference` writes the
reference solution in one simple, consistent style, and `render_signature` its signature.

Levels (the curriculum):
    1  one step, fixed small input size, no edge cases
    2  one step, variable sizes, edge cases (empty, single, sorted, reversed, duplicates, negatives, unicode)
    3  pipelines of 2-3 steps, edge cases
    4  pipelines of 3..max steps, vague text: the task is defined mostly by its (more numerous) examples
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from generator.families.steps import (
    KINDS,
    PARAM_NAMES,
    SOURCE_CODE,
    applicable_kinds,
    output_type,
    render_step,
    sample_step,
)
from generator.families.values import ANNOTATIONS, ELEMENTS, input_annotation, input_etype

# family name -> input kind (see generator.families.values): a list of each element type, then a text and CSV lines
FAMILIES = {**{e.family: e.kind for e in ELEMENTS}, "string": "text", "record_pipeline": "csv"}
# How often each family is drawn (list transforms dominate, as in typical list exercises).
FAMILY_WEIGHTS = {
    "list_int": 4,
    "list_float": 2,
    "list_str": 3,
    "list_record": 2,
    "list_tuple": 2,
    "string": 2,
    "record_pipeline": 2,
}
# family -> the step kinds its pipelines draw from (a family not named here draws every kind its input allows)
FAMILY_STEPS: dict[str, tuple[str, ...]] = {}
LEVELS = (1, 2, 3, 4)


class PipelineError(ValueError):
    """No pipeline satisfies the requested constraints."""


def register_family(name: str, kind: str, weight: float = 1.0, steps: Sequence[str] | None = None) -> None:
    """A family drawn beside the others from now on: pipelines on the input `kind` (one the families already take),
    drawn with weight `weight`, their steps of the kinds `steps` only (None: every kind the input allows). The three
    tables it fills are `FAMILIES`, `FAMILY_WEIGHTS` and `FAMILY_STEPS`; a ValueError names a taken name, an unknown
    input kind or step kind, or a weight <= 0."""
    if name in FAMILIES:
        raise ValueError(f"task family {name!r} is taken")
    if kind not in FAMILIES.values():
        raise ValueError(f"task family {name!r}: unknown input kind {kind!r} (one of {', '.join(FAMILIES.values())})")
    unknown = sorted(set(steps or ()) - set(KINDS))
    if unknown or (steps is not None and not steps):
        raise ValueError(f"task family {name!r}: steps must be some of {', '.join(KINDS)}, got {list(steps or ())}")
    if not weight > 0:
        raise ValueError(f"task family {name!r}: weight must be > 0, got {weight}")
    FAMILIES[name] = kind
    FAMILY_WEIGHTS[name] = weight
    if steps is not None:
        FAMILY_STEPS[name] = tuple(steps)


def level_depths(level: int, max_depth: int) -> tuple[int, int]:
    """Range of pipeline depth (steps after the source) for a curriculum level."""
    return {1: (1, 1), 2: (1, 1), 3: (2, min(3, max_depth)), 4: (min(3, max_depth), max_depth)}[level]


def kinds_of(steps: list[dict]) -> list[str]:
    return [s["kind"] for s in steps]


def sample_pipeline(
    rng: random.Random,
    kind: str,
    depth: int,
    *,
    forbid_pairs=(),
    require_pair=None,
    tries: int = 200,
    literals: str = "narrow",
    steps: Sequence[str] | None = None,
) -> list[dict]:
    """Steps of a `depth`-step pipeline on input `kind`.

    forbid_pairs: unordered pairs of step kinds that must not both appear; require_pair: one that must;
    literals: the range the steps' constants come from (catalogue.LITERALS); steps: the step kinds it may draw
    (None: all; a family's `FAMILY_STEPS`).
    """
    forbid = [frozenset(p) for p in forbid_pairs]
    for _ in range(tries):
        forced: dict[int, str] = {}
        if require_pair is not None:
            if depth < 2:
                raise PipelineError("a required pair of steps needs depth >= 2")
            i, j = sorted(rng.sample(range(depth), 2))
            a, b = rng.sample(sorted(require_pair), 2)  # sorted: a set's order follows the hash seed
            forced = {i: a, j: b}
        drawn = _try_pipeline(rng, kind, depth, forced, literals, steps)
        if drawn is None:
            continue
        present = set(kinds_of(drawn))
        if any(p <= present for p in forbid):
            continue
        return drawn
    raise PipelineError(f"no {depth}-step pipeline for {kind} with pairs forbid={forbid_pairs} require={require_pair}")


def _try_pipeline(
    rng: random.Random, kind: str, depth: int, forced: dict[int, str], literals: str, allowed: Sequence[str] | None
) -> list[dict] | None:
    etype = input_etype(kind)
    steps: list[dict] = []
    for i in range(depth):
        last = i == depth - 1
        options = [k for k in applicable_kinds(etype) if (k != "sink" or last)]
        if steps:  # no immediate repeats and no no-op orderings
            prev = steps[-1]["kind"]
            options = [k for k in options if k != prev and not (prev == "sort" and k == "reverse")]
        if allowed is not None:  # a family's own step kinds (FAMILY_STEPS)
            options = [k for k in options if k in allowed]
            if not options:
                return None
        if i in forced:
            if forced[i] not in options:
                return None
            chosen = forced[i]
        else:
            weights = [0.5 if k == "sink" else 2.0 if k in ("filter", "map", "sort") else 1.0 for k in options]
            chosen = rng.choices(options, weights)[0]
        step = sample_step(rng, chosen, etype, literals)
        steps.append(step)
        etype, scalar = output_type(step, etype)
        if scalar and not last:
            return None
    return steps


def final_type(kind: str, steps: list[dict]) -> tuple[str, bool]:
    etype, scalar = input_etype(kind), False
    for step in steps:
        etype, scalar = output_type(step, etype)
    return etype, scalar


def render_reference(params: dict) -> str:
    """The reference solution: `def solve(<arg>):` with one block per step, in one consistent style."""
    kind, steps = params["input"], params["steps"]
    arg = PARAM_NAMES.get(kind, "xs")
    body = list(SOURCE_CODE.get(kind, []))
    etype = input_etype(kind)
    for step in steps:
        lines = render_step(step, etype)
        if step["kind"] == "sink":
            lines = ["return " + lines[0][len("xs = ") :]]
        body += lines
        etype, _ = output_type(step, etype)
    if not steps or steps[-1]["kind"] != "sink":
        body.append("return xs")
    return f"def solve({arg}):\n" + "".join(f"    {line}\n" for line in body)


def render_signature(params: dict) -> str:
    kind = params["input"]
    etype, scalar = final_type(kind, params["steps"])
    out = ANNOTATIONS[etype] if scalar else f"list[{ANNOTATIONS[etype]}]"
    return f"def solve({PARAM_NAMES.get(kind, 'xs')}: {input_annotation(kind)}) -> {out}"


__all__ = [
    "FAMILIES",
    "FAMILY_STEPS",
    "FAMILY_WEIGHTS",
    "KINDS",
    "LEVELS",
    "PipelineError",
    "final_type",
    "kinds_of",
    "level_depths",
    "register_family",
    "render_reference",
    "render_signature",
    "sample_pipeline",
]
