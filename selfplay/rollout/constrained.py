"""Grammar-constrained decoding of the generator's answer (`generator.constrained`, docs/rl.md, docs/generator.md).

`compile_constraint(tokenizer, fmt, vocab_size)` compiles the format's grammar (generator/grammars.py) for the
model's tokenizer with xgrammar; a grammar that does not compile stops the run at start (a UserError naming
`generator.constrained`). `GrammarConstraint.start(batch)` gives one `Decoding` per `generate` call: at every step
it advances each row's matcher by the token just sampled, fills the rows' allowed-token bitmask and keeps it
(packed, 32 tokens per int32, on the CPU: [steps, ceil(V / 32)] per row, about 19 kB per step for a 150k
vocabulary). `rl.sampling_logprobs(logits, T, allowed)` turns those bits into the masked, renormalised
distribution that is sampled from, and the trainer scores each token under the same recorded bits.
`GrammarConstraint.per_prompt(grammars)` compiles one grammar per prompt (the mutation format's grammar of each
prompt's references, generator.grammars.prompt_grammar), handed to the batches of one `sample` call in order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from selfplay.runtime.errors import UserError

KEY = "generator.constrained"


def unpack_bits(packed: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[..., ceil(V / 32)] int32 bitmask (bit j of word i: token 32 i + j allowed) -> [..., V] bool."""
    shifts = torch.arange(32, dtype=torch.int32, device=packed.device)
    bits = (packed.to(torch.int32).unsqueeze(-1) >> shifts) & 1
    return bits.reshape(*packed.shape[:-1], -1)[..., :vocab_size].bool()


def words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


@dataclass
class GrammarConstraint:
    """A compiled grammar for one tokenizer and vocabulary size."""

    compiled: object
    vocab_size: int
    fmt: str
    compiler: object = None  # the xgrammar GrammarCompiler it came from (per_prompt compiles more with it)
    text: str = ""  # the EBNF it was compiled from (a vLLM engine compiles it again: selfplay.rollout.engine)

    def start(self, batch: int) -> "Decoding":
        return Decoding(self, batch)

    def per_prompt(self, grammars) -> "PromptGrammars":
        """One compiled grammar per prompt: each EBNF text (a text given more than once compiled once), or this
        grammar where the text is None."""
        texts = [self.text if g is None else g for g in grammars]
        compiled = {self.text: self.compiled}
        for text in texts:
            if text not in compiled:
                compiled[text] = self.compiler.compile_grammar(text)
        return PromptGrammars([compiled[t] for t in texts], self.vocab_size, self.fmt, texts=texts)


@dataclass
class PromptGrammars:
    """One compiled grammar per prompt; each `start(batch)` takes the next `batch` of them (the prompts of one
    `sample` call, batch after batch)."""

    rows: list
    vocab_size: int
    fmt: str
    used: int = 0
    texts: list = field(default_factory=list)  # each row's EBNF

    def start(self, batch: int) -> "Decoding":
        rows = self.rows[self.used: self.used + batch]
        if len(rows) != batch:
            raise RuntimeError(f"{batch} prompts to decode but {len(rows)} grammars left")
        self.used += batch
        return Decoding(self, batch, rows)


class Decoding:
    """The matchers of one batch; `step(input_ids, new)` -> the [B, V] bool mask of this step (recorded)."""

    def __init__(self, constraint, batch: int, rows=None):
        import xgrammar as xgr

        self.constraint = constraint
        self.matchers = [xgr.GrammarMatcher(c) for c in (rows if rows is not None else [constraint.compiled] * batch)]
        self.bitmask = xgr.allocate_token_bitmask(batch, constraint.vocab_size)
        self.steps: list[torch.Tensor] = []  # packed [B, words] per generated step

    def step(self, last_tokens: torch.Tensor | None) -> torch.Tensor:
        """Advance every live row by its last sampled token (none on the first step) and return this step's
        allowed-token mask. A row whose grammar has ended (or that took a token after its stop) allows every token:
        Hugging Face pads finished rows, and those steps are dropped from the answer."""
        self.bitmask.fill_(-1)
        for b, matcher in enumerate(self.matchers):
            if last_tokens is not None and not matcher.is_terminated():
                if not matcher.accept_token(int(last_tokens[b])):  # cannot happen: the token was allowed
                    raise RuntimeError(f"row {b}: sampled token {int(last_tokens[b])} outside the grammar")
            if not matcher.is_terminated():
                matcher.fill_next_token_bitmask(self.bitmask, b)
        self.steps.append(self.bitmask.clone())
        return unpack_bits(self.bitmask, self.constraint.vocab_size)

    def recorded(self, b: int, n: int) -> torch.Tensor:
        """Row b's packed masks of its first n steps: [n, words] int32."""
        return torch.stack([s[b] for s in self.steps[:n]])


def compile_constraint(tokenizer, fmt: str, vocab_size: int, stop_token_ids=None) -> GrammarConstraint:
    """The grammar of `generator.format=fmt` compiled for this tokenizer (logits of `vocab_size` entries). Refuses
    (UserError naming generator.constrained) a format without a grammar or a grammar that does not compile."""
    from generator.grammars import GRAMMARS

    if fmt not in GRAMMARS:
        raise UserError(f"{KEY}=true: no grammar for generator.format={fmt!r} (one of {', '.join(GRAMMARS)})")
    return compile_grammar(tokenizer, GRAMMARS[fmt](), vocab_size, stop_token_ids, fmt)


def compile_grammar(tokenizer, grammar: str, vocab_size: int, stop_token_ids=None, fmt: str = "") -> GrammarConstraint:
    try:
        import xgrammar as xgr

        kw = {"stop_token_ids": list(stop_token_ids)} if stop_token_ids else {}
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, **kw)
        compiler = xgr.GrammarCompiler(info)
        compiled = compiler.compile_grammar(grammar)
    except Exception as exc:  # noqa: BLE001 - any failure to build the grammar is the configuration's
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"{KEY}=true: the {fmt or 'given'} grammar cannot be compiled for this tokenizer: "
                        f"{first[:200]}") from exc
    return GrammarConstraint(compiled, vocab_size, fmt, compiler, grammar)
