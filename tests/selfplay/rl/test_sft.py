"""Supervised fine-tuning learns answers from prompts (tiny model, CPU, seconds); bf16 models keep updates below
half an ulp through fp32 master weights; micro-batches step as their whole batch; fp32 models are stepped as plain
AdamW, bit for bit."""

import random
from types import SimpleNamespace

import pytest
import torch

from selfplay.models.factory import build_tiny_model, train_tokenizer
from selfplay.rl.sft import answer_loss, batch_backward, collate, length_batches, lr_at, sft

PAIRS = [(f"double {n}", f"return {2 * n}") for n in range(8)] + [(f"negate {n}", f"return -{n}") for n in range(8)]


def test_collate_masks_the_prompt_and_keeps_the_answer_when_truncating():
    ids, mask, labels = collate([([1, 2, 3], [4, 5]), ([6], [7])], pad_id=0, max_len=4)
    assert ids.tolist() == [[2, 3, 4, 5], [6, 7, 0, 0]]
    assert mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert labels.tolist() == [[-100, -100, 4, 5], [-100, 7, -100, -100]]


def test_sft_learns_the_answers():
    tok = train_tokenizer([p + " " + a for p, a in PAIRS], vocab_size=300, kind="word")
    torch.manual_seed(0)
    model = build_tiny_model(tok, n_layer=2, n_embd=64, n_head=4, max_positions=64)
    examples = [(tok(p + " :")["input_ids"], tok(" " + a)["input_ids"] + [tok.eos_token_id]) for p, a in PAIRS]
    losses = sft(model, examples, steps=150, batch_size=8, lr=3e-3, pad_id=tok.pad_token_id, max_len=64, warmup=10)
    assert losses[-1] < 0.1 * losses[0]
    correct = 0
    for prompt, answer in examples:
        out = model.generate(
            torch.tensor([prompt]), max_new_tokens=len(answer), do_sample=False, pad_token_id=tok.pad_token_id
        )
        correct += out[0, len(prompt) :].tolist() == answer
    assert correct >= 14, correct  # of 16 prompts


class Bigram(torch.nn.Module):
    """The smallest causal LM `sft` trains: the logits after token t are row t of one weight matrix."""

    def __init__(self, vocab: int, value: float, dtype: torch.dtype):
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((vocab, vocab), value, dtype=dtype))

    def forward(self, input_ids, attention_mask=None, use_cache=False):
        return SimpleNamespace(logits=self.w[input_ids])


def test_bf16_updates_below_half_an_ulp_add_up_in_the_fp32_masters():
    # Every weight 0.02, stored in bf16 as 0.02001953125 (41 x 2^-11); its ulp is 2^-13 = 1.2207e-4, half of it
    # 6.1e-5. One example: after token 1 comes token 2, so row 1's gradient is softmax - onehot(2): -0.75 at column
    # 2, +0.25 elsewhere, the same sign at every step, and AdamW moves each weight by the step's learning rate. 10
    # steps at a peak of 2e-5 (no warm-up, cosine to 10 %): the rates sum to 2e-5 x (10 x 0.55 + 0.45 x 1) = 1.19e-4,
    # each below half an ulp. Plain bf16 AdamW rounds every one of them away; the fp32 masters keep them, and their
    # sum rounds to one ulp: column 2 of row 1 up by 2^-13, the others of row 1 down by 2^-13, other rows untouched.
    steps, lr = 10, 2e-5
    rates = [lr_at(k, steps, lr, warmup=0) for k in range(steps)]
    assert max(rates) < 2**-14 and sum(rates) == pytest.approx(1.19e-4)
    stored, ulp = 41 * 2**-11, 2**-13
    assert torch.tensor(0.02, dtype=torch.bfloat16).item() == stored

    model = Bigram(4, 0.02, torch.bfloat16)
    sft(model, [([1], [2])], steps=steps, batch_size=1, lr=lr, pad_id=0, max_len=8, warmup=0, weight_decay=0.0)
    expected = torch.full((4, 4), stored)
    expected[1] = stored - ulp
    expected[1, 2] = stored + ulp
    assert model.w.dtype == torch.bfloat16 and torch.equal(model.w.float(), expected)
    assert model.w.grad is None  # no gradient left behind on the model

    plain = Bigram(4, 0.02, torch.bfloat16)  # the same steps with AdamW on the bf16 weights themselves
    optimizer = torch.optim.AdamW(plain.parameters(), lr=lr, weight_decay=0.0)
    ids, mask, labels = collate([([1], [2])], pad_id=0, max_len=8)
    for rate in rates:
        optimizer.param_groups[0]["lr"] = rate
        optimizer.zero_grad()
        answer_loss(plain, ids, mask, labels).backward()
        optimizer.step()
    assert torch.equal(plain.w.float(), torch.full((4, 4), stored))  # every update rounded away


def tiny_world(seed: int = 0):
    tok = train_tokenizer([p + " " + a for p, a in PAIRS], vocab_size=300, kind="word")
    torch.manual_seed(seed)
    model = build_tiny_model(tok, n_layer=2, n_embd=32, n_head=4, max_positions=64)
    # answers of different lengths, so that the micro-batches hold different numbers of answer tokens
    examples = [
        (tok(p + " :")["input_ids"], tok(" " + a + " ok" * (i % 3))["input_ids"] + [tok.eos_token_id])
        for i, (p, a) in enumerate(PAIRS)
    ]
    return tok, model, examples


@pytest.mark.parametrize("micro", [1, 2, 3, 4])
def test_micro_batched_gradients_are_the_whole_batch_s(micro):
    tok, model, examples = tiny_world()
    batch = collate(examples[:7], tok.pad_token_id, 64)
    whole_loss = batch_backward(model, *batch)
    whole = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    split_loss = batch_backward(model, *batch, micro_batch_size=micro)
    assert split_loss == pytest.approx(whole_loss, rel=1e-6)
    for a, p in zip(whole, model.parameters()):
        torch.testing.assert_close(p.grad, a, rtol=1e-5, atol=1e-7)


def test_micro_batched_sft_steps_are_the_whole_batch_s():
    tok, whole, examples = tiny_world()
    _, split, _ = tiny_world()
    kw = dict(steps=4, batch_size=6, lr=1e-3, pad_id=tok.pad_token_id, max_len=64, warmup=2)
    losses = sft(whole, examples, **kw)
    assert sft(split, examples, micro_batch_size=4, **kw) == pytest.approx(losses, rel=1e-5)  # 4 + 2 rows a step
    for a, b in zip(whole.parameters(), split.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)


def test_an_fp32_model_is_stepped_as_plain_adamw_bit_for_bit():
    """fp32 parameters are their own masters: the loop is the plain one (AdamW on the parameters, the mean answer
    loss, the gradient clipped), bit for bit."""
    tok, model, examples = tiny_world()
    _, plain, _ = tiny_world()
    kw = dict(steps=5, batch_size=4, lr=1e-3, pad_id=tok.pad_token_id, max_len=64, seed=3, warmup=2)
    losses = sft(model, examples, **kw)

    rng = random.Random(3)
    optimizer = torch.optim.AdamW([p for p in plain.parameters() if p.requires_grad], lr=1e-3, weight_decay=0.01)
    lengths = [len(p) + len(a) for p, a in examples]
    batches, plain_losses = [], []
    plain.train()
    for step in range(5):
        batches = batches or length_batches(lengths, 4, rng)
        ids, mask, labels = collate([examples[i] for i in batches.pop()], tok.pad_token_id, 64)
        optimizer.param_groups[0]["lr"] = lr_at(step, 5, 1e-3, 2)
        loss = answer_loss(plain, ids, mask, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(plain.parameters(), 1.0)
        optimizer.step()
        plain_losses.append(float(loss.detach()))
    assert losses == plain_losses
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), plain.parameters()))


def test_a_negative_micro_batch_is_refused():
    tok, model, examples = tiny_world()
    with pytest.raises(ValueError, match="micro_batch_size"):
        sft(model, examples, steps=1, batch_size=4, lr=1e-3, pad_id=tok.pad_token_id, max_len=64, micro_batch_size=-1)


@pytest.mark.parametrize("value", [-1, 17])
def test_the_config_refuses_a_micro_batch_outside_the_batch_in_one_line_naming_the_key(value):
    from selfplay.runtime.config import load_config
    from selfplay.runtime.errors import UserError

    with pytest.raises(UserError, match="warmstart.micro_batch_size") as exc:
        load_config(overrides=["warmstart.batch_size=16", f"warmstart.micro_batch_size={value}"])
    assert "\n" not in str(exc.value)
    assert load_config(overrides=["warmstart.micro_batch_size=16"]).warmstart.micro_batch_size == 16
