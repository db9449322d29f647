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

    def start(self, batch: int) -> Decoding:
        return Decoding(self, batch)

    def per_prompt(self, grammars) -> PromptGrammars:
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

    def start(self, batch: int) -> Decoding:
        rows = self.rows[self.used : self.used + batch]
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
        raise UserError(
            f"{KEY}=true: the {fmt or 'given'} grammar cannot be compiled for this tokenizer: {first[:200]}"
        ) from exc
    return GrammarConstraint(compiled, vocab_size, fmt, compiler, grammar)


# ---- closing an answer inside its token budget (generator.close_reserve) ------------------------------------------
# The characters a closing tries first, in this order: brackets and the line's end close what is open, "0" is the
# shortest operand, "I" and "E" begin INPUTS and END, ":" before "," (a dict's key wants its value; a list needs no
# more items). Inside free text (a string, the description: nearly every character allowed) the line's end or a
# quote comes first, one that leaves the free text before one that does not. The other characters follow.
CLOSING_ORDER = (
    ")",
    "]",
    "}",
    "\n",
    "0",
    "I",
    "E",
    ":",
    ",",
    " ",
    "e",
    "l",
    "s",
    "i",
    "n",
    "x",
    "(",
    "[",
    "=",
    '"',
    "'",
)
FREE_TEXT_ORDER = ("\n", '"', "'")
CLOSING_BRANCHES = 6  # the first few characters of each state are tried; the rest are never needed in practice
CLOSING_NODES = 4000  # states a search may visit before it gives up (the answer then stays cut off)


class Closer:
    """The shortest way this tokenizer's one-character tokens find to end an answer under its grammar: a best-first
    search from the matcher's state, fewest departures from the closing order first, then fewest characters. The
    closing is then written in the tokenizer's own tokens where they take the same way (fewer tokens), else one
    character a token, and ends with the grammar's end (end of sequence)."""

    def __init__(self, tokenizer, vocab_size: int, eos_ids):
        self.tokenizer, self.vocab_size, self.eos = tokenizer, vocab_size, list(eos_ids)
        single: dict[str, int] = {}
        for piece, i in sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1]):
            text = tokenizer.convert_tokens_to_string([piece])
            if i < vocab_size and len(text) == 1 and (text.isprintable() or text == "\n"):
                single.setdefault(text, i)
        self.single = single
        self.rest = [c for c in single if c not in CLOSING_ORDER]

    def _allowed(self, matcher, bitmask) -> set[str] | None:
        """The characters allowed next; None where the grammar may end here."""
        matcher.fill_next_token_bitmask(bitmask, 0)
        words = bitmask[0].tolist()

        def on(i: int) -> bool:
            return bool((words[i >> 5] >> (i & 31)) & 1)

        if any(on(e) for e in self.eos if e < self.vocab_size):
            return None
        return {c for c, i in self.single.items() if on(i)}

    def _free_text(self, allowed) -> bool:
        return allowed is not None and len(allowed) >= len(self.single) - 8

    def _options(self, matcher, bitmask, last: str = "") -> list[str] | None:
        """The characters allowed next, in closing order; None where the grammar may end here. After a name or a
        number's character (`last`), what would only lengthen it comes after everything else."""
        allowed = self._allowed(matcher, bitmask)
        if allowed is None:
            return None
        order: list[str] = []
        if self._free_text(allowed):  # the ender first: the line's end or the quote after which it is not free text
            enders = [c for c in FREE_TEXT_ORDER if c in allowed]
            leaves = {c for c in enders if not self._free_text(self._allowed(_after(matcher, self.single[c]), bitmask))}
            order = sorted(enders, key=lambda c: c not in leaves)
        seen: set[str] = set()
        options = [c for c in (*order, *CLOSING_ORDER, *self.rest) if c in allowed and not (c in seen or seen.add(c))]
        if _word(last) and not self._free_text(allowed):
            options.sort(key=_word)
        return options

    def text(self, matcher, limit: int, last: str = "") -> str | None:
        """The closing characters (at most `limit`) from this matcher's state (after the character `last`), or None
        if none was found."""
        import heapq

        import xgrammar as xgr

        bitmask = xgr.allocate_token_bitmask(1, self.vocab_size)
        heap, count = [(0, 0, 0, matcher.fork(), "")], 0
        while heap and count < CLOSING_NODES:
            departures, depth, _, state, path = heapq.heappop(heap)
            options = self._options(state, bitmask, path[-1:] or last)
            if options is None:
                return path
            if depth >= limit:
                continue
            for rank, ch in enumerate(options[:CLOSING_BRANCHES]):
                count += 1
                heapq.heappush(heap, (departures + rank, depth + 1, count, _after(state, self.single[ch]), path + ch))
        return None

    def tokens(self, matcher, limit: int, last: str = "") -> list[int] | None:
        """The closing as token ids, end of sequence included, within `limit` tokens; None if it does not fit. The
        matcher is left as it was."""
        text = self.text(matcher, limit - 1, last)
        if text is None:
            return None
        own = list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []
        for ids in (own, [self.single[c] for c in text]):
            trial = matcher.fork()
            if (
                len(ids) < limit
                and all(i < self.vocab_size and trial.accept_token(i) for i in ids)
                and trial.accept_token(self.eos[0])
            ):
                return ids + [self.eos[0]]
        return None


def _word(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


def _after(matcher, token: int):
    child = matcher.fork()
    child.accept_token(token)
    return child


def one_hot_bits(tokens, vocab_size: int) -> torch.Tensor:
    """Packed masks [len(tokens), words] that allow only each step's token: a forced step, whose log-prob under the
    masked distribution is 0 for every policy."""
    out = torch.zeros(len(tokens), words(vocab_size), dtype=torch.int32)
    for row, t in enumerate(tokens):
        word, bit = divmod(int(t), 32)
        out[row, word] = (1 << bit) - (1 << 32 if bit == 31 else 0)  # bit 31 is the int32's sign bit
    return out


def grammars_ahead(constraint, n: int) -> list:
    """The compiled grammars of the next n prompts this constraint decodes (not taken)."""
    if hasattr(constraint, "rows"):
        return list(constraint.rows[constraint.used : constraint.used + n])
    return [constraint.compiled] * n


CLOSING_BACKOFF = 4  # sampled tokens a closing may take back where none ends the answer from its last one


def close_answers(answers, grammars, closer: Closer, room, decode) -> int:
    """Ends each answer the token budget cut off (not finished) with `closer`'s closing, within `room[i]` more
    tokens, under the grammar it was drawn with; each closing token is recorded with a mask that allows only it
    (and a sampler's log-prob of 0), and the text is decoded again with `decode`. Where no closing starts from the
    last sampled token (it ends inside a character's bytes, whose remaining bytes no one-character token writes),
    up to CLOSING_BACKOFF sampled tokens are taken back first: the answer is then a shorter sample, closed. Answers
    are changed in place; returns how many were closed."""
    import xgrammar as xgr

    closed = 0
    for answer, compiled, limit in zip(answers, grammars, room):
        if answer.finished or answer.allowed is None or limit < 1:
            continue
        matcher = xgr.GrammarMatcher(compiled)
        if not all(matcher.accept_token(int(t)) for t in answer.tokens):
            continue
        ids, keep = None, len(answer.tokens)
        while ids is None and keep >= len(answer.tokens) - CLOSING_BACKOFF and keep >= 0:
            if keep < len(answer.tokens):
                matcher.rollback(1)
            last = answer.text[-1:] if keep == len(answer.tokens) else decode(answer.tokens[:keep])[-1:]
            ids = closer.tokens(matcher, limit + len(answer.tokens) - keep, last)
            keep -= ids is None
        if ids is None:
            continue
        if keep < len(answer.tokens):
            answer.tokens, _, answer.allowed, answer.logprobs = answer.cut(keep)
        answer.tokens = list(answer.tokens) + ids
        answer.allowed = torch.cat([answer.allowed, one_hot_bits(ids, closer.vocab_size)])
        if answer.logprobs is not None:
            answer.logprobs = list(answer.logprobs) + [0.0] * len(ids)
        answer.text, answer.finished, answer.closed = decode(answer.tokens), True, len(ids)
        closed += 1
    return closed
