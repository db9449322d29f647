"""The task sources of selfplay/train/sources.py: what each mode draws, and that a source restored from its state
(with the loop's RNG and mixer state) draws exactly what the original draws next."""

from __future__ import annotations

import random

import pytest

import sandbox
from generator.build import generate_tasks
from selfplay.data.corpus import Corpus
from selfplay.runtime.config import load_config
from selfplay.runtime.errors import UserError
from selfplay.train.mixer import IterationStats, Mixer
from selfplay.train.sources import (CurriculumSource, FixedSource, MixerSource, ProceduralStream, UniformSource,
                                    fixed_schedule, make_source, validate)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A process sandbox and a small corpus of level-1 and level-2 procedural training tasks."""
    folder = tmp_path_factory.mktemp("sources")
    with sandbox.open_sandbox(backend="process", timeout_s=5.0) as sb, Corpus(folder / "corpus.sqlite") as corpus:
        for level in (1, 2):
            corpus.insert_many(generate_tasks(12, level=level, seed=level, sb=sb, corpus_index=corpus))
        yield sb, corpus, folder


def ids(tasks):
    return [t.id for t in tasks]


def test_mixer_source_restored_from_state_draws_the_same_tasks(world):
    sb, corpus, _ = world
    cfg = load_config()
    stream = ProceduralStream(cfg.tasks, cfg.run.seed, sb, corpus)
    pool = corpus.query(split="train", order="random", seed=7, limit=1024)
    offered = pool[:6]  # stand-ins for this iteration's valid generator proposals
    a = MixerSource(Mixer(cfg.mixer, seed=0), stream, adapt=True)
    rng_a = random.Random(0)
    a.draw(8, rng_a, step=1, offered=offered, pool=pool)
    a.observe(IterationStats(solve_rate=1.0, validity_rate=1.0, diversity=1.0, task_rates=[1.0] * 8,
                             procedural_rates=[1.0] * 4, generator_in_band=0.5))
    # a fresh source given the mixer's and the RNG's state (what a checkpoint keeps) continues identically
    b = MixerSource(Mixer(cfg.mixer, seed=0), stream, adapt=True)
    b.mixer.load_state_dict(a.mixer.state_dict())
    b.load_state_dict(a.state_dict())
    rng_b = random.Random()
    rng_b.setstate(rng_a.getstate())
    da, db = (s.draw(8, r, step=2, offered=offered, pool=pool) for s, r in ((a, rng_a), (b, rng_b)))
    assert ids(da.tasks) == ids(db.tasks) and ids(da.extra) == ids(db.extra) and da.counts == db.counts
    assert sum(da.counts.values()) == len(da.tasks) <= 8
    assert da.new_ids == {t.id for t in da.tasks if t.id not in {x.id for x in pool}}
    assert set(a.metrics(2)) and all(k.startswith("mixer/") for k in a.metrics(2))


def test_a_mixer_that_does_not_adapt_ignores_what_it_observes(world):
    sb, corpus, _ = world
    cfg = load_config()
    source = MixerSource(Mixer(cfg.mixer, seed=0), ProceduralStream(cfg.tasks, 0, sb, corpus), adapt=False)
    before = source.mixer.state_dict()
    source.observe(IterationStats(solve_rate=1.0, task_rates=[1.0] * 4, procedural_rates=[1.0] * 4))
    assert source.mixer.state_dict() == before and source.metrics(1) == {}


def test_curriculum_follows_its_level_schedule(world):
    sb, corpus, _ = world
    cfg = load_config()
    source = CurriculumSource(ProceduralStream(cfg.tasks, 0, sb, corpus), steps_per_level=2)
    assert [source.level(s) for s in range(1, 10)] == [1, 1, 2, 2, 3, 3, 4, 4, 4]
    drawn = source.draw(3, random.Random(0), step=3, offered=[], pool=[])
    assert {t.level for t in drawn.tasks} == {2} and drawn.new_ids == set(ids(drawn.tasks))
    assert drawn.counts == {"generator": 0, "procedural": 3, "replay": 0}
    assert source.metrics(3) == {"mixer/level": 2} and source.state_dict() == {}


def test_uniform_draws_every_level_of_the_mixers_range_alike_and_as_a_function_of_the_step(world):
    sb, corpus, folder = world
    cfg = load_config(overrides=["train.mode=uniform", "mixer.level_min=1", "mixer.level_max=3"])
    source = make_source(cfg, mixer=Mixer(cfg.mixer, seed=0), sb=sb, corpus=corpus, run_dir=folder, log=print)
    assert isinstance(source, UniformSource) and source.levels == [1, 2, 3]
    drawn = [lv for step in range(1, 201) for lv in source.draw_levels(6, step)]
    counts = [drawn.count(lv) for lv in (1, 2, 3)]
    assert sum(counts) == 1200 and min(counts) > 340  # 400 each expected; 340 is > 5 sd below
    assert source.draw_levels(6, 7) == source.draw_levels(6, 7) != source.draw_levels(6, 8)
    # a fresh source (a resumed run) draws the same levels at the same step, whatever the loop's RNG did
    again = UniformSource(source.procedural, [1, 2, 3], cfg.run.seed)
    batch = source.draw(4, random.Random(1), step=5, offered=[], pool=[])
    assert ids(batch.tasks) == ids(again.draw(4, random.Random(2), step=5, offered=[], pool=[]).tasks)
    assert sorted(t.level for t in batch.tasks) == sorted(source.draw_levels(4, 5))
    assert batch.counts == {"generator": 0, "procedural": 4, "replay": 0} and batch.new_ids == set(ids(batch.tasks))
    assert source.metrics(5) == {"mixer/level": sum(source.draw_levels(4, 5)) / 4}
    with pytest.raises(UserError, match="mixer.level_min"):
        UniformSource(source.procedural, [], 0)


def test_fixed_source_state_round_trip_and_a_changed_set_is_reported(world, tmp_path):
    sb, corpus, _ = world
    cfg = load_config(overrides=["train.mode=fixed", "train.fixed_tasks=6", "train.solver_tasks=4"])
    logged: list[str] = []

    def source():
        return make_source(cfg, mixer=Mixer(cfg.mixer), sb=sb, corpus=corpus, run_dir=tmp_path, log=logged.append)

    first = source()
    assert isinstance(first, FixedSource) and first.state_dict() == {}  # nothing chosen yet
    steps = [ids(first.draw(4, random.Random(0), step=s, offered=[], pool=[]).tasks) for s in (1, 2)]
    assert (tmp_path / "fixed_tasks.jsonl").exists()
    assert steps[1] == [ids(first.tasks)[i] for i in fixed_schedule(6, 2, 4, cfg.run.seed)]
    state = first.state_dict()
    resumed = source()
    resumed.load_state_dict(state)
    assert ids(resumed.draw(4, random.Random(1), step=2, offered=[], pool=[]).tasks) == steps[1]
    assert resumed.state_dict() == state and not any("not exact" in line for line in logged)
    changed = source()
    changed.load_state_dict({"fixed_tasks": "0" * 16})
    changed.draw(4, random.Random(0), step=3, offered=[], pool=[])
    assert any("not exact" in line for line in logged)


def test_task_choice_settings_name_their_key():
    for override, message in (("train.mode=random", "train.mode must be one of selfplay, curriculum, uniform, fixed"),
                              ("train.fixed_source=held", "train.fixed_source must be one of corpus, fresh")):
        with pytest.raises(UserError, match=message):
            validate(load_config(overrides=[override]).train)
