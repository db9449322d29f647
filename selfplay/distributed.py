"""torch.distributed and DeepSpeed, or a single plain process, behind a few small functions.

- `init_distributed()` joins the process group torchrun describes in the environment (RANK, WORLD_SIZE,
  LOCAL_RANK, MASTER_ADDR/PORT), or returns a single-process `DistInfo` when there is none;
- `wrap_model(model, ppo_cfg, dist_cfg, info)` returns (engine, None) from `deepspeed.initialize` with a ZeRO config
  from `configs/deepspeed/` (its "auto" fields filled from the `ppo:` section), or (model, AdamW) without DeepSpeed
  (DistributedDataParallel when there are several processes);
- `barrier`, `broadcast_object`, `gather_objects`, `all_reduce_mean`: no-ops in a single process.

On a CPU (no CUDA) DeepSpeed runs with DS_ACCELERATOR=cpu over gloo; the CPU configs use `"torch_adam": true` so
no fused optimiser is compiled (the first run still JIT-builds a small comm op, about 50 s, cached under ~/.cache).

`python -m selfplay.distributed --smoke OUT` (under torchrun) runs a few PPO steps on a tiny model and writes each
rank's parameter checksum to OUT/rank_N.json: a quick check that a cluster setup trains and stays in sync.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from selfplay.config import CONFIG_DIR
from selfplay.errors import UserError

DEEPSPEED_CONFIG_DIR = CONFIG_DIR / "deepspeed"


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits: global rank, number of processes, rank on this node, backend (None = single)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None

    @property
    def is_main(self) -> bool:
        """Rank 0 owns logging, corpus writes and checkpoint markers."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _default_backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def init_distributed(backend: str = "", timeout_min: int = 30) -> DistInfo:
    """Join the torchrun process group (idempotent); a single process when WORLD_SIZE is unset or 1."""
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # must be set before deepspeed is imported
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if world_size <= 1:
        return DistInfo()
    backend = backend or _default_backend()
    if not dist.is_initialized():
        if backend == "nccl":
            torch.cuda.set_device(local_rank)
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(minutes=timeout_min))
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, backend)


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """`obj` from rank `src` on every rank (any picklable object)."""
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order, on every rank."""
    if not is_distributed():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def all_reduce_mean(value: float) -> float:
    """Mean of a float over the ranks (e.g. a metric)."""
    if not is_distributed():
        return float(value)
    t = torch.tensor([float(value)], dtype=torch.float64)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t)
    return t.item() / dist.get_world_size()


# ---------------------------------------------------------------------------- DeepSpeed


def load_deepspeed_config(name_or_path: str) -> dict:
    """A DeepSpeed JSON config: a file name in configs/deepspeed/ or a path."""
    path = Path(name_or_path)
    if not path.exists():
        path = DEEPSPEED_CONFIG_DIR / name_or_path
    if not path.exists():
        names = sorted(p.name for p in DEEPSPEED_CONFIG_DIR.glob("*.json"))
        raise UserError(f"DeepSpeed config {name_or_path!r} not found (choose one of {names} or give a path)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise UserError(f"DeepSpeed config {path} is not valid JSON: {exc}") from exc


def fill_deepspeed_config(ds: dict, ppo_cfg, world_size: int) -> dict:
    """Replace the "auto" fields with values from the `ppo:` section (batch sizes, clipping, optimiser)."""
    ds = json.loads(json.dumps(ds))  # deep copy
    gas = ppo_cfg.mini_batch_size // ppo_cfg.micro_batch_size
    auto = {
        "train_micro_batch_size_per_gpu": ppo_cfg.micro_batch_size,
        "gradient_accumulation_steps": gas,
        "train_batch_size": ppo_cfg.micro_batch_size * gas * world_size,
        "gradient_clipping": ppo_cfg.max_grad_norm,
    }
    for key, value in auto.items():
        if ds.get(key, "auto") == "auto":
            ds[key] = value
    params = ds.get("optimizer", {}).get("params", {})
    for key, value in {"lr": ppo_cfg.lr, "weight_decay": ppo_cfg.weight_decay}.items():
        if params.get(key) == "auto":
            params[key] = value
    return ds


def wrap_model(model: torch.nn.Module, ppo_cfg, dist_cfg, info: DistInfo):
    """(engine, None) through `deepspeed.initialize`, or (model, AdamW) without DeepSpeed (DDP across ranks)."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    if dist_cfg.deepspeed:
        if not torch.cuda.is_available():
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        import deepspeed

        ds_config = fill_deepspeed_config(load_deepspeed_config(dist_cfg.zero_config), ppo_cfg, info.world_size)
        if info.distributed and not dist.is_initialized():
            init_distributed(dist_cfg.backend, dist_cfg.timeout_min)
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=trainable, config=ds_config)
        return engine, None
    if torch.cuda.is_available():
        model = model.to(f"cuda:{info.local_rank}")
    optimizer = torch.optim.AdamW(trainable, lr=ppo_cfg.lr, weight_decay=ppo_cfg.weight_decay)
    if info.distributed:
        ids = [info.local_rank] if torch.cuda.is_available() else None
        # a separate critic backbone never uses its LM head; otherwise every parameter takes part in each step
        unused = getattr(model, "critic", None) is not None
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids, find_unused_parameters=unused)
    return model, optimizer


def param_checksum(model: torch.nn.Module) -> dict:
    """sha256 over every parameter's bytes (name order) and the float sum: equal models give equal checksums.
    Collective under ZeRO-3 (the partitioned parameters are gathered): call it on every rank."""
    import contextlib

    named = sorted(getattr(model, "module", model).named_parameters())
    gather = contextlib.nullcontext()
    if named and hasattr(named[0][1], "ds_id"):  # ZeRO-3: each rank holds a shard; gather the full tensors
        import deepspeed

        gather = deepspeed.zero.GatheredParameters([p for _, p in named])
    h, total = hashlib.sha256(), 0.0
    with gather:
        for name, p in named:
            data = p.detach().float().cpu().contiguous()
            h.update(name.encode())
            h.update(data.numpy().tobytes())
            total += data.double().sum().item()
    return {"sha256": h.hexdigest(), "sum": total}


# ---------------------------------------------------------------------------- smoke run


def smoke(out_dir: str, zero_config: str = "zero2_cpu.json", steps: int = 3, deepspeed_on: bool = True) -> dict:
    """A few PPO steps on a tiny random GPT-2, each rank on its own rollouts; writes OUT/rank_N.json."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from selfplay.config import DistributedConfig, PPOConfig
    from selfplay.models import ActorCritic, frozen_copy
    from selfplay.ppo import PPOTrainer, generate

    info = init_distributed()
    torch.manual_seed(0)  # same initial weights on every rank
    policy = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_layer=2, n_embd=32, n_head=2, n_positions=64, bos_token_id=63,
                                        eos_token_id=63, pad_token_id=0,
                                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    model, ref = ActorCritic(policy), frozen_copy(policy)
    ppo_cfg = PPOConfig(lr=1e-3, mini_batch_size=4, micro_batch_size=2, epochs=2)
    engine, optimizer = wrap_model(model, ppo_cfg, DistributedConfig(deepspeed=deepspeed_on, zero_config=zero_config),
                                   info)
    before = param_checksum(engine)
    trainer = PPOTrainer(engine, ref, ppo_cfg, optimizer, pad_token_id=0, seed=info.rank)
    torch.manual_seed(1000 + info.rank)  # different rollouts per rank
    metrics = {}
    for _ in range(steps):
        prompts = torch.randint(1, 64, (8, 5)).tolist()
        samples = generate(engine, prompts, pad_token_id=0, eos_token_id=63, max_new_tokens=6)
        scores = [float(s.tokens[0] % 2) for s in samples]
        metrics = trainer.step(prompts, [s.tokens for s in samples], scores)
    result = {"rank": info.rank, "world_size": info.world_size, "before": before, "after": param_checksum(engine),
              "metrics": metrics}
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    (Path(out_dir) / f"rank_{info.rank}.json").write_text(json.dumps(result, indent=1))
    barrier()
    if dist.is_initialized():
        dist.destroy_process_group()
    return result


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="distributed smoke check (run under torchrun)")
    parser.add_argument("--smoke", metavar="OUT", required=True, help="folder for rank_N.json checksums")
    parser.add_argument("--zero-config", default="zero2_cpu.json", help="file in configs/deepspeed/ or a path")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--no-deepspeed", action="store_true", help="plain torch (DDP across ranks)")
    a = parser.parse_args()
    smoke(a.smoke, a.zero_config, a.steps, not a.no_deepspeed)
