"""Grammar-constrained decoding (generator.constrained): the sampler draws from the masked, renormalised
distribution, and the trainer scores every token under the same mask (old, new, reference)."""

import random

import hypothesis
import pytest
import torch

from generator.agent import ProposalError
from generator.mutation import MAX_ANSWER_TOKENS, parse_mutation
from selfplay.models.agent import LMAgent
from selfplay.models.factory import ActorCritic, build_tiny_model, frozen_copy, train_tokenizer
from selfplay.rl import core as rl
from selfplay.rl import ppo
from selfplay.rollout.constrained import compile_constraint, compile_grammar, unpack_bits
from selfplay.runtime.config import PPOConfig
from selfplay.runtime.errors import UserError

pytest.importorskip("xgrammar")

TEXTS = [
    "REF 1\nEDIT add 3 take last 2\nEND\n",
    "REF 2\nEDIT const 1 k=5\nEND\n",
    "def solve(xs):\n    return xs\n",
    "DESCRIPTION: Keep the even numbers.\nSIGNATURE: def solve(xs: list[int]) -> list[int]\nINPUTS:\n[[1, 2]]\n",
    "filter map sort top_k largest smallest window group reverse dedup sink swap splice order drop type",
] * 20


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(TEXTS, vocab_size=400, kind="bpe")


def agent(tok, seed=0, temperature=1.0):
    torch.manual_seed(seed)
    policy = build_tiny_model(tok, n_layer=1, n_embd=32, n_head=2, max_positions=160)
    cfg = PPOConfig(
        mini_batch_size=4, micro_batch_size=2, max_new_tokens=MAX_ANSWER_TOKENS, temperature=temperature, epochs=1
    )
    return LMAgent("generator", ActorCritic(policy), frozen_copy(policy), tok, cfg, seed=seed)


def prompts(a, n):
    return [a.chat_ids(f"Edit one reference task's program. {i}") for i in range(n)]


def test_random_model_under_the_mutation_grammar_always_parses(tok):
    a = agent(tok, temperature=1.0)
    a.constrain("mutation")
    answers = a.sample(prompts(a, 32), max_new_tokens=MAX_ANSWER_TOKENS)
    parsed = [parse_mutation(x.text) for x in answers]
    bad = [(x.text, p.reason) for x, p in zip(answers, parsed) if isinstance(p, ProposalError)]
    assert not bad, bad[:3]
    assert len({x.text for x in answers}) > 16  # the grammar leaves real choice
    a.constraint = None  # the same model unconstrained parses (almost) never
    free = [parse_mutation(x.text) for x in a.sample(prompts(a, 32), max_new_tokens=MAX_ANSWER_TOKENS)]
    assert sum(not isinstance(p, ProposalError) for p in free) == 0


def test_a_random_model_under_its_prompts_grammars_proposes_only_edits_that_compile(tok):
    """Mutation format, generator.constrained: each answer is decoded under its own prompt's grammar, so every one
    parses and compiles (no `edit` rejection), whatever the weights."""
    import sandbox
    from generator.build import materialise, sample_params
    from selfplay.rollout.episodes import generator_rollouts

    rng = random.Random(1)
    tasks = [materialise(sample_params(rng, 1 + i % 3), "train") for i in range(12)]
    a = agent(tok, temperature=1.0)
    a.constrain("mutation")
    base = a.constraint
    with sandbox.open_sandbox(backend="process", timeout_s=5.0) as sb:
        rollouts = generator_rollouts(
            a, [rng.sample(tasks, 2) for _ in range(10)], sb, step=1, rng=rng, max_prompt_tokens=60, fmt="mutation"
        )
    assert a.constraint is base  # the catalogue grammar is back for the next call
    assert [(r.rejection, r.reasons) for r in rollouts if r.rejection in ("unparsable", "edit")] == []
    assert all(r.task is not None and r.answer.allowed is not None for r in rollouts)
    assert len({r.answer.text for r in rollouts}) > 5


def test_free_grammar_answers_follow_the_sections(tok):
    a = agent(tok)
    a.constrain("free")
    answers = a.sample(prompts(a, 8), max_new_tokens=24)
    for x in answers:  # a random model writes long lines: each (truncated) answer is a prefix of the shape
        assert "DESCRIPTION: ".startswith(x.text[:13]) or x.text.startswith("DESCRIPTION: "), x.text


def test_an_answer_the_token_limit_cuts_off_is_rejected_saying_so(tok):
    """Under the free grammar every answer that ends parses; one cut off by the token limit is unparsable, and its
    reason names the cut, so a researcher tells a short limit from a grammar the parser disagrees with."""
    import sandbox
    from generator.build import materialise, sample_params
    from selfplay.rollout.episodes import generator_rollouts

    rng = random.Random(2)
    tasks = [materialise(sample_params(rng, 1), "train") for _ in range(4)]
    a = agent(tok)
    a.constrain("free")
    with sandbox.open_sandbox(backend="process", timeout_s=5.0) as sb:
        rollouts = generator_rollouts(
            a, [[t] for t in tasks], sb, step=1, rng=rng, max_prompt_tokens=60, max_new_tokens=24, fmt="free"
        )
    assert all(not r.answer.finished and len(r.answer.tokens) == 24 for r in rollouts)
    assert all(
        r.rejection == "unparsable" and r.parse_error.startswith("cut off at 24 tokens before its end: ")
        for r in rollouts
    ), [r.parse_error for r in rollouts]


def test_masked_positions_are_minus_inf_and_the_distribution_sums_to_one():
    logits = torch.randn(3, 5, 50)
    allowed = torch.rand(3, 5, 50) < 0.3
    allowed[..., 0] = True
    logdist = rl.sampling_logprobs(logits, 0.7, allowed)
    assert torch.isneginf(logdist[~allowed]).all() and torch.isfinite(logdist[allowed]).all()
    assert torch.allclose(logdist.exp().sum(-1), torch.ones(3, 5))
    full = rl.sampling_logprobs(logits, 0.7, torch.ones_like(allowed))
    assert torch.equal(full, rl.sampling_logprobs(logits, 0.7))
    ent = rl.entropy_from_logits(logdist)  # entropy of the masked distribution, finite
    p = logdist.exp()
    assert torch.allclose(ent, -(p * logdist.masked_fill(~allowed, 0)).sum(-1), atol=1e-5)


def test_unpack_bits_round_trips():
    allowed = torch.rand(4, 70) < 0.5
    packed = torch.zeros(4, 3, dtype=torch.int64)
    for j in range(70):
        packed[:, j // 32] |= allowed[:, j].long() << (j % 32)
    packed = ((packed + 2**31) % 2**32 - 2**31).to(torch.int32)  # as int32 words
    assert torch.equal(unpack_bits(packed, 70), allowed)


def test_trainer_scores_equal_the_samplers_under_the_grammar_and_ratios_are_one(tok):
    a = agent(tok, temperature=0.8)
    a.constrain("mutation")
    ps = prompts(a, 4)
    samples, scores = ppo.generate(
        a.model,
        ps,
        pad_token_id=tok.pad_token_id,
        eos_token_id=a.eos_ids,
        max_new_tokens=MAX_ANSWER_TOKENS,
        temperature=0.8,
        return_scores=True,
        constraint=a.constraint,
    )
    assert all(s.allowed is not None and len(s.allowed) == len(s.tokens) for s in samples)
    # the sampled distribution is masked: excluded tokens -inf, and it sums to 1
    step0 = scores[:, 0]
    assert torch.isneginf(step0).any() and torch.allclose(step0.exp().sum(-1), torch.ones(4), atol=1e-5)
    t = a.trainer
    queries, responses = ps, [s.tokens for s in samples]
    packed = ppo.pack_allowed(
        [s.allowed for s in samples], ppo.first_action(ppo.pad_rollouts(queries, responses, tok.pad_token_id)[2])[1]
    )
    r, _ = t._prepare(queries, responses, [1.0, 0.0, 0.5, 0.0], None, None, [s.allowed for s in samples])
    for b, s in enumerate(samples):
        pos = r.action_mask[b].bool()
        assert torch.allclose(r.old_logp[b][pos], torch.tensor(s.logprobs), atol=1e-5)
    # the reference is the policy's frozen copy: its masked scores equal them too (KL 0)
    ids, att = r.input_ids, r.attention_mask
    ref = t._ref_logprobs(ids, att, r.start, packed)
    assert torch.allclose(ref[r.action_mask.bool()], r.old_logp[r.action_mask.bool()], atol=1e-5)
    # the same tokens scored without the mask differ (the mask matters)
    unmasked = t._ref_logprobs(ids, att, r.start)
    assert not torch.allclose(unmasked[r.action_mask.bool()], ref[r.action_mask.bool()], atol=1e-3)
    # one PPO step on constrained rollouts: new == old before the first optimiser step
    answers = a.sample(ps)
    before = [p.clone() for p in a.module.parameters()]
    stats = a.update(answers, [1.0, 0.0, 0.5, 0.0])
    assert stats["approx_kl"] == 0.0 and stats["clipfrac"] == 0.0 and stats["kl"] == pytest.approx(0.0, abs=1e-6)
    assert all(torch.isfinite(torch.tensor(v)) for k, v in stats.items() if isinstance(v, float) and k != "lr")
    assert any(not torch.equal(p, q) for p, q in zip(before, a.module.parameters()))


def test_a_grammar_that_cannot_be_compiled_is_refused_naming_the_key(tok):
    with pytest.raises(UserError, match="generator.constrained"):
        compile_grammar(tok, 'root ::= "REF " undefined_rule', 400)
    with pytest.raises(UserError, match="generator.constrained"):
        compile_constraint(tok, "prose", 400)
    with pytest.raises(UserError, match="generator.constrained"):
        compile_grammar(object(), 'root ::= "a"', 400)  # not a tokenizer


def test_every_warm_start_target_is_in_its_grammar(tok):
    """The grammars are not tighter than the formats: the warm start's targets (procedural tasks in the free format,
    drawn mutations) are all accepted, to their end."""
    import xgrammar as xgr

    from generator.agent import format_proposal
    from generator.build import materialise, sample_params
    from generator.mutation import choose_mutation_instruction, format_mutation, random_mutation

    rng = random.Random(0)
    tasks = [materialise(sample_params(rng, 1 + i % 4), "train") for i in range(60)]
    mutations = []
    for _ in range(120):
        refs = rng.sample(tasks, 3)
        found = random_mutation(rng, refs, choose_mutation_instruction(rng, refs))
        if found is not None:
            mutations.append(format_mutation(found[0]))
    assert len(mutations) > 60
    for fmt, texts in (("free", [format_proposal(t) for t in tasks]), ("mutation", mutations)):
        compiled = compile_constraint(tok, fmt, len(tok)).compiled
        for text in texts:
            matcher = xgr.GrammarMatcher(compiled)
            assert matcher.accept_string(text), (fmt, text)
            assert matcher.accept_token(tok.eos_token_id) and matcher.is_terminated(), (fmt, text)


@pytest.mark.slow  # measured over 9 s: out of the fast subset
def test_answers_the_novelty_screen_strikes_are_drawn_again_and_scored_under_their_own_grammar(tok):
    """generator.redraws: an answer whose program or behaviour the corpus has is struck from its prompt's grammar
    and drawn again; what is kept is never a novelty rejection unless every redraw was spent, and the trainer
    scores a redrawn answer's tokens exactly as the sampler drew them (under the smaller grammar)."""
    import sandbox
    from generator.build import generate_tasks
    from generator.validity import MemoryIndex
    from selfplay.rollout.episodes import generator_rollouts

    rng = random.Random(4)
    a = agent(tok, temperature=1.0)
    a.constrain("mutation")
    with sandbox.open_sandbox(backend="process", timeout_s=5.0) as sb:
        corpus = generate_tasks(300, split="train", seed=5, sb=sb)  # validated: fingerprints from the sandbox
        index = MemoryIndex(corpus)
        groups = [[t] for t in rng.sample(corpus, 24)]
        sampled_before = a.sampled_tokens
        rollouts = generator_rollouts(
            a, groups, sb, step=1, rng=rng, corpus_index=index, max_prompt_tokens=60, fmt="mutation", redraws=3
        )
    redrawn = [r for r in rollouts if r.redrawn]
    assert redrawn, "no answer of a random model hit a known behaviour: the test shows nothing"
    # what the agent counts as sampled (the loop's compute/generator_tokens) includes the struck answers' tokens
    kept = sum(len(r.answer.tokens) for r in rollouts)
    assert a.sampled_tokens - sampled_before > kept
    assert all(r.rejection != "novel" or r.redrawn == 3 for r in rollouts), [(r.redrawn, r.reasons) for r in rollouts]
    answers = [r.answer for r in redrawn[:4]]
    prepared, _ = a.trainer._prepare(
        [x.prompt for x in answers],
        [x.tokens for x in answers],
        [0.0] * len(answers),
        None,
        None,
        [x.allowed for x in answers],
    )
    for b, x in enumerate(answers):
        pos = prepared.action_mask[b].bool()
        assert torch.allclose(prepared.old_logp[b][pos], torch.tensor(x.logprobs), atol=1e-5)


# ---- the free format tied: SIGNATURE's function in CODE (generator.tie_signature) ---------------------------
MISMATCHED = (
    "DESCRIPTION: Keep the even numbers.\nSIGNATURE: def solve(xs: list[int], k: int) -> list[int]\n"
    "CODE:\ndef solve(xs):\n    return xs\nINPUTS:\n[[1, 2], 3]\nEND\n"
)


@pytest.fixture(scope="module")
def mismatcher(tok):
    """A generator that has learnt one free answer by heart, whose CODE defines solve(xs) under a SIGNATURE of
    solve(xs, k): sampled from under the one free grammar it writes the mismatch."""
    from selfplay.rl.sft import sft

    torch.manual_seed(0)
    policy = build_tiny_model(tok, n_layer=2, n_embd=64, n_head=2, max_positions=192)
    cfg = PPOConfig(mini_batch_size=4, micro_batch_size=2, max_new_tokens=128, temperature=1.0, epochs=1)
    a = LMAgent("generator", ActorCritic(policy), frozen_copy(policy), tok, cfg, seed=0)
    answer = list(tok(MISMATCHED, add_special_tokens=False)["input_ids"]) + [a.eos_ids[0]]
    examples = [(p, answer) for p in prompts(a, 8)]
    sft(policy, examples, steps=150, batch_size=8, lr=1e-2, pad_id=tok.pad_token_id, max_len=192, warmup=10)
    a.constrain("free")
    return a


def _code_params(text: str):
    import ast

    from generator.agent import parse_proposal

    parsed = parse_proposal(text)
    if isinstance(parsed, ProposalError):
        return None
    fn = next(n for n in ast.parse(parsed.code).body if isinstance(n, ast.FunctionDef))
    return [a.arg for a in fn.args.args]


def test_tied_answers_define_the_signatures_parameters_and_are_scored_as_sampled(mismatcher):
    """Drawn in two stages (episodes._sample_tied), the memorised mismatch cannot be written: every finished answer's
    CODE takes SIGNATURE's parameters; under the one grammar the same model writes solve(xs). The trainer scores each
    joined answer's tokens exactly as the two stages drew them."""
    from selfplay.rollout.episodes import _sample_tied

    a = mismatcher
    ps = prompts(a, 16)
    untied = [_code_params(x.text) for x in a.sample(ps, max_new_tokens=128)]
    assert untied.count(["xs"]) >= 8, untied  # the model writes the mismatch: the test can fail
    tied = _sample_tied(a, a.constraint, ps, 128)
    assert a.constraint is not None and not hasattr(a.constraint, "rows")  # the agent's grammar is given back
    finished = [x for x in tied if x.finished]
    assert len(finished) >= 8, [x.text for x in tied]
    assert all(_code_params(x.text) == ["xs", "k"] for x in finished), [x.text for x in finished]
    for x in tied:
        assert len(x.allowed) == len(x.tokens) == len(x.logprobs) and x.prompt in ps
        assert x.text == a.decode(x.tokens) and x.text.startswith("DESCRIPTION: ")
    prepared, _ = a.trainer._prepare(
        [x.prompt for x in tied[:6]], [x.tokens for x in tied[:6]], [0.0] * 6, None, None, [x.allowed for x in tied[:6]]
    )
    for b, x in enumerate(tied[:6]):
        pos = prepared.action_mask[b].bool()
        assert torch.allclose(prepared.old_logp[b][pos], torch.tensor(x.logprobs), atol=1e-5)


def test_tied_answers_keep_the_one_stage_token_budget(mismatcher):
    """The two stages share one budget: no answer is longer than it, and one the budget cuts off says so."""
    from selfplay.rollout.episodes import _sample_tied

    ps = prompts(mismatcher, 6)
    for budget in (30, 40):  # the answer learnt is 64 tokens, 34 of them to its SIGNATURE line's end
        answers = _sample_tied(mismatcher, mismatcher.constraint, ps, budget)
        assert all(len(x.tokens) <= budget for x in answers)
        assert all(not x.finished and len(x.tokens) == budget for x in answers), [len(x.tokens) for x in answers]


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(
    lengths=hypothesis.strategies.lists(hypothesis.strategies.integers(1, 100), min_size=1, max_size=12),
    data=hypothesis.strategies.data(),
)
def test_rest_groups_give_every_row_its_budget(lengths, data):
    from selfplay.rollout.episodes import _rest_groups

    limit = 160
    needs = [data.draw(hypothesis.strategies.integers(1, limit - n)) for n in lengths]
    groups = _rest_groups(lengths, needs, limit)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for g in groups:  # the batch's room (the positions less its longest prompt) covers each row's need
        assert all(limit - max(lengths[j] for j in g) >= needs[i] for i in g)
    assert len(_rest_groups(lengths, needs, None)) == 1


def test_generator_rollouts_tie_the_free_signature_unless_told_not_to(mismatcher):
    """generator.tie_signature in the rollouts: untied, the memorised answer parses and fails the signature check;
    tied (the default), no proposal is rejected for its signature."""
    import sandbox
    from generator.build import materialise, sample_params
    from selfplay.rollout.episodes import generator_rollouts

    rng = random.Random(3)
    groups = [[materialise(sample_params(rng, 1), "train")] for _ in range(12)]
    with sandbox.open_sandbox(backend="process", timeout_s=5.0) as sb:
        runs = {
            tie: generator_rollouts(
                mismatcher,
                groups,
                sb,
                step=1,
                rng=random.Random(0),
                max_prompt_tokens=60,
                max_new_tokens=128,
                fmt="free",
                tie_signature=tie,
            )
            for tie in (False, True)
        }
    assert sum(r.rejection == "signature" for r in runs[False]) >= 4, [r.rejection for r in runs[False]]
    assert not any(r.rejection == "signature" for r in runs[True]), [
        (r.reasons, r.answer.text) for r in runs[True] if r.rejection == "signature"
    ]
    assert sum(r.parsed for r in runs[True]) >= 4, [r.parse_error for r in runs[True]]


# ---- closing a cut-off answer inside its budget (generator.close_reserve) ------------------------------------------
@pytest.fixture(scope="module")
def closer(tok):
    from selfplay.rollout.constrained import CLOSING_ORDER, Closer

    c = Closer(tok, len(tok), [tok.eos_token_id])
    assert set(CLOSING_ORDER) <= set(c.single)  # the tokenizer writes every closing character alone
    return c


def test_one_hot_bits_allow_only_their_token():
    from selfplay.rollout.constrained import one_hot_bits

    tokens = [0, 5, 31, 32, 63, 69]
    bits = unpack_bits(one_hot_bits(tokens, 70), 70)
    assert bits.sum(-1).tolist() == [1] * len(tokens)
    assert bits.nonzero()[:, 1].tolist() == tokens


@hypothesis.settings(max_examples=60, deadline=None, suppress_health_check=[hypothesis.HealthCheck.too_slow])
@hypothesis.given(seed=hypothesis.strategies.integers(0, 10_000), cut=hypothesis.strategies.floats(0.0, 1.0))
def test_a_proposal_cut_anywhere_is_closed_into_one_that_parses(tok, closer, seed, cut):
    """Any prefix of a procedural proposal (what a warm-started generator writes), drawn in the tied stages as the
    loop draws it (generator.tie_signature), is ended by the closer within 120 characters a stage, and the closed
    answer is read by `parse_proposal`, its CODE defining SIGNATURE's function, each INPUTS line of its arity."""
    import ast

    import xgrammar as xgr

    from generator.agent import format_proposal, parse_proposal
    from generator.build import materialise, sample_params
    from generator.grammars import free_head_grammar, free_tail_grammar
    from generator.validity import parse_signature

    def close(grammar: str, prefix: str) -> str:
        matcher = xgr.GrammarMatcher(compile_grammar(tok, grammar, len(tok)).compiled)
        assert matcher.accept_string(prefix)
        closing = closer.text(matcher, 120)
        assert closing is not None, prefix
        return prefix + closing

    text = format_proposal(materialise(sample_params(random.Random(seed), 1 + seed % 4), "train"))
    prefix = text[: int(cut * (len(text) - 1))]
    at = text.find("\nCODE:") + 1
    head = close(free_head_grammar(), prefix) if len(prefix) < at else text[:at]
    signature = head.split("\nSIGNATURE: ", 1)[-1].strip()
    answer = head + close(free_tail_grammar(signature), prefix[at:] if len(prefix) >= at else "")
    parsed = parse_proposal(answer)
    assert not isinstance(parsed, ProposalError), (answer, parsed)
    sig = parse_signature(parsed.signature)
    fn = next(n for n in ast.parse(parsed.code).body if isinstance(n, ast.FunctionDef))
    assert fn.name == sig.name and [a.arg for a in fn.args.args] == [a.arg for a in sig.args.args]
    assert all(len(args) == len(sig.args.args) for args in parsed.inputs)


def test_cut_off_answers_are_closed_and_their_forced_tokens_scored_as_sampled(tok):
    """generator.close_reserve: sampling stops the reserve short of the budget, each answer unfinished there is
    closed under its grammar within the budget, and the closing's tokens carry masks that allow only them: the
    sampler's log-prob and the trainer's (old policy and reference) are 0 there, and a PPO step's ratios are 1."""
    from generator.agent import parse_proposal

    a = agent(tok, temperature=1.0)
    a.constrain("free", close_reserve=96)
    ps = prompts(a, 4)
    answers = a.sample(ps, max_new_tokens=128)
    assert all(x.finished and x.closed > 0 and len(x.tokens) <= 128 for x in answers), [len(x.tokens) for x in answers]
    assert all(len(x.tokens) - x.closed <= 128 - 96 for x in answers)  # sampled within the budget less the reserve
    assert all(not isinstance(parse_proposal(x.text), ProposalError) for x in answers), [x.text for x in answers]
    for x in answers:
        forced = unpack_bits(x.allowed[-x.closed :], len(tok))
        assert forced.sum(-1).tolist() == [1] * x.closed and x.logprobs[-x.closed :] == [0.0] * x.closed
    t = a.trainer
    queries, responses, allowed = ps, [x.tokens for x in answers], [x.allowed for x in answers]
    r, _ = t._prepare(queries, responses, [1.0, 0.0, 0.5, 0.0], None, None, allowed)
    packed = ppo.pack_allowed(allowed, ppo.first_action(ppo.pad_rollouts(queries, responses, tok.pad_token_id)[2])[1])
    ref = t._ref_logprobs(r.input_ids, r.attention_mask, r.start, packed)
    for b, x in enumerate(answers):
        pos = r.action_mask[b].bool()
        assert torch.allclose(r.old_logp[b][pos], torch.tensor(x.logprobs), atol=1e-5)
        assert torch.allclose(r.old_logp[b][pos][-x.closed :], torch.zeros(x.closed), atol=1e-6)
        assert torch.allclose(ref[b][pos], r.old_logp[b][pos], atol=1e-5)
    stats = a.update(answers, [1.0, 0.0, 0.5, 0.0])
    assert stats["approx_kl"] == 0.0 and stats["clipfrac"] == 0.0
    a.close_reserve, a.closer = 0, None  # without the reserve the same budget cuts them off
    assert not any(x.finished for x in a.sample(ps, max_new_tokens=32))


def test_an_answer_cut_inside_a_characters_bytes_is_closed_taking_back_what_no_closing_follows(tok):
    """An answer cut after any one byte token the grammar accepts (a character's first bytes, as sampling leaves
    them) is closed. Where no closing follows that byte (a four-byte character's lead: its remaining bytes are no
    one-character token's), the closing takes sampled tokens back first, at most CLOSING_BACKOFF; the tokens,
    masks and log-probs kept are the sampled ones."""
    import xgrammar as xgr

    from generator.agent import parse_proposal
    from selfplay.rollout.constrained import CLOSING_BACKOFF, close_answers
    from selfplay.rollout.engines import Answer

    a = agent(tok)
    a.constrain("free", close_reserve=96)
    head = tok("DESCRIPTION: caf", add_special_tokens=False)["input_ids"]
    words = (len(tok) + 31) // 32
    taken_back = 0
    for byte in (i for i in range(len(tok)) if tok.decode([i]) == "\ufffd"):
        tokens, matcher = head + [byte], xgr.GrammarMatcher(a.constraint.compiled)
        if not all(matcher.accept_token(t) for t in tokens):  # not a first byte of a character the grammar allows
            continue
        allowed = torch.randint(0, 2**31 - 1, (len(tokens), words), dtype=torch.int32)
        answer = Answer([1], list(tokens), tok.decode(tokens), False, allowed.clone(), [-0.5] * len(tokens))
        assert close_answers([answer], [a.constraint.compiled], a.closer, [96], a.decode) == 1, byte
        kept = len(answer.tokens) - answer.closed
        assert answer.finished and len(tokens) - CLOSING_BACKOFF <= kept and len(answer.tokens) <= len(tokens) + 96
        assert answer.tokens[:kept] == tokens[:kept] and answer.logprobs == [-0.5] * kept + [0.0] * answer.closed
        assert torch.equal(answer.allowed[:kept], allowed[:kept])
        assert not isinstance(parse_proposal(answer.text), ProposalError), answer.text
        taken_back += kept < len(tokens)
    assert taken_back > 0  # some byte has no closing after it: the case sampling met


def test_a_negative_close_reserve_is_refused_naming_the_key():
    from selfplay.runtime.config import load_config

    with pytest.raises(UserError, match="generator.close_reserve"):
        load_config(None, ["generator.close_reserve=-1"])
