"""Pipeline steps: the transforms that procedural tasks compose.

A step is a JSON dict `{"kind": ..., ...}` (so a task's params fully describe it). For each kind:
`sample_step` draws one for a list of element type `etype`, `render_step` gives its code lines (operating on the
variable `xs`) and the element type it leaves (or the scalar type, for sinks), and `step_phrases` gives
alternative English clauses describing it. Sources (split a text, parse CSV lines) start some pipelines.
"""

from __future__ import annotations

import random

from generator.families.catalogue import AGGREGATES, GROUP_KEYS, GROUP_VALUES, KEYS, MAPS, PREDICATES, SINKS, Expr, find
from generator.families.values import NOUNS

KINDS = ("filter", "map", "sort", "reverse", "dedup", "take", "top_k", "window", "group", "sink")


def applicable_kinds(etype: str) -> list[str]:
    kinds = ["filter", "map", "sort", "reverse", "dedup", "take", "top_k"]
    if etype in ("int", "float"):
        kinds.append("window")
    if etype in GROUP_KEYS:
        kinds.append("group")
    kinds.append("sink")
    return kinds


# Literal range (catalogue.LITERALS) -> the largest k of take and top_k, and the widest sliding window.
MAX_K = {"narrow": 4, "wide": 8}
MAX_WINDOW = {"narrow": 3, "wide": 5}


def _pick(rng: random.Random, table: dict[str, list[Expr]], etype: str, literals: str) -> dict:
    expr = rng.choice(table[etype])
    return {"expr": expr.name, "args": {name: rng.choice(c) for name, c in expr.choices(literals).items()}}


def sample_step(rng: random.Random, kind: str, etype: str, literals: str = "narrow") -> dict:
    """One step of `kind` on elements of `etype`, its constants drawn from the `literals` range."""
    if kind == "filter":
        return {"kind": kind, **_pick(rng, PREDICATES, etype, literals)}
    if kind == "map":
        return {"kind": kind, **_pick(rng, MAPS, etype, literals)}
    if kind == "sort":
        key = _pick(rng, KEYS, etype, literals)
        return {
            "kind": kind,
            "key": key["expr"],
            "args": key["args"],
            "desc": rng.random() < 0.4,
            "in_place": rng.random() < 0.15,
        }
    if kind in ("reverse", "dedup"):
        return {"kind": kind}
    if kind == "take":
        return {"kind": kind, "k": rng.randint(1, MAX_K[literals]), "end": rng.choice(["first", "last"])}
    if kind == "top_k":
        key = _pick(rng, KEYS, etype, literals)
        return {
            "kind": kind,
            "key": key["expr"],
            "args": key["args"],
            "k": rng.randint(1, MAX_K[literals]),
            "largest": rng.random() < 0.6,
        }
    if kind == "window":
        return {"kind": kind, "w": rng.randint(2, MAX_WINDOW[literals]), "agg": rng.choice(["sum", "max", "min"])}
    if kind == "group":
        key = rng.choice(GROUP_KEYS[etype])
        agg = rng.choice(list(AGGREGATES))
        val = rng.choice(GROUP_VALUES[etype])
        return {"kind": kind, "key": key.name, "val": val.name, "agg": agg}
    if kind == "sink":
        return {"kind": kind, **_pick(rng, SINKS, etype, literals)}
    raise ValueError(f"unknown step kind {kind!r}")


def output_type(step: dict, etype: str) -> tuple[str, bool]:
    """(type after the step, is_scalar)."""
    kind = step["kind"]
    if kind == "map":
        return find(MAPS, etype, step["expr"]).out, False
    if kind == "group":
        return "tup", False
    if kind == "sink":
        return find(SINKS, etype, step["expr"]).out, True
    return etype, False


def render_step(step: dict, etype: str) -> list[str]:
    """Code lines (without indentation) that update `xs`."""
    kind = step["kind"]
    if kind == "filter":
        return [f"xs = [x for x in xs if {find(PREDICATES, etype, step['expr']).fill(step['args'])}]"]
    if kind == "map":
        return [f"xs = [{find(MAPS, etype, step['expr']).fill(step['args'])} for x in xs]"]
    if kind == "sort":
        key = find(KEYS, etype, step["key"]).fill(step["args"])
        rev = ", reverse=True" if step["desc"] else ""
        if step.get("in_place"):
            return [f"xs.sort(key=lambda x: {key}{rev})"]
        return [f"xs = sorted(xs, key=lambda x: {key}{rev})"]
    if kind == "reverse":
        return ["xs = xs[::-1]"]
    if kind == "dedup":
        return ["seen = []", "for x in xs:", "    if x not in seen:", "        seen.append(x)", "xs = seen"]
    if kind == "take":
        return [f"xs = xs[:{step['k']}]" if step["end"] == "first" else f"xs = xs[-{step['k']}:]"]
    if kind == "top_k":
        key = find(KEYS, etype, step["key"]).fill(step["args"])
        rev = ", reverse=True" if step["largest"] else ""
        return [f"xs = sorted(xs, key=lambda x: {key}{rev})[:{step['k']}]"]
    if kind == "window":
        w = step["w"]
        return [f"xs = [{step['agg']}(xs[i:i + {w}]) for i in range(len(xs) - {w} + 1)]"]
    if kind == "group":
        key = find(GROUP_KEYS, etype, step["key"]).code
        agg = AGGREGATES[step["agg"]][0]
        val = "x" if step["agg"] == "count" else find(GROUP_VALUES, etype, step["val"]).code
        return [
            "groups = {}",
            "for x in xs:",
            f"    groups.setdefault({key}, []).append({val})",
            f"xs = [[k, {agg}] for k, v in sorted(groups.items())]",
        ]
    if kind == "sink":
        return [f"xs = {find(SINKS, etype, step['expr']).fill(step['args'])}"]
    raise ValueError(f"unknown step kind {kind!r}")


def _expand(templates: list[str], phrases: tuple[str, ...], args: dict, **names) -> list[str]:
    """Every template with every phrasing of the component (its own {placeholders} filled from args)."""
    return [t.format(p=p.format(**args), **names) for p in phrases for t in templates]


def step_phrases(step: dict, etype: str) -> list[str]:
    """Alternative imperative clauses describing the step (lower-case start, no final period)."""
    noun, one = NOUNS[etype]
    kind = step["kind"]
    if kind in ("filter", "map"):
        templates = (
            ["keep only the {noun} {p}", "select the {noun} {p}", "discard every {one} except those {p}"]
            if kind == "filter"
            else ["replace each {one} with {p}", "map every {one} to {p}", "turn each {one} into {p}"]
        )
        expr = find(PREDICATES if kind == "filter" else MAPS, etype, step["expr"])
        return _expand(templates, expr.phrases, step["args"], noun=noun, one=one)
    if kind == "sort":
        order, big = ("descending", "largest") if step["desc"] else ("ascending", "smallest")
        templates = (
            [
                "sort the list in place by {p} ({order}, stable)",
                "reorder the list in place (no copy) by {p}, {big} first, keeping ties in order",
            ]
            if step.get("in_place")
            else [
                "sort the {noun} by {p} in {order} order, keeping ties in their original order",
                "order the {noun} by {p}, {big} first (a stable sort)",
                "stable-sort the {noun} by {p} ({order})",
            ]
        )
        return _expand(templates, find(KEYS, etype, step["key"]).phrases, step["args"], noun=noun, order=order, big=big)
    if kind == "reverse":
        return [f"reverse the order of the {noun}", f"put the {noun} in reverse order", "reverse the list"]
    if kind == "dedup":
        return [
            f"remove duplicate {noun}, keeping the first occurrence of each",
            f"drop repeated {noun} so that each appears once, in order of first appearance",
            "remove duplicates while preserving the original order",
        ]
    if kind == "take":
        k, end = step["k"], step["end"]
        return [
            f"keep only the {end} {k} {noun}",
            f"take the {end} {k} {noun} (fewer if the list is shorter)",
            f"cut the list down to its {end} {k} {noun}",
        ]
    if kind == "top_k":
        order, big = ("descending", "largest") if step["largest"] else ("ascending", "smallest")
        templates = [
            "keep the {k} {noun} with the {big} {p}, in {order} order of {p}",
            "take the top {k} {noun} by {p} ({big} first; ties keep their order)",
        ]
        return _expand(
            templates,
            find(KEYS, etype, step["key"]).phrases,
            step["args"],
            noun=noun,
            order=order,
            big=big,
            k=step["k"],
        )
    if kind == "window":
        w, agg = step["w"], {"sum": "sum", "max": "maximum", "min": "minimum"}[step["agg"]]
        return [
            f"replace the list with the {agg} of every window of {w} consecutive {noun}",
            f"compute the {agg} of each sliding window of size {w}",
            f"slide a window of length {w} over the {noun} and list the {agg} of each window",
        ]
    if kind == "group":
        key = find(GROUP_KEYS, etype, step["key"])
        vals = find(GROUP_VALUES, etype, step["val"]).phrases[0]
        aggs = [a.format(noun=noun, vals=vals) for a in AGGREGATES[step["agg"]][1]]
        out = []
        for p in key.phrases:
            for a in aggs:
                out += [
                    f"group the {noun} by {p} and, for each {p} in increasing order, produce the pair [{p}, {a}]",
                    f"make a list of [{p}, {a}] pairs, one per distinct {p}, sorted by {p}",
                ]
        return out
    if kind == "sink":
        s = find(SINKS, etype, step["expr"])
        return [p.format(noun=noun, **step["args"]) for p in s.phrases]
    raise ValueError(f"unknown step kind {kind!r}")


# ---- sources: how the function's argument becomes the list `xs` -------------------------------------------
SOURCE_CODE = {
    "text": ["xs = s.split()"],
    "csv": [
        "xs = []",
        "for line in lines:",
        '    name, city, age, score = line.split(",")',
        '    xs.append({"name": name, "city": city, "age": int(age), "score": int(score)})',
    ],
}
SOURCE_PHRASES = {
    "text": [
        "split the text into words at whitespace",
        "break the sentence into its words",
        "cut the string into words separated by spaces",
    ],
    "csv": [
        "parse each line 'name,city,age,score' into a record with integer age and score",
        "read every CSV line (name, city, age, score) as a record, converting age and score to integers",
    ],
}
PARAM_NAMES = {"text": "s", "csv": "lines"}
