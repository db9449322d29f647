"""Preemption that loses nothing: a stop request is answered at the next stage boundary of an iteration (before the
update the iteration is abandoned and the last completed step checkpointed as it stood; after it the iteration is
finished), and the resumed run matches the uninterrupted one bit for bit (the comparison of test_resume_exact.py).
The frozen reference is written once, with step_0; later checkpoints point to it, pruning keeps it.

The stop comes as a real SIGUSR1 that the run sends itself right after a chosen stage of a chosen step (a subclass of
the loop, in its own process), so the boundary it meets is known.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from selfplay.models.agent import load_agent_parts
from selfplay.runtime.checkpoint import REFERENCE_POINTER, CheckpointManager, reference_folder
from selfplay.runtime.tb import read_scalars
from tests.conftest import REPO, SMOKE, copy_run, selfplay
from tests.selfplay.train.test_resume_exact import (
    agent_fingerprint,
    checkpoint,
    corpus_rows,
    resumable_state,
    step_scalars,
    train,
)

# a run of the smoke config that sends itself SIGUSR1 right after stage method STAGE of step STEP
STOPPING_RUN = """
import os, signal, sys
from selfplay.runtime.config import load_config
from selfplay.train.loop import SelfPlay

stage, step, overrides = sys.argv[1], int(sys.argv[2]), sys.argv[3:]

class Stopped(SelfPlay):
    pass

def stopping(self, *args, **kwargs):
    out = getattr(SelfPlay, stage)(self, *args, **kwargs)
    if self.step == step:
        os.kill(os.getpid(), signal.SIGUSR1)
    return out

setattr(Stopped, stage, stopping)
loop = Stopped(load_config(overrides[0], overrides[1:]))
try:
    summary = loop.run()
finally:
    loop.close()
assert summary["stopped"], summary
"""


def stopping_run(run: Path, stage: str, step: int, *overrides: str, script: str = STOPPING_RUN) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", script, stage, str(step), *SMOKE, f"run.dir={run}", *overrides],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONHASHSEED": "4"},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def straight(warm_run, tmp_path_factory) -> Path:
    """The uninterrupted run: steps 0 -> 2 in one process."""
    run = copy_run(warm_run, tmp_path_factory.mktemp("straight"))
    train(run, 2, "1")
    return run


def assert_same_run(a: Path, b: Path, step: int) -> None:
    for name in ("solver", "generator"):
        assert agent_fingerprint(checkpoint(a, step) / name) == agent_fingerprint(checkpoint(b, step) / name), name
    assert resumable_state(checkpoint(a, step)) == resumable_state(checkpoint(b, step))
    assert step_scalars(a, step) == step_scalars(b, step)
    assert corpus_rows(a) == corpus_rows(b)


@pytest.mark.slow
@pytest.mark.parametrize(
    "stage,step,boundary,saved",
    [
        ("_attempt", 2, "the solver rollouts", 1),  # mid-iteration: step 2 abandoned, step 1 checkpointed as it stood
        ("_propose", 2, "the proposals", 1),
        ("_update", 1, "the PPO update", 1),  # the update done: step 1 finished and checkpointed
    ],
)
def test_a_stop_at_a_stage_boundary_resumes_to_the_uninterrupted_run(
    warm_run, straight, tmp_path, stage, step, boundary, saved
):
    run = copy_run(warm_run, tmp_path)
    out = stopping_run(run, stage, step, "train.steps=2", "run.torch_threads=1")
    assert f"stop requested: checkpoint step_{saved} written" in out and f"answered after {boundary})" in out, out
    assert (f"after {boundary} of step {step}: the iteration is abandoned" in out) == (stage != "_update")
    assert checkpoint(run, saved) and json.loads((checkpoint(run, saved) / "state.json").read_text())["step"] == saved
    train(run, 2, "3")
    assert_same_run(straight, run, 2)


@pytest.mark.slow
def test_a_stop_after_the_update_leaves_the_step_s_evaluation_for_the_resume(warm_run, tmp_path):
    """After the update the iteration is finished and checkpointed at once: its periodic evaluation is left for the
    resumed run, which measures it before step 2."""
    run = copy_run(warm_run, tmp_path)
    first = stopping_run(run, "_update", 1, "train.steps=3", "train.eval_every=1")
    assert "stop requested: checkpoint step_1 written" in first and "eval step 1" not in first
    state = json.loads((checkpoint(run, 1) / "state.json").read_text())
    assert state["step"] == 1 and "1" not in state["evals"]
    proc = subprocess.run(
        [sys.executable, "-m", "selfplay", "train", *SMOKE, f"run.dir={run}", "train.steps=3", "train.eval_every=1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "step 1: its evaluation was left for the resume by a stop" in out
    assert out.index("eval step 1") < out.index("eval step 2")
    state = json.loads((checkpoint(run, 3) / "state.json").read_text())
    assert {"1", "2", "3"} <= set(state["evals"]) and [h["step"] for h in state["history"]] == [1, 2, 3]


# a run of the smoke config (one rank of it) in which rank RANK sends itself SIGTERM right after the first piece (the
# greedy episodes of its shard) of step STEP's evaluation; every rank must end stopped
STOPPING_EVAL = """
import os, signal, sys
from selfplay.rollout import episodes
from selfplay.runtime.config import load_config
from selfplay.train import checkpointing, evaluation, loop

rank, step, overrides = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
evaluate, rollouts, armed = evaluation.evaluate, episodes.solver_rollouts, []

def evaluating(run, at):
    armed[:] = [at == step and run.rank == rank]
    return evaluate(run, at)

def rolling_out(*args, **kwargs):
    out = rollouts(*args, **kwargs)
    if armed and armed.pop():  # the first piece of the armed evaluation is done
        os.kill(os.getpid(), signal.SIGTERM)
    return out

loop.evaluate = evaluation.evaluate = checkpointing.evaluate = evaluating  # step 0's: checkpointing's
episodes.solver_rollouts = rolling_out
summary = loop.train(load_config(overrides[0], overrides[1:]))
assert summary["stopped"], summary
print(f"[test] rank {os.environ.get('RANK', '0')} stopped at step {summary['steps']}", flush=True)
"""


def eval_scalars(run: Path) -> dict:
    """Every `eval/` scalar of the run's TensorBoard: (step, value) for each time it was logged."""
    return {tag: series for tag, series in read_scalars(run).items() if tag.startswith("eval/")}


@pytest.mark.slow
@pytest.mark.parametrize("step,overrides", [(2, []), (1, ["train.eval_every=1"])], ids=["last", "periodic"])
def test_a_stop_within_an_evaluation_abandons_it_and_the_resume_measures_it_once(
    warm_run, straight, tmp_path, step, overrides
):
    """A stop between two pieces of an evaluation (the last step's, or a periodic one) is answered there: the step
    is checkpointed without that evaluation, and the resumed run measures it first, once, and ends as the
    uninterrupted run did: weights, state, scalars, corpus and the evaluations (in the checkpoint and in
    TensorBoard, each logged once)."""
    if overrides:  # the uninterrupted run with the same evaluations
        straight = copy_run(warm_run, tmp_path / "straight")
        selfplay_train(straight, 2, "1", *overrides)
    run = copy_run(warm_run, tmp_path / "stopped")
    out = stopping_run(run, "0", step, "train.steps=2", "run.torch_threads=1", *overrides, script=STOPPING_EVAL)
    assert f"stop requested during step {step}'s evaluation: it is abandoned" in out, out[-3000:]
    assert f"checkpoint step_{step} written" in out and f"(answered after a piece of step {step}'s evaluation)" in out
    assert f"eval step {step}:" not in out
    state = json.loads((checkpoint(run, step) / "state.json").read_text())
    assert state["step"] == step and str(step) not in state["evals"]
    assert not any(s == step for series in eval_scalars(run).values() for s, _ in series)
    resumed = selfplay_train(run, 2, "3", *overrides)
    assert f"step {step}: its evaluation was left for the resume by a stop" in resumed
    assert_same_run(straight, run, 2)
    assert (
        json.loads((checkpoint(run, 2) / "state.json").read_text())["evals"]
        == json.loads((checkpoint(straight, 2) / "state.json").read_text())["evals"]
    )
    assert {t: [v for _, v in series] for t, series in eval_scalars(run).items()} == {
        t: [v for _, v in series] for t, series in eval_scalars(straight).items()
    }  # every evaluation logged once, with the same figures
    assert (run / "summary.json").exists()


@pytest.mark.slow
def test_a_stop_within_the_warm_start_s_evaluation_leaves_step_0_to_be_evaluated_on_the_resume(tmp_path):
    """A fresh run folder: the warm start writes step_0, and a stop within its evaluation leaves step_0 as written,
    without `eval_before`; the resumed run evaluates it, once, and changes nothing else of step_0."""
    run = tmp_path / "run"
    out = stopping_run(run, "0", 0, "train.steps=1", "run.torch_threads=1", script=STOPPING_EVAL)
    assert "stop requested during step 0's evaluation: it is abandoned" in out, out[-3000:]
    assert "stop requested: step_0 is already checkpointed" in out and "eval step 0:" not in out
    stopped = json.loads((checkpoint(run, 0) / "state.json").read_text())
    assert "eval_before" not in stopped and "0" not in stopped["evals"]
    assert not eval_scalars(run)
    weights = {name: agent_fingerprint(checkpoint(run, 0) / name) for name in ("solver", "generator")}
    stop_file = tmp_path / "stop"  # `selfplay warmstart` asked to stop again within that evaluation: a clean exit
    stop_file.write_text("")
    proc = selfplay("warmstart", *SMOKE, f"run.dir={run}", env={"SELFPLAY_STOP_FILE": str(stop_file)})
    assert "stopped within step 0's evaluation" in proc.stdout, (proc.stdout + proc.stderr)[-3000:]
    assert json.loads((checkpoint(run, 0) / "state.json").read_text()) == stopped and not eval_scalars(run)
    proc = selfplay("warmstart", *SMOKE, f"run.dir={run}")  # the resume: step_0's evaluation, nothing else
    out = proc.stdout + proc.stderr
    assert out.count("eval step 0:") == 1, out[-3000:]
    state = json.loads((checkpoint(run, 0) / "state.json").read_text())
    assert state["eval_before"] and state["evals"] == {"0": state["eval_before"]}
    assert {k: v for k, v in state.items() if k not in ("eval_before", "evals")} == {
        k: v for k, v in stopped.items() if k != "evals"
    }
    assert {name: agent_fingerprint(checkpoint(run, 0) / name) for name in ("solver", "generator")} == weights
    assert eval_scalars(run) and all(len(series) == 1 for series in eval_scalars(run).values())


def selfplay_train(run: Path, steps: int, hash_seed: str, *overrides: str) -> str:
    """test_resume_exact's `train` with `overrides`; its output."""
    args = [*SMOKE, f"run.dir={run}", f"train.steps={steps}", "run.torch_threads=1", *overrides]
    proc = selfplay("train", *args, env={"PYTHONHASHSEED": hash_seed})
    return proc.stdout + proc.stderr


def tree_digest(folder: Path) -> dict[str, tuple[str, int]]:
    """Every file under `folder`: its bytes' sha256 and its modification time (ns)."""
    return {
        str(f.relative_to(folder)): (hashlib.sha256(f.read_bytes()).hexdigest(), f.stat().st_mtime_ns)
        for f in sorted(folder.rglob("*"))
        if f.is_file()
    }


@pytest.mark.slow
def test_the_reference_is_written_once_and_a_resume_loads_it(warm_run, tmp_path):
    run = copy_run(warm_run, tmp_path)
    before = {a: tree_digest(run / "checkpoints" / "step_0" / a / "reference") for a in ("solver", "generator")}
    train(run, 2, "1")  # smoke: checkpoints at step 2 only
    train(run, 3, "2")  # resumed from step 2, which points to step_0's reference, and saved again at step 3
    for agent in ("solver", "generator"):
        home = run / "checkpoints" / "step_0" / agent / "reference"
        assert tree_digest(home) == before[agent], agent  # the same bytes, never rewritten
        for step in (2, 3):
            folder = run / "checkpoints" / f"step_{step}" / agent
            assert not (folder / "reference").exists()
            assert json.loads((folder / REFERENCE_POINTER).read_text()) == {"path": f"step_0/{agent}/reference"}
            assert reference_folder(folder) == home
        _, reference, _ = load_agent_parts(run / "checkpoints" / "step_3" / agent)
        _, original, _ = load_agent_parts(run / "checkpoints" / "step_0" / agent)
        theirs = original.state_dict()
        assert all(torch.equal(t, theirs[k]) for k, t in reference.state_dict().items())


@settings(max_examples=12, deadline=None)
@given(keep_last=st.integers(1, 3), steps=st.lists(st.integers(1, 12), min_size=1, max_size=6, unique=True))
def test_pruning_keeps_step_0_and_every_reference_a_kept_checkpoint_points_to(tmp_path_factory, keep_last, steps):
    """Checkpoints whose agents point to step_0's reference, or to another step's (a run whose first checkpoint was
    not step_0): pruning leaves at most keep_last of the others, and never a pointed-to one, nor step_0."""
    ckpt = CheckpointManager(tmp_path_factory.mktemp("run"), keep_last)
    steps = sorted(steps)
    home = f"step_{steps[0]}"  # the first saved holds the reference; step_0 holds its own

    def write(step: int, pointer: str | None) -> None:
        def files(folder: Path) -> None:
            (folder / "solver").mkdir()
            if pointer is None:
                (folder / "solver" / "reference").mkdir()
            else:
                (folder / "solver" / REFERENCE_POINTER).write_text(json.dumps({"path": f"{pointer}/solver/reference"}))

        ckpt.save(step, {}, files)

    write(0, None)
    for i, step in enumerate(steps):
        write(step, None if i == 0 else home)
        left = ckpt.steps()
        assert 0 in left and steps[0] in left and step in left
        others = [s for s in left if s not in (0, steps[0])]
        assert len(others) <= keep_last
        for s in left:
            folder = ckpt.root / f"step_{s}" / "solver"
            assert reference_folder(folder).is_dir()


@pytest.mark.slow
def test_each_iteration_logs_a_stops_bound_and_a_lead_too_short_for_it_is_warned_of_once(warm_run, tmp_path):
    """`time/stop_bound_s`: the iteration's longest stage between stop boundaries plus the last checkpoint's write
    (none yet in this process at step 1); with `SELFPLAY_SIGNAL_LEAD` (slurm/selfplay.sh's) shorter than it plus
    SLURM's 60 s of lateness, rank 0 warns once, naming the variable."""
    run = copy_run(warm_run, tmp_path)
    steps = ["train.steps=3", "train.checkpoint_every=1"]
    proc = selfplay("train", *SMOKE, f"run.dir={run}", *steps, env={"SELFPLAY_SIGNAL_LEAD": "1"})
    assert proc.stdout.count("SELFPLAY_SIGNAL_LEAD") == 1, proc.stdout[-3000:]
    assert "more than the signal's lead of 1 s" in proc.stdout
    tags = read_scalars(run)
    bound = dict(tags["time/stop_bound_s"])
    longest = {
        step: max(
            dict(tags[f"time/{stage}"]).get(step, 0.0) for stage in ("generator_s", "plan_s", "rollout_s", "update_s")
        )
        for step in (1, 2, 3)
    }
    assert bound[1] == pytest.approx(longest[1])  # no checkpoint written yet by this process
    assert all(bound[s] > longest[s] for s in (2, 3))  # then the last checkpoint's write is added
    quiet = copy_run(warm_run, tmp_path / "quiet")
    proc = selfplay("train", *SMOKE, f"run.dir={quiet}", "train.steps=1", env={"SELFPLAY_SIGNAL_LEAD": "3600"})
    assert "SELFPLAY_SIGNAL_LEAD" not in proc.stdout
