"""Checkpoint layout and atomicity (CPU)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from selfplay.runtime.checkpoint import (
    LORA_BASE_DIR,
    CheckpointManager,
    frozen_folder,
    frozen_home,
    rng_state,
    set_rng_state,
    write_pointer,
)


def test_save_latest_and_keep_last(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=2)
    assert mgr.latest_checkpoint() is None
    for step in (1, 2, 3):
        mgr.save(step, {"counter": step * 10}, lambda d, step=step: (d / "model.bin").write_bytes(b"x" * step))
    assert mgr.steps() == [2, 3]
    latest = mgr.latest_checkpoint()
    assert latest.name == "step_3"
    assert mgr.load_state(latest) == {"step": 3, "counter": 30}
    assert (latest / "model.bin").read_bytes() == b"xxx"


def test_the_warm_start_s_step_0_is_never_pruned(tmp_path):
    # a finished run keeps its "before" (step_0) for `selfplay eval`, whatever keep_last says
    mgr = CheckpointManager(tmp_path, keep_last=1)
    for step in (0, 1, 2, 3):
        mgr.save(step, {"counter": step})
    assert mgr.steps() == [0, 3] and mgr.latest_checkpoint().name == "step_3"


def test_pruning_keeps_the_checkpoint_holding_an_adapter_s_own_base_that_a_kept_one_points_to(tmp_path):
    """A LoRA adapter's own base (`lora/base/`) is written once; later checkpoints hold `lora/base.json`, which loading
    follows (`frozen_folder`), and pruning keeps the checkpoint that holds it."""
    ckpt = CheckpointManager(tmp_path, keep_last=1)
    ckpt.save(0, {})

    def base_here(folder):
        (folder / "solver" / LORA_BASE_DIR).mkdir(parents=True)

    ckpt.save(1, {}, base_here)
    home = frozen_home(ckpt.root / "step_1" / "solver", LORA_BASE_DIR)
    assert home == "step_1/solver/lora/base"
    for step in (2, 3):
        ckpt.save(step, {}, lambda folder, home=home: write_pointer(folder / "solver", LORA_BASE_DIR, home))
    assert ckpt.steps() == [0, 1, 3]  # step_2 pruned, step_1 kept: step_3 points to it
    assert json.loads((ckpt.root / "step_3/solver/lora/base.json").read_text()) == {"path": home}
    assert frozen_folder(ckpt.root / "step_3" / "solver", LORA_BASE_DIR) == ckpt.root / "step_1/solver/lora/base"
    assert frozen_home(ckpt.root / "step_3" / "solver", LORA_BASE_DIR) == home


def test_a_failed_save_leaves_the_previous_checkpoint(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=3)
    mgr.save(1, {"a": 1})

    def crash(folder):
        (folder / "half.bin").write_bytes(b"half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        mgr.save(2, {"a": 2}, crash)
    assert mgr.latest_checkpoint().name == "step_1"
    mgr.clean_partial()
    assert not list((tmp_path / "checkpoints").glob("*.partial"))


def test_sigkill_during_saves_never_leaves_a_broken_latest(tmp_path):
    """A real process saving checkpoints in a loop is killed with SIGKILL at a random moment, several times:
    `latest` always names a complete checkpoint whose state matches its folder."""
    script = textwrap.dedent(f"""
        import sys
        from selfplay.runtime.checkpoint import CheckpointManager
        mgr = CheckpointManager({str(tmp_path)!r}, keep_last=2)
        step = 0
        while True:
            step += 1
            mgr.save(step, {{"payload": list(range(2000))}},
                     lambda d: (d / "weights.bin").write_bytes(bytes(200_000)))
            print(step, flush=True)
    """)
    rng = random.Random(0)
    for _ in range(4):
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        for _ in range(rng.randint(2, 6)):
            proc.stdout.readline()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        mgr = CheckpointManager(tmp_path, keep_last=2)
        latest = mgr.latest_checkpoint()
        state = mgr.load_state(latest)
        assert latest.name == f"step_{state['step']}"
        assert len((latest / "weights.bin").read_bytes()) == 200_000
        mgr.clean_partial()


def test_rng_states_round_trip_through_json():
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    saved = json.loads(json.dumps(rng_state()))
    expected = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    random.seed(2), np.random.seed(2), torch.manual_seed(2)
    set_rng_state(saved)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected


def test_keep_last_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="keep_last"):
        CheckpointManager(tmp_path, keep_last=0)


def test_code_version_is_this_checkouts_commit_and_a_resume_under_other_code_is_appended():
    from pathlib import Path

    import selfplay
    from selfplay.runtime.checkpoint import code_version, code_versions

    root = Path(selfplay.__file__).resolve().parent.parent
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
    here = code_version()
    assert here["version"] == selfplay.__version__
    assert here["commit"] == (head.stdout.strip() if head.returncode == 0 else None)
    assert (here["dirty"] is None) == (here["commit"] is None)
    assert code_versions(None) == [here] and code_versions([]) == [here]
    assert code_versions([here]) == [here]  # resumed under the same code: nothing new
    older = {"version": "0.0.9", "commit": "f" * 40, "dirty": False}
    assert code_versions([older]) == [older, here]
    assert code_versions([here, older]) == [here, older, here]  # back under this code: said again, in order
