"""Supervised fine-tuning on (prompt, answer) token pairs, loss on the answer tokens only.

The warm start of both agents is behaviour cloning: the solver imitates reference solutions
of procedural tasks, the generator imitates procedural tasks written as proposals. Examples are grouped by length
so that batches carry little padding; the learning rate warms up linearly and decays with a cosine.
"""

from __future__ import annotations

import math
import random
from typing import Callable, Sequence

import torch
import torch.nn.functional as F


def answer_loss(policy, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over positions whose label is not -100 (the answer tokens)."""
    logits = policy(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), labels[:, 1:].reshape(-1),
                           ignore_index=-100)


def collate(examples: Sequence[tuple[Sequence[int], Sequence[int]]], pad_id: int, max_len: int):
    """Right-padded input_ids, attention_mask and labels (-100 on prompt and padding). Long examples keep their
    answer and lose the start of the prompt."""
    rows = []
    for prompt, answer in examples:
        ids = list(prompt) + list(answer)
        n_prompt = len(prompt)
        if len(ids) > max_len:
            cut = len(ids) - max_len
            ids, n_prompt = ids[cut:], max(0, n_prompt - cut)
        rows.append((ids, n_prompt))
    width = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for b, (ids, n_prompt) in enumerate(rows):
        input_ids[b, : len(ids)] = torch.tensor(ids)
        mask[b, : len(ids)] = 1
        labels[b, n_prompt: len(ids)] = torch.tensor(ids[n_prompt:])
    return input_ids, mask, labels


def length_batches(lengths: Sequence[int], batch_size: int, rng: random.Random) -> list[list[int]]:
    """Batches of indices of similar length, in random order."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], rng.random()))
    batches = [order[i: i + batch_size] for i in range(0, len(order), batch_size)]
    rng.shuffle(batches)
    return batches


def lr_at(step: int, total: int, lr: float, warmup: int) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def sft(policy, examples: Sequence[tuple[Sequence[int], Sequence[int]]], *, steps: int, batch_size: int, lr: float,
        pad_id: int, max_len: int, seed: int = 0, warmup: int = 20, weight_decay: float = 0.01,
        max_grad_norm: float = 1.0, on_step: Callable[[int, float], None] | None = None) -> list[float]:
    """`steps` optimiser steps of answer-only cross-entropy over `examples`; returns the loss of every step."""
    if not examples:
        raise ValueError("no examples to fine-tune on")
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=lr,
                                  weight_decay=weight_decay)
    lengths = [len(p) + len(a) for p, a in examples]
    batches: list[list[int]] = []
    losses = []
    device = next(policy.parameters()).device
    policy.train()
    for step in range(steps):
        if not batches:
            batches = length_batches(lengths, batch_size, rng)
        idx = batches.pop()
        input_ids, mask, labels = (t.to(device) for t in collate([examples[i] for i in idx], pad_id, max_len))
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, steps, lr, warmup)
        loss = answer_loss(policy, input_ids, mask, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), max_grad_norm)
        optimizer.step()
        losses.append(float(loss.detach()))
        if on_step is not None:
            on_step(step, losses[-1])
    optimizer.zero_grad(set_to_none=True)  # the last step's gradients are not kept (the next agent's SFT follows)
    policy.eval()
    return losses
