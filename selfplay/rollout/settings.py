"""The `rollout:` config section and its checks, apart from the engines themselves (selfplay/rollout/engine.py).
The section, its checks and the engines' names are defined on the runtime's floor
(selfplay/runtime/config_parts.py), so that the config holds and checks them without importing the engines, the
agents and the trainer they reach; this module keeps their names for the rollout room's readers."""

from __future__ import annotations

from selfplay.runtime.config_parts import (  # noqa: F401 - the rollout: section, its names kept here
    CPU_HEAD_SIZES,
    KEY,
    SYNCS,
    RolloutConfig,
    check_rollout,
    engine_name,
    engine_names,
    head_size_error,
    on_gpu,
)
