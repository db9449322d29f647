"""Supervised fine-tuning learns answers from prompts (tiny model, CPU, seconds)."""

import torch

from selfplay.models.factory import build_tiny_model, train_tokenizer
from selfplay.rl.sft import collate, sft

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
        out = model.generate(torch.tensor([prompt]), max_new_tokens=len(answer), do_sample=False,
                             pad_token_id=tok.pad_token_id)
        correct += out[0, len(prompt):].tolist() == answer
    assert correct >= 14, correct  # of 16 prompts
