"""A run's checkpoints read back for evaluation and analysis: which checkpoint a path names, the run's config
from its state.json, and its solver for sampling. Used by `selfplay eval` and by scripts that read runs."""

from __future__ import annotations

import copy
from pathlib import Path

from selfplay.runtime.errors import UserError


def resolve(target: str) -> tuple[Path, Path]:
    """(run folder, checkpoint folder) of a run folder or a step_N checkpoint folder."""
    from selfplay.runtime.checkpoint import STATE_FILE, CheckpointManager

    path = Path(target)
    if not path.is_dir():
        raise UserError(f"{target}: no such folder")
    if (path / STATE_FILE).exists():  # a checkpoint: RUN_DIR/checkpoints/step_N
        if not (path / "solver").is_dir():
            raise UserError(f"{target} has a state.json but no solver/ folder: not a complete checkpoint")
        return path.resolve().parent.parent, path
    try:
        latest = CheckpointManager(path).latest_checkpoint()
    except RuntimeError as exc:
        raise UserError(str(exc)) from exc
    if latest is None:
        raise UserError(
            f"{target} holds no checkpoint (no checkpoints/latest; run `selfplay warmstart` or "
            f"`selfplay train` with run.dir={target} first)"
        )
    return path, latest


def config_of(state: dict, checkpoint: Path):
    """The run's typed config from a checkpoint's state.json."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from selfplay.runtime.config import Config

    if not isinstance(state.get("config"), dict):
        raise UserError(f"{checkpoint}/state.json holds no run config")
    try:
        return OmegaConf.merge(OmegaConf.structured(Config), state["config"])
    except OmegaConfBaseException as exc:
        raise UserError(f"{checkpoint}/state.json: config does not fit this code: {str(exc).splitlines()[0]}") from exc


def load_solver(folder: Path, cfg):
    """The checkpoint's solver for sampling only (no frozen reference loaded), on the GPU when there is one."""
    import torch
    from transformers import AutoTokenizer

    from selfplay.models.agent import LMAgent
    from selfplay.models.factory import ActorCritic, ensure_chat_template, torch_dtype

    if cfg.run.torch_threads > 0:
        torch.set_num_threads(cfg.run.torch_threads)
    tokenizer = ensure_chat_template(AutoTokenizer.from_pretrained(folder, local_files_only=True))
    model = ActorCritic.from_pretrained(folder, dtype=torch_dtype(cfg.model.dtype))
    if torch.cuda.is_available():
        model.to("cuda")
    # the policy stands in for the KL reference, which only PPO updates read: no second copy of the weights
    return LMAgent("solver", model, model.policy, tokenizer, copy.deepcopy(cfg.ppo), seed=cfg.run.seed)
