"""Element types and their random values: what the inputs of procedural tasks look like.

Type tags: "int", "float", "str", "rec" (a person record {"name", "city", "age", "score"}), "tup" (a [name, count]
pair). Task inputs are a list of one element type, a text (`str`, for the string family) or CSV lines (for the
record pipeline). `make_inputs` draws typical inputs and the edge cases the curriculum asks for (empty, single,
sorted, reversed, duplicates, negatives, unicode); `probe_inputs` are fixed inputs used to fingerprint behaviour.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class ElementType:
    """One element type, every spelling of it in one row (the tables below and elsewhere derive from ELEMENTS)."""

    tag: str  # "tup": the catalogue's tables, the short input name of the program text, (etype, sink) pairs
    name: str  # "tuple": its user-facing name, which held-out types are named with (tasks.heldout_types)
    family: str  # "list_tuple": the family whose input is a list of it, the input kind "list:<tag>"
    annotation: str  # "list": its annotation in a signature (a list of it: "list[list]")
    nouns: tuple[str, str]  # plural, singular
    phrases: tuple[str, ...]  # how a description names a list of it (descriptions.INPUT_PHRASES)

    @property
    def kind(self) -> str:
        """The input kind of a list of it."""
        return f"list:{self.tag}"


ELEMENTS = (
    ElementType(
        "int",
        "int",
        "list_int",
        "int",
        ("numbers", "number"),
        ("a list of integers", "a list of whole numbers", "an integer list"),
    ),
    ElementType(
        "float",
        "float",
        "list_float",
        "float",
        ("values", "value"),
        ("a list of floating-point numbers", "a list of decimal values", "a list of floats"),
    ),
    ElementType(
        "str",
        "str",
        "list_str",
        "str",
        ("words", "word"),
        ("a list of words", "a list of strings", "a list of short words"),
    ),
    ElementType(
        "rec",
        "record",
        "list_record",
        "dict",
        ("records", "record"),
        (
            "a list of person records (dicts with keys 'name', 'city', 'age' and 'score')",
            "a list of dicts, each with 'name', 'city', 'age' and 'score'",
        ),
    ),
    ElementType(
        "tup",
        "tuple",
        "list_tuple",
        "list",
        ("pairs", "pair"),
        ("a list of [name, count] pairs", "a list of two-element lists [name, count]"),
    ),
)
ELEMENT_TYPES = tuple(e.tag for e in ELEMENTS)
# The user-facing name of each element type (held-out splits are named with these).
TYPE_NAMES = {e.tag: e.name for e in ELEMENTS}
ANNOTATIONS = {**{e.tag: e.annotation for e in ELEMENTS}, "bool": "bool"}
NOUNS = {e.tag: e.nouns for e in ELEMENTS}  # plural, singular

WORDS = (
    "apple",
    "banana",
    "cherry",
    "kiwi",
    "mango",
    "pear",
    "plum",
    "fig",
    "grape",
    "lemon",
    "lime",
    "melon",
    "Apple",
    "Kiwi",
    "Zebra",
    "ant",
    "bee",
    "cat",
    "dog",
    "eel",
    "owl",
    "yak",
    "level",
    "noon",
    "radar",
    "stats",
    "tree",
    "Sky",
    "moon",
    "star",
    "sun",
    "rain",
    "snow",
)
UNICODE_WORDS = ("café", "naïve", "straße", "élan", "日本", "ñandú", "Ωmega", "über", "façade", "jalapeño")
NAMES = ("ana", "ben", "cleo", "dan", "eva", "finn", "gus", "hana", "ivan", "jade", "kai", "lena", "mo", "nina")
CITIES = ("oslo", "rome", "lima", "kyiv", "nice", "bern")
SENTENCE_WORDS = (
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "dog",
    "a",
    "cat",
    "sat",
    "on",
    "mat",
    "Hello",
    "World",
    "data",
    "is",
    "fun",
    "level",
    "noon",
    "code",
    "runs",
    "fast",
)


def random_element(rng: random.Random, etype: str, *, negatives: bool = True, unicode: bool = False):
    if etype == "int":
        return rng.randint(-20 if negatives else 0, 20)
    if etype == "float":
        return round(rng.uniform(-20.0 if negatives else 0.0, 20.0), 2)
    if etype == "str":
        return rng.choice(UNICODE_WORDS if unicode and rng.random() < 0.6 else WORDS)
    if etype == "rec":
        return {
            "name": rng.choice(NAMES),
            "city": rng.choice(CITIES),
            "age": rng.randint(18, 70),
            "score": rng.randint(0, 100),
        }
    if etype == "tup":
        return [rng.choice(WORDS[:12] + (UNICODE_WORDS[:3] if unicode else ())), rng.randint(0, 20)]
    raise ValueError(f"unknown element type {etype!r}")


def _sort_key(etype: str):
    if etype == "rec":
        return lambda r: (r["age"], r["name"], r["city"], r["score"])
    return lambda v: v


def random_list(rng: random.Random, etype: str, size: int, case: str = "random") -> list:
    """A list of `size` elements shaped by `case` (random, sorted, reversed, duplicates, negatives, unicode)."""
    if case == "duplicates":
        pool = [random_element(rng, etype) for _ in range(max(1, size // 3))]
        return [rng.choice(pool) for _ in range(size)]
    if case == "negatives" and etype in ("int", "float"):
        return [-abs(random_element(rng, etype)) or -1 for _ in range(size)]
    xs = [random_element(rng, etype, unicode=(case == "unicode")) for _ in range(size)]
    if case in ("sorted", "reversed"):
        xs.sort(key=_sort_key(etype), reverse=(case == "reversed"))
    return xs


def to_csv(record: dict) -> str:
    return f"{record['name']},{record['city']},{record['age']},{record['score']}"


def random_text(rng: random.Random, size: int, case: str = "random") -> str:
    words = UNICODE_WORDS + SENTENCE_WORDS if case == "unicode" else SENTENCE_WORDS
    if case == "duplicates":
        pool = [rng.choice(words) for _ in range(max(1, size // 3))]
        return " ".join(rng.choice(pool) for _ in range(size))
    picked = [rng.choice(words) for _ in range(size)]
    if case in ("sorted", "reversed"):
        picked.sort(reverse=(case == "reversed"))
    return " ".join(picked)


# Input kinds: what the single argument of `solve` is.
#   "list:<etype>"  a list of elements; "text"  a sentence (string family); "csv"  CSV lines (record pipeline).
def input_etype(kind: str) -> str:
    """The element type a task's input is made of (what held-out type splits look at)."""
    if kind == "text":
        return "str"
    if kind == "csv":
        return "rec"
    return kind.split(":", 1)[1]


def input_annotation(kind: str) -> str:
    if kind == "text":
        return "str"
    if kind == "csv":
        return "list[str]"
    return f"list[{ANNOTATIONS[input_etype(kind)]}]"


def make_input(rng: random.Random, kind: str, size: int, case: str = "random"):
    if kind == "text":
        return random_text(rng, size, case)
    if kind == "csv":
        return [to_csv(r) for r in random_list(rng, "rec", size, case)]
    return random_list(rng, input_etype(kind), size, case)


EDGE_CASES = ("empty", "single", "sorted", "reversed", "duplicates", "negatives", "unicode")


def edge_case_applies(kind: str, case: str) -> bool:
    etype = input_etype(kind)
    if case == "negatives":
        return etype in ("int", "float") and kind != "text"
    if case == "unicode":
        return etype in ("str", "tup")
    return True


def make_inputs(rng: random.Random, kind: str, n: int, *, size_range: tuple[int, int], edge_cases: bool) -> list[list]:
    """`n` argument lists (each `[value]`): edge cases first when asked, then random inputs."""
    args: list[list] = []
    if edge_cases:
        for case in EDGE_CASES:
            if len(args) >= n - 1:  # keep at least one random input
                break
            if not edge_case_applies(kind, case):
                continue
            size = (
                0
                if case == "empty"
                else 1
                if case == "single"
                else rng.randint(max(4, size_range[0]), max(6, size_range[1]))
            )
            args.append([make_input(rng, kind, size, "random" if case in ("empty", "single") else case)])
    while len(args) < n:
        args.append([make_input(rng, kind, rng.randint(*size_range))])
    return args


def probe_inputs(kind: str, n: int = 12) -> list[list]:
    """Fixed inputs for a behaviour fingerprint: the same for every task with this input kind."""
    rng = random.Random(f"probe:{kind}")
    return make_inputs(rng, kind, n, size_range=(3, 12), edge_cases=True)
