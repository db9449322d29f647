"""Token-level PPO with a value head, shared by the solver and the generator (docs/rl.md).

`PPOTrainer.step(queries, responses, scores)` takes a batch of rollouts (prompt token ids, response token ids, one
scalar reward per response) and runs one PPO update in the stages CleanRL's ppo.py uses:

1. rollout quantities, no gradients: log-probs and values under the current ("old") policy, log-probs under the
   frozen reference. Two forward passes are left out where they cannot change what is computed: the old policy's
   when the update is one optimiser step with no critic and no KL in the reward (a group advantage, one epoch, the
   whole batch one minibatch, kl_coef 0): its log-probs are then those of the update's own forward pass, under the
   same weights, detached; the reference's when the KL is neither in the reward nor measured (`ppo.kl_metric`);
2. per-token rewards: -beta * KL(policy || reference) on every response token, the scalar reward on the last one;
3. GAE (gamma, lambda) over the response tokens, advantages whitened over the batch; or, with `advantage=rloo`,
   one advantage per answer: its return minus the mean return of the other answers to the same task (no critic,
   no value loss; not whitened, so a task whose answers all scored alike gives almost no update: only their KL
   penalties differ); `grpo` / `dr_grpo`: the answer's score less its task's mean score, divided by their standard
   deviation (grpo) or not (dr_grpo), plus its KL penalties' return less the task's mean of those;
4. `epochs` passes of shuffled minibatches (gradient accumulation over micro-batches): clipped policy loss +
   vf_coef * clipped value loss - entropy_coef * entropy, each a mean over the minibatch's tokens (a token weighs
   1 / tokens in its minibatch, whatever the micro-batch size or backend; `loss_aggregation`: per answer, as GRPO
   and Dr. GRPO), the ratio clipped to [1 - clip_low, 1 + clip_high], gradients clipped to `max_grad_norm`,
   one optimiser step per minibatch (under DeepSpeed too: the trainer sets the accumulation boundary itself);
5. KL coefficient (adaptive: from the KL averaged over all ranks, so beta is the same on each) and entropy
   coefficient (linear schedule) updated; metrics returned under plain names.

Every log-prob (sampling, old, new, reference) comes from one function, `rl.sampling_logprobs` (temperature only:
ppo.top_k and ppo.top_p are refused), and `generate` samples from exactly that distribution, with an explicit
generation configuration that leaves a checkpoint's own decoding options (repetition penalty, ...) out. During the
update the model is in `models.update_mode`: no dropout, gradient checkpointing where it is enabled. docs/rl.md.

Optional replay (`ppo.replay_coef` > 0 and `step(..., replay=...)`): past successful answers (selfplay.rl.replay) add
replay_coef * their token-mean negative log-likelihood (answer tokens only, under the untempered policy: temperature
1 whatever ppo.temperature is, since the T = 1 policy is the one evaluated) to the loss of every optimiser step. The
replay rows are split over the micro-batches of each minibatch and scored in the same forward pass as the PPO rows
(one forward per backward, as DDP and DeepSpeed expect); the chunks' losses add up to the whole replay batch's mean.

The model is an `ActorCritic` with a torch optimiser, or a DeepSpeed engine wrapping one (then the engine does the
optimiser step and clipping from its JSON config, at the accumulation boundaries the trainer sets). `generate(...)`
samples batched answers with their log-probs. `selfplay bench ppo` (selfplay/bench/ppo_bench.py) measures
throughput on the tiny model.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from selfplay.models.factory import accepts_logits_to_keep, update_mode
from selfplay.rl import core as rl
from selfplay.runtime.config import ADVANTAGES, GROUP_ADVANTAGES
from selfplay.runtime.distributed import weighted_mean_over_ranks
from selfplay.runtime.errors import UserError

# ppo.loss_aggregation="" takes the advantage's own: GRPO's per-answer token mean, Dr. GRPO's constant normaliser
AGGREGATIONS = {
    "gae": "token_mean",
    "rloo": "token_mean",
    "grpo": "seq_mean_token_mean",
    "dr_grpo": "seq_mean_token_sum_norm",
}
WHITEN_MIN = 3  # ppo.whiten_advantages needs this many sequences in a rank's batch (below it: not whitened)

# ---------------------------------------------------------------------------- batching


def pad_rollouts(
    queries: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    pad_token_id: int,
    response_masks: Sequence[Sequence[int]] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Concatenate query + response per row, right-pad. Returns input_ids, attention_mask [B, L] and action_mask
    [B, L-1]: action_mask[b, i] = 1 when token i+1 is a response token the policy chose (the log-prob of token
    i+1 comes from the logits at position i). `response_masks` can exclude response tokens the policy did not
    produce (observations inserted between the turns of an episode)."""
    if len(queries) != len(responses):
        raise ValueError(f"{len(queries)} queries but {len(responses)} responses")
    lengths = [len(q) + len(r) for q, r in zip(queries, responses)]
    batch, width = len(queries), max(lengths)
    input_ids = torch.full((batch, width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((batch, width), dtype=torch.long)
    action_mask = torch.zeros((batch, width - 1), dtype=torch.float32)
    for b, (q, r) in enumerate(zip(queries, responses)):
        if len(q) == 0 or len(r) == 0:
            raise ValueError(f"rollout {b}: empty query or response (every response needs at least one token)")
        input_ids[b, : lengths[b]] = torch.tensor(list(q) + list(r), dtype=torch.long)
        attention_mask[b, : lengths[b]] = 1
        rmask = (
            torch.ones(len(r)) if response_masks is None else torch.as_tensor(response_masks[b], dtype=torch.float32)
        )
        action_mask[b, len(q) - 1 : lengths[b] - 1] = rmask
    return input_ids, attention_mask, action_mask


def pad_behaviour(
    queries: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    behaviour: Sequence[Sequence[float] | None],
    width: int,
) -> torch.Tensor:
    """The sampler's log-prob of each response token on pad_rollouts' shifted axis ([B, width - 1]; the log-prob
    of token i+1 at position i), NaN where there is none (prompts, padding, rows given None)."""
    out = torch.full((len(queries), width - 1), float("nan"))
    for b, (q, r, lp) in enumerate(zip(queries, responses, behaviour)):
        if lp is None:
            continue
        if len(lp) != len(r):
            raise ValueError(f"rollout {b}: {len(lp)} sampler log-probs for {len(r)} response tokens")
        out[b, len(q) - 1 : len(q) - 1 + len(r)] = torch.as_tensor(lp, dtype=torch.float32)
    return out


def first_action(action_mask: torch.Tensor) -> tuple[int, torch.Tensor]:
    """(start, action_mask[:, start:]): the first position (shifted axis) holding an action in any row, i.e. the
    shortest prompt's last token; per-token tensors of a batch begin there."""
    start = int(action_mask.any(0).float().argmax())
    return start, action_mask[:, start:]


def last_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of the last set position in each row of a [B, T] mask."""
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    return torch.where(mask.bool(), positions, torch.full_like(positions, -1)).max(dim=1).values


def _chunks(indices: torch.Tensor, size: int) -> list[torch.Tensor]:
    return [indices[i : i + size] for i in range(0, len(indices), size)]


def _pad_right(x: torch.Tensor, width: int, value: int) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value)


def pack_allowed(allowed: Sequence[torch.Tensor | None], action_mask: torch.Tensor) -> torch.Tensor | None:
    """Per-rollout packed allowed-token bits ([actions, W] int32 each, or None) laid on the batch's shifted axis:
    [B, T, W] on the CPU, row b's k-th action position holding its k-th step's bits; every other position (prompt,
    padding, observations, unconstrained rows) allows every token (all bits set). None when no row has bits."""
    rows = [a for a in allowed if a is not None]
    if not rows:
        return None
    mask = action_mask.bool().cpu()
    out = torch.full((*mask.shape, rows[0].shape[-1]), -1, dtype=torch.int32)
    for b, bits in enumerate(allowed):
        if bits is None:
            continue
        positions = mask[b].nonzero().squeeze(-1)
        if len(positions) != len(bits):
            raise ValueError(f"rollout {b}: {len(bits)} steps of allowed-token bits for {len(positions)} actions")
        out[b, positions] = bits.to(torch.int32)
    return out


def _unpacked(bits: torch.Tensor | None, logits: torch.Tensor) -> torch.Tensor | None:
    """Packed bits [B, T, W] -> bool [B, T, V] on the logits' device (None stays None)."""
    if bits is None:
        return None
    from selfplay.rollout.constrained import unpack_bits

    return unpack_bits(bits.to(logits.device), logits.shape[-1])


# ---------------------------------------------------------------------------- the trainer


@dataclass
class _Rollout:
    """Everything fixed during the update (computed once, without gradients)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    start: int  # first position (shifted axis) holding an action in any row: the per-token tensors begin there
    action_mask: torch.Tensor
    old_logp: torch.Tensor | None  # None: the update's own first forward gives them (PPOTrainer.reuses_forward)
    old_values: torch.Tensor | None
    advantages: torch.Tensor
    returns: torch.Tensor
    allowed: torch.Tensor | None = None  # constrained decoding: packed allowed-token bits [B, T, ceil(V/32)] (CPU)
    ref_logp: torch.Tensor | None = None  # kept where the KL is measured in the update (old_logp None)
    prompt_lens: list[int] | None = None  # each row's prompt length (ppo.share_prompts)
    behaviour_logp: torch.Tensor | None = None  # ppo.tis_cap: the sampler's log-prob of each action (NaN: unknown)


@dataclass
class _Replay:
    """Replayed successful answers, padded; `tokens` = answer tokens in the whole replay batch."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    start: int
    action_mask: torch.Tensor
    tokens: int


def _unwrap(model):
    """The module inside a DeepSpeed engine (or the model itself)."""
    return getattr(model, "module", model)


def is_deepspeed_engine(model) -> bool:
    return hasattr(model, "backward") and hasattr(model, "module") and hasattr(model, "optimizer")


class PPOTrainer:
    """One PPO update per `step` call. `cfg` is a `ppo:` config section (selfplay.runtime.config.PPOConfig)."""

    def __init__(
        self,
        model,
        ref_model,
        cfg,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        pad_token_id: int = 0,
        seed: int = 0,
    ):
        self.model, self.ref_model, self.cfg = model, ref_model, cfg
        self.engine = model if is_deepspeed_engine(model) else None
        if self.engine is None and optimizer is None:
            optimizer = torch.optim.AdamW(
                [p for p in model.parameters() if p.requires_grad], lr=cfg.lr, weight_decay=cfg.weight_decay
            )
        self.optimizer = optimizer if self.engine is None else self.engine.optimizer
        self.pad_token_id = pad_token_id
        self.ref_model.to(self.device)  # next to the policy (DeepSpeed / wrap_model moved only the policy)
        self._ref_keeps_logits = accepts_logits_to_keep(ref_model)
        if cfg.advantage not in ADVANTAGES:
            raise UserError(f"ppo.advantage must be one of {', '.join(ADVANTAGES)}, got {cfg.advantage!r}")
        self.aggregation = cfg.loss_aggregation or AGGREGATIONS[cfg.advantage]
        if self.aggregation not in rl.LOSS_AGGREGATIONS:
            raise UserError(
                f'ppo.loss_aggregation must be one of {", ".join(rl.LOSS_AGGREGATIONS)} (or "": the '
                f"advantage's own), got {cfg.loss_aggregation!r}"
            )
        # DAPO's clip-higher: the ratio is clipped to [1 - clip_low, 1 + clip_high], each ppo.clip by default
        self.clip_low = cfg.clip if cfg.clip_low is None else cfg.clip_low
        self.clip_high = cfg.clip if cfg.clip_high is None else cfg.clip_high
        if cfg.mini_batch_size % cfg.micro_batch_size:
            raise ValueError(
                f"ppo.mini_batch_size ({cfg.mini_batch_size}) must be a multiple of "
                f"ppo.micro_batch_size ({cfg.micro_batch_size})"
            )
        check_sampling(cfg.top_k, cfg.top_p, "ppo.")
        self.kl_ctl = (
            rl.AdaptiveKLController(cfg.kl_coef, cfg.kl_target, cfg.kl_horizon)
            if cfg.adaptive_kl
            else rl.FixedKLController(cfg.kl_coef)
        )
        self.updates = 0  # step() calls so far (drives the entropy schedule)
        self.generator = torch.Generator().manual_seed(seed)  # minibatch shuffling

    @property
    def device(self) -> torch.device:
        return next(_unwrap(self.model).parameters()).device

    @property
    def entropy_coef(self) -> float:
        c = self.cfg
        return rl.linear_schedule(c.entropy_coef_start, c.entropy_coef_end, self.updates, c.entropy_decay_updates)

    @property
    def kl_in_reward(self) -> bool:
        return self.cfg.adaptive_kl or self.kl_ctl.value != 0.0

    def reuses_forward(self, batch: int) -> bool:
        """Whether the old policy's log-probs are taken from the update's own forward pass: one optimiser step
        (one epoch, the whole batch in one minibatch) sees the weights the answers were scored under, so the
        separate no-gradient pass would give the same numbers; it is needed only by a critic (GAE's values) and by a
        KL penalty in the reward (before the advantages)."""
        c = self.cfg
        return (
            c.advantage in GROUP_ADVANTAGES and c.epochs == 1 and batch <= c.mini_batch_size and not self.kl_in_reward
        )

    # -- forward passes

    def _policy_forward(
        self,
        input_ids,
        attention_mask,
        start: int = 0,
        allowed: torch.Tensor | None = None,
        prompt_lens: list[int] | None = None,
    ):
        """Log-probs of the taken tokens, values and the sampling log-distribution (rl.sampling_logprobs) for
        shifted positions start..L-2: [B, L-1-start] (the last [.., V]): the logits at position i score token i+1;
        positions before `start` are prompt-only and skipped. `allowed`: packed allowed-token bits of those
        positions ([B, L-1-start, ceil(V/32)], constrained decoding): the masked distribution is scored.
        `prompt_lens` (with ppo.share_prompts): rows with the same prompt share one pass over it."""
        extra = {"prompt_lens": prompt_lens} if prompt_lens is not None and self.cfg.share_prompts else {}
        logits, values = self.model(input_ids, attention_mask, logits_to_keep=input_ids.shape[1] - start, **extra)
        logdist = rl.sampling_logprobs(logits[:, :-1], self.cfg.temperature, _unpacked(allowed, logits))
        return rl.gather_tokens(logdist, input_ids[:, start + 1 :]), values[:, :-1].float(), logdist

    @torch.no_grad()
    def _ref_logprobs(self, input_ids, attention_mask, start: int = 0, allowed: torch.Tensor | None = None):
        keep = input_ids.shape[1] - start
        extra = {"logits_to_keep": keep} if self._ref_keeps_logits else {}
        logits = self.ref_model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **extra).logits
        logits = logits[:, -keep:-1]
        return rl.gather_tokens(
            rl.sampling_logprobs(logits, self.cfg.temperature, _unpacked(allowed, logits)), input_ids[:, start + 1 :]
        )

    # -- stage 1-3: rollout quantities, rewards, advantages

    @torch.no_grad()
    def _prepare(
        self, queries, responses, scores, response_masks, groups=None, allowed=None, behaviour=None
    ) -> tuple[_Rollout, dict]:
        cfg, device = self.cfg, self.device
        input_ids, attention_mask, action_mask = (
            t.to(device) for t in pad_rollouts(queries, responses, self.pad_token_id, response_masks)
        )
        start, action_mask = first_action(action_mask)
        packed = pack_allowed(allowed, action_mask) if allowed is not None else None
        behaviour_logp = None
        if behaviour is not None and cfg.tis_cap > 0:
            behaviour_logp = pad_behaviour(queries, responses, behaviour, input_ids.shape[1])[:, start:].to(device)
        scores = torch.as_tensor(scores, dtype=torch.float32, device=device)
        reuse = self.reuses_forward(len(queries))
        prompt_lens = [len(q) for q in queries]
        measure_kl = self.kl_in_reward or cfg.kl_metric
        old_logp, old_values, ref_logp = [], [], []
        for idx in _chunks(torch.arange(len(queries), device=device), cfg.micro_batch_size):
            bits = None if packed is None else packed[idx.cpu()]
            if not reuse:
                logp, values, _ = self._policy_forward(
                    input_ids[idx], attention_mask[idx], start, bits, [prompt_lens[i] for i in idx.tolist()]
                )
                old_logp.append(logp)
                old_values.append(values)
            if measure_kl:
                ref_logp.append(self._ref_logprobs(input_ids[idx], attention_mask[idx], start, bits))
        ref_logp = torch.cat(ref_logp) if measure_kl else None
        if reuse:  # the update's forward gives the old log-probs; no KL in the reward, no values needed
            old_logp = old_values = None
            kl = torch.zeros_like(action_mask, dtype=torch.float32)
        else:
            old_logp, old_values = torch.cat(old_logp), torch.cat(old_values)
            kl = (
                rl.kl_estimate(old_logp, ref_logp, cfg.kl_estimator) * action_mask
                if measure_kl
                else torch.zeros_like(old_logp)
            )

        # per-token reward: KL penalty everywhere, the scalar reward on the last response token
        rewards = -self.kl_ctl.value * kl
        rows = torch.arange(len(queries), device=device)
        rewards[rows, last_index(action_mask)] += scores

        if cfg.advantage in GROUP_ADVANTAGES:  # one advantage per answer: its return against its task's other answers
            if groups is None or len(groups) != len(queries):
                raise ValueError(f"ppo.advantage={cfg.advantage} needs the group (task) of every rollout")
            returns = rl.discounted_returns(rewards, action_mask, cfg.gamma)
            first = action_mask.argmax(1)
            seq_returns = returns[rows, first]  # the return from each answer's first token
            if cfg.advantage == "rloo":
                seq_adv = rl.rloo_advantages(seq_returns, groups)
            else:  # the score's return normalised in its group (grpo: / the group's std), the KL penalties' centred
                # (each return on its own, not the score's as the total less the KL's: a difference rounds, and a
                # group whose scores are equal would get a std of rounding errors, which grpo divides by)
                score_rewards = torch.zeros_like(rewards)
                score_rewards[rows, last_index(action_mask)] = scores
                score_returns = rl.discounted_returns(score_rewards, action_mask, cfg.gamma)[rows, first]
                kl_returns = rl.discounted_returns(-self.kl_ctl.value * kl, action_mask, cfg.gamma)[rows, first]
                seq_adv = rl.group_advantages(
                    score_returns, groups, scale=cfg.advantage == "grpo"
                ) + rl.group_advantages(kl_returns, groups, scale=False)
            advantages = seq_adv[:, None] * action_mask
        else:
            advantages, returns = rl.gae(rewards, old_values * action_mask, action_mask, cfg.gamma, cfg.lam)
        raw_adv_mean = rl.masked_mean(advantages, action_mask).item()
        # group advantages are used as they are; so are gae's over fewer than WHITEN_MIN sequences, where the
        # batch mean would be the lone answers' own return and whitening would erase the sign of their reward
        if cfg.whiten_advantages and cfg.advantage == "gae" and len(queries) >= WHITEN_MIN:
            advantages = rl.masked_whiten(advantages, action_mask)
        kl_seq = kl.sum(1).mean().item()
        stats = {}
        if groups is not None:  # answers whose task's answers scored differently: where a group baseline learns
            stats["mixed_groups"] = sum(rl.mixed_groups(scores.tolist(), groups)) / len(groups)
        stats.update(
            {
                "score_mean": scores.mean().item(),
                "score_std": scores.std().item() if len(scores) > 1 else 0.0,
                "reward_total_mean": rewards.sum(1).mean().item(),
                "kl_coef": self.kl_ctl.value,
                "returns_mean": rl.masked_mean(returns, action_mask).item(),
                "advantages_mean": raw_adv_mean,
                "response_len": action_mask.sum(1).mean().item(),
                "tokens": int(action_mask.sum().item()),
            }
        )
        if measure_kl and not reuse:  # (reused: the update measures them, _loss)
            stats["kl"] = rl.masked_mean(kl, action_mask).item()  # per token, with the configured estimator
            stats["kl_seq"] = kl_seq  # summed over the response, averaged over the batch
        if not reuse:
            stats["values_mean"] = rl.masked_mean(old_values, action_mask).item()
            stats["explained_var"] = rl.explained_variance(old_values, returns, action_mask).item()
        return _Rollout(
            input_ids,
            attention_mask,
            start,
            action_mask,
            old_logp,
            old_values,
            advantages,
            returns,
            packed,
            ref_logp if reuse else None,
            prompt_lens,
            behaviour_logp,
        ), stats

    def _prepare_replay(self, replay) -> _Replay | None:
        """Pad (queries, responses, masks) of replayed answers; None when replay is off or empty."""
        if replay is None or self.cfg.replay_coef <= 0 or not replay[0]:
            return None
        queries, responses, masks = replay
        input_ids, attention_mask, action_mask = (
            t.to(self.device) for t in pad_rollouts(queries, responses, self.pad_token_id, masks)
        )
        start, action_mask = first_action(action_mask)
        return _Replay(input_ids, attention_mask, start, action_mask, int(action_mask.sum().item()))

    def _joint_forward(self, r: _Rollout, idx: torch.Tensor, rep: _Replay, ridx: torch.Tensor):
        """PPO rows `idx` and replay rows `ridx` in one forward pass (right-padded to one width, scored from the
        earlier start). Returns the PPO rows' (logp, values, logits) on their own axis, scored at ppo.temperature,
        and the replay rows' logp, scored at temperature 1."""
        a_ids, b_ids = r.input_ids[idx], rep.input_ids[ridx]
        width = max(a_ids.shape[1], b_ids.shape[1])
        ids = torch.cat([_pad_right(a_ids, width, self.pad_token_id), _pad_right(b_ids, width, self.pad_token_id)])
        att = torch.cat([_pad_right(r.attention_mask[idx], width, 0), _pad_right(rep.attention_mask[ridx], width, 0)])
        start = min(r.start, rep.start)
        n, a0, b0 = len(idx), r.start - start, rep.start - start
        a = slice(a0, a0 + a_ids.shape[1] - 1 - r.start)
        b = slice(b0, b0 + b_ids.shape[1] - 1 - rep.start)
        bits = None
        if r.allowed is not None:  # the PPO rows' recorded bits on the joint axis; replay rows allow every token
            bits = torch.full((n, width - 1 - start, r.allowed.shape[-1]), -1, dtype=torch.int32)
            bits[:, a] = r.allowed[idx.cpu()]
        logits, values = self.model(ids, att, logits_to_keep=width - start)
        logits, targets = logits[:, :-1], ids[:, start + 1 :]
        # PPO rows: the distribution they were sampled from (ppo.temperature, their grammar's mask)
        logdist = rl.sampling_logprobs(logits[:n], self.cfg.temperature, _unpacked(bits, logits))
        logp = rl.gather_tokens(logdist, targets[:n])
        # replay rows: the untempered policy's (T = 1) likelihood, the policy that is evaluated; an NLL taken at the
        # sampling temperature T would fit logits / T to the data and leave the T = 1 policy flatter (docs/rl.md)
        replay_logp = rl.gather_tokens(rl.sampling_logprobs(logits[n:], 1.0), targets[n:])
        return (logp[:, a], values[:n, :-1].float()[:, a], logdist[:, a]), replay_logp[:, b]

    # -- stage 4: minibatch updates

    def _loss(
        self,
        r: _Rollout,
        idx: torch.Tensor,
        entropy_coef: float,
        n_tokens: float,
        rep: _Replay | None = None,
        ridx: torch.Tensor | None = None,
        n_seqs: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, dict]:
        """PPO loss of micro-batch rows `idx` as their share of the minibatch's token mean (`n_tokens`: action
        tokens in the whole minibatch; `n_seqs`: its answers, for ppo.loss_aggregation's per-answer means), and the
        replay NLL of replay rows `ridx` (their share of the replay batch's token mean; None without replay rows).
        The stats are shares too: a minibatch's add up to its means (clipfrac, approx_kl: token means)."""
        cfg, mask = self.cfg, r.action_mask[idx]
        replay_nll = None
        if rep is not None and len(ridx):
            (logp, values, logits), replay_logp = self._joint_forward(r, idx, rep, ridx)
            replay_nll = rl.nll_loss(replay_logp, rep.action_mask[ridx], rep.tokens)
        else:
            bits = None if r.allowed is None else r.allowed[idx.cpu()]
            logp, values, logits = self._policy_forward(
                r.input_ids[idx], r.attention_mask[idx], r.start, bits, [r.prompt_lens[i] for i in idx.tolist()]
            )
        kl_stats = {}
        if r.old_logp is None:  # one optimiser step (reuses_forward): this forward is under the old weights
            old_logp, old_values = logp.detach(), values.detach()
            if r.ref_logp is not None:  # the KL of these answers, as _prepare would have measured it
                kl = rl.kl_estimate(old_logp, r.ref_logp[idx], cfg.kl_estimator) * mask
                kl_stats = {"kl": rl.token_mean(kl, mask, n_tokens).item(), "kl_seq": kl.sum().item() / n_seqs}
        else:
            old_logp, old_values = r.old_logp[idx], r.old_values[idx]
        weights, total = mask, n_tokens  # each token's weight in the loss terms: 1 / n_tokens, or ...
        if self.aggregation != "token_mean":  # ... per answer (GRPO's token mean, Dr. GRPO's constant)
            weights, total = rl.loss_weights(mask, self.aggregation, n_seqs=n_seqs, max_len=cfg.max_new_tokens), 1.0
        tis = None  # ppo.tis_cap: each token's policy loss weighted by min(pi_old / pi_sampler, cap)
        if r.behaviour_logp is not None:
            tis = rl.truncated_is_weights(old_logp, r.behaviour_logp[idx], cfg.tis_cap)
        policy_weights = weights if tis is None else weights * tis
        policy_loss = rl.clipped_policy_loss(
            logp, old_logp, r.advantages[idx], policy_weights, self.clip_low, total, clip_high=self.clip_high
        )
        value_loss = rl.clipped_value_loss(values, old_values, r.returns[idx], weights, cfg.value_clip, total)
        entropy = rl.token_mean(rl.entropy_from_logits(logits), weights, total)
        vf_coef = cfg.vf_coef if cfg.advantage == "gae" else 0.0  # group advantages use no critic (value_loss logged)
        loss = policy_loss + vf_coef * value_loss - entropy_coef * entropy
        with torch.no_grad():
            value_clipped = (values - old_values).abs() > cfg.value_clip
            stats = {
                "loss": loss.item(),
                "policy_loss": policy_loss.item(),
                "value_loss": value_loss.item(),
                "entropy": entropy.item(),
                "clipfrac": rl.clip_fraction(logp, old_logp, mask, self.clip_low, n_tokens, self.clip_high).item(),
                # tokens whose ratio rose above 1 + the upper clip (where clip-higher's wider range binds)
                "clipfrac_high": rl.token_mean(
                    (torch.exp(logp - old_logp) > 1.0 + self.clip_high).float(), mask, n_tokens
                ).item(),
                "value_clipfrac": rl.token_mean(value_clipped.float(), mask, n_tokens).item(),
                "approx_kl": rl.approx_kl(logp, old_logp, mask, n_tokens).item(),
                **kl_stats,
            }
            if tis is not None:
                capped = torch.exp(old_logp - r.behaviour_logp[idx]) > cfg.tis_cap  # NaN compares False
                stats["tis_weight"] = rl.token_mean(tis, mask, n_tokens).item()
                stats["tis_truncated"] = rl.token_mean(capped.float(), mask, n_tokens).item()
        return loss, replay_nll, stats

    def _optimise(self, r: _Rollout, entropy_coef: float, rep: _Replay | None = None) -> dict:
        """`epochs` passes of minibatches, one optimiser step at the end of each (ceil(batch / mini_batch_size) per
        epoch, on either backend: nothing is left accumulated for the next update or a checkpoint)."""
        cfg, batch, engine = self.cfg, r.input_ids.shape[0], self.engine
        sums: dict[str, float] = {}
        steps, grad_norms, replay_losses = 0, [], []
        update_mode(self.model)  # no dropout (ratios exactly 1 before the first step), checkpointing where enabled
        try:
            for _ in range(cfg.epochs):
                perm = torch.randperm(batch, generator=self.generator).to(self.device)
                for mini in _chunks(perm, cfg.mini_batch_size):
                    micros = _chunks(mini, cfg.micro_batch_size)
                    n_tokens = r.action_mask[mini].sum().item()  # every token of the minibatch weighs 1 / n_tokens
                    replay_parts = (
                        torch.tensor_split(torch.arange(rep.input_ids.shape[0], device=self.device), len(micros))
                        if rep is not None
                        else [None] * len(micros)
                    )
                    replay_loss = 0.0
                    for i, (micro, ridx) in enumerate(zip(micros, replay_parts)):
                        loss, replay_nll, stats = self._loss(r, micro, entropy_coef, n_tokens, rep, ridx, len(mini))
                        if replay_nll is not None:
                            loss = loss + cfg.replay_coef * replay_nll
                            replay_loss += replay_nll.item()
                        if engine is not None:
                            # the minibatch's last micro-batch is the boundary (gradients reduced, optimiser step),
                            # however many micro-batches it has; the loss is already the minibatch's token mean
                            engine.set_gradient_accumulation_boundary(i == len(micros) - 1)
                            engine.backward(loss, scale_wrt_gas=False)
                            engine.step()
                        else:
                            loss.backward()
                        for k, v in stats.items():
                            sums[k] = sums.get(k, 0.0) + v
                    steps += 1
                    if rep is not None:
                        replay_losses.append(replay_loss)
                    if engine is None:
                        params = [p for g in self.optimizer.param_groups for p in g["params"]]
                        grad_norms.append(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm).item())
                        self.optimizer.step()
                        self.optimizer.zero_grad(set_to_none=True)
                    else:
                        norm = engine.get_global_grad_norm()
                        if norm is not None:
                            grad_norms.append(float(norm))
        finally:
            self.model.train(False)
        out = {k: v / max(steps, 1) for k, v in sums.items()}  # means over the minibatches
        out["grad_norm"] = sum(grad_norms) / len(grad_norms) if grad_norms else float("nan")
        out["optimizer_steps"] = steps
        if replay_losses:  # token-mean NLL of the replay batch, averaged over the optimiser steps
            out["replay_loss"] = sum(replay_losses) / len(replay_losses)
        return out

    # -- the public step

    def step(
        self,
        queries: Sequence[Sequence[int]],
        responses: Sequence[Sequence[int]],
        scores: Sequence[float] | torch.Tensor,
        response_masks: Sequence[Sequence[int]] | None = None,
        replay: tuple[Sequence, Sequence, Sequence | None] | None = None,
        groups: Sequence | None = None,
        allowed: Sequence[torch.Tensor | None] | None = None,
        behaviour_logprobs: Sequence[Sequence[float] | None] | None = None,
    ) -> dict:
        """One PPO update on a batch of rollouts; returns the metrics dict (plain names, floats). `replay` =
        (queries, responses, response masks or None) of successful answers for the auxiliary NLL loss (used when
        ppo.replay_coef > 0; metric `replay_loss`). `groups`: the task of every rollout (needed by ppo.advantage=rloo,
        grpo and dr_grpo).
        `allowed`: per rollout, the packed allowed-token bits its action tokens were sampled under ([actions,
        ceil(V/32)] int32, `Sample.allowed`; None: unconstrained); old, new and reference log-probs are then scored
        under the same masks (docs/rl.md).
        `behaviour_logprobs`: per rollout, the sampler's log-prob of each response token (None: unknown); with
        ppo.tis_cap > 0 they weight the policy loss (truncated importance sampling), else they are not used."""
        t0 = time.perf_counter()
        rollout, stats = self._prepare(queries, responses, scores, response_masks, groups, allowed, behaviour_logprobs)
        entropy_coef = self.entropy_coef
        stats.update(self._optimise(rollout, entropy_coef, self._prepare_replay(replay)))
        # stage 5: coefficients for the next update; an adaptive beta follows the KL of every rank's samples (a
        # collective: every rank updates), so that it stays the same on all of them
        if self.cfg.adaptive_kl:
            kl_seq, n_samples = weighted_mean_over_ranks(stats["kl_seq"], len(queries))
            self.kl_ctl.update(kl_seq, int(n_samples))
        self.updates += 1
        stats["entropy_coef"] = entropy_coef
        stats["lr"] = self.optimizer.param_groups[0]["lr"] if self.optimizer is not None else float("nan")
        stats["update_s"] = time.perf_counter() - t0
        return stats

    def state_dict(self) -> dict:
        """Trainer counters for checkpoints (model and optimiser states are saved by their owners)."""
        return {"updates": self.updates, "kl_ctl": self.kl_ctl.state_dict(), "rng": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.updates = int(state["updates"])
        self.kl_ctl.load_state_dict(state["kl_ctl"])
        self.generator.set_state(state["rng"])


# ---------------------------------------------------------------------------- sampling


@dataclass
class Sample:
    """One sampled answer: its token ids (up to and including eos), their log-probs, whether eos ended it."""

    tokens: list[int]
    logprobs: list[float]
    finished: bool
    allowed: torch.Tensor | None = None  # constrained decoding: packed allowed-token bits of each step [T, W]


def policy_of(model):
    """The causal LM inside an ActorCritic / DeepSpeed engine (or the model itself)."""
    inner = _unwrap(model)
    return getattr(inner, "policy", inner)


def _zero3_partitioned(model) -> bool:
    """Whether DeepSpeed ZeRO-3 partitions this model's parameters (they carry a `ds_id`)."""
    return hasattr(next(model.parameters()), "ds_id")


def check_sampling(top_k: int, top_p: float, prefix: str = "") -> None:
    """Refuse top-k / nucleus truncation: the trainer scores every token under the full tempered distribution
    (the reference too, whose KL needs the same support), so truncated sampling would make PPO's ratio compare
    another distribution than the one the tokens came from (docs/rl.md)."""
    if top_k:
        raise UserError(
            f"{prefix}top_k={top_k}: top-k sampling is not supported (the PPO trainer scores the full "
            f"tempered distribution); set {prefix}top_k=0 and tune {prefix}temperature instead"
        )
    if top_p < 1.0:
        raise UserError(
            f"{prefix}top_p={top_p}: nucleus sampling is not supported (the PPO trainer scores the full "
            f"tempered distribution); set {prefix}top_p=1.0 and tune {prefix}temperature instead"
        )


def _sampling_processor(temperature: float, decoding=None, prompt_width: int = 0):
    """A Hugging Face logits processor whose output is rl.sampling_logprobs: the only one `generate` uses. With a
    grammar's `decoding` (selfplay.rollout.constrained), each step's allowed tokens mask the distribution (and are
    recorded for the trainer)."""
    from transformers import LogitsProcessor

    class SamplingDistribution(LogitsProcessor):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            if decoding is None:
                return rl.sampling_logprobs(scores, temperature)
            last = input_ids[:, -1].cpu() if input_ids.shape[1] > prompt_width else None
            return rl.sampling_logprobs(scores, temperature, decoding.step(last).to(scores.device))

    return SamplingDistribution()


@torch.no_grad()
def generate(
    model,
    prompts: Sequence[Sequence[int]],
    *,
    pad_token_id: int,
    eos_token_id: int | Sequence[int],
    max_new_tokens: int = 256,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    do_sample: bool = True,
    synced_gpus: bool = False,
    return_scores: bool = False,
    constraint=None,
):
    """Batched sampling (left-padded prompts, HF `generate` with a KV cache) from rl.sampling_logprobs.

    The generation configuration is explicit: the model's own `generation_config` (a checkpoint's repetition
    penalty, n-gram bans, min_p, suppressed tokens, ...) is set aside for the call, and the only logits processor is
    the sampling distribution the PPO trainer scores, so each Sample's log-probs are the trainer's. top_k / top_p
    other than 0 / 1 are refused (`check_sampling`). Greedy decoding takes the argmax of the same distribution.
    Under ZeRO-3 with several ranks synced_gpus is switched on by itself. With return_scores, also returns the
    [B, new, V] log-distributions sampled from (padded steps included). `constraint`: a compiled
    grammar (selfplay.rollout.constrained.GrammarConstraint): tokens are drawn from the masked, renormalised
    distribution and each Sample carries the packed allowed-token bits of its steps (`Sample.allowed`) for the trainer.
    """
    from transformers import GenerationConfig, LogitsProcessorList

    check_sampling(top_k, top_p)
    policy = policy_of(model)
    device = next(policy.parameters()).device
    # ZeRO-3 gathers parameters inside every forward: all ranks must keep stepping until every rank is done
    synced_gpus = synced_gpus or (_zero3_partitioned(policy) and dist.is_initialized() and dist.get_world_size() > 1)
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for b, p in enumerate(prompts):
        input_ids[b, width - len(p) :] = torch.tensor(list(p), dtype=torch.long)
        attention_mask[b, width - len(p) :] = 1
    eos_ids = {eos_token_id} if isinstance(eos_token_id, int) else set(eos_token_id)
    # every decoding option neutral (temperature 1, no top-k/top-p: the processor below does the tempering)
    config = GenerationConfig(
        do_sample=do_sample,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        num_beams=1,
        max_new_tokens=max_new_tokens,
        pad_token_id=pad_token_id,
        eos_token_id=sorted(eos_ids),
        return_dict_in_generate=True,
        output_scores=True,
    )
    decoding = constraint.start(len(prompts)) if constraint is not None else None
    was_training, own_config = policy.training, policy.generation_config
    policy.eval()
    policy.generation_config = GenerationConfig()  # HF fills what `config` leaves unset from the model's own
    try:
        out = policy.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention_mask.to(device),
            generation_config=config,
            synced_gpus=synced_gpus,
            logits_processor=LogitsProcessorList([_sampling_processor(temperature, decoding, width)]),
        )
    finally:
        policy.generation_config = own_config
        policy.train(was_training)
    new_tokens = out.sequences[:, width:].cpu()
    scores = torch.stack(out.scores, dim=1).float().cpu()  # [B, new, V]: what each token was drawn from
    logprobs = rl.logprobs_from_logits(scores, new_tokens)
    samples = []
    for b in range(len(prompts)):
        tokens, lps, finished = [], [], False
        for tok, lp in zip(new_tokens[b].tolist(), logprobs[b].tolist()):
            tokens.append(tok)
            lps.append(lp)
            if tok in eos_ids:
                finished = True
                break
        samples.append(
            Sample(tokens, lps, finished, decoding.recorded(b, len(tokens)) if decoding is not None else None)
        )
    return (samples, scores) if return_scores else samples
