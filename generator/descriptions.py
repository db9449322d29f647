"""Task descriptions from templates, with paraphrase variety, a vague mode (level 4) and a noisy mode (evaluation).

`describe(params, rng)` returns the text; the structure (opener, step clauses, connectors, closer) and each
clause's wording are drawn independently, so two tasks with the same pipeline rarely read the same.
Noisy mode (`noise` in params) applies some of: an irrelevant sentence, a vague clause in place of a precise
one, a small error (a number off by one or a flipped direction); the examples stay the ground truth.
"""

from __future__ import annotations

import random
import re

from generator.families import final_type
from generator.families.steps import PARAM_NAMES, SOURCE_PHRASES, output_type, step_phrases
from generator.families.values import ELEMENTS, NOUNS, input_etype

INPUT_PHRASES = {
    **{e.kind: list(e.phrases) for e in ELEMENTS},
    "text": ["a string of words separated by spaces", "a sentence (a string)", "a line of text"],
    "csv": ["a list of CSV lines 'name,city,age,score'", "lines of comma-separated values name,city,age,score"],
}
IRRELEVANT = (
    "The data comes from a legacy system that is being migrated.",
    "Performance is not a concern for this exercise.",
    "This function will be called from a reporting script.",
    "Our team reviews all code on Fridays.",
    "Assume the caller has already logged the input.",
    "Remember that readability matters.",
)
VAGUE_CLAUSES = (
    "process the {noun} the way the examples show",
    "adjust the {noun} as needed",
    "apply the appropriate transformation",
    "tidy the data up",
)
KIND_WORDS = {
    "filter": "filtering",
    "map": "transforming each element",
    "sort": "sorting",
    "reverse": "reversing",
    "dedup": "removing duplicates",
    "take": "slicing",
    "top_k": "picking the top elements",
    "window": "sliding windows",
    "group": "grouping",
    "sink": "reducing to a single value",
}
NOISE_KINDS = ("irrelevant", "vague", "error")


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _clauses(params: dict, rng: random.Random) -> list[str]:
    kind = params["input"]
    etype = input_etype(kind)
    out = [rng.choice(SOURCE_PHRASES[kind])] if kind in SOURCE_PHRASES else []
    for step in params["steps"]:
        out.append(rng.choice(step_phrases(step, etype)))
        etype, _ = output_type(step, etype)
    return out


def _join(clauses: list[str], rng: random.Random) -> str:
    if len(clauses) == 1:
        return _cap(clauses[0]) + "."
    style = rng.randrange(3)
    if style == 0:
        seconds = ["Then", "Next", "After that"]
        parts = [f"First, {clauses[0]}."] + [f"{rng.choice(seconds)}, {c}." for c in clauses[1:-1]]
        return " ".join(parts + [f"Finally, {clauses[-1]}."])
    if style == 1:
        return "Steps:\n" + "\n".join(f"{i}. {_cap(c)}." for i, c in enumerate(clauses, 1))
    return _cap(", then ".join(clauses[:-1]) + f", and finally {clauses[-1]}.")


def _closer(params: dict, rng: random.Random) -> str:
    if params["steps"] and params["steps"][-1]["kind"] == "sink":
        return ""
    etype, _ = final_type(params["input"], params["steps"])
    noun = NOUNS.get(etype, ("values",))[0]
    return rng.choice(
        [
            " Return the resulting list.",
            " Return the list you end up with.",
            f" The function returns the final list of {noun}.",
            " Return the result as a list.",
        ]
    )


def _opener(params: dict, rng: random.Random) -> str:
    kind = params["input"]
    what = rng.choice(INPUT_PHRASES[kind])
    arg = PARAM_NAMES.get(kind, "xs")
    return rng.choice(
        [
            f"Write a function `solve({arg})` that takes {what}.",
            f"The input `{arg}` is {what}.",
            f"You are given {what} `{arg}`.",
            f"Implement `solve({arg})`, where `{arg}` is {what}.",
        ]
    )


def describe(params: dict, rng: random.Random, *, vague: bool = False, noise: list[str] = ()) -> str:
    """Description of a pipeline task. `vague`: level-4 text (a hint only); `noise`: a subset of NOISE_KINDS."""
    opener = _opener(params, rng)
    if vague:
        kinds = sorted({KIND_WORDS[s["kind"]] for s in params["steps"]})
        hint = rng.choice(kinds)
        body = rng.choice(
            [
                f"Work out the rule from the examples; it involves {hint}, among other things.",
                f"The examples define what to compute (hint: {hint} is part of it).",
                f"Figure out the transformation from the input/output examples. One ingredient: {hint}.",
            ]
        )
        return f"{opener} {body}"
    clauses = _clauses(params, rng)
    if "vague" in noise and clauses:
        i = rng.randrange(len(clauses))
        noun = NOUNS.get(input_etype(params["input"]), ("values",))[0]
        clauses[i] = rng.choice(VAGUE_CLAUSES).format(noun=noun)
    if "error" in noise:
        clauses = _inject_error(clauses, rng)
    body = f"{_join(clauses, rng)}{_closer(params, rng)}"
    if "irrelevant" in noise:  # after the opener or at the very end
        if rng.random() < 0.5:
            opener = f"{opener} {rng.choice(IRRELEVANT)}"
        else:
            body = f"{body} {rng.choice(IRRELEVANT)}"
    return f"{opener} {body}"


_SWAPS = (("ascending", "descending"), ("largest", "smallest"), ("greater", "less"), ("first", "last"))


def _inject_error(clauses: list[str], rng: random.Random) -> list[str]:
    """A small mistake: one number off by one, or else one direction word flipped."""
    order = list(range(len(clauses)))
    rng.shuffle(order)
    for i in order:
        m = re.search(r"(?<![\w.'])(\d+)(?![\w.'])", clauses[i])
        if m:
            n = int(m.group(1))
            clauses[i] = clauses[i][: m.start()] + str(n + 1) + clauses[i][m.end() :]
            return clauses
    for i in order:
        for a, b in _SWAPS:
            if re.search(rf"\b{a}\b", clauses[i]):
                clauses[i] = re.sub(rf"\b{a}\b", b, clauses[i], count=1)
                return clauses
    return clauses
