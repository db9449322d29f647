"""The prompt grammar of the mutation format (generator.grammars.prompt_grammar): it accepts every edit that compiles
for the prompt's references, to its end, and nothing that does not compile."""

import random

import pytest

from generator.grammars import mutation_grammar, prompt_grammar
from generator.mutation import (Mutation, MutationError, choose_mutation_instruction, compile_mutation,
                                format_mutation, parse_mutation, possible_edits, random_mutation)
from generator.schema import Task

xgr = pytest.importorskip("xgrammar")


@pytest.fixture(scope="module")
def compiler():
    from selfplay.models.factory import train_tokenizer

    tok = train_tokenizer(["REF 1\nEDIT add 3 take last 2\nEND\n", 'filter map sort "a" top_k window group'] * 20,
                          vocab_size=400, kind="bpe")
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
        for text in ("REF 3\nEDIT drop 1\nEND\n", "REF 1\nEDIT drop 7\nEND\n", "REF 1\nEDIT type float\nEND\n",
                     "REF 1\nEDIT expr 1 palindrome x=1\nEND\n", "REF 2\nEDIT add 1 sink len\nEND\n"):
            mutation = parse_mutation(text)
            if isinstance(compile_mutation(mutation, refs), MutationError):
                assert not accepts(compiled, tok, text), text


def test_a_prompt_without_a_possible_edit_has_no_grammar(task_pool):
    bare = Task(**{**task_pool[0].to_dict(), "params": {}, "id": "bare"})
    assert prompt_grammar([bare]) is None


def test_the_catalogue_grammar_writes_every_string_constant(compiler):
    tok, comp = compiler
    compiled = comp.compile_grammar(mutation_grammar())
    for text in ('REF 1\nEDIT set 1 map suffix s=".."\nEND\n', 'REF 1\nEDIT expr 2 replace c="a" d="*"\nEND\n',
                 'REF 2\nEDIT const 1 s="-1"\nEND\n'):
        assert accepts(compiled, tok, text), text
