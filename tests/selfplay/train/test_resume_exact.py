"""A resumed run reproduces the uninterrupted run bit for bit (one process, CPU, torch_threads=1).

From one warm start: run A trains steps 0 -> 2 in one process; run B trains 0 -> 1 (its last step: a held-out
evaluation and a checkpoint the straight run does not make), then a second process resumes it to step 2; the three
processes run under different PYTHONHASHSEED. Both must end with the same weights, the same optimiser, trainer,
mixer and RNG states, the same step-2 TensorBoard scalars (wall-clock ones aside) and the same corpus rows in the
same order.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import pytest
import torch

from selfplay.models.agent import load_agent_parts
from selfplay.runtime.distributed import param_checksum
from selfplay.runtime.tb import read_scalars
from tests.conftest import SMOKE, copy_run, selfplay  # the warm_run fixture lives there too

CLOCK_TAGS = ("time/", "perf/", "sandbox/")  # wall-clock measurements: differ between any two runs
# programs the sandbox ran: its result cache, in memory, starts empty in a resumed process, which then runs again
# what the uninterrupted run found in its cache
CACHE_TAGS = ("compute/sandbox_execs",)


def train(run: Path, steps: int, hash_seed: str) -> None:
    """Each process under its own PYTHONHASHSEED: no set's iteration order may reach the run."""
    selfplay(
        "train",
        *SMOKE,
        f"run.dir={run}",
        f"train.steps={steps}",
        "run.torch_threads=1",
        env={"PYTHONHASHSEED": hash_seed},
    )


def checkpoint(run: Path, step: int) -> Path:
    assert (run / "checkpoints" / "latest").read_text().strip() == f"step_{step}"
    return run / "checkpoints" / f"step_{step}"


def agent_fingerprint(folder: Path) -> dict:
    """Weights (policy + value head), optimiser and trainer state of one saved agent, as comparable values."""
    model, _, _ = load_agent_parts(folder)
    raw = lambda v: v.numpy().tobytes() if torch.is_tensor(v) else v  # noqa: E731 (bit-exact tensor contents)
    optimizer = torch.load(folder / "optimizer.pt", map_location="cpu")
    trainer = torch.load(folder / "trainer.pt", map_location="cpu", weights_only=False)
    moments = hashlib.sha256(
        repr({k: sorted((n, raw(v)) for n, v in s.items()) for k, s in optimizer["state"].items()}).encode()
    ).hexdigest()
    return {
        "weights": param_checksum(model)["sha256"],
        "optimizer": moments,
        "param_groups": optimizer["param_groups"],
        "trainer": {"updates": trainer["updates"], "kl_ctl": trainer["kl_ctl"], "rng": raw(trainer["rng"])},
    }


def resumable_state(folder: Path) -> dict:
    state = json.loads((folder / "state.json").read_text())
    return {k: state.get(k) for k in ("step", "mixer", "replay", "rng", "loop_rng", "corpus_size")}


def step_scalars(run: Path, step: int) -> dict:
    out = {}
    for tag, series in read_scalars(run).items():
        values = [v for s, v in series if s == step]
        if values and not tag.startswith(CLOCK_TAGS + CACHE_TAGS) and not tag.endswith("/update_s"):
            out[tag] = values[-1]
    return out


def corpus_rows(run: Path) -> tuple[list, list]:
    """Task rows and difficulty history in insertion order (without their wall-clock timestamps)."""
    with sqlite3.connect(run / "corpus.sqlite") as db:
        tasks = db.execute("SELECT seq, id, source, split, level, created_step, record FROM tasks ORDER BY seq")
        history = db.execute(
            "SELECT seq, task_id, solve_rate, difficulty, n_samples, step FROM difficulty ORDER BY seq"
        )
        return tasks.fetchall(), history.fetchall()


@pytest.mark.slow
def test_resumed_run_matches_the_uninterrupted_run(warm_run, tmp_path):
    straight = copy_run(warm_run, tmp_path / "a")
    train(straight, 2, "1")
    resumed = copy_run(warm_run, tmp_path / "b")
    train(resumed, 1, "2")
    train(resumed, 2, "3")

    a, b = checkpoint(straight, 2), checkpoint(resumed, 2)
    for name in ("solver", "generator"):
        assert agent_fingerprint(a / name) == agent_fingerprint(b / name), name
    assert resumable_state(a) == resumable_state(b)

    scalars_a, scalars_b = step_scalars(straight, 2), step_scalars(resumed, 2)
    assert "ppo/solver/policy_loss" in scalars_a and "ppo/generator/policy_loss" in scalars_a
    assert scalars_a == scalars_b

    tasks_a, history_a = corpus_rows(straight)
    assert len(tasks_a) > len(corpus_rows(warm_run)[0])  # the two iterations added tasks
    assert (tasks_a, history_a) == corpus_rows(resumed)
