"""Code extraction is robust to prose, fences and truncation, and never raises."""

from hypothesis import given, strategies as st

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
