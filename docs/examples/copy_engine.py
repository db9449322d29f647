"""A third rollout engine, the worked example of docs/extending.md "A rollout engine": `rollout.engine=copy` samples
with Hugging Face `generate` from a copy of the agent's policy that it holds apart from the trainer's (as a served
engine holds weights of its own), and takes the trainer's weights into that copy after every PPO update. A toy: one
process, no ZeRO-3 (whose partitions it would have to gather), no position limit. Importing this module registers
it; tests/selfplay/rollout/test_engine_example.py runs it."""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence

import torch

from selfplay.rl.ppo import generate, policy_of
from selfplay.rollout.engines import Answer, Sampling, register_engine


class CopyEngine:
    name = "copy"
    on_trainer_model = False  # weights of its own: synced after each update, its sync times reported

    def __init__(self, agent):
        self.policy = copy.deepcopy(policy_of(agent.model))
        self.sync_times: list[float] = []

    def sample(self, agent, prompts: Sequence[Sequence[int]], sampling: Sampling) -> list[Answer]:
        """One answer per prompt, from the copy, at the sampling's temperature (its argmax when greedy)."""
        if not prompts:
            return []
        samples = generate(
            self.policy,
            prompts,
            pad_token_id=agent.tokenizer.pad_token_id,
            eos_token_id=list(sampling.stop_ids),
            max_new_tokens=sampling.max_new_tokens,
            temperature=sampling.temperature,
            do_sample=not sampling.greedy,
            constraint=agent.constraint,
        )  # under a grammar: each step's allowed-token bits
        return [
            Answer(list(p), s.tokens, agent.decode(s.tokens), s.finished, s.allowed, s.logprobs)
            for p, s in zip(prompts, samples)
        ]

    def before_update(self) -> None:
        pass  # it holds no memory the update needs

    def sync(self, agent) -> float:
        """The trainer's updated weights into the copy; the seconds it took."""
        t0 = time.perf_counter()
        with torch.no_grad():
            self.policy.load_state_dict(policy_of(agent.model).state_dict())
        self.sync_times.append(time.perf_counter() - t0)
        return self.sync_times[-1]

    def take_metrics(self) -> dict:
        out = {"weight_sync_s": sum(self.sync_times)} if self.sync_times else {}
        self.sync_times = []
        return out


@register_engine("copy")
def copy_engine(cfg, agent, folder, *, rank: int = 0) -> CopyEngine:
    return CopyEngine(agent)
