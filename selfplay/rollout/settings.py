"""The `rollout:` config section and its checks, apart from the engines themselves (selfplay/rollout/engine.py), so
that the ground-floor config (selfplay/runtime/config.py) can hold and check the section without importing the
engines, the agents and the trainer they reach: the engines' names come from the registry
(selfplay/rollout/engines.py), which imports no engine."""

from __future__ import annotations

from dataclasses import dataclass

from selfplay.rollout.engines import engine_name, engine_names  # noqa: F401 - engine_name: the config's readers
from selfplay.runtime.errors import UserError

SYNCS = ("auto", "reload", "load_weights", "folder")
KEY = "rollout.engine"
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)  # vLLM CPU attention's head sizes


@dataclass
class RolloutConfig:
    # hf (Hugging Face generate on the trainer's model) | vllm (a vLLM engine in each rank) | a registered engine
    engine: str = "hf"
    generator_engine: str = ""  # the generator's engine, when it differs from rollout.engine ("" = the same)
    kv_cache_gb: float = 1.0  # vllm, CPU build: KV-cache space per engine in GiB (VLLM_CPU_KVCACHE_SPACE)
    gpu_memory_utilization: float = 0.3  # vllm on a GPU: share of its memory each engine takes (weights + KV cache)
    sleep: bool = True  # vllm on a GPU: the engines sleep (weights offloaded, KV cache freed) during PPO updates
    # weight sync after each update: auto (CPU: reload, GPU: load_weights) | reload | load_weights | folder
    sync: str = "auto"
    sync_dir: str = "/dev/shm"  # rollout.sync=folder: where the weights are written for the engine to reload
    gap_answers: int = 8  # answers per sampled batch the trainer re-scores for rollout/logprob_gap (0 = off)


def check_rollout(cfg) -> None:
    """The `rollout:` values, before any work (one line naming the key); the tiny model's head size where the CPU
    build is to serve it (a pretrained model's is checked when its engine starts)."""
    rcfg, m = cfg.rollout, cfg.model
    if (
        "vllm" in (rcfg.engine, rcfg.generator_engine)
        and m.name_or_path == "tiny"
        and m.n_head > 0
        and m.n_embd % m.n_head == 0
        and m.n_embd // m.n_head not in CPU_HEAD_SIZES
        and not on_gpu()
    ):
        raise UserError(head_size_error(m.n_embd // m.n_head))
    for key in ("engine", "generator_engine"):
        value = getattr(rcfg, key)
        if value not in engine_names() and not (key == "generator_engine" and value == ""):
            raise UserError(f"rollout.{key} must be one of {', '.join(engine_names())}, got {value!r}")
    if rcfg.sync not in SYNCS:
        raise UserError(f"rollout.sync must be one of {', '.join(SYNCS)}, got {rcfg.sync!r}")
    if rcfg.kv_cache_gb <= 0 or not 0 < rcfg.gpu_memory_utilization <= 1:
        raise UserError("rollout.kv_cache_gb must be > 0 and rollout.gpu_memory_utilization in (0, 1]")
    if rcfg.gap_answers < 0:
        raise UserError(f"rollout.gap_answers must be >= 0, got {rcfg.gap_answers}")


def head_size_error(head: int) -> str:
    return (
        f"{KEY}=vllm: vLLM's CPU attention takes head sizes {', '.join(map(str, CPU_HEAD_SIZES))}, this "
        f"model's is {head} (model.n_embd / model.n_head): change them or use {KEY}=hf"
    )


def on_gpu() -> bool:
    import torch

    return torch.cuda.is_available()
