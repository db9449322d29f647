"""The rollout engine contract and its registry (`rollout.engine`, `rollout.generator_engine`; docs/extending.md
"A rollout engine").

An engine is what samples an agent's answers. `LMAgent.sample` hands it the prompts and a `Sampling` (temperature,
greedy, token budget, stop ids), it returns one `Answer` per prompt; `LMAgent.update` calls `before_update` before
the PPO step and `sync` after it; `engine_metrics` (selfplay/rollout/engine.py) asks `take_metrics` once per
iteration. Every agent has one: `HFEngine` (Hugging Face `generate` on the trainer's own model) unless `make_engine`
gives it another.

The registry is lazy: `BUILT_IN` names the module that registers each engine shipped here, imported when the engine
is first built, so that the config (selfplay/runtime/config_parts.py) can check names without importing an engine. An
engine from elsewhere registers itself with `@register_engine(NAME)` when its module is imported.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

# the names' registry, on the config's floor (the config checks the names without importing this room)
from selfplay.runtime.config_parts import BUILT_IN, ENGINES, engine_name, engine_names  # noqa: F401

if TYPE_CHECKING:
    import torch


@dataclass
class Answer:
    """A sampled answer: the prompt ids, the answer ids (eos included when it finished), the decoded text."""

    prompt: list[int]
    tokens: list[int]
    text: str
    finished: bool
    allowed: torch.Tensor | None = None  # constrained decoding: packed allowed-token bits of each answer token
    logprobs: list[float] | None = None  # the sampler's log-prob of each answer token (rollout/logprob_gap)
    closed: int = 0  # tokens of a forced closing at its end (generator.close_reserve; one-token masks)

    def cut(self, n: int) -> tuple[list[int], bool, object, object]:
        """The first n tokens: (tokens, finished, allowed bits, log-probs); finished only if it ended within n."""
        allowed = None if self.allowed is None else self.allowed[:n]
        logprobs = None if self.logprobs is None else self.logprobs[:n]
        return self.tokens[:n], self.finished and len(self.tokens) <= n, allowed, logprobs


@dataclass(frozen=True)
class Sampling:
    """How one batch is sampled, from the distribution the PPO trainer scores (rl.sampling_logprobs): the tempered
    distribution, no top-k / top-p (ppo.top_k / ppo.top_p are refused), its argmax when greedy."""

    temperature: float  # the agent's: agents.<name>.temperature, or ppo.temperature
    max_new_tokens: int  # answer tokens at most (an engine also keeps prompt + answer within agent.max_positions)
    greedy: bool = False  # the argmax instead of a draw (temperature set aside)
    stop_ids: tuple[int, ...] = ()  # an answer ends with the first of these it samples (agent.eos_ids)
    batch_size: int = 64  # prompts per generation call where the engine batches them itself (HFEngine)


class RolloutEngine(Protocol):
    """What `LMAgent` asks of its engine. `on_trainer_model`: generation runs on the trainer's own model, so under
    ZeRO-3 across ranks every generation step is a collective (selfplay/rollout/episodes.py `_calls_in_step` keeps
    the ranks in step), there are no weights to push and nothing to compare."""

    name: str
    on_trainer_model: bool

    def sample(self, agent, prompts: Sequence[Sequence[int]], sampling: Sampling) -> list[Answer]:
        """One answer per prompt, in order: tokens with a stop id when finished, text = agent.decode(tokens); under
        agent.constraint each answer's allowed-token bits; the sampler's log-probs or None."""

    def before_update(self) -> None:
        """Before the agent's PPO step (a vLLM engine on a GPU frees its memory for it)."""

    def sync(self, agent) -> float | None:
        """After the PPO step: the agent's new weights into the engine; the seconds it took (the update's
        weight_sync_s), None where there is nothing to push (on_trainer_model)."""

    def take_metrics(self) -> dict:
        """`weight_sync_s` and/or `logprob_gap` since the last call, then reset (not asked when on_trainer_model)."""


Builder = Callable[..., RolloutEngine]  # builder(cfg, agent, folder, *, rank) -> the agent's engine
# ENGINES (selfplay/runtime/config_parts.py): name -> builder, filled by register_engine as the engines' modules are
# imported; BUILT_IN there names the module that registers each engine shipped here


def register_engine(name: str) -> Callable[[Builder], Builder]:
    """`@register_engine(NAME)` on `builder(cfg, agent, folder, *, rank=0) -> engine`: `rollout.engine=NAME` then
    builds the agent's engine with it (folder: the agent's Hugging Face folder in the checkpoint it starts from)."""

    def add(builder: Builder) -> Builder:
        ENGINES[name] = builder
        return builder

    return add


def make_engine(cfg, agent, folder: str | Path, *, rank: int = 0) -> RolloutEngine:
    """The engine `rollout:` asks for this agent, built from its checkpoint folder `folder`."""
    name = engine_name(cfg.rollout, agent.name)
    if name not in ENGINES and name in BUILT_IN:
        importlib.import_module(BUILT_IN[name])  # its module registers it
    return ENGINES[name](cfg, agent, folder, rank=rank)
