"""The RL math both agents share: small pure tensor functions (tensors in, tensors out).

Conventions: per-token tensors are shaped [batch, time]; `mask` is 1.0 (or True) on the tokens the
policy produced (the actions) and 0.0 elsewhere (prompt, padding, observation tokens in multi-turn
episodes). Means are over the masked tokens of the whole batch (token-level, as in OpenRLHF/veRL); the
losses take `n_tokens`, the token count of the whole minibatch, so that the losses of its micro-batches
add up to the minibatch's token mean (docs/rl.md); `mask` may also hold per-token weights (`loss_weights`: GRPO's
per-answer mean, Dr. GRPO's constant) with `n_tokens=1`, the losses then being sum(weight * l_t).
`sampling_logprobs` is the one definition of the distribution answers are sampled from, used by the sampler and by
the trainer alike. Every function here is checked against hand-computed numbers in tests/selfplay/rl/test_rl.py
(the GRPO, Dr. GRPO and DAPO ones in tests/selfplay/rl/test_objectives.py).
"""

from __future__ import annotations

import torch

from selfplay.runtime.config import LOSS_AGGREGATIONS  # the names, declared with the config that checks them

# ---------------------------------------------------------------------------- masked statistics


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of `x` where `mask` is set."""
    mask = mask.to(x.dtype)
    return (x * mask).sum() if dim is None else (x * mask).sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `x` over the masked entries (0 when the mask is empty)."""
    mask = mask.to(x.dtype)
    count = mask.sum() if dim is None else mask.sum(dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1.0)


def token_mean(x: torch.Tensor, mask: torch.Tensor, n_tokens: float | torch.Tensor | None = None) -> torch.Tensor:
    """sum(x over the masked entries) / n_tokens (default: the masked count, i.e. the token mean). Given the token
    count of a whole minibatch, the values of its micro-batches add up to the minibatch's token mean."""
    if n_tokens is None:
        return masked_mean(x, mask)
    return masked_sum(x, mask) / torch.as_tensor(n_tokens, dtype=x.dtype, device=x.device).clamp(min=1.0)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of `x` over the masked entries (Bessel-corrected by default)."""
    mask = mask.to(x.dtype)
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    if unbiased:
        n = mask.sum()
        var = var * n / (n - 1).clamp(min=1.0)
    return var


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / std over the masked entries; masked-out entries become 0.

    With `shift_mean=False` only the scale changes (keeps the sign of every advantage).
    """
    mask = mask.to(x.dtype)
    mean, var = masked_mean(x, mask), masked_var(x, mask)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out * mask


# ---------------------------------------------------------------------------- advantages


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over the masked tokens, walking backwards in time.

    delta_t = r_t + gamma * V_{t+1} - V_t,   A_t = delta_t + gamma * lam * A_{t+1},   returns = A + V.
    "t+1" is the next *masked* token: unmasked positions (padding, or observation tokens between the
    turns of a multi-turn episode) are skipped, and the state after the last masked token is terminal
    (V = 0). Rewards must sit on masked tokens; rewards on unmasked positions are ignored.
    Returns (advantages, returns), both 0 outside the mask.
    """
    batch, steps = rewards.shape
    m = mask.to(torch.bool)
    next_value = torch.zeros(batch, dtype=values.dtype, device=values.device)
    next_adv = torch.zeros_like(next_value)
    advantages = torch.zeros_like(values)
    for t in reversed(range(steps)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv = delta + gamma * lam * next_adv
        advantages[:, t] = torch.where(m[:, t], adv, torch.zeros_like(adv))
        next_adv = torch.where(m[:, t], adv, next_adv)
        next_value = torch.where(m[:, t], values[:, t], next_value)
    returns = (advantages + values) * m.to(values.dtype)
    return advantages, returns


def discounted_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Monte-Carlo returns G_t = r_t + gamma * G_{t+1} over the masked tokens (GAE with V = 0, lam = 1)."""
    return gae(rewards, torch.zeros_like(rewards), mask, gamma, 1.0)[0]


def rloo_advantages(returns: torch.Tensor, groups) -> torch.Tensor:
    """REINFORCE leave-one-out (Ahmadian et al. 2024): each sample's return minus the mean return of the other
    samples in its group (the other answers to the same task), so no critic is needed. `returns` is [B], `groups`
    B hashable ids. Advantages sum to 0 within every group; a group whose samples all scored the same gets 0 (an
    all-failed task teaches nothing), and a group of one sample keeps its return (no baseline to subtract)."""
    index: dict = {}
    ids = torch.tensor([index.setdefault(g, len(index)) for g in groups], device=returns.device)
    if len(ids) != len(returns):
        raise ValueError(f"{len(returns)} returns but {len(ids)} group ids")
    sums = torch.zeros(len(index), dtype=returns.dtype, device=returns.device).index_add_(0, ids, returns)
    counts = torch.zeros(len(index), dtype=returns.dtype, device=returns.device).index_add_(
        0, ids, torch.ones_like(returns)
    )
    n = counts[ids]
    baseline = torch.where(n > 1, (sums[ids] - returns) / (n - 1).clamp(min=1), torch.zeros_like(returns))
    return returns - baseline


def group_advantages(returns: torch.Tensor, groups, scale: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """GRPO (Shao et al. 2024): each sample's return minus the mean return of its group, divided by the group's
    standard deviation (Bessel-corrected, as TRL and veRL take it) + eps; with `scale=False`, Dr. GRPO (Liu et al.
    2025): the return minus the group mean, not divided. `returns` is [B], `groups` B hashable ids. Advantages sum
    to 0 within every group; a group whose samples all scored the same gets 0, and a group of one sample keeps its
    return (no baseline, as in `rloo_advantages`)."""
    index: dict = {}
    ids = torch.tensor([index.setdefault(g, len(index)) for g in groups], device=returns.device)
    if len(ids) != len(returns):
        raise ValueError(f"{len(returns)} returns but {len(ids)} group ids")
    zeros = torch.zeros(len(index), dtype=returns.dtype, device=returns.device)
    n = zeros.clone().index_add_(0, ids, torch.ones_like(returns))[ids]
    mean = zeros.clone().index_add_(0, ids, returns)[ids] / n
    centred = returns - mean
    if scale:
        var = zeros.clone().index_add_(0, ids, centred**2)[ids] / (n - 1).clamp(min=1)
        centred = centred / (var.sqrt() + eps)
    return torch.where(n > 1, centred, returns)


def mixed_groups(scores, groups) -> list[bool]:
    """For each sample: whether the samples of its group (the answers to one task) did not all score the same.
    Only those carry a group-baseline signal: a uniform group's leave-one-out advantages are zero up to the KL
    penalties (DAPO's dynamic sampling drops such groups from the update). `scores` and `groups` are parallel."""
    scores, groups = list(scores), list(groups)
    if len(scores) != len(groups):
        raise ValueError(f"{len(scores)} scores but {len(groups)} group ids")
    lo: dict = {}
    hi: dict = {}
    for g, s in zip(groups, scores):
        lo[g], hi[g] = min(lo.get(g, s), s), max(hi.get(g, s), s)
    return [hi[g] > lo[g] for g in groups]


# ---------------------------------------------------------------------------- losses


def loss_weights(
    mask: torch.Tensor,
    mode: str,
    n_tokens: float | None = None,
    n_seqs: int | None = None,
    max_len: float | None = None,
) -> torch.Tensor:
    """Each action token's weight in a minibatch's loss sum(weight * l_t) (pass them as the mask, with n_tokens=1):
    "token_mean": 1 / n_tokens (every token of the minibatch alike; DAPO's); "seq_mean_token_mean": 1 / (its
    answer's tokens * n_seqs) (a token mean per answer, then the mean over answers; GRPO's); "seq_mean_token_sum_norm":
    1 / (max_len * n_seqs) (each answer's token sum over a constant, then the mean over answers; Dr. GRPO's).
    `n_tokens` and `n_seqs` are the minibatch's (default: this mask's), so its micro-batches' losses add up to it."""
    mask = mask.float() if not mask.is_floating_point() else mask
    if mode == "token_mean":
        return mask / float(n_tokens if n_tokens is not None else mask.sum().clamp(min=1.0))
    n_seqs = n_seqs if n_seqs is not None else mask.shape[0]
    if mode == "seq_mean_token_mean":
        return mask / (mask.sum(1, keepdim=True).clamp(min=1.0) * n_seqs)
    if mode == "seq_mean_token_sum_norm":
        if not max_len or max_len <= 0:
            raise ValueError(f"seq_mean_token_sum_norm needs max_len > 0, got {max_len}")
        return mask / (float(max_len) * n_seqs)
    raise ValueError(f"unknown loss aggregation {mode!r}; use one of {', '.join(LOSS_AGGREGATIONS)}")


def clipped_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip: float,
    n_tokens: float | torch.Tensor | None = None,
    clip_high: float | None = None,
) -> torch.Tensor:
    """PPO surrogate: token mean (`token_mean`) of max(-A * ratio, -A * clip(ratio, 1 - clip, 1 + clip_high)),
    ratio = exp(logp - old_logp); `clip_high` (DAPO's clip-higher) defaults to `clip`, the symmetric range."""
    ratio = torch.exp(logp - old_logp)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip, 1.0 + (clip if clip_high is None else clip_high))
    return token_mean(torch.maximum(unclipped, clipped), mask, n_tokens)


def clipped_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float,
    n_tokens: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """0.5 * token mean of max((V - R)^2, (V_old + clip(V - V_old, -clip, clip) - R)^2)."""
    clipped_values = old_values + torch.clamp(values - old_values, -clip, clip)
    loss = torch.maximum((values - returns) ** 2, (clipped_values - returns) ** 2)
    return 0.5 * token_mean(loss, mask, n_tokens)


def nll_loss(logp: torch.Tensor, mask: torch.Tensor, n_tokens: float | torch.Tensor | None = None) -> torch.Tensor:
    """Negative log-likelihood of the masked tokens: sum(-logp) / n_tokens (default: the masked count, i.e. the
    token mean). Pass the token count of a whole batch to make the losses of its chunks add up to the batch mean."""
    return token_mean(-logp, mask, n_tokens)


def clip_fraction(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    mask: torch.Tensor,
    clip: float,
    n_tokens: float | torch.Tensor | None = None,
    clip_high: float | None = None,
) -> torch.Tensor:
    """Share of masked tokens whose ratio lies outside [1 - clip, 1 + clip_high] (`clip_high` default: `clip`)."""
    ratio = torch.exp(logp - old_logp)
    outside = (ratio - 1.0 > (clip if clip_high is None else clip_high)) | (1.0 - ratio > clip)
    return token_mean(outside.to(logp.dtype), mask, n_tokens)


def approx_kl(
    logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor, n_tokens: float | torch.Tensor | None = None
) -> torch.Tensor:
    """KL(old || new) estimated with k3 on the samples: mean of (ratio - 1) - log ratio (always >= 0)."""
    log_ratio = logp - old_logp
    return token_mean(torch.exp(log_ratio) - 1.0 - log_ratio, mask, n_tokens)


def truncated_is_weights(old_logp: torch.Tensor, behaviour_logp: torch.Tensor, cap: float) -> torch.Tensor:
    """Truncated importance sampling (TIS; Yao et al. 2025) of answers drawn by a sampler mu whose log-probs differ
    from the trainer's pi_old (another engine's kernels and precision): per token min(pi_old / mu, cap), without
    gradient. Tokens whose `behaviour_logp` is NaN (no sampler log-prob) weigh 1."""
    ratio = torch.exp(old_logp.detach() - behaviour_logp)
    return torch.where(torch.isnan(behaviour_logp), torch.ones_like(ratio), ratio.clamp(max=cap))


# ---------------------------------------------------------------------------- KL to the reference


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k1") -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from log-probs of tokens sampled from the policy.

    k1 = logp - ref_logp (unbiased, can be negative); k2 = 0.5 * (logp - ref_logp)^2;
    k3 = exp(ref - logp) - (ref - logp) - 1 (unbiased, always >= 0; Schulman's estimator).
    """
    log_ratio = logp - ref_logp
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * log_ratio**2
    if kind == "k3":
        return torch.exp(-log_ratio) + log_ratio - 1.0
    raise ValueError(f"unknown KL estimator {kind!r}; use 'k1', 'k2' or 'k3'")


class FixedKLController:
    """A constant KL coefficient beta."""

    def __init__(self, value: float):
        self.value = float(value)

    def update(self, current_kl: float, n_samples: int) -> float:
        return self.value

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        """Nothing to restore: a fixed beta is the configured one, whatever the checkpoint was saved with (a run
        started from a warm start with another ppo.kl_coef uses its own)."""


class AdaptiveKLController(FixedKLController):
    """Ziegler et al. (2019): move beta so the observed KL tracks `target`.

    error = clip(kl / target - 1, -0.2, 0.2);  beta <- beta * (1 + error * n_samples / horizon).
    """

    def __init__(self, init_value: float, target: float, horizon: float):
        super().__init__(init_value)
        self.init = float(init_value)
        if target <= 0 or horizon <= 0:
            raise ValueError(f"adaptive KL needs target > 0 and horizon > 0, got {target}, {horizon}")
        self.target, self.horizon = float(target), float(horizon)

    def update(self, current_kl: float, n_samples: int) -> float:
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_samples / self.horizon
        return self.value

    def state_dict(self) -> dict:
        return {"value": self.value, "adaptive": True, "init": self.init, "target": self.target}

    def load_state_dict(self, state: dict) -> None:
        """Continue from the saved beta when it was adapted toward the same start and target (a resumed run);
        otherwise (a warm start's fixed beta, or settings changed since) start again from `init_value`."""
        if state.get("adaptive") and state.get("init") == self.init and state.get("target") == self.target:
            self.value = float(state["value"])


# ---------------------------------------------------------------------------- the sampling distribution


def sampling_logprobs(
    logits: torch.Tensor, temperature: float = 1.0, allowed: torch.Tensor | None = None
) -> torch.Tensor:
    """The log-distribution answers are sampled from, at every position: log softmax(logits / temperature), [..., V]
    in float32. The sampler draws from it (selfplay.rl.ppo.SamplingDistribution turns it into Hugging Face's only
    logits processor) and the trainer scores the sampled tokens under it (old, new and reference log-probs), so the
    PPO ratio compares the distribution the tokens really came from. `allowed` ([..., V] bool, e.g. a grammar's
    tokens at each step): the masked, renormalised distribution log softmax(mask(logits / temperature)), -inf on
    every token not allowed (docs/rl.md); a position must allow at least one token."""
    if temperature <= 0:
        raise ValueError(f"sampling temperature must be > 0, got {temperature}")
    if allowed is None:
        return torch.log_softmax(logits.float() / temperature, dim=-1)
    return torch.log_softmax((logits.float() / temperature).masked_fill(~allowed, float("-inf")), dim=-1)


def gather_tokens(logdist: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """logdist[..., token] at each position: [B, T, V], [B, T] -> [B, T]."""
    return torch.gather(logdist, -1, tokens.unsqueeze(-1)).squeeze(-1)


# ---------------------------------------------------------------------------- diagnostics


def logprobs_from_logits(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[token] for each position: [B, T, V], [B, T] -> [B, T]."""
    return gather_tokens(torch.log_softmax(logits.float(), dim=-1), tokens)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution at each position: logsumexp(z) - sum softmax(z) * z (logits or a
    log-distribution alike)."""
    logits = logits.float()
    probs = torch.softmax(logits, dim=-1)
    if torch.isneginf(logits).any():  # a masked distribution: excluded tokens add 0 (and no NaN gradient)
        return torch.logsumexp(logits, dim=-1) - (probs * logits.masked_fill(torch.isneginf(logits), 0.0)).sum(-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(-1)


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """1 - Var(R - V) / Var(R) over the masked tokens: 1 is perfect, 0 is no better than a constant, < 0 worse.

    NaN when the returns have no variance.
    """
    var_r = masked_var(returns, mask, unbiased=False)
    var_err = masked_var(returns - values, mask, unbiased=False)
    if var_r.item() == 0.0:
        return torch.tensor(float("nan"))
    return 1.0 - var_err / var_r


def linear_schedule(start: float, end: float, step: int, total_steps: int) -> float:
    """Linear interpolation from `start` (step 0) to `end` (step >= total_steps); `start` if total_steps <= 0."""
    if total_steps <= 0:
        return float(start)
    frac = min(max(step / total_steps, 0.0), 1.0)
    return float(start + (end - start) * frac)
