"""Model factory: tiny tokenizer + model built, saved and reloaded through the same path as pretrained ones."""

import pytest
import torch

from selfplay.models import factory as models
from selfplay.runtime.config import load_config
from selfplay.runtime.errors import UserError

CODE = [
    "def add(a, b):\n    return a + b\n",
    "def double_all(xs):\n    return [x * 2 for x in xs]\n",
    "def count_even(xs):\n    n = 0\n    for x in xs:\n        if x % 2 == 0:\n            n += 1\n    return n\n",
    "Return the sum of the list.\ndef total(values):\n    return sum(values)\n",
    "Examples: total([1, 2, 3]) == 6 ; double_all([]) == []\n",
] * 4


@pytest.fixture(scope="module")
def bpe():
    return models.train_tokenizer(CODE, vocab_size=300, kind="bpe")


def test_bpe_round_trips_any_text_and_keeps_specials(bpe):
    text = "def unseen_name(q):\n        return  q+1234 # ünïcode 日本\n"
    assert bpe.decode(bpe(text)["input_ids"]) == text
    assert len(bpe) <= 300
    for tok in models.SPECIAL_TOKENS:
        assert len(bpe(tok, add_special_tokens=False)["input_ids"]) == 1
    assert bpe.eos_token == models.END and bpe.pad_token == models.PAD


def test_code_aware_pieces(bpe):
    pieces = bpe.convert_ids_to_tokens(bpe("    return x * 2\n", add_special_tokens=False)["input_ids"])
    assert "ĠĠĠĠ" in pieces and "Ċ" in pieces  # an indentation unit and the newline are pieces of their own
    assert pieces.count("Ġ2") + pieces.count("2") == 1  # digits are single tokens, so numbers generalise
    assert all(len(bpe.convert_tokens_to_string([p]).strip()) <= 6 or p.isidentifier() for p in pieces)


def test_word_level_tokenizer_maps_unseen_words_to_unk():
    word = models.train_tokenizer(CODE, vocab_size=200, kind="word")
    ids = word("def add(a, b):", add_special_tokens=False)["input_ids"]
    assert word.unk_token_id not in ids
    assert word.decode(ids) == "def add(a, b):"
    assert word.unk_token_id in word(" zebra_quux", add_special_tokens=False)["input_ids"]


def test_chat_template_ends_with_the_generation_prompt(bpe):
    text = bpe.apply_chat_template([{"role": "user", "content": "write f"}], add_generation_prompt=True, tokenize=False)
    assert text == "<|user|>\nwrite f<|end|>\n<|assistant|>\n"


def test_plain_template_for_a_tokenizer_without_one(bpe, tmp_path):
    bpe.save_pretrained(tmp_path)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tmp_path)
    tok.chat_template = None
    models.ensure_chat_template(tok)
    assert tok.chat_template == models.TINY_CHAT_TEMPLATE  # role tokens exist, so the tiny template is used
    tok.chat_template = models.PLAIN_CHAT_TEMPLATE  # what a pretrained base model without role tokens gets
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "def f(): pass"}]
    text = tok.apply_chat_template(msgs, tokenize=False)
    assert text == f"### User:\nhi\n\n### Assistant:\ndef f(): pass{models.END}\n\n"


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_tiny_model_saved_and_reloaded_identically(arch, tmp_path):
    model, tok = models.build_tiny(
        CODE, tmp_path, vocab_size=300, arch=arch, n_layer=2, n_embd=32, n_head=2, max_positions=128
    )
    loaded, tok2 = models.load_model_and_tokenizer(str(tmp_path), local_files_only=True)
    ids = torch.tensor([tok("def add(a, b):")["input_ids"]])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, loaded(ids).logits, atol=1e-6)
    assert tok2.chat_template == tok.chat_template and len(tok2) == len(tok)
    assert loaded.config.vocab_size == len(tok) and loaded.config.eos_token_id == tok.eos_token_id
    assert models.param_count(loaded) < 200_000


def test_actor_critic_shapes_save_and_reload(tmp_path, bpe):
    policy = models.build_tiny_model(bpe, n_layer=2, n_embd=32, n_head=2, max_positions=64)
    for value_model in ("head", "separate"):
        ac = models.ActorCritic(policy, value_model)
        ids = torch.randint(0, len(bpe), (3, 7))
        logits, values = ac(ids, torch.ones_like(ids))
        assert logits.shape == (3, 7, len(bpe)) and values.shape == (3, 7)
        out = tmp_path / value_model
        ac.save_pretrained(out)
        again = models.ActorCritic.from_pretrained(out)
        assert (again.critic is None) == (value_model == "head")
        with torch.no_grad():
            assert torch.allclose(again(ids, torch.ones_like(ids))[1], values, atol=1e-6)
    # the separate critic shares no parameters with the policy
    ac = models.ActorCritic(policy, "separate")
    assert not {id(p) for p in ac.critic.parameters()} & {id(p) for p in ac.policy.parameters()}


def test_detached_value_head_sends_no_gradient_into_the_policy(tmp_path, bpe):
    policy = models.build_tiny_model(bpe, n_layer=2, n_embd=32, n_head=2, max_positions=64)
    ids = torch.randint(0, len(bpe), (2, 5))
    for value_model, reaches_policy in (("head", True), ("detached", False)):
        ac = models.ActorCritic(policy, value_model)
        ac.zero_grad()
        ac(ids, torch.ones_like(ids))[1].sum().backward()  # a loss on the values only
        grads = [p.grad for p in ac.policy.parameters() if p.grad is not None and p.grad.abs().sum() > 0]
        assert bool(grads) == reaches_policy, value_model
        assert ac.value_head.summary.weight.grad.abs().sum() > 0  # the head itself always learns
    # the same parameters: a head checkpoint loads as detached (and back), a separate critic is fixed
    models.ActorCritic(policy, "head").save_pretrained(tmp_path / "head")
    assert models.ActorCritic.from_pretrained(tmp_path / "head", "detached").value_model == "detached"
    with pytest.raises(UserError, match="model.value_model=separate"):
        models.ActorCritic.from_pretrained(tmp_path / "head", "separate")
    models.ActorCritic(policy, "separate").save_pretrained(tmp_path / "sep")
    with pytest.raises(UserError, match="holds a separate critic"):
        models.ActorCritic.from_pretrained(tmp_path / "sep", "detached")
    with pytest.raises(UserError, match="model.value_model must be one of"):
        models.ActorCritic(policy, "shared")


def test_frozen_reference_does_not_move(bpe):
    policy = models.build_tiny_model(bpe, n_layer=1, n_embd=32, n_head=2, max_positions=64)
    ref = models.frozen_copy(policy)
    assert not any(p.requires_grad for p in ref.parameters()) and not ref.training
    with torch.no_grad():
        next(policy.parameters()).add_(1.0)
    assert not torch.equal(next(policy.parameters()), next(ref.parameters()))


def test_build_models_from_config_builds_then_reuses_the_tiny_default(tmp_path):
    cfg = load_config(
        overrides=[
            "model.n_layer=1",
            "model.n_embd=32",
            "model.n_head=2",
            "model.vocab_size=300",
            "model.max_positions=64",
        ]
    )
    ac, ref, tok = models.build_models(cfg.model, tmp_path, texts=CODE)
    assert (tmp_path / "models" / "tiny" / "config.json").exists()
    ac2, _, tok2 = models.build_models(cfg.model, tmp_path)  # no corpus needed the second time
    assert torch.equal(next(ac.policy.parameters()), next(ac2.policy.parameters())) and len(tok2) == len(tok)
    assert not any(p.requires_grad for p in ref.parameters())


def test_missing_model_says_how_to_point_at_a_local_copy(tmp_path):
    with pytest.raises(models.ModelNotFound, match="model.name_or_path"):
        models.load_model_and_tokenizer("no-such-org/no-such-model", local_files_only=True)
    with pytest.raises(models.ModelNotFound, match="does not exist"):
        models.load_model_and_tokenizer(str(tmp_path / "nothing" / "here"))
    with pytest.raises(models.UserError, match="model.arch"):
        models.build_tiny_model(models.train_tokenizer(CODE, 300), arch="rnn")


def test_solver_render_uses_the_tokenizer_template_and_matches_the_plain_one(bpe):
    from solver.prompts import render

    msgs = [
        {"role": "user", "content": "write f"},
        {"role": "assistant", "content": "def f(): pass"},
        {"role": "user", "content": "Result:\nok"},
    ]
    assert render(msgs, bpe) == bpe.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    saved = bpe.chat_template
    try:
        bpe.chat_template = models.PLAIN_CHAT_TEMPLATE
        with_template = bpe.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        bpe.chat_template = None
        assert render(msgs, bpe) == with_template  # the Python fallback and the Jinja template agree
    finally:
        bpe.chat_template = saved
