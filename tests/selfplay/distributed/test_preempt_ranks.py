"""Preemption on 2 CPU ranks (torchrun, DDP over gloo): a SIGTERM that reaches one rank only, in the middle of the
solver's rollout stage, stops every rank at the next stage boundary (the stop check is one collective), the step
before is checkpointed as it stood, and the run resumed on 2 ranks ends where the uninterrupted one does: the same
corpus rows (no task lost or written twice), weights, optimiser states, history and RNG states.

The signal is a real SIGTERM that rank 1 sends itself as its rollouts of the chosen step begin (a subclass of the
loop, run by torchrun as a script), so the boundary where it is answered is known.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import SMOKE, copy_run
from tests.selfplay.distributed.test_distributed import two_ranks
from tests.selfplay.train.test_preempt import STOPPING_EVAL
from tests.selfplay.train.test_resume_exact import agent_fingerprint, checkpoint, corpus_rows, resumable_state

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

# each rank runs the loop; rank RANK sends itself SIGTERM when its rollouts of step STEP begin (after the boundary
# of the solver batch, before that of the rollouts); every rank must end stopped
STOPPING_RANK = """
import os, signal, sys
from selfplay.runtime.config import load_config
from selfplay.train import loop

rank, step, overrides = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
attempt = loop.SelfPlay._attempt

def stopping(self, *args, **kwargs):
    if self.step == step and self.rank == rank:
        os.kill(os.getpid(), signal.SIGTERM)
    return attempt(self, *args, **kwargs)

loop.SelfPlay._attempt = stopping
summary = loop.train(load_config(overrides[0], overrides[1:]))
assert summary["stopped"], summary
print(f"[test] rank {os.environ['RANK']} stopped at step {summary['steps']}", flush=True)
"""

OVERRIDES = ["train.steps=2", "run.torch_threads=1"]


def train_on_two_ranks(run: Path, hash_seed: str) -> str:
    return two_ranks(
        ["-m", "selfplay", "train", *SMOKE, f"run.dir={run}", *OVERRIDES],
        timeout=900,
        env={"PYTHONHASHSEED": hash_seed},
    )


def final(run: Path, step: int) -> dict:
    state = json.loads((checkpoint(run, step) / "state.json").read_text())
    return {
        **resumable_state(checkpoint(run, step)),
        "world_size": state["world_size"],
        "history": state["history"],
        "param_checksums": state["param_checksums"],
        **{name: agent_fingerprint(checkpoint(run, step) / name) for name in ("solver", "generator")},
    }


@pytest.fixture(scope="module")
def straight(warm_run, tmp_path_factory) -> Path:
    """The uninterrupted run on 2 ranks: steps 0 -> 2 in one launch."""
    run = copy_run(warm_run, tmp_path_factory.mktemp("straight"))
    train_on_two_ranks(run, "1")
    return run


def test_a_sigterm_to_one_rank_mid_rollouts_stops_both_and_resumes_to_the_uninterrupted_run(
    warm_run, straight, tmp_path
):
    run = copy_run(warm_run, tmp_path / "stopped")
    script = tmp_path / "stopping_rank.py"
    script.write_text(STOPPING_RANK)
    out = two_ranks(
        [str(script), "1", "2", *SMOKE, f"run.dir={run}", *OVERRIDES], timeout=900, env={"PYTHONHASHSEED": "2"}
    )
    # rank 0 never got the signal: it learnt of rank 1's at the boundary, and both abandoned step 2
    assert "[test] rank 0 stopped at step 1" in out and "[test] rank 1 stopped at step 1" in out, out[-3000:]
    assert "stop requested after the solver rollouts of step 2: the iteration is abandoned" in out, out[-3000:]
    assert "stop requested: checkpoint step_1 written" in out and "(answered after the solver rollouts)" in out
    stopped = json.loads((checkpoint(run, 1) / "state.json").read_text())
    assert stopped["step"] == 1 and stopped["world_size"] == 2 and [h["step"] for h in stopped["history"]] == [1]

    out = train_on_two_ranks(run, "3")
    assert "checkpoints/step_1 (step 1;" in out, out[-3000:]  # resumed from the stop's checkpoint
    tasks, _ = corpus_rows(run)
    ids = [row[1] for row in tasks]
    assert len(ids) == len(set(ids))  # no task written twice
    assert corpus_rows(run) == corpus_rows(straight)  # nor one lost: the same rows in the same order
    resumed, uninterrupted = final(run, 2), final(straight, 2)
    assert resumed["world_size"] == 2 and [h["step"] for h in resumed["history"]] == [1, 2]
    assert resumed == uninterrupted


def test_a_sigterm_to_one_rank_within_the_sharded_evaluation_stops_both_at_the_same_piece(warm_run, straight, tmp_path):
    """The last step's evaluation, sharded over 2 ranks: rank 1 is asked to stop after its first piece; both ranks
    abandon the evaluation there (rank 0 learns of it at that piece's boundary), step 2 is checkpointed without it,
    and the run resumed on 2 ranks measures it first and ends where the uninterrupted one does."""
    run = copy_run(warm_run, tmp_path / "stopped")
    script = tmp_path / "stopping_rank_in_eval.py"
    script.write_text(STOPPING_EVAL)  # rank 1 asked to stop after its first piece
    out = two_ranks(
        [str(script), "1", "2", *SMOKE, f"run.dir={run}", *OVERRIDES], timeout=900, env={"PYTHONHASHSEED": "2"}
    )
    assert "[test] rank 0 stopped at step 2" in out and "[test] rank 1 stopped at step 2" in out, out[-3000:]
    assert "stop requested during step 2's evaluation: it is abandoned" in out, out[-3000:]
    assert "(answered after a piece of step 2's evaluation)" in out and "eval step 2:" not in out
    assert "2" not in json.loads((checkpoint(run, 2) / "state.json").read_text())["evals"]

    out = train_on_two_ranks(run, "3")
    assert "step 2: its evaluation was left for the resume by a stop" in out, out[-3000:]
    assert corpus_rows(run) == corpus_rows(straight)
    assert final(run, 2) == final(straight, 2)
    evals = [json.loads((checkpoint(r, 2) / "state.json").read_text())["evals"] for r in (run, straight)]
    assert evals[0] == evals[1] and "2" in evals[0]
