"""Code extraction is robust to prose, fences and truncation, and never raises."""

from hypothesis import assume, given
from hypothesis import strategies as st

from solver.parse import extract_code

CODE = "def solve(xs):\n    return sorted(xs)\n"


def test_fenced_and_bare_code():
    assert extract_code(f"Here you go:\n```python\n{CODE}```\nHope it helps").code == CODE
    assert extract_code(f"```\n{CODE}```").code == CODE
    assert extract_code(f"Sure. {CODE}".replace("Sure. def", "Sure.\ndef")).code == CODE
    assert extract_code(CODE + "\nThis sorts the list.").code == CODE


def test_unclosed_fence_and_truncated_tail():
    assert extract_code(f"```python\n{CODE}def other(x):\n    return (x +").code == CODE


def test_other_language_fence_is_skipped():
    text = f"```bash\nls -la\n```\n```python\n{CODE}```"
    assert extract_code(text).code == CODE


def test_no_code():
    assert extract_code("").reason == "empty answer"
    assert extract_code("I cannot do that.").code is None


@given(st.text(max_size=300), st.text(max_size=300))
def test_code_survives_arbitrary_prose_around_a_fence(before, after):
    before = before.replace("`", "").replace("~", "")
    after = after.replace("`", "").replace("~", "")
    assert extract_code(f"{before}\n```python\n{CODE}```\n{after}").code == CODE


@given(st.text(max_size=500))
def test_never_raises(text):
    result = extract_code(text)
    assert result.code is None or result.code.endswith("\n")


# ---- typed outcomes and properties over generated programs and prose ------------------------------------

import ast  # noqa: E402
import keyword  # noqa: E402

from solver.parse import STATUSES  # noqa: E402

NAMES = st.from_regex(r"[a-z][a-z0-9_]{0,7}", fullmatch=True).filter(lambda s: not keyword.iskeyword(s))
WORDS = st.lists(st.from_regex(r"[A-Za-z]{1,8}", fullmatch=True), min_size=1, max_size=8)


@st.composite
def programs(draw):
    """A small random function (one to three statements), ending with a newline."""
    name, params = draw(NAMES), draw(st.lists(NAMES, min_size=1, max_size=3, unique=True))
    p = params[0]
    exprs = [
        f"{p} + {draw(st.integers(0, 99))}",
        f"[v * 2 for v in {p}]",
        f"sorted({p})",
        f"len({p}) % 3",
        f"{{'k': {p}}}",
        f"({p}, {draw(st.integers(-5, 5))})",
    ]
    body = [f"    out = {draw(st.sampled_from(exprs))}"]
    if draw(st.booleans()):
        body.append(f"    if out == {draw(st.integers(0, 9))}:\n        return None")
    body.append("    return out")
    header = "import math\n\n" if draw(st.booleans()) else ""
    return f"{header}def {name}({', '.join(params)}):\n" + "\n".join(body) + "\n"


@st.composite
def prose(draw):
    """Sentences that never parse as Python ("Word word word." lines)."""
    lines = draw(st.lists(WORDS, min_size=0, max_size=3))
    return "\n".join(" ".join(words) + "." for words in lines)


def entry_of(code):
    return [n.name for n in ast.parse(code).body if isinstance(n, ast.FunctionDef)][0]


@given(programs(), prose(), prose(), st.sampled_from(["```python", "```py", "```", "~~~", "```Python3"]))
def test_fenced_code_in_any_prose_is_recovered(code, before, after, fence):
    close = "~~~" if fence == "~~~" else "```"
    result = extract_code(f"{before}\n{fence}\n{code}{close}\n{after}", entry_point=entry_of(code))
    assert result.ok and result.status == "ok" and result.code == code


@given(programs(), prose(), prose())
def test_bare_code_between_prose_paragraphs_is_recovered(code, before, after):
    result = extract_code(f"{before}\n{code}{after}")
    assert result.ok and result.code == code


@given(programs(), prose(), st.sampled_from(["    return (x +", "def other(y):\n    if y", "  ]]]", "Done"]))
def test_truncated_or_trailing_garbage_is_dropped(code, before, tail):
    assert extract_code(f"{before}\n```python\n{code}{tail}").code == code  # unclosed fence, cut mid-way
    assert extract_code(f"{code}{tail}").code == code


@given(programs(), programs())
def test_the_block_defining_the_entry_point_wins(usage, solution):
    name = entry_of(solution)
    assume(name != entry_of(usage))
    text = f"Usage:\n```python\n{usage}```\nSolution:\n```python\n{solution}```"
    assert extract_code(text, entry_point=name).code == solution
    assert extract_code(text).code == usage  # without an entry point, the first block that defines something


@given(st.text(max_size=400), st.sampled_from([None, "solve"]))
def test_any_text_gives_a_typed_outcome(text, entry_point):
    r = extract_code(text, entry_point=entry_point)
    assert r.status in STATUSES
    assert (r.code is not None) == r.ok
    if r.ok:
        ast.parse(r.code)
    else:
        assert r.reason


def test_typed_failures():
    assert extract_code("   \n").status == "empty"
    assert extract_code(None).status == "empty"
    assert extract_code("I cannot do that.").status == "no_code"
    broken = extract_code("```python\ndef f(x:\n    return x\n```")
    assert broken.status == "syntax_error" and broken.code is None
    assert "def f(x:" in broken.candidate and broken.reason.startswith("syntax error line")
    assert extract_code("def f(x) return x").status == "syntax_error"
    assert extract_code("x\0y").status in ("no_code", "syntax_error")


def test_a_closed_block_with_a_syntax_error_is_a_syntax_error_not_a_truncated_program():
    broken = "```python\ndef solve(xs):\n    ys = [x for x in xs\n    return ys\n```"
    result = extract_code(broken)
    assert result.status == "syntax_error" and result.code is None and "def solve" in result.candidate
