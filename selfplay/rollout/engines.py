"""Which rollout engine each agent gets (`rollout.engine`, `rollout.generator_engine`): Hugging Face `generate` on
the trainer's own model (None: `LMAgent.sample` calls `sample_hf`), an in-process vLLM engine (`VLLMEngine`), or,
with both agents on vLLM, the generator's engine in a child process of its own (`ChildEngine`): one vLLM engine per
process (docs/rl.md "One engine per process")."""

from __future__ import annotations

from pathlib import Path

from selfplay.rollout.engine import VLLMEngine
from selfplay.rollout.engine_process import ChildEngine
from selfplay.rollout.settings import engine_name


def make_engine(cfg, agent, folder: str | Path, *, rank: int = 0):
    """The engine `rollout:` asks for this agent (None for hf: `LMAgent.sample` then calls `sample_hf` itself). With
    both agents on vLLM the generator's engine runs in a child process (`ChildEngine`): one engine per process."""
    if engine_name(cfg.rollout, agent.name) == "hf":
        return None
    kwargs = dict(seed=cfg.run.seed + rank, dtype=cfg.model.dtype, trust_remote_code=cfg.model.trust_remote_code)
    if agent.name == "generator" and engine_name(cfg.rollout, "solver") == "vllm":
        return ChildEngine(agent, folder, cfg.rollout, **kwargs)
    return VLLMEngine(agent, folder, cfg.rollout, **kwargs)
