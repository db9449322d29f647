"""Which grammar library for `generator.constrained`: compile time and per-token mask cost of the generator's
grammars (generator/grammars.py) on a Hugging Face byte-level BPE tokenizer (the tiny model's, or any folder).

    python -m selfplay.bench.constrained_libs --tokenizer RUN_DIR/checkpoints/step_0/generator \
        [--libs xgrammar,lmfe,tcfg]

Each library walks 64 random grammar-respecting steps (a token drawn uniformly among the allowed ones) and the
mean time of one "allowed tokens" query is reported. lm-format-enforcer takes a regex (the mutation grammar is
regular: `mutation_regex` writes it from the same tables), transformers-cfg the EBNF text itself.
"""

from __future__ import annotations

import argparse
import random
import re
import time

import torch


def mutation_regex() -> str:
    """The mutation grammar as one regular expression (derived from its EBNF: every rule is inlined)."""
    from generator.grammars import mutation_grammar

    rules = {}
    for line in mutation_grammar().splitlines():
        name, _, body = line.partition(" ::= ")
        rules[name.strip()] = body.strip()

    def expand(body: str, depth: int = 0) -> str:
        out = []
        tokens = re.findall(r'"(?:[^"\\]|\\.)*"|\[[^\]]*\]|[A-Za-z_]+|[()|?*+]', body)
        for tok in tokens:
            if tok.startswith('"'):
                out.append(re.escape(tok[1:-1].encode().decode("unicode_escape")))
            elif tok.startswith("["):
                out.append(tok)
            elif tok in "()|?*+":
                out.append(tok)
            else:
                out.append("(?:" + expand(rules[tok], depth + 1) + ")")
        return "".join(o.replace("(", "(?:") if o == "(" else o for o in out)

    return expand(rules["root"])


def walk(allowed_fn, advance_fn, steps: int, seed: int = 0) -> tuple[float, int]:
    rng = random.Random(seed)
    times, n = [], 0
    for _ in range(steps):
        t0 = time.perf_counter()
        allowed = allowed_fn()
        times.append(time.perf_counter() - t0)
        if not allowed:
            break
        if not advance_fn(rng.choice(allowed)):
            break
        n += 1
    return sum(times) / max(len(times), 1), n


def bench_xgrammar(tok, grammar: str, vocab: int, eos: int, steps: int) -> dict:
    import xgrammar as xgr

    from selfplay.rollout.constrained import unpack_bits

    t0 = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab, stop_token_ids=[eos])
    compiled = xgr.GrammarCompiler(info, cache_enabled=False).compile_grammar(grammar)
    compile_s = time.perf_counter() - t0
    m = xgr.GrammarMatcher(compiled)
    mask = xgr.allocate_token_bitmask(1, vocab)

    def allowed():
        if m.is_terminated():
            return []
        m.fill_next_token_bitmask(mask, 0)
        return unpack_bits(mask[0], vocab).nonzero().squeeze(-1).tolist()

    per, n = walk(allowed, lambda t: m.accept_token(t) and not m.is_terminated(), steps)
    return {"compile_s": compile_s, "mask_ms": per * 1e3, "steps": n}


def bench_lmfe(tok, regex: str, vocab: int, eos: int, steps: int) -> dict:
    from lmformatenforcer import RegexParser, TokenEnforcer, TokenEnforcerTokenizerData

    # its transformers integration does not import under transformers 5 (transformers.tokenization_utils is gone):
    # the same tokenizer data, built as that integration builds it
    t0 = time.perf_counter()
    zero = tok.encode("0")[-1]
    special = set(tok.all_special_ids)
    regular = []
    for i in range(vocab):
        if i not in special:
            after = tok.decode([zero, i])[1:]
            regular.append((i, after, len(after) > len(tok.decode([i]))))
    data = TokenEnforcerTokenizerData(regular, lambda ids: tok.decode(ids).rstrip("\ufffd"), eos, False, vocab)
    enforcer = TokenEnforcer(data, RegexParser(regex))
    prefix: list[int] = []
    enforcer.get_allowed_tokens(prefix)
    compile_s = time.perf_counter() - t0

    def advance(t):
        prefix.append(t)
        return t != eos

    per, n = walk(lambda: list(enforcer.get_allowed_tokens(prefix).allowed_tokens), advance, steps)
    return {"compile_s": compile_s, "mask_ms": per * 1e3, "steps": n}


def bench_tcfg(tok, grammar: str, vocab: int, eos: int, steps: int) -> dict:
    from transformers_cfg.generation.logits_process import GrammarConstrainedLogitsProcessor
    from transformers_cfg.grammar_utils import IncrementalGrammarConstraint

    t0 = time.perf_counter()
    constraint = IncrementalGrammarConstraint(grammar, "root", tok)
    proc = GrammarConstrainedLogitsProcessor(constraint)
    compile_s = time.perf_counter() - t0
    ids = [tok.bos_token_id or 0]

    def allowed():
        scores = proc(torch.tensor([ids]), torch.zeros(1, vocab))
        return torch.isfinite(scores[0]).nonzero().squeeze(-1).tolist()

    def advance(t):
        ids.append(t)
        return t != eos

    per, n = walk(allowed, advance, steps)
    return {"compile_s": compile_s, "mask_ms": per * 1e3, "steps": n}


def main() -> None:
    from transformers import AutoTokenizer

    from generator.grammars import free_grammar, mutation_grammar

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--libs", default="xgrammar,lmfe,tcfg")
    parser.add_argument("--steps", type=int, default=64)
    args = parser.parse_args()
    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    vocab, eos = len(tok), tok.eos_token_id
    print(f"tokenizer {type(tok).__name__}, vocabulary {vocab}")
    cases = {
        "xgrammar": [("mutation", bench_xgrammar, mutation_grammar()), ("free", bench_xgrammar, free_grammar())],
        "lmfe": [("mutation", bench_lmfe, mutation_regex())],
        "tcfg": [("mutation", bench_tcfg, mutation_grammar()), ("free", bench_tcfg, free_grammar())],
    }
    for lib in args.libs.split(","):
        for fmt, fn, grammar in cases[lib]:
            try:
                r = fn(tok, grammar, vocab, eos, args.steps)
                print(
                    f"{lib:>9} {fmt:>8}: compile {r['compile_s']:.3f} s, {r['mask_ms']:.3f} ms per token mask "
                    f"({r['steps']} steps walked)"
                )
            except Exception as exc:  # noqa: BLE001 - report what each library does with this tokenizer
                print(f"{lib:>9} {fmt:>8}: FAILED {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")


if __name__ == "__main__":
    main()
