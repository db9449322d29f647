"""`train.mode=fixed`: the schedule over a fixed task set (pure, property-tested) and its config checks.
A real fixed-mode run is in test_compare_arms.py."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from selfplay.runtime.config import load_config
from selfplay.runtime.tb import read_scalars
from selfplay.train.loop import SelfPlay
from selfplay.train.sources import ProceduralStream, fixed_schedule
from tests.conftest import SMOKE, copy_run, selfplay


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 40), st.integers(1, 16), st.integers(1, 6), st.integers(0, 3))
def test_every_task_once_per_pass_and_steps_are_pure(n_tasks, per_step, passes, seed):
    steps = -(-passes * n_tasks // per_step)  # enough steps to cover `passes` full passes
    stream = [i for step in range(1, steps + 1) for i in fixed_schedule(n_tasks, step, per_step, seed)]
    assert all(len(fixed_schedule(n_tasks, s, per_step, seed)) == per_step for s in (1, steps))
    for p in range(passes):
        assert Counter(stream[p * n_tasks : (p + 1) * n_tasks]) == Counter(range(n_tasks))
    # a resumed run asks for step k alone and gets what the continuous run got
    k = steps
    assert fixed_schedule(n_tasks, k, per_step, seed) == stream[(k - 1) * per_step : k * per_step]


def test_passes_are_reshuffled():
    first = [i for s in range(1, 11) for i in fixed_schedule(40, s, 4, 0)]
    second = [i for s in range(11, 21) for i in fixed_schedule(40, s, 4, 0)]
    assert sorted(first) == sorted(second) == list(range(40)) and first != second


@pytest.mark.slow  # measured over 9 s: out of the fast subset
def test_bad_fixed_settings_name_the_key(tmp_path):
    for override, message in (
        ("train.fixed_tasks=2", "train.fixed_tasks (2) must be >= train.solver_tasks"),
        ("train.fixed_levels=[0,5]", "train.fixed_levels must be"),
        ("train.fixed_source=held", "train.fixed_source must be one of corpus, fresh, reserved"),
        ("ppo.replay_source=past", "ppo.replay_source must be one of successes, sft"),
    ):
        proc = selfplay("train", *SMOKE, f"run.dir={tmp_path}", "train.mode=fixed", override, check=False)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr


@pytest.mark.slow  # measured over 9 s: out of the fast subset
def test_fresh_tasks_are_new_programs_and_join_the_corpus(warm_run, tmp_path):
    run = copy_run(warm_run, tmp_path)

    def corpus():
        with sqlite3.connect(run / "corpus.sqlite") as db:
            return dict(db.execute("SELECT id, ast_hash FROM tasks"))

    before = corpus()
    selfplay(
        "train",
        *SMOKE,
        f"run.dir={run}",
        "train.mode=fixed",
        "train.fixed_source=fresh",
        "train.fixed_tasks=8",
        "train.steps=1",
        "train.eval_every=0",
    )
    fixed = [json.loads(line) for line in (run / "fixed_tasks.jsonl").read_text().splitlines()]
    assert len(fixed) == 8 and {t["level"] for t in fixed} <= {1, 2}
    heldout = {json.loads(line)["id"] for line in (run / "heldout.jsonl").read_text().splitlines()}
    assert not {t["id"] for t in fixed} & (set(before) | heldout)
    after = corpus()
    assert {t["id"] for t in fixed} <= set(after) and len(after) == len(before) + 8
    assert not {after[t["id"]] for t in fixed} & set(before.values())  # new programs, not new ids only


@pytest.mark.slow  # measured over 9 s: out of the fast subset
def test_reserved_pool_is_drawn_before_sft_and_kept_out_of_it(tmp_path):
    """train.fixed_source=reserved: the warm start draws the fixed set's pool after the held-out tasks and before
    its SFT corpus, keeps its programs out of that corpus, and a fixed-mode run then trains on exactly that pool."""
    run = tmp_path / "run"
    reserved = ["train.fixed_source=reserved", "train.fixed_tasks=8"]
    selfplay("warmstart", *SMOKE, f"run.dir={run}", *reserved)
    pool = [json.loads(line) for line in (run / "reserved_tasks.jsonl").read_text().splitlines()]
    assert Counter(t["level"] for t in pool) == {1: 4, 2: 4}
    with sqlite3.connect(run / "corpus.sqlite") as db:
        sft_programs = {r[0] for r in db.execute("SELECT ast_hash FROM tasks")}
        kept_out = dict(db.execute("SELECT id, reason FROM reserved"))
    assert not {t["fingerprints"]["ast"] for t in pool} & sft_programs
    assert {kept_out[t["id"]] for t in pool} == {"fixed pool"}
    heldout = [json.loads(line) for line in (run / "heldout.jsonl").read_text().splitlines()]
    assert not {t["fingerprints"]["ast"] for t in pool} & {t["fingerprints"]["ast"] for t in heldout}
    selfplay("train", *SMOKE, f"run.dir={run}", "train.mode=fixed", *reserved, "train.steps=1", "train.eval_every=0")
    fixed = [json.loads(line)["id"] for line in (run / "fixed_tasks.jsonl").read_text().splitlines()]
    assert sorted(fixed) == sorted(t["id"] for t in pool)


def test_reserved_source_without_a_pool_says_how_to_make_one(warm_run, tmp_path):
    run = copy_run(warm_run, tmp_path)  # warm-started without train.fixed_source=reserved: no pool
    proc = selfplay(
        "train",
        *SMOKE,
        f"run.dir={run}",
        "train.mode=fixed",
        "train.fixed_source=reserved",
        "train.fixed_tasks=8",
        "train.steps=1",
        check=False,
    )
    assert proc.returncode == 2 and "reserved_tasks.jsonl is missing" in proc.stderr, proc.stderr
    assert "warm start with train.fixed_source=reserved" in proc.stderr


@pytest.mark.slow  # measured over 9 s: out of the fast subset
def test_procedural_stream_repeats_training_programs_but_never_a_reserved_one(tmp_path):
    """The curriculum and self-play modes' fresh procedural tasks: a training program may come back (with new
    inputs), a held-out (reserved) program never does."""
    import sandbox
    from generator.build import generate_tasks
    from selfplay.data.corpus import Corpus

    cfg = load_config()
    with sandbox.open_sandbox(backend="process", timeout_s=5.0) as sb, Corpus(tmp_path / "c.sqlite") as corpus:
        heldout = generate_tasks(200, level=1, seed=11, sb=sb)  # ~200 of the ~720 one-step programs each
        corpus.reserve(heldout)
        corpus.insert_many(generate_tasks(200, level=1, seed=12, sb=sb, corpus_index=corpus))
        drawn = ProceduralStream(cfg.tasks, cfg.run.seed, sb, corpus)([1] * 40 + [2] * 20, step=1)
        training = {t.fingerprints["ast"] for t in corpus.iter_tasks()}
    programs = {t.fingerprints["ast"] for t in drawn}
    assert len(drawn) == 60 and {t.level for t in drawn} == {1, 2}
    assert not programs & {t.fingerprints["ast"] for t in heldout}
    assert programs & training  # not deduplicated against the corpus's own tasks


def _episode(task_id: str, reward: float):
    return SimpleNamespace(task=SimpleNamespace(id=task_id), reward=reward)


def test_skip_uniform_groups_keeps_only_tasks_whose_answers_differ():
    episodes = [
        _episode("a", 1.0),
        _episode("a", 0.0),
        _episode("b", 0.0),
        _episode("b", 0.0),
        _episode("c", 0.5),
        _episode("c", 0.25),
        _episode("d", 1.0),
        _episode("d", 1.0),
    ]
    for skip, kept_ids, share in ((True, ["a", "a", "c", "c"], 0.5), (False, list("aabbccdd"), None)):
        cfg = load_config(overrides=[f"ppo.skip_uniform_groups={str(skip).lower()}"])
        metrics: dict = {}
        kept = SelfPlay._update_rollouts(SimpleNamespace(cfg=cfg), episodes, metrics)
        assert [e.task.id for e in kept] == kept_ids
        assert metrics.get("ppo/solver/kept_share") == share


@pytest.mark.slow  # measured over 9 s: out of the fast subset
def test_skip_uniform_groups_in_a_real_fixed_run(warm_run, tmp_path):
    """The smoke solver passes (almost) nothing, so most or all groups are uniform: the run must go on, skipping
    the solver's update when no task is left, and log the share it kept."""
    run = copy_run(warm_run, tmp_path)
    selfplay(
        "train",
        *SMOKE,
        f"run.dir={run}",
        "train.mode=fixed",
        "train.fixed_tasks=8",
        "train.steps=2",
        "train.eval_every=0",
        "ppo.advantage=rloo",
        "ppo.skip_uniform_groups=true",
    )
    scalars = read_scalars(run)
    kept = [v for _, v in scalars["ppo/solver/kept_share"]]
    assert len(kept) == 2 and all(0.0 <= v <= 1.0 for v in kept)
    updates = len(scalars.get("ppo/solver/policy_loss", []))
    assert updates == sum(v > 0 for v in kept)  # an update exactly when some task's answers differed


@pytest.mark.slow  # measured over 9 s: out of the fast subset
def test_sft_replay_mixes_the_warm_starts_examples_into_ppo(warm_run, tmp_path):
    """ppo.replay_source=sft (PPO-ptx): every update adds the NLL of warm-start SFT examples, drawn from the
    corpus rows the warm start inserted; the replay term is logged under ppo/solver/replay_loss."""
    run = copy_run(warm_run, tmp_path)
    with sqlite3.connect(run / "corpus.sqlite") as db:
        sft_tasks = db.execute("SELECT COUNT(*) FROM tasks WHERE split='train'").fetchone()[0]
    proc = selfplay(
        "train",
        *SMOKE,
        f"run.dir={run}",
        "train.mode=fixed",
        "train.fixed_tasks=8",
        "train.steps=2",
        "train.eval_every=0",
        "ppo.replay_source=sft",
        "ppo.replay_coef=0.5",
        "ppo.replay_batch=4",
    )
    replaying = [line for line in proc.stdout.splitlines() if "warm-start SFT examples" in line]
    assert len(replaying) == 1, proc.stdout  # built once
    n = int(replaying[0].split("replaying ")[1].split()[0])
    assert 0.9 * sft_tasks <= n <= sft_tasks  # all of them but answers too long for warmstart.max_len
    losses = [v for _, v in read_scalars(run)["ppo/solver/replay_loss"]]
    assert len(losses) == 2 and all(0 < v < 20 for v in losses)  # the answer NLL of a trained-on example
    assert "replay/size" not in read_scalars(run)  # no buffer of successes
