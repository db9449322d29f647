"""The self-play baselines that measure the generator's own contribution: a generator held at its warm start
(`train.train_generator=false`) and random edits of the same references in place of its answers
(`generator.source=random_edits`); and the loop's compute counters (`compute/`, the checkpoint's `compute`)."""

from __future__ import annotations

import hashlib
import json
import random
import sqlite3
from pathlib import Path

import pytest

import sandbox
from generator.build import generate_tasks
from generator.mutation import RANDOM_EDITS, parse_mutation
from generator.validity import MemoryIndex
from selfplay.runtime.config import load_config
from selfplay.runtime.errors import UserError
from selfplay.runtime.tb import read_scalars
from selfplay.train.history import COMPUTE
from selfplay.train.proposals import random_edit_rollouts
from tests.conftest import SMOKE, copy_run, selfplay  # the warm_run fixture lives there too


@pytest.fixture(scope="module")
def references():
    """A process sandbox and reference groups of one procedural training task each (levels 1 and 2)."""
    with sandbox.open_sandbox(backend="process", timeout_s=5.0) as sb:
        tasks = generate_tasks(6, level=1, seed=3, sb=sb) + generate_tasks(6, level=2, seed=4, sb=sb)
        yield sb, [[t] for t in tasks]


def test_random_edits_are_edits_of_their_references_through_the_validity_checks(references):
    sb, groups = references
    rollouts = random_edit_rollouts(groups, sb, step=7, rng=random.Random(0), corpus_index=MemoryIndex())
    assert len(rollouts) == len(groups)
    valid = [ro for ro in rollouts if ro.valid]
    assert len(valid) >= len(groups) // 2
    for ro, refs in zip(rollouts, groups):
        assert ro.references == refs and ro.answer.tokens == [] and ro.answer.finished  # nothing was sampled
        assert ro.valid == (ro.rejection is None)
        if ro.answer.text:  # the edit written as a generator's answer would be
            assert parse_mutation(ro.answer.text).ref == 1
    for ro in valid:  # compiled as an answer's task is, and every check run and passed
        task = ro.task
        assert task.source == "generator" and task.parent_ids == [ro.references[0].id]
        assert task.created_step == 7 and task.generator_checkpoint == RANDOM_EDITS
        assert task.checks and all(task.checks.values()) and task.outputs_computed
    # the same draw against a corpus that already holds those tasks: the novelty check rejects every one of them
    again = random_edit_rollouts(
        groups, sb, step=7, rng=random.Random(0), corpus_index=MemoryIndex([ro.task for ro in valid])
    )
    assert [ro.answer.text for ro in again] == [ro.answer.text for ro in rollouts]
    made = {v.answer.text for v in valid}
    assert {(ro.valid, ro.rejection) for ro in again if ro.answer.text in made} == {(False, "novel")}


def test_random_edits_need_the_mutation_format_and_a_run_must_train_something():
    with pytest.raises(UserError, match="generator.source=random_edits .* needs generator.format=mutation"):
        load_config("configs/smoke.yaml", ["generator.source=random_edits", "generator.format=free"])
    with pytest.raises(UserError, match="generator.source must be one of model, random_edits"):
        load_config("configs/smoke.yaml", ["generator.source=other"])
    with pytest.raises(
        UserError,
        match="train.train_solver=false with train.mode=selfplay and generator.source=random_edits trains nothing",
    ):
        load_config("configs/smoke.yaml", ["generator.source=random_edits", "train.train_solver=false"])


def weights(run: Path, step: int, agent: str) -> str:
    folder = run / "checkpoints" / f"step_{step}" / agent
    files = sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.bin"))
    assert files, folder
    return hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()


def state(run: Path, step: int) -> dict:
    return json.loads((run / "checkpoints" / f"step_{step}" / "state.json").read_text())


@pytest.mark.slow
def test_a_frozen_generator_keeps_its_weights_while_the_solver_learns(warm_run, tmp_path):
    run = copy_run(warm_run, tmp_path)
    selfplay(
        "train", *SMOKE, f"run.dir={run}", "train.steps=1", "train.checkpoint_every=1", "train.train_generator=false"
    )
    assert weights(run, 1, "generator") == weights(run, 0, "generator")
    assert weights(run, 1, "solver") != weights(run, 0, "solver")
    tags = read_scalars(run)
    assert "generator/validity_rate" in tags and "ppo/solver/policy_loss" in tags  # it proposed; the solver learnt
    assert not any(tag.startswith("ppo/generator/") for tag in tags)
    assert state(run, 1)["compute"]["generator_tokens"] > 0  # it sampled its proposals


@pytest.mark.slow
def test_random_edits_in_place_of_the_generator_and_the_compute_kept_across_a_resume(warm_run, tmp_path):
    """generator.source=random_edits: the proposals are valid edits that reach the corpus and the solver's batch,
    no generator is sampled or updated; the compute counters go on from the checkpoint when the run resumes."""
    run = copy_run(warm_run, tmp_path)
    args = [*SMOKE, f"run.dir={run}", "train.checkpoint_every=1", "generator.source=random_edits", "train.proposals=4"]
    selfplay("train", *args, "train.steps=1")
    selfplay("train", *args, "train.steps=2")  # resumes from step_1
    assert weights(run, 2, "generator") == weights(warm_run, 0, "generator")  # (step_0 is no longer kept)
    tags = read_scalars(run)
    assert not any(tag.startswith("ppo/generator/") for tag in tags) and "ppo/solver/policy_loss" in tags
    assert all(v > 0 for _, v in tags["generator/validity_rate"])
    with sqlite3.connect(run / "corpus.sqlite") as db:  # the valid edits joined the corpus, every check passed
        made = [json.loads(r[0]) for r in db.execute("SELECT record FROM tasks WHERE source = 'generator'")]
    assert made and all(t["generator_checkpoint"] == RANDOM_EDITS and all(t["checks"].values()) for t in made)
    spent = state(run, 2)["compute"]
    assert set(spent) == set(COMPUTE)
    n = 4 * 2  # train.solver_tasks x train.samples_per_task of the smoke config, two iterations
    assert spent["ppo_episodes"] == 2 * n and spent["solver_episodes"] >= 2 * n  # the resumed run counted on
    assert spent["generator_proposals"] == 2 * 4 and spent["generator_tokens"] == 0
    assert spent["solver_tokens"] > 0 and spent["sandbox_execs"] > 0
    assert [v for _, v in tags["compute/ppo_episodes"]] == [n, 2 * n]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["compute"] == spent
