"""The prompt grammar of the mutation format (generator.grammars.prompt_grammar): it accepts every edit that compiles
for the prompt's references, to its end, and nothing that does not compile."""

import random

import hypothesis
import pytest

from generator.grammars import mutation_grammar, prompt_grammar
from generator.mutation import (
    Mutation,
    MutationError,
    choose_mutation_instruction,
    compile_mutation,
    format_mutation,
    parse_mutation,
    possible_edits,
    random_mutation,
)
from generator.schema import Task

xgr = pytest.importorskip("xgrammar")


@pytest.fixture(scope="module")
def compiler():
    from selfplay.models.factory import train_tokenizer

    tok = train_tokenizer(
        ["REF 1\nEDIT add 3 take last 2\nEND\n", 'filter map sort "a" top_k window group'] * 20,
        vocab_size=400,
        kind="bpe",
    )
    return tok, xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok)))


def accepts(compiled, tok, text: str) -> bool:
    matcher = xgr.GrammarMatcher(compiled)
    return matcher.accept_string(text) and matcher.accept_token(tok.eos_token_id) and matcher.is_terminated()


def test_the_prompt_grammar_accepts_exactly_the_edits_that_compile(task_pool, compiler):
    tok, comp = compiler
    rng = random.Random(0)
    train = [t for t in task_pool if t.split == "train"]
    for _ in range(6):
        refs = rng.sample(train, 2)
        compiled = comp.compile_grammar(prompt_grammar(refs))
        possible = possible_edits(refs)
        for ref, edits in possible.items():
            for edit in rng.sample(edits, min(15, len(edits))):
                assert accepts(compiled, tok, format_mutation(Mutation(ref, edit))), (ref, edit)
        for _ in range(15):  # drawn mutations are possible edits; answers outside the grammar do not compile
            found = random_mutation(rng, refs, choose_mutation_instruction(rng, refs))
            if found is not None:
                assert accepts(compiled, tok, format_mutation(found[0]))
        for text in (
            "REF 3\nEDIT drop 1\nEND\n",
            "REF 1\nEDIT drop 7\nEND\n",
            "REF 1\nEDIT type float\nEND\n",
            "REF 1\nEDIT expr 1 palindrome x=1\nEND\n",
            "REF 2\nEDIT add 1 sink len\nEND\n",
        ):
            mutation = parse_mutation(text)
            if isinstance(compile_mutation(mutation, refs), MutationError):
                assert not accepts(compiled, tok, text), text


def test_a_prompt_without_a_possible_edit_has_no_grammar(task_pool):
    bare = Task(**{**task_pool[0].to_dict(), "params": {}, "id": "bare"})
    assert prompt_grammar([bare]) is None


def test_the_catalogue_grammar_writes_every_string_constant(compiler):
    tok, comp = compiler
    compiled = comp.compile_grammar(mutation_grammar())
    for text in (
        'REF 1\nEDIT set 1 map suffix s=".."\nEND\n',
        'REF 1\nEDIT expr 2 replace c="a" d="*"\nEND\n',
        'REF 2\nEDIT const 1 s="-1"\nEND\n',
    ):
        assert accepts(compiled, tok, text), text


# ---- the free format's grammar: a Python subset -------------------------------------------------------------
FREE_HEAD = "DESCRIPTION: d\nSIGNATURE: def solve(xs: list[int]) -> list[int]\nCODE:\ndef solve(xs):\n"
FREE_TAIL = "INPUTS:\n[[1, -2, 30]]\n[[]]\nEND\n"
GOOD_BODIES = [
    "    return xs\n",
    "    xs = [x for x in xs if x > 0 and not x % 2 == 1]\n"
    "    return sorted(xs, key=lambda x: (-x, x), reverse=True)[:2]\n",
    "    total = 0\n    for i, x in enumerate(xs):\n        if x < 0:\n            total -= x\n        elif x == 0:\n"
    "            pass\n        else:\n            total += x * i\n    return total\n",
    "    groups = {}\n    for x in xs:\n        groups.setdefault(x % 3, []).append(x)\n"
    "    return [[k, sum(v)] for k, v in sorted(groups.items())]\n",
    "    seen = set()\n    out = []\n    while xs:\n        x = xs.pop()\n        if x not in seen:\n"
    '            seen.add(x)\n            out.append(str(x) + "!")\n    return ", ".join(out)\n',
    "    d = {x: x ** 2 for x in xs}\n    a, b = xs[0], xs[-1]\n    xs[0] = d[a]\n"
    "    return max(x for x in xs) if xs else None\n",
    "    return {\"a\": 1, 'b': [xs[::-1], xs[1:], (1,), ()], 'c': 0.5, \"d\\n\": True is not False}\n",
]
BAD_BODIES = [
    "    for = 1\n    return xs\n",  # a keyword as a name
    "    return xs.lambda\n",
    "    return 1 + not xs\n",  # `not` inside arithmetic
    "    return [x for x in xs if x else 0]\n",  # a conditional where the filter belongs
    "    return f(a=1, xs)\n",  # positional after keyword
    "    return 007\n",  # leading zeros
    "    return (xs\n",
    "    return xs\n  return xs\n",  # bad indentation
    "    else:\n        return xs\n",  # else without if
    "    if xs:\n    return xs\n",  # an empty block
    "    f(x) = 1\n",  # assignment to a call
    "    return x if xs\n",
]


@pytest.fixture(scope="module")
def free_matcher(compiler):
    from generator.grammars import free_grammar

    tok, comp = compiler
    compiled = comp.compile_grammar(free_grammar())
    return lambda text: accepts(compiled, tok, text)


def _parses(code: str) -> bool:
    import ast

    try:
        ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    return True


def test_the_free_grammar_accepts_the_python_a_task_needs_and_rejects_what_does_not_parse(free_matcher):
    from generator.agent import ProposalError, parse_proposal

    for body in GOOD_BODIES:
        assert _parses("def solve(xs):\n" + body), body
        assert free_matcher(FREE_HEAD + body + FREE_TAIL), body
        assert not isinstance(parse_proposal(FREE_HEAD + body + FREE_TAIL), ProposalError)
    for body in BAD_BODIES:
        assert not _parses("def solve(xs):\n" + body), body
        assert not free_matcher(FREE_HEAD + body + FREE_TAIL), body
    for inputs in ("[007]\n", '["a\tb"]\n', "[1,2]\n", "[]\n[-0.]\n"):  # json.loads rejects each
        assert not free_matcher(FREE_HEAD + "    return xs\nINPUTS:\n" + inputs + "END\n"), inputs


NEAR_MISS_CHARS = " \n()[]{}:,.=+-*/%<>\"'_0123456789abcdefinorstx"


def near_miss(data, text: str, alphabet: str = NEAR_MISS_CHARS) -> str:
    """`text` with one to three characters deleted, inserted (from `alphabet`) or replaced: the errors a model makes."""
    for _ in range(data.draw(hypothesis.strategies.integers(1, 3))):
        i = data.draw(hypothesis.strategies.integers(0, len(text) - 1))
        c = data.draw(hypothesis.strategies.sampled_from(alphabet))
        op = data.draw(hypothesis.strategies.sampled_from(("delete", "insert", "replace")))
        text = text[:i] + ("" if op == "delete" else c) + text[i + (op != "insert") :]
    return text


@hypothesis.settings(max_examples=300, deadline=None, suppress_health_check=[hypothesis.HealthCheck.too_slow])
@hypothesis.given(data=hypothesis.strategies.data())
def test_what_the_free_grammar_accepts_parses_as_python(free_matcher, task_pool, data):
    """Soundness on near misses, the errors a model makes: a procedural task's proposal text with a few characters
    deleted, inserted or replaced is accepted by the grammar only if `parse_proposal` reads it: its CODE parses,
    its INPUTS are JSON lists, its sections are there."""
    from generator.agent import ProposalError, format_proposal, parse_proposal

    text = near_miss(data, format_proposal(data.draw(hypothesis.strategies.sampled_from(task_pool))))
    if free_matcher(text):  # a CFG cannot make CODE define the very name SIGNATURE gives: that is left to the check
        parsed = parse_proposal(text)
        assert not isinstance(parsed, ProposalError) or parsed.reason.startswith("CODE does not define"), (text, parsed)


# ---- the free format tied: SIGNATURE's function in CODE (generator.tie_signature) ---------------------------
@pytest.fixture(scope="module")
def tied_matcher(compiler):
    """text -> whether the two stages accept it: its head (to the end of the SIGNATURE line) under
    free_head_grammar, the rest under free_tail_grammar of that signature."""
    from generator.grammars import free_head_grammar, free_tail_grammar

    tok, comp = compiler
    head = comp.compile_grammar(free_head_grammar())

    def match(text: str) -> bool:
        at = text.find("\nCODE:")
        if at < 0:
            return False
        first, rest = text[: at + 1], text[at + 1 :]
        signature = first.split("\nSIGNATURE: ", 1)[-1].strip()
        return accepts(head, tok, first) and accepts(comp.compile_grammar(free_tail_grammar(signature)), tok, rest)

    return match


def test_the_tied_stages_accept_every_procedural_proposal(tied_matcher, task_pool):
    """Not tighter than the format: every proposal the warm start teaches (a procedural task's) passes both stages."""
    from generator.agent import format_proposal

    for task in task_pool:
        assert tied_matcher(format_proposal(task)), format_proposal(task)


def test_the_tied_tail_takes_only_the_signatures_function_parameters_and_arity(tied_matcher, free_matcher):
    head = "DESCRIPTION: d\nSIGNATURE: def solve(xs: list[int], k: int) -> list[int]\nCODE:\n"
    body = "    return xs[:k]\nINPUTS:\n[[1, -2, 30], 2]\n[[], 0]\nEND\n"
    for line in ("def solve(xs, k):\n", "def solve(xs: list[int], k: int) -> list[int]:\n", "def solve(xs, k: int):\n"):
        assert tied_matcher(head + line + body), line
    for line in (
        "def solve(xs):\n",
        "def solve(k, xs):\n",
        "def solve(xs, k, j):\n",
        "def solve(ys, k):\n",
        "def solver(xs, k):\n",
        "def f(xs, k):\n",
    ):
        assert free_matcher(head + line + body), line  # one grammar cannot tell: the signature check did
        assert not tied_matcher(head + line + body), line
    for inputs in ("[[1, 2]]\n", "[[1], 2, 3]\n", "[[1], 2]\n[3]\n", "[]\n"):  # each line passes two arguments
        text = head + "def solve(xs, k):\n    return xs[:k]\nINPUTS:\n" + inputs + "END\n"
        assert free_matcher(text) and not tied_matcher(text), inputs
    empty = "DESCRIPTION: d\nSIGNATURE: def solve() -> int\nCODE:\n"
    assert tied_matcher(empty + "def solve():\n    return 1\nINPUTS:\n[]\n[]\nEND\n")
    assert not tied_matcher(empty + "def solve(xs):\n    return 1\nINPUTS:\n[]\nEND\n")
    assert not tied_matcher(empty + "def solve():\n    return 1\nINPUTS:\n[1]\nEND\n")
    one = "DESCRIPTION: d\nSIGNATURE: def solve(xs: list[int]) -> int\nCODE:\ndef solve(xs):\n    return 1\n"
    assert tied_matcher(one + FREE_TAIL) and not tied_matcher(one + "INPUTS:\n[[1], 2]\nEND\n")


@hypothesis.settings(max_examples=200, deadline=None, suppress_health_check=[hypothesis.HealthCheck.too_slow])
@hypothesis.given(data=hypothesis.strategies.data())
def test_what_the_tied_stages_accept_parses_and_defines_the_signatures_function(tied_matcher, task_pool, data):
    """Soundness on near misses, as for the one grammar, and without its exception: whatever the two stages accept,
    `parse_proposal` reads, its CODE defines SIGNATURE's function with SIGNATURE's parameters, and each INPUTS line
    passes as many arguments."""
    import ast

    from generator.agent import ProposalError, format_proposal, parse_proposal
    from generator.validity import parse_signature

    text = near_miss(
        data, format_proposal(data.draw(hypothesis.strategies.sampled_from(task_pool))), NEAR_MISS_CHARS + "k"
    )
    if tied_matcher(text):
        parsed = parse_proposal(text)
        assert not isinstance(parsed, ProposalError), (text, parsed)
        sig = parse_signature(parsed.signature)
        fn = next(n for n in ast.parse(parsed.code).body if isinstance(n, ast.FunctionDef) and n.name == sig.name)
        assert [a.arg for a in fn.args.args] == [a.arg for a in sig.args.args], text
        assert all(len(args) == len(sig.args.args) for args in parsed.inputs), text


def test_free_expressions_nest_at_most_max_expr_depth_levels(free_matcher):
    """Brackets and the recursions without them (`not`, unary minus, `lambda`, a conditional's `else`) open a level;
    MAX_EXPR_DEPTH levels are accepted, one more is not, so no expression runs on without end."""
    from generator.grammars import MAX_EXPR_DEPTH

    def nested(opener: str, closer: str, depth: int) -> str:
        return FREE_HEAD + f"    return {opener * depth}0{closer * depth}\n" + FREE_TAIL

    for opener, closer in (("[", "]"), ("f(", ")"), ("-", ""), ("not ", ""), ("lambda: ", "")):
        assert free_matcher(nested(opener, closer, MAX_EXPR_DEPTH)), opener
        assert not free_matcher(nested(opener, closer, MAX_EXPR_DEPTH + 1)), opener
    chain = " else ".join(["0 if x"] * MAX_EXPR_DEPTH) + " else 0"
    assert free_matcher(FREE_HEAD + f"    return {chain}\n" + FREE_TAIL)
    assert not free_matcher(FREE_HEAD + f"    return 0 if x else {chain}\n" + FREE_TAIL)
    assert free_matcher(FREE_HEAD + "    return [x for x in xs if x if x for y in xs if y]\n" + FREE_TAIL)
    assert not free_matcher(FREE_HEAD + "    return [x for x in xs for y in xs for z in xs]\n" + FREE_TAIL)
