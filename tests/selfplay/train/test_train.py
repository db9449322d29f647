"""`selfplay train` end to end on the smoke config (CPU, real models, real sandbox, real PPO, real self-play).

The warm start runs once per session (slowest part); each test continues from a copy of that run folder, which is
exactly what `selfplay train` does on a folder that holds a checkpoint.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from generator.schema import Task
from selfplay.runtime.config import load_config
from selfplay.runtime.tb import read_scalars
from tests.conftest import REPO, SMOKE, copy_run, selfplay  # the warm_run fixture lives there too


def corpus_ids(run: Path) -> list[str]:
    with sqlite3.connect(run / "corpus.sqlite") as db:
        return [r[0] for r in db.execute("SELECT id FROM tasks")]


def latest_state(run: Path) -> dict:
    name = (run / "checkpoints" / "latest").read_text().strip()
    return json.loads((run / "checkpoints" / name / "state.json").read_text())


@pytest.mark.slow
def test_warm_start_writes_step_0(warm_run):
    assert (warm_run / "checkpoints" / "latest").read_text().strip() == "step_0"
    state = latest_state(warm_run)
    assert state["step"] == 0 and state["corpus_size"] == 160 == len(corpus_ids(warm_run))
    assert state["warmstart"]["solver_sft_loss_last"] < state["warmstart"]["solver_sft_loss_first"]
    for agent in ("solver", "generator"):
        folder = warm_run / "checkpoints" / "step_0" / agent
        assert (folder / "config.json").exists() and (folder / "value_head.pt").exists()
        assert (folder / "reference" / "config.json").exists() and (folder / "optimizer.pt").exists()
    assert set(state["eval_before"]) >= {"test", "deeper", "noisy", "heldout_types", "heldout_compositions"}


@pytest.mark.slow
def test_a_warm_start_killed_before_its_evaluation_is_evaluated_from_step_0_on_the_next_start(warm_run, tmp_path):
    # step_0 is written first and evaluated as loaded back (with the configured rollout engine); a kill between
    # the two leaves a step_0 without `eval_before`, which `selfplay warmstart` measures instead of skipping
    run = copy_run(warm_run, tmp_path)
    state_file = run / "checkpoints" / "step_0" / "state.json"
    recorded = json.loads(state_file.read_text())
    state_file.write_text(json.dumps({**{k: v for k, v in recorded.items() if k != "eval_before"}, "evals": {}}))
    out = selfplay("warmstart", *SMOKE, f"run.dir={run}")
    assert "nothing to do" not in out.stdout and "held-out test" in out.stdout
    assert json.loads(state_file.read_text())["eval_before"] == recorded["eval_before"]  # same seed, same weights
    again = selfplay("warmstart", *SMOKE, f"run.dir={run}")
    assert "already holds a checkpoint (step_0); nothing to do" in again.stdout


@pytest.mark.slow
def test_a_stop_requested_before_the_first_iteration_stops_at_once(warm_run, tmp_path):
    # A stop (SIGUSR1/SIGTERM or the stop file) is answered at the next stage boundary, the start of an iteration
    # too: a run started with the stop file present trains nothing, keeps its checkpoint and exits 0. (A stop after
    # an update, whose evaluation is left for the resume: tests/selfplay/train/test_preempt.py.)
    run, stop = copy_run(warm_run, tmp_path), tmp_path / "stop"
    stop.touch()
    first = selfplay("train", *SMOKE, f"run.dir={run}", "train.steps=3", env={"SELFPLAY_STOP_FILE": str(stop)})
    assert "stop requested: step_0 is already checkpointed" in first.stdout + first.stderr
    assert latest_state(run)["step"] == 0 and not (run / "summary.json").exists()


@pytest.mark.slow  # measured over 9 s: out of the fast subset
def test_train_logs_checkpoints_and_continues(warm_run, tmp_path):
    run = copy_run(warm_run, tmp_path)
    proc = selfplay("train", *SMOKE, f"run.dir={run}", "train.steps=3")
    assert "held-out test" in proc.stdout and "corpus by source" in proc.stdout
    # the closing summary says in words what the paired interval shows; the first iteration gives the run's pace
    assert any(v in proc.stdout for v in ("the solver improved", "the solver got worse", "no measurable change"))
    assert "the first iteration took" in proc.stdout and "the 2 left take about" in proc.stdout
    ckpts = sorted(p.name for p in (run / "checkpoints").iterdir() if p.is_dir())
    assert ckpts == ["step_0", "step_2", "step_3"]  # keep_last=2 in the smoke config, and the warm start
    state = latest_state(run)
    assert state["step"] == 3 and [h["step"] for h in state["history"]] == [1, 2, 3]
    assert state["corpus_size"] == len(corpus_ids(run)) == len(set(corpus_ids(run)))

    tags = read_scalars(run)
    for tag in (
        "solver/pass_rate",
        "solver/reward_mean",
        "generator/reward_mean",
        "generator/validity_rate",
        "generator/diversity",
        "mixer/target_solve_rate",
        "mixer/share/generator",
        "mixer/share/replay",
        "ppo/solver/policy_loss",
        "ppo/solver/value_loss",
        "ppo/solver/kl",
        "ppo/solver/entropy",
        "ppo/solver/clipfrac",
        "ppo/solver/explained_var",
        "ppo/generator/policy_loss",
        "sandbox/execs_per_s",
        "sandbox/cache_hit_rate",
        "time/rollout_s",
        "time/update_s",
        "time/sandbox_s",
        "eval/heldout/test/pass@1_greedy",
        "eval/heldout/deeper/pass@1",
    ):
        assert tag in tags, tag
    assert [s for s, _ in tags["solver/pass_rate"]] == [1, 2, 3]
    assert all(0.0 <= v <= 1.0 for _, v in tags["generator/validity_rate"])
    # the warm start's SFT losses were written step by step as they came, not only its totals at the end
    for agent in ("solver", "generator"):
        steps = [s for s, _ in tags[f"warmstart/{agent}_sft_loss"]]
        assert len(steps) > 1 and steps == list(range(len(steps))), agent
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["corpus_by_source"]["procedural"] >= 160

    # train.steps is the total: the same command again has nothing to do, a larger one continues
    again = selfplay("train", *SMOKE, f"run.dir={run}", "train.steps=3")
    assert "nothing to do" in again.stdout
    # ... and a learning rate or KL coefficient given for the continuation is the one used (not the one saved with
    # the optimiser or the trainer)
    selfplay(
        "train",
        *SMOKE,
        f"run.dir={run}",
        "train.steps=4",
        "ppo.lr=0.0123",
        "agents.generator.lr_scale=0.5",
        "ppo.kl_coef=0.321",
        "agents.generator.kl_coef=0.654",
        "agents.generator.entropy_coef=0.0042",
    )
    assert latest_state(run)["step"] == 4
    tags = read_scalars(run)
    assert [s for s, _ in tags["solver/pass_rate"]] == [1, 2, 3, 4]
    solver_lr, generator_lr = tags["ppo/solver/lr"][-1], tags["ppo/generator/lr"][-1]
    assert solver_lr[0] == generator_lr[0] == 4 and generator_lr[1] == pytest.approx(0.5 * solver_lr[1])
    assert 0.0123 * 0.1 <= solver_lr[1] <= 0.0123 + 1e-9  # times the mixer's lr_scale, in [0.1, 1]
    assert tags["ppo/solver/lr"][0][1] <= 1e-4 + 1e-12  # the smoke config's own ppo.lr before
    assert tags["ppo/solver/kl_coef"][-1] == (4, pytest.approx(0.321))
    assert tags["ppo/solver/kl_coef"][0][1] == pytest.approx(load_config(REPO / "configs" / "smoke.yaml").ppo.kl_coef)
    # the generator's own coefficients reach its trainer; the solver's stay ppo's
    assert tags["ppo/generator/kl_coef"][-1] == (4, pytest.approx(0.654))
    assert tags["ppo/generator/entropy_coef"][-1] == (4, pytest.approx(0.0042))
    assert tags["ppo/solver/entropy_coef"][-1][1] != pytest.approx(0.0042)


@pytest.mark.slow
def test_the_generator_without_a_critic_takes_the_iterations_proposals_as_one_group(warm_run, tmp_path):
    """agents.generator.advantage=rloo_batch: the generator's update passes its proposals as one group (the
    trainer logs `mixed_groups` only when it is given groups) and leaves its value head as it was; with `gae`,
    the key's default, the value head trains."""
    import torch

    def value_head(run, step):
        return torch.load(run / "checkpoints" / f"step_{step}" / "generator" / "value_head.pt")

    for advantage, critic_trained in (("rloo_batch", False), ("gae", True)):
        run = copy_run(warm_run, tmp_path / advantage)
        selfplay(
            "train",
            *SMOKE,
            f"run.dir={run}",
            "train.steps=1",
            "train.checkpoint_every=1",
            f"agents.generator.advantage={advantage}",
        )
        before, after = value_head(run, 0), value_head(run, 1)
        same = all(torch.equal(before[k], after[k]) for k in before)
        assert same != critic_trained, advantage
        tags = read_scalars(run)
        assert ("ppo/generator/mixed_groups" in tags) == (advantage == "rloo_batch")
        assert "ppo/solver/mixed_groups" in tags  # the solver's groups, its tasks, either way


@pytest.mark.slow  # measured over 9 s: out of the fast subset
def test_the_in_band_pool_of_generator_tasks_is_logged_and_checkpointed(warm_run, tmp_path):
    """mixer.generator_tasks=in_band: each iteration logs what the pool served and kept, and a checkpoint holds the
    pool (the source's state) for an exact resume."""
    import json

    run = copy_run(warm_run, tmp_path)
    selfplay(
        "train", *SMOKE, f"run.dir={run}", "train.steps=2", "train.checkpoint_every=1", "mixer.generator_tasks=in_band"
    )
    tags = read_scalars(run)
    assert {"mixer/in_band_pool/served", "mixer/in_band_pool/kept", "solver/in_band_rate/procedural"} <= set(tags)
    assert [v for _, v in tags["mixer/in_band_pool/served"]][0] == 0  # nothing measured before the first draw
    state = json.loads((run / "checkpoints" / "step_2" / "state.json").read_text())
    pooled = state["source"]["in_band_pool"]
    assert len(pooled) == [v for _, v in tags["mixer/in_band_pool/kept"]][-1]
    assert all(step in (1, 2) and task["source"] == "generator" for step, task in pooled)


def a_task(task_id: str, source: str) -> Task:
    return Task(
        id=task_id,
        family=source,
        source=source,
        split="train",
        level=1,
        description="d",
        entry_point="f",
        signature="def f(x)",
        reference_solution="def f(x):\n    return x",
    )


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_every_task_the_solver_measured_gets_its_rate_once_replayed_generator_tasks_too(data):
    """An iteration's corpus rows: its valid proposals and the batch's new procedural tasks are added, and every
    task measured gets one difficulty row, whatever its source: a generator task served again (replayed, or from the
    in-band pool) is measured by the solver it meets now."""
    from selfplay.train.loop import corpus_updates

    proposals = [a_task(f"g{i}", "generator") for i in range(data.draw(st.integers(0, 5)))]
    earlier = [a_task(f"old{i}", data.draw(st.sampled_from(["generator", "procedural"]))) for i in range(3)]
    new = [a_task(f"p{i}", "procedural") for i in range(data.draw(st.integers(0, 3)))]
    served = data.draw(st.lists(st.sampled_from(proposals + earlier), unique_by=lambda x: x.id))
    batch = data.draw(st.permutations(served + new))
    everything = {x.id for x in proposals + batch}
    rates = {i: data.draw(st.sampled_from([0.0, 0.5, 1.0])) for i in everything if data.draw(st.booleans())}
    tasks, measured = corpus_updates(proposals, batch, {x.id for x in new}, rates, 8, 3)
    assert [x.id for x in tasks] == [x.id for x in proposals] + [
        x.id for x in batch if x.id in rates and x.id.startswith("p")
    ]
    assert sorted(m[0] for m in measured) == sorted(rates)  # each measured task once, nothing unmeasured
    assert all(rates[i] == r and (n, step) == (8, 3) for i, r, n, step in measured)


@pytest.mark.slow
def test_a_held_solver_keeps_its_weights_while_the_generator_learns_against_it(warm_run, tmp_path):
    """train.train_solver=false: an iteration leaves the solver's weights as the warm start's (it still attempts
    its batch and the proposals, whose solve rates pay the generator) while the generator's change."""
    import hashlib

    def weights(run, step, agent):
        folder = run / "checkpoints" / f"step_{step}" / agent
        files = sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.bin"))
        assert files, folder
        return hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()

    run = copy_run(warm_run, tmp_path)
    proc = selfplay(
        "train", *SMOKE, f"run.dir={run}", "train.steps=1", "train.checkpoint_every=1", "train.train_solver=false"
    )
    assert "held at its warm start: its held-out figures are step 0's" in proc.stdout
    assert "eval step 1" not in proc.stdout + proc.stderr
    assert weights(run, 1, "solver") == weights(run, 0, "solver")
    assert weights(run, 1, "generator") != weights(run, 0, "generator")
    tags = read_scalars(run)
    assert "ppo/generator/policy_loss" in tags and "solver/pass_rate" in tags
    assert not any(tag.startswith("ppo/solver/") for tag in tags)


def test_a_run_that_trains_nothing_is_refused_naming_the_keys():
    from selfplay.runtime.errors import UserError
    from selfplay.train.loop import SelfPlay

    for mode in ("curriculum", "uniform", "fixed"):
        with pytest.raises(UserError, match=rf"train.train_solver=false with train.mode={mode} trains nothing"):
            SelfPlay._validate(load_config(None, ["train.train_solver=false", f"train.mode={mode}"]))
    with pytest.raises(UserError, match=r"train.mode=selfplay and train.train_generator=false trains nothing"):
        SelfPlay._validate(load_config(None, ["train.train_solver=false", "train.train_generator=false"]))
    SelfPlay._validate(load_config(None, ["train.train_solver=false"]))


def test_the_generator_without_a_critic_needs_two_proposals_on_every_rank(monkeypatch):
    """Each rank's proposals are one group: over 2 ranks, train.proposals=2 leaves each rank one proposal and no
    baseline (its advantage would be its raw return); refused at start naming the keys, 4 is accepted."""
    from selfplay.runtime.errors import UserError
    from selfplay.train.loop import SelfPlay

    monkeypatch.setenv("WORLD_SIZE", "2")
    rloo = ["agents.generator.advantage=rloo_batch", "train.solver_tasks=4"]
    with pytest.raises(
        UserError,
        match=r"agents.generator.advantage=rloo_batch .* train.proposals=2 over 2 ranks "
        r"gives each 1.*train.proposals >= 4",
    ):
        SelfPlay._validate(load_config(None, [*rloo, "train.proposals=2"]))
    SelfPlay._validate(load_config(None, [*rloo, "train.proposals=4"]))
    SelfPlay._validate(
        load_config(None, ["agents.generator.advantage=gae", "train.solver_tasks=4", "train.proposals=2"])
    )
    monkeypatch.setenv("WORLD_SIZE", "1")
    SelfPlay._validate(load_config(None, [*rloo, "train.proposals=2"]))


@pytest.mark.slow
def test_sigkill_mid_run_resumes_with_the_corpus_intact(warm_run, tmp_path):
    run = copy_run(warm_run, tmp_path)
    args = [
        sys.executable,
        "-m",
        "selfplay",
        "train",
        *SMOKE,
        f"run.dir={run}",
        "train.steps=5",
        "train.checkpoint_every=1",
    ]
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 600
    latest = run / "checkpoints" / "latest"
    while time.time() < deadline and latest.read_text().strip() in ("step_0", "step_1"):
        assert proc.poll() is None, "the run ended before it could be killed"
        time.sleep(0.2)
    time.sleep(1.0)  # somewhere inside the next iteration
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = latest_state(run)["step"]
    assert 2 <= killed_at < 5

    selfplay("train", *SMOKE, f"run.dir={run}", "train.steps=5", "train.checkpoint_every=1")
    state = latest_state(run)
    assert state["step"] == 5 and [h["step"] for h in state["history"]] == [1, 2, 3, 4, 5]
    ids = corpus_ids(run)
    assert len(ids) == len(set(ids)) == state["corpus_size"]
    assert not list((run / "checkpoints").glob("*.partial"))


def test_bad_config_key_fails_before_any_work(tmp_path):
    run = tmp_path / "never"
    proc = selfplay("train", "configs/smoke.yaml", f"run.dir={run}", "train.stepz=3", check=False, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["selfplay train: error: override: unknown config key 'train.stepz'"]
    assert not run.exists()
    proc = selfplay("train", "configs/nope.yaml", check=False, timeout=120)
    assert proc.returncode == 2 and "config file not found" in proc.stderr


def test_bad_mode_and_batch_sizes_are_named(tmp_path):
    proc = selfplay(
        "train", "configs/smoke.yaml", f"run.dir={tmp_path}/r", "train.mode=magic", check=False, timeout=120
    )
    assert proc.returncode == 2 and "train.mode" in proc.stderr
    proc = selfplay(
        "train", "configs/smoke.yaml", f"run.dir={tmp_path}/r", "mixer.generator_tasks=best", check=False, timeout=120
    )
    assert proc.returncode == 2 and "mixer.generator_tasks must be one of fresh, in_band" in proc.stderr


def test_lora_switched_on_after_the_warm_start_is_refused_naming_the_key(warm_run, tmp_path):
    """LoRA is chosen at the warm start: a run whose checkpoint has no adapter, resumed with model.lora.r > 0, stops
    with one line naming the key instead of silently training all weights."""
    run = copy_run(warm_run, tmp_path)
    proc = selfplay("train", *SMOKE, f"run.dir={run}", "train.steps=1", "model.lora.r=4", check=False)
    assert proc.returncode != 0
    assert "model.lora" in proc.stderr and "has no LoRA adapter" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow  # measured over 9 s: out of the fast subset
def test_the_null_reward_control_updates_on_the_same_episodes_with_no_reward(warm_run, tmp_path):
    """ppo.null_reward: the solver's episodes are graded as ever (solver/reward_mean), its update sees 0 for each
    (ppo/solver/score_mean), and it still takes its optimiser steps."""
    run = copy_run(warm_run, tmp_path)
    selfplay(
        "train", *SMOKE, f"run.dir={run}", "train.steps=2", "ppo.null_reward=true", "ppo.skip_uniform_groups=false"
    )
    tags = read_scalars(run)
    assert [v for _, v in tags["ppo/solver/score_mean"]] == [0.0, 0.0]
    assert all(v >= 1 for _, v in tags["ppo/solver/optimizer_steps"])
    assert len(tags["solver/reward_mean"]) == 2
