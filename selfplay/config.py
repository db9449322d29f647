"""One typed config for everything: OmegaConf over dataclasses.

Each section is a dataclass whose fields say what they are. `load_config` merges, in order, the
defaults below, a YAML file (default `configs/tiny.yaml`) and `key=value` overrides, and rejects
unknown keys or badly typed values with a one-line error naming the key, before any work starts.

Sections are owned by the package that uses them; add a field here (with a comment) when you need one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from selfplay.errors import UserError
from selfplay.mixer import MixerConfig

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = REPO_ROOT / "configs"
DEFAULT_CONFIG = CONFIG_DIR / "tiny.yaml"


@dataclass
class RunConfig:
    dir: str = "runs/tiny"  # run folder: checkpoints/, tb/, corpus.sqlite; resuming if it holds a checkpoint
    seed: int = 0  # global seed (python, numpy, torch, task generation)
    keep_last: int = 3  # checkpoints kept (older step_N folders are removed after a new one is complete)


@dataclass
class SandboxConfig:
    backend: str = "process"  # "process" (fork-server workers) or "docker" (warm containers)
    workers: int = 0  # parallel workers; 0 = one per CPU core
    timeout_s: float = 5.0  # wall-clock limit per program
    memory_mb: int = 512  # address-space limit per program
    cache: bool = True  # content-addressed result cache
    cache_path: str = ""  # on-disk SQLite cache shared by workers; "" = in memory only
    trace_path: str = ""  # JSONL log of every execution; "" = off
    image: str = "selfplay-sandbox:latest"  # Docker image for the docker backend


@dataclass
class TasksConfig:
    max_level: int = 4  # highest curriculum level procedural families generate (1..4)
    n_visible: int = 3  # visible examples shown to the solver
    n_hidden: int = 8  # hidden tests used for grading
    heldout_splits: list[str] = field(default_factory=list)  # held-out split names (see generator.splits)


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    tasks: TasksConfig = field(default_factory=TasksConfig)
    mixer: MixerConfig = field(default_factory=MixerConfig)  # adaptive difficulty mixer (selfplay/mixer.py)


def _schema():
    return OmegaConf.structured(Config)


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Any:
    """Defaults <- YAML file <- `key=value` overrides. Returns a typed OmegaConf object (attribute access)."""
    cfg = _schema()
    path = Path(path) if path is not None else DEFAULT_CONFIG
    if not path.exists():
        raise UserError(f"config file not found: {path}")
    try:
        file_cfg = OmegaConf.load(path)
    except Exception as exc:  # yaml errors carry the line number
        raise UserError(f"cannot parse config {path}: {exc}".replace("\n", " ")) from exc
    try:
        cfg = OmegaConf.merge(cfg, file_cfg)
    except OmegaConfBaseException as exc:
        raise UserError(f"{path}: {_describe(exc)}") from exc
    for item in overrides:
        if "=" not in item:
            raise UserError(f"override {item!r} is not key=value")
    try:
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(list(overrides)))
    except OmegaConfBaseException as exc:
        raise UserError(f"override: {_describe(exc)}") from exc
    return cfg


def _describe(exc: OmegaConfBaseException) -> str:
    key = getattr(exc, "full_key", None)
    msg = str(exc).split("\n")[0]
    if "not in struct" in msg or "Key '" in msg and "not" in msg:
        return f"unknown config key '{key}'"
    return f"bad value for config key '{key}': {msg}" if key else msg


def to_dict(cfg: Any) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)


def field_names(section: type) -> list[str]:
    return [f.name for f in dataclasses.fields(section)]
