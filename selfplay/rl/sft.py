"""Supervised fine-tuning on (prompt, answer) token pairs, loss on the answer tokens only.

The warm start of both agents is behaviour cloning: the solver imitates reference solutions
of procedural tasks, the generator imitates procedural tasks written as proposals. Examples are grouped by length
so that batches carry little padding; the learning rate warms up linearly and decays with a cosine.

Precision: a bf16 (or fp16) model is trained through fp32 master weights (`MasterWeights`): AdamW steps fp32 copies
of the trainable parameters, with fp32 moments and fp32 gradients (each parameter's gradient is added into its
master's as soon as backward has it, so no low-precision gradient is kept), and the model gets the masters cast to
its dtype after every step. Without them an update below half a bf16 ulp of its weight (1e-5 against a weight near
0.02, whose half ulp is 6.1e-5) rounds away. An fp32 model is stepped directly, as before, bit for bit.

Memory: `micro_batch_size` splits each batch into micro-batches whose gradients are accumulated before the step;
each micro-batch's loss is its answer tokens' summed cross-entropy over the whole batch's answer tokens, so the step
is the unsplit batch's (to rounding).

Under DeepSpeed (`sft_engine`, the warm start on several ranks: selfplay/train/warmstart_ranks.py) the same steps run
inside an engine: every rank draws the same batches, takes its share of each (`rank_batching`), and the engine's
ZeRO partitioning, mixed precision (fp32 masters of its own), gradient accumulation and clipping do the rest.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from selfplay.runtime.distributed import all_reduce_sum

WARMUP, WEIGHT_DECAY, MAX_GRAD_NORM = 20, 0.01, 1.0  # the SFT's schedule warm-up, AdamW decay and clipping


def answer_loss(
    policy, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor, reduction: str = "mean"
) -> torch.Tensor:
    """Next-token cross-entropy over positions whose label is not -100 (the answer tokens): their mean, or their
    sum with reduction="sum"."""
    logits = policy(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
    return F.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
        labels[:, 1:].reshape(-1),
        ignore_index=-100,
        reduction=reduction,
    )


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
        labels[b, n_prompt : len(ids)] = torch.tensor(ids[n_prompt:])
    return input_ids, mask, labels


def length_batches(lengths: Sequence[int], batch_size: int, rng: random.Random) -> list[list[int]]:
    """Batches of indices of similar length, in random order."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], rng.random()))
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    rng.shuffle(batches)
    return batches


def lr_at(step: int, total: int, lr: float, warmup: int) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


LOW_PRECISION = (torch.bfloat16, torch.float16)  # parameter dtypes trained through fp32 master weights


class MasterWeights:
    """fp32 masters of trainable parameters: a low-precision parameter gets an fp32 copy for the optimiser to step,
    an fp32 parameter is its own master. Backward's gradient of a low-precision parameter is added into its master's
    fp32 gradient as soon as it is accumulated (a post-accumulate-grad hook) and dropped from the parameter, so
    micro-batches accumulate in fp32 and no low-precision gradient outlives its parameter's backward."""

    def __init__(self, params: Sequence[torch.nn.Parameter]):
        self.pairs = [(p, p.detach().float().clone() if p.dtype in LOW_PRECISION else p) for p in params]
        self._hooks = [p.register_post_accumulate_grad_hook(self._into(m)) for p, m in self.pairs if m is not p]

    @property
    def masters(self) -> list[torch.Tensor]:
        """What the optimiser steps and clips: the masters, in the parameters' order."""
        return [m for _, m in self.pairs]

    @staticmethod
    def _into(master: torch.Tensor) -> Callable[[torch.Tensor], None]:
        def hook(param: torch.Tensor) -> None:
            if master.grad is None:
                master.grad = param.grad.float()
            else:
                master.grad.add_(param.grad)
            param.grad = None

        return hook

    def write_back(self) -> None:
        """The model's low-precision parameters set to their masters, rounded to the parameters' dtype."""
        with torch.no_grad():
            for p, m in self.pairs:
                if m is not p:
                    p.copy_(m)

    def close(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []


def batch_backward(
    policy, input_ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor, micro_batch_size: int = 0
) -> float:
    """Forward and backward of one batch, in micro-batches of `micro_batch_size` rows (0, or at least the batch:
    one pass, the mean answer loss); returns the batch's mean answer loss. Split, each micro-batch's summed loss over
    its answer tokens is divided by the whole batch's answer tokens, so the gradients add up to the unsplit batch's."""
    rows = input_ids.shape[0]
    if micro_batch_size <= 0 or micro_batch_size >= rows:
        loss = answer_loss(policy, input_ids, mask, labels)
        loss.backward()
        return float(loss.detach())
    tokens = max(1, int((labels[:, 1:] != -100).sum()))
    total = 0.0
    for start in range(0, rows, micro_batch_size):
        part = slice(start, start + micro_batch_size)
        width = int(mask[part].sum(1).max())  # right-padded: the micro-batch's longest row, no wider
        loss = (
            answer_loss(policy, input_ids[part, :width], mask[part, :width], labels[part, :width], reduction="sum")
            / tokens
        )
        loss.backward()
        total += float(loss.detach())
    return total


def sft(
    policy,
    examples: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    steps: int,
    batch_size: int,
    lr: float,
    pad_id: int,
    max_len: int,
    seed: int = 0,
    warmup: int = WARMUP,
    weight_decay: float = WEIGHT_DECAY,
    max_grad_norm: float = MAX_GRAD_NORM,
    micro_batch_size: int = 0,
    on_step: Callable[[int, float], None] | None = None,
) -> list[float]:
    """`steps` optimiser steps of answer-only cross-entropy over `examples`; returns the loss of every step.
    micro_batch_size: rows per forward/backward, gradients accumulated over a batch (0 = the whole batch at once).
    A bf16/fp16 model is stepped through fp32 master weights (`MasterWeights`)."""
    if not examples:
        raise ValueError("no examples to fine-tune on")
    if micro_batch_size < 0:
        raise ValueError(f"micro_batch_size must be >= 0 (0: the whole batch), got {micro_batch_size}")
    rng = random.Random(seed)
    masters = MasterWeights([p for p in policy.parameters() if p.requires_grad])
    optimizer = torch.optim.AdamW(masters.masters, lr=lr, weight_decay=weight_decay)
    lengths = [len(p) + len(a) for p, a in examples]
    batches: list[list[int]] = []
    losses = []
    device = next(policy.parameters()).device
    policy.train()
    try:
        for step in range(steps):
            if not batches:
                batches = length_batches(lengths, batch_size, rng)
            idx = batches.pop()
            input_ids, mask, labels = (t.to(device) for t in collate([examples[i] for i in idx], pad_id, max_len))
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, steps, lr, warmup)
            optimizer.zero_grad(set_to_none=True)
            losses.append(batch_backward(policy, input_ids, mask, labels, micro_batch_size))
            torch.nn.utils.clip_grad_norm_(masters.masters, max_grad_norm)
            optimizer.step()
            masters.write_back()
            if on_step is not None:
                on_step(step, losses[-1])
    finally:
        optimizer.zero_grad(set_to_none=True)  # no gradient is kept (the next agent's SFT follows)
        masters.close()
    policy.eval()
    return losses


def rank_batching(batch_size: int, micro_batch_size: int, world: int) -> tuple[int, int]:
    """(rows per micro-batch, micro-batches per step) of each rank when SFT batches of `batch_size` rows are split
    over `world` ranks: a rank's share is ceil(batch_size / world) contiguous rows, passed `micro_batch_size` rows at
    a time (0: its whole share at once); the engine's train_micro_batch_size_per_gpu and gradient_accumulation_steps."""
    share = -(-batch_size // world)
    micro = min(micro_batch_size, share) if micro_batch_size > 0 else share
    return micro, -(-share // micro)


def sft_engine(
    engine,
    examples: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    steps: int,
    batch_size: int,
    lr: float,
    pad_id: int,
    max_len: int,
    seed: int = 0,
    warmup: int = WARMUP,
    micro_batch_size: int = 0,
    rank: int = 0,
    world: int = 1,
    on_step: Callable[[int, float], None] | None = None,
) -> list[float]:
    """`sft`'s steps inside a DeepSpeed `engine` (a causal LM wrapped by `deepspeed.initialize`, its config from
    `rank_batching`; AdamW, weight decay, clipping and mixed precision as the engine's config says), data parallel
    over `world` ranks: every rank draws the same batches as `sft` (the same `length_batches` from `seed`), takes
    its contiguous share of each and passes it in micro-batches. Each micro-batch's loss is its answer tokens' summed
    cross-entropy over the whole batch's answer tokens, times `world` (the engine averages gradients over the ranks),
    so that a step's gradient is the unsplit batch's, as in `sft`. A rank whose share of a short batch runs out
    passes a zero-weighted row instead: every rank runs as many forward/backward passes (ZeRO's gathers and
    reductions are collectives). The learning rate follows `lr_at`. Returns every step's batch mean answer loss
    (the same on every rank; a collective)."""
    if not examples:
        raise ValueError("no examples to fine-tune on")
    micro, passes = rank_batching(batch_size, micro_batch_size, world)
    if (engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()) != (micro, passes):
        raise ValueError(
            f"the engine passes {engine.train_micro_batch_size_per_gpu()} rows x "
            f"{engine.gradient_accumulation_steps()} per step, the SFT's batches of {batch_size} over {world} "
            f"ranks need {micro} x {passes} (rank_batching)"
        )
    rng = random.Random(seed)
    lengths = [len(p) + len(a) for p, a in examples]
    batches: list[list[int]] = []
    losses = []
    engine.train()
    for step in range(steps):
        if not batches:
            batches = length_batches(lengths, batch_size, rng)
        idx = batches.pop()
        input_ids, mask, labels = collate([examples[i] for i in idx], pad_id, max_len)
        tokens = max(1, int((labels[:, 1:] != -100).sum()))
        share = -(-len(idx) // world)
        mine = list(range(rank * share, min(len(idx), (rank + 1) * share)))
        for group in engine.optimizer.param_groups:
            group["lr"] = lr_at(step, steps, lr, warmup)
        total = 0.0
        for j in range(passes):
            rows, weight = mine[j * micro : (j + 1) * micro], world / tokens
            if not rows:  # this rank's share ran out: a pass that counts for nothing
                rows, weight = [0], 0.0
            width = int(mask[rows].sum(1).max())  # right-padded: the micro-batch's longest row, no wider
            part = (t[rows, :width].to(engine.device) for t in (input_ids, mask, labels))
            loss = answer_loss(engine, *part, reduction="sum")
            engine.backward(loss * weight, scale_wrt_gas=False)
            engine.step()  # the optimiser steps at the last pass (the engine's accumulation boundary)
            total += float(loss.detach()) * weight / world
        losses.append(all_reduce_sum(total)[0])
        if on_step is not None:
            on_step(step, losses[-1])
    engine.eval()
    return losses
