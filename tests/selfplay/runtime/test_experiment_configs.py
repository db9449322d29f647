"""configs/experiments/*.yaml: each loads, on top of the config its `base:` names, and a bad `base:` is one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from selfplay.runtime.config import load_config
from selfplay.runtime.errors import UserError

EXPERIMENTS = sorted((Path(__file__).resolve().parents[3] / "configs" / "experiments").glob("*.yaml"))


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.stem)
def test_every_experiment_loads_over_its_base(path):
    cfg = load_config(path)
    tiny = load_config()  # configs/tiny.yaml, the base of every experiment
    assert cfg.model.n_layer == tiny.model.n_layer and cfg.warmstart.tasks == tiny.warmstart.tasks
    assert cfg.train.fixed_source == "reserved" and cfg.tasks.literals == "wide"


def test_a_file_overrides_its_base_and_its_bases_base():
    control = load_config(next(p for p in EXPERIMENTS if p.stem == "ptx8_control"))
    ptx8 = load_config(next(p for p in EXPERIMENTS if p.stem == "ptx8"))
    assert (control.reward.solved, ptx8.reward.solved) == (0.0, 1.0)
    assert control.train.solver_tasks == 4 and ptx8.train.solver_tasks == 16
    assert control.ppo.replay_source == ptx8.ppo.replay_source == "sft"  # from ptx8.yaml, under the control


def test_a_bad_base_is_named(tmp_path):
    (tmp_path / "a.yaml").write_text("base: missing.yaml\n")
    with pytest.raises(UserError, match="base: config file not found"):
        load_config(tmp_path / "a.yaml")
    (tmp_path / "b.yaml").write_text("base: c.yaml\n")
    (tmp_path / "c.yaml").write_text("base: b.yaml\n")
    with pytest.raises(UserError, match="includes itself"):
        load_config(tmp_path / "b.yaml")
