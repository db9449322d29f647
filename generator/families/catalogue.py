"""The component library: expressions over one element `x`, per element type.

Each `Expr` is a code template (with `{k}`-style placeholders filled from `args` choices), the type it produces,
and several phrasings (so descriptions vary). Predicates are phrased as post-noun clauses ("that are even"),
maps and keys as noun phrases ("its square", "absolute value"). Steps (`generator.families.steps`) combine these.

Literal ranges (`tasks.literals`): "narrow" (the default world) draws each placeholder from `args`; "wide" from
`wide` where an expression has it: more thresholds, divisors, offsets and letters, so that programs with a constant
repeat less (one-step programs: ~720 narrow, ~1,700 wide; steps without a constant, such as reverse, are unchanged).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from generator.families.values import CITIES


@dataclass(frozen=True)
class Expr:
    name: str
    code: str  # Python expression over `x` (or `xs` for sinks), with {placeholders}
    phrases: tuple[str, ...]  # alternative phrasings, same placeholders
    out: str = ""  # type tag of the value (maps, keys, sinks)
    args: dict = field(default_factory=dict)  # placeholder -> tuple of choices
    wide: dict = field(default_factory=dict)  # placeholder -> the wider tuple of choices (tasks.literals=wide)

    def fill(self, values: dict) -> str:
        return self.code.format(**values)

    def choices(self, literals: str = "narrow") -> dict:
        """Placeholder -> the choices drawn from under a literal range ("narrow" or "wide")."""
        return {**self.args, **self.wide} if literals == "wide" else self.args


LITERALS = ("narrow", "wide")


def _e(name, code, phrases, out="", wide=None, **args) -> Expr:
    return Expr(
        name,
        code,
        tuple(phrases),
        out,
        {k: tuple(v) for k, v in args.items()},
        {k: tuple(v) for k, v in (wide or {}).items()},
    )


LETTERS = ("a", "b", "c", "e", "k", "l", "m", "p", "s", "t")
WIDE_LETTERS = "abcdefghiklmnoprstuwyz"  # letters the words of values.py contain
QUARTERS = [v / 4 for v in range(-60, 61)]  # -15.0, -14.75, ..., 15.0

PREDICATES: dict[str, list[Expr]] = {
    "int": [
        _e(
            "gt",
            "x > {k}",
            ["that are greater than {k}", "that exceed {k}", "bigger than {k}"],
            k=range(-3, 9),
            wide={"k": range(-15, 16)},
        ),
        _e(
            "lt",
            "x < {k}",
            ["that are less than {k}", "that are smaller than {k}", "below {k}"],
            k=range(-2, 11),
            wide={"k": range(-15, 16)},
        ),
        _e("even", "x % 2 == 0", ["that are even", "that are divisible by 2"]),
        _e("odd", "x % 2 != 0", ["that are odd", "that are not divisible by 2"]),
        _e(
            "div",
            "x % {m} == 0",
            ["that are divisible by {m}", "that are multiples of {m}"],
            m=range(3, 6),
            wide={"m": range(3, 10)},
        ),
        _e("nonzero", "x != 0", ["that are not zero", "that are non-zero"]),
        _e(
            "abs_gt",
            "abs(x) > {k}",
            ["whose absolute value exceeds {k}", "that are further than {k} from zero"],
            k=range(2, 12),
            wide={"k": range(1, 18)},
        ),
        _e("last_digit", "abs(x) % 10 == {d}", ["whose last digit is {d}", "ending in the digit {d}"], d=range(0, 10)),
        _e("nonneg", "x >= 0", ["that are not negative", "that are zero or positive"]),
    ],
    "float": [
        _e(
            "gt",
            "x > {t}",
            ["that are greater than {t}", "above {t}"],
            t=[v / 2 for v in range(-10, 21)],
            wide={"t": QUARTERS},
        ),
        _e(
            "lt",
            "x < {t}",
            ["that are less than {t}", "below {t}"],
            t=[v / 2 for v in range(-10, 21)],
            wide={"t": QUARTERS},
        ),
        _e("nonneg", "x >= 0", ["that are not negative", "that are zero or positive"]),
    ],
    "str": [
        _e(
            "longer",
            "len(x) > {k}",
            ["that are longer than {k} characters", "with more than {k} characters"],
            k=range(2, 6),
            wide={"k": range(1, 8)},
        ),
        _e(
            "shorter",
            "len(x) < {k}",
            ["that are shorter than {k} characters", "with fewer than {k} characters"],
            k=range(3, 7),
            wide={"k": range(2, 9)},
        ),
        _e(
            "starts",
            'x.startswith("{c}")',
            ["that start with '{c}'", "beginning with '{c}'"],
            c=LETTERS,
            wide={"c": WIDE_LETTERS},
        ),
        _e(
            "ends",
            'x.endswith("{c}")',
            ["that end with '{c}'", "ending in '{c}'"],
            c=("a", "e", "n", "s", "t", "y"),
            wide={"c": WIDE_LETTERS},
        ),
        _e(
            "contains",
            '"{c}" in x',
            ["that contain the letter '{c}'", "containing '{c}'"],
            c=("a", "e", "i", "o", "n", "r"),
            wide={"c": WIDE_LETTERS},
        ),
        _e("lower", "x.islower()", ["that are written in lower case", "that are all lower-case"]),
        _e("palindrome", "x == x[::-1]", ["that are palindromes", "that read the same backwards"]),
        _e("capital", "x[:1].isupper()", ["that start with a capital letter", "beginning with an upper-case letter"]),
        _e(
            "exact_len",
            "len(x) == {k}",
            ["that are exactly {k} characters long", "of length {k}"],
            k=range(3, 7),
            wide={"k": range(2, 9)},
        ),
    ],
    "rec": [
        _e(
            "age_gt",
            'x["age"] > {k}',
            ["whose age is greater than {k}", "older than {k}"],
            k=range(20, 65, 5),
            wide={"k": range(18, 70)},
        ),
        _e(
            "score_ge",
            'x["score"] >= {k}',
            ["whose score is at least {k}", "scoring {k} or more"],
            k=range(30, 90, 10),
            wide={"k": range(5, 100)},
        ),
        _e("city", 'x["city"] == "{c}"', ["who live in {c}", "whose city is '{c}'"], c=CITIES),
        _e(
            "age_lt",
            'x["age"] < {k}',
            ["younger than {k}", "whose age is below {k}"],
            k=range(25, 65, 5),
            wide={"k": range(19, 71)},
        ),
        _e(
            "score_lt",
            'x["score"] < {k}',
            ["whose score is below {k}", "scoring under {k}"],
            k=range(30, 90, 10),
            wide={"k": range(5, 100)},
        ),
        _e(
            "name_starts",
            'x["name"].startswith("{c}")',
            ["whose name starts with '{c}'"],
            c=("a", "b", "d", "e", "f", "j", "k", "n"),
            wide={"c": "abcdefghijklmn"},
        ),
    ],
    "tup": [
        _e(
            "count_gt",
            "x[1] > {k}",
            ["whose count is greater than {k}", "with a count above {k}"],
            k=range(2, 16),
            wide={"k": range(0, 20)},
        ),
        _e("count_even", "x[1] % 2 == 0", ["whose count is even", "with an even count"]),
        _e(
            "count_lt",
            "x[1] < {k}",
            ["whose count is below {k}", "with a count under {k}"],
            k=range(3, 16),
            wide={"k": range(1, 21)},
        ),
        _e(
            "name_starts",
            'x[0].startswith("{c}")',
            ["whose name starts with '{c}'"],
            c=LETTERS,
            wide={"c": WIDE_LETTERS},
        ),
    ],
}

MAPS: dict[str, list[Expr]] = {
    "int": [
        _e(
            "mul",
            "x * {k}",
            ["its value times {k}", "{k} times its value"],
            "int",
            k=range(2, 6),
            wide={"k": range(2, 13)},
        ),
        _e(
            "add",
            "x + {k}",
            ["its value plus {k}", "its value increased by {k}"],
            "int",
            k=range(1, 11),
            wide={"k": range(1, 51)},
        ),
        _e("square", "x * x", ["its square", "its value squared"], "int"),
        _e("abs", "abs(x)", ["its absolute value", "its distance from zero"], "int"),
        _e("neg", "-x", ["its negation", "its value with the sign flipped"], "int"),
        _e(
            "floordiv",
            "x // {k}",
            ["its value divided by {k} and rounded down", "its floor division by {k}"],
            "int",
            k=range(2, 5),
            wide={"k": range(2, 11)},
        ),
        _e(
            "mod",
            "x % {m}",
            ["its remainder modulo {m}", "its remainder when divided by {m}"],
            "int",
            m=range(3, 8),
            wide={"m": range(2, 13)},
        ),
        _e("tostr", "str(x)", ["its decimal string", "its string form"], "str"),
        _e(
            "clip_low",
            "max(x, {k})",
            ["its value, raised to {k} if it is smaller", "the larger of it and {k}"],
            "int",
            k=range(-5, 6),
            wide={"k": range(-20, 21)},
        ),
        _e(
            "clip_high",
            "min(x, {k})",
            ["its value, capped at {k}", "the smaller of it and {k}"],
            "int",
            k=range(0, 11),
            wide={"k": range(-20, 21)},
        ),
    ],
    "float": [
        _e(
            "scale",
            "round(x * {k}, 2)",
            ["its value times {k}, rounded to 2 decimals"],
            "float",
            k=range(2, 5),
            wide={"k": range(2, 13)},
        ),
        _e("half", "round(x / 2, 2)", ["half its value, rounded to 2 decimals"], "float"),
        _e("abs", "abs(x)", ["its absolute value", "its distance from zero"], "float"),
        _e("neg", "-x", ["its negation", "its value with the sign flipped"], "float"),
        _e("round", "round(x)", ["its value rounded to the nearest integer", "the nearest whole number"], "int"),
    ],
    "str": [
        _e("upper", "x.upper()", ["its upper-case form", "the word in capital letters"], "str"),
        _e("lower", "x.lower()", ["its lower-case form", "the word in small letters"], "str"),
        _e("reverse", "x[::-1]", ["its reversal", "the word spelled backwards"], "str"),
        _e(
            "prefix",
            "x[:{k}]",
            ["its first {k} characters", "the first {k} letters of it"],
            "str",
            k=range(1, 4),
            wide={"k": range(1, 7)},
        ),
        _e(
            "suffix",
            'x + "{s}"',
            ["the word followed by '{s}'", "the word with '{s}' appended"],
            "str",
            s=("!", "s", "_x", "?"),
            wide={"s": ("!", "s", "_x", "?", "ed", "ing", "er", "-1", "#", "ly", "..")},
        ),
        _e("capitalize", "x.capitalize()", ["the word with its first letter capitalised"], "str"),
        _e("double", "x * 2", ["the word written twice", "the word repeated two times"], "str"),
        _e(
            "last_chars",
            "x[-{k}:]",
            ["its last {k} characters", "the final {k} letters of it"],
            "str",
            k=range(1, 4),
            wide={"k": range(1, 7)},
        ),
        _e("swapcase", "x.swapcase()", ["the word with the case of every letter swapped"], "str"),
        _e(
            "replace",
            'x.replace("{c}", "{d}")',
            ["the word with every '{c}' replaced by '{d}'"],
            "str",
            c=("a", "e", "o"),
            d=("_", "*", "0"),
            wide={"c": "aeiounrt", "d": "_*0-#+1"},
        ),
        _e("len", "len(x)", ["its length", "its number of characters"], "int"),
        _e(
            "count",
            'x.count("{c}")',
            ["the number of times '{c}' occurs in it", "its count of '{c}'"],
            "int",
            c=("a", "e", "o", "n"),
            wide={"c": "aeiounrtl"},
        ),
    ],
    "rec": [
        _e("age", 'x["age"]', ["its age", "the person's age"], "int"),
        _e("score", 'x["score"]', ["its score", "the person's score"], "int"),
        _e("name", 'x["name"]', ["its name", "the person's name"], "str"),
        _e("city", 'x["city"]', ["its city", "the person's city"], "str"),
        _e(
            "label",
            'x["name"] + ": " + str(x["score"])',
            ["a label 'name: score'", "the text '<name>: <score>'"],
            "str",
        ),
        _e("total", 'x["age"] + x["score"]', ["the sum of its age and score", "age plus score"], "int"),
        _e("handle", 'x["name"] + "@" + x["city"]', ["the text '<name>@<city>'", "a handle 'name@city'"], "str"),
        _e("name_age", '[x["name"], x["age"]]', ["the pair [name, age]", "a [name, age] pair"], "tup"),
        _e("city_score", '[x["city"], x["score"]]', ["the pair [city, score]"], "tup"),
        _e(
            "bump",
            'dict(x, score=x["score"] + {k})',
            ["the same record with its score raised by {k}"],
            "rec",
            k=range(1, 11),
            wide={"k": range(1, 51)},
        ),
        _e("upper_name", 'dict(x, name=x["name"].upper())', ["the same record with the name in upper case"], "rec"),
    ],
    "tup": [
        _e("first", "x[0]", ["its name (the first element)", "its first element"], "str"),
        _e("second", "x[1]", ["its count (the second element)", "its second element"], "int"),
        _e(
            "scale",
            "[x[0], x[1] * {k}]",
            ["the pair with its count multiplied by {k}"],
            "tup",
            k=range(2, 5),
            wide={"k": range(2, 13)},
        ),
        _e("upper", "[x[0].upper(), x[1]]", ["the pair with its name in upper case"], "tup"),
    ],
}

# Sort / top-k keys: phrases are nouns ("sort by <phrase>", "the largest <phrase>").
KEYS: dict[str, list[Expr]] = {
    "int": [
        _e("value", "x", ["value", "numeric value"]),
        _e("abs", "abs(x)", ["absolute value", "distance from zero"]),
        _e(
            "mod",
            "x % {m}",
            ["remainder modulo {m}", "remainder when divided by {m}"],
            m=range(3, 6),
            wide={"m": range(2, 10)},
        ),
        _e("last_digit", "abs(x) % 10", ["last digit", "final decimal digit"]),
    ],
    "float": [
        _e("value", "x", ["value", "numeric value"]),
        _e("abs", "abs(x)", ["absolute value", "distance from zero"]),
    ],
    "str": [
        _e("value", "x", ["the word itself (alphabetical order)", "dictionary order"]),
        _e("len", "len(x)", ["length", "number of characters"]),
        _e("lower", "x.lower()", ["lower-case spelling (ignoring case)", "case-insensitive spelling"]),
        _e("last", "x[-1:]", ["last character", "final letter"]),
        _e("len_alpha", "(len(x), x)", ["length, then alphabetical order", "length with ties broken alphabetically"]),
    ],
    "rec": [
        _e("age", 'x["age"]', ["age"]),
        _e("score", 'x["score"]', ["score"]),
        _e("name", 'x["name"]', ["name"]),
        _e("city_name", '(x["city"], x["name"])', ["city, then name", "city with ties broken by name"]),
    ],
    "tup": [
        _e("count", "x[1]", ["count", "second element"]),
        _e("name", "x[0]", ["name", "first element"]),
        _e("count_name", "(x[1], x[0])", ["count, then name", "count with ties broken by name"]),
    ],
}

# Group-by keys (phrases are nouns) and the values aggregated per group.
GROUP_KEYS: dict[str, list[Expr]] = {
    "int": [
        _e("parity", '"even" if x % 2 == 0 else "odd"', ["parity ('even' or 'odd')"]),
        _e("sign", '"negative" if x < 0 else "non-negative"', ["sign ('negative' or 'non-negative')"]),
    ],
    "str": [
        _e("first", "x[:1]", ["first letter", "initial"]),
        _e("last", "x[-1:]", ["last letter", "final character"]),
    ],
    "rec": [_e("city", 'x["city"]', ["city"])],
    "tup": [_e("name", "x[0]", ["name"])],
}
GROUP_VALUES: dict[str, list[Expr]] = {
    "int": [_e("value", "x", ["values"])],
    "str": [_e("len", "len(x)", ["lengths"])],
    "rec": [_e("age", 'x["age"]', ["ages"]), _e("score", 'x["score"]', ["scores"])],
    "tup": [_e("count", "x[1]", ["counts"])],
}
AGGREGATES = {  # name -> (code over the group list v, phrases with {vals} and {noun})
    "count": ("len(v)", ("the number of {noun}", "how many {noun} it has")),
    "sum": ("sum(v)", ("the sum of their {vals}", "the total of their {vals}")),
    "max": ("max(v)", ("the largest of their {vals}", "their maximum {vals}")),
    "min": ("min(v)", ("the smallest of their {vals}", "their minimum {vals}")),
}

# Sinks reduce the list to one value; they end a pipeline. Phrases are complete clauses.
SINKS: dict[str, list[Expr]] = {
    "int": [
        _e("sum", "sum(xs)", ["return their sum", "return the total of the {noun}"], "int"),
        _e("max", "max(xs, default=0)", ["return the largest one (0 if there is none)"], "int"),
        _e("min", "min(xs, default=0)", ["return the smallest one (0 if there is none)"], "int"),
        _e("len", "len(xs)", ["return how many {noun} there are", "return the number of {noun}"], "int"),
    ],
    "float": [
        _e("sum", "round(sum(xs), 2)", ["return their sum rounded to 2 decimals"], "float"),
        _e("max", "max(xs, default=0.0)", ["return the largest one (0.0 if there is none)"], "float"),
        _e("len", "len(xs)", ["return how many {noun} there are", "return the number of {noun}"], "int"),
    ],
    "str": [
        _e("join_comma", '", ".join(xs)', ["join them into one string separated by ', '"], "str"),
        _e(
            "join_space",
            '" ".join(xs)',
            ["join them with single spaces", "return them as one space-separated string"],
            "str",
        ),
        _e(
            "join_none", '"".join(xs)', ["concatenate them into one string", "glue them together without spaces"], "str"
        ),
        _e("len", "len(xs)", ["return how many {noun} there are", "return the number of {noun}"], "int"),
    ],
    "rec": [_e("len", "len(xs)", ["return how many {noun} there are", "return the number of {noun}"], "int")],
    "tup": [
        _e("len", "len(xs)", ["return how many {noun} there are", "return the number of {noun}"], "int"),
        _e("total", "sum(x[1] for x in xs)", ["return the total of the counts", "return the sum of all counts"], "int"),
    ],
}


def find(table: dict[str, list[Expr]], etype: str, name: str) -> Expr:
    for expr in table.get(etype, ()):
        if expr.name == name:
            return expr
    raise KeyError(f"no expression {name!r} for element type {etype!r}")
