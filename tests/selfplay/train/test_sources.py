"""The task sources of selfplay/train/sources.py: what each mode draws, and that a source restored from its state
(with the loop's RNG and mixer state) draws exactly what the original draws next."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sandbox
from generator.build import generate_tasks
from generator.schema import Task
from selfplay.data.corpus import Corpus
from selfplay.runtime.config import load_config
from selfplay.runtime.errors import UserError
from selfplay.train.mixer import IterationStats, Mixer
from selfplay.train.sources import (
    CurriculumSource,
    FixedSource,
    InBandPool,
    MixerSource,
    ProceduralStream,
    UniformSource,
    curriculum_level,
    fixed_schedule,
    make_source,
    validate,
)


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
    a.observe(
        IterationStats(
            solve_rate=1.0,
            validity_rate=1.0,
            diversity=1.0,
            task_rates=[1.0] * 8,
            procedural_rates=[1.0] * 4,
            generator_in_band=0.5,
        )
    )
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


def proposals(template, step: int, n: int) -> list:
    """n distinct stand-ins for one iteration's valid generator proposals (new ids, as fresh proposals have)."""
    return [dataclasses.replace(template, id=f"proposal-{step}-{i}", source="generator") for i in range(n)]


def test_a_pooled_mixer_source_restored_from_json_state_draws_the_same_tasks(world):
    """mixer.generator_tasks=in_band: the pool of measured proposals is in the source's state; a source restored
    from it (through JSON, as a checkpoint keeps it) serves the same pooled tasks next."""
    sb, corpus, _ = world
    cfg = load_config(
        overrides=[
            "mixer.generator_tasks=in_band",
            "mixer.min_share_generator=0.5",
            "mixer.share_generator=0.5",
            "mixer.share_procedural=0.3",
        ]
    )  # 2 of 4, trusted or not
    stream = ProceduralStream(cfg.tasks, cfg.run.seed, sb, corpus)
    pool = corpus.query(split="train", order="random", seed=7, limit=1024)
    a = make_source(cfg, mixer=Mixer(cfg.mixer, seed=0), sb=sb, corpus=corpus, run_dir=world[2], log=print)
    assert isinstance(a.in_band, InBandPool) and a.state_dict() == {"in_band_pool": []}
    rng_a = random.Random(0)
    first = a.draw(4, rng_a, step=1, offered=proposals(pool[0], 1, 6), pool=pool)
    assert first.counts["generator"] == 2 and len(first.extra) == 4  # nothing kept yet: fresh ones serve
    rates = {t.id: r for t, r in zip(first.extra, (0.5, 0.0, 0.25, 1.0))}  # two of the four measured in band
    a.observe(
        IterationStats(
            solve_rate=0.5,
            validity_rate=1.0,
            diversity=1.0,
            task_rates=[0.5] * 4,
            procedural_rates=[0.5],
            generator_in_band=0.5,
            proposal_rates=rates,
        )
    )
    in_band = [t.id for t in first.extra if 0 < rates[t.id] < 1]
    b = MixerSource(Mixer(cfg.mixer, seed=0), stream, adapt=True, in_band=InBandPool(cfg.mixer.in_band_max_age))
    b.mixer.load_state_dict(json.loads(json.dumps(a.mixer.state_dict())))
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    rng_b = random.Random()
    rng_b.setstate(rng_a.getstate())
    offered = proposals(pool[0], 2, 6)
    da, db = (s.draw(4, r, step=2, offered=offered, pool=pool) for s, r in ((a, rng_a), (b, rng_b)))
    assert ids(da.tasks) == ids(db.tasks) and ids(da.extra) == ids(db.extra) and da.counts == db.counts
    assert ids(da.tasks)[:2] == in_band[::-1]  # the pool's two, newest first, before any fresh one
    assert len(da.extra) == 6  # every fresh proposal measured, none served
    assert a.metrics(2)["mixer/in_band_pool/served"] == 2 and a.metrics(2)["mixer/in_band_pool/kept"] == 0


def a_proposal() -> Task:
    """A minimal valid-looking generator task (the pool reads only its id)."""
    return Task(
        id="t",
        family="generator",
        source="generator",
        split="train",
        level=1,
        description="d",
        entry_point="f",
        signature="def f(x)",
        reference_solution="def f(x):\n    return x",
    )


@settings(max_examples=60, deadline=None)
@given(
    max_age=st.integers(1, 4),
    events=st.lists(
        st.tuples(st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0]), max_size=4), st.integers(0, 3)), max_size=12
    ),
)
def test_the_in_band_pool_serves_tasks_measured_in_band_once_newest_first_and_never_stale(max_age, events):
    pool, template = InBandPool(max_age), a_proposal()
    measured: dict[str, tuple[int, float]] = {}  # task id -> (step measured, p)
    served: set[str] = set()
    for step, (rates, want) in enumerate(events, start=1):
        available = sum(1 for i, (s, p) in measured.items() if 0 < p < 1 and i not in served and step - s <= max_age)
        taken = pool.take(want, step)
        assert len(taken) == min(want, available)
        steps = [measured[t.id][0] for t in taken]
        assert steps == sorted(steps, reverse=True)  # newest first
        for t in taken:
            s, p = measured[t.id]
            assert 0 < p < 1 and step - s <= max_age and t.id not in served
            served.add(t.id)
        tasks = [dataclasses.replace(template, id=f"t{step}-{i}") for i in range(len(rates))]
        measured.update({t.id: (step, p) for t, p in zip(tasks, rates)})
        pool.add(tasks, {t.id: p for t, p in zip(tasks, rates)}, step)


def test_generator_tasks_from_the_in_band_pool_are_in_band_more_often_than_fresh_ones(world):
    """A simulated solver: each proposal has a hidden solve probability q (half nearly never solved, three in ten
    at 0.3, two in ten nearly always), measured with 8 samples each time the solver attempts it. Served from the
    pool, the generator's batch tasks are measured in band more often than served fresh (the selection by a first
    measure: about 0.70 against 0.43 in expectation), with the same proposals and draws."""
    sb, corpus, _ = world
    template = corpus.query(split="train", order="random", seed=1, limit=1)[0]

    def run(generator_tasks: str, seed: int) -> tuple[int, int]:
        cfg = load_config(
            overrides=[
                f"mixer.generator_tasks={generator_tasks}",
                "mixer.share_generator=1",
                "mixer.share_procedural=0",
                "mixer.share_replay=0",
                "mixer.min_share_generator=1",
            ]
        )
        source = make_source(cfg, mixer=Mixer(cfg.mixer, seed=seed), sb=sb, corpus=corpus, run_dir=world[2], log=print)
        world_rng, q, hits, served = random.Random(seed), {}, 0, 0
        for step in range(1, 61):
            offered = proposals(template, step, 8)
            for t in offered:
                q[t.id] = world_rng.choices([0.02, 0.3, 0.95], weights=[5, 3, 2])[0]
            drawn = source.draw(2, random.Random(step), step=step, offered=offered, pool=[])
            measure = random.Random(seed * 1000 + step)  # the solver's samples, the same in both arms
            rates = {t.id: sum(measure.random() < q[t.id] for _ in range(8)) / 8 for t in drawn.tasks + drawn.extra}
            served += len(drawn.tasks)
            hits += sum(0 < rates[t.id] < 1 for t in drawn.tasks)
            source.observe(
                IterationStats(
                    solve_rate=0.5,
                    validity_rate=1.0,
                    diversity=1.0,
                    task_rates=[rates[t.id] for t in drawn.tasks],
                    generator_in_band=0.5,
                    proposal_rates={t.id: rates[t.id] for t in drawn.extra},
                )
            )
        return hits, served

    for seed in (0, 1):
        (fresh, n_fresh), (pooled, n_pooled) = run("fresh", seed), run("in_band", seed)
        assert n_fresh == n_pooled == 120
        assert pooled / n_pooled > fresh / n_fresh + 0.15


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


@settings(max_examples=60, deadline=None)
@given(st.integers(4, 400), st.sampled_from([(1, 4), (1, 3), (2, 4), (1, 2)]))
def test_the_default_curriculum_visits_every_level_in_order_within_any_run(steps, bounds):
    """Without train.curriculum_steps_per_level the schedule is set by train.steps: it climbs the mixer's range one
    level at a time, lowest first, spends a stretch of about steps / L iterations on each, and ends at the top."""
    cfg = load_config(
        overrides=[
            f"train.steps={steps}",
            "train.mode=curriculum",
            f"mixer.level_min={bounds[0]}",
            f"mixer.level_max={bounds[1]}",
        ]
    )
    source = make_source(cfg, mixer=Mixer(cfg.mixer), sb=None, corpus=None, run_dir=None, log=print)
    levels = list(range(bounds[0], bounds[1] + 1))
    schedule = [source.level(s) for s in range(1, steps + 1)]
    assert schedule[0] == levels[0] and schedule[-1] == levels[-1]
    assert list(dict.fromkeys(schedule)) == levels  # each level, in order ...
    assert all(b - a in (0, 1) for a, b in zip(schedule, schedule[1:]))  # ... one step up at a time
    stretch = [schedule.count(lv) for lv in levels]
    assert max(stretch) - min(stretch) <= 1  # equal stretches


@pytest.mark.parametrize("steps", [1, 2, 3])
def test_a_run_shorter_than_the_levels_still_goes_from_the_lowest_to_the_highest(steps):
    schedule = [curriculum_level(s, steps, [1, 2, 3, 4]) for s in range(1, steps + 1)]
    assert schedule == {1: [1], 2: [1, 4], 3: [1, 3, 4]}[steps]  # (the middle step: 1.5 levels up, rounded up)


def test_the_recorded_comparisons_length_reaches_the_top_level():
    """train.steps=20 with the default schedule: five iterations at each of levels 1-4 (it used to stay at 1)."""
    cfg = load_config(overrides=["train.steps=20", "train.mode=curriculum"])
    source = make_source(cfg, mixer=Mixer(cfg.mixer), sb=None, corpus=None, run_dir=None, log=print)
    assert [source.level(s) for s in range(1, 21)] == [1] * 5 + [2] * 5 + [3] * 5 + [4] * 5
    explicit = load_config(overrides=["train.steps=20", "train.mode=curriculum", "train.curriculum_steps_per_level=8"])
    source = make_source(explicit, mixer=Mixer(cfg.mixer), sb=None, corpus=None, run_dir=None, log=print)
    assert [source.level(s) for s in range(1, 21)] == [1] * 8 + [2] * 8 + [3] * 4  # a set value is kept
    with pytest.raises(UserError, match="train.curriculum_steps_per_level"):
        validate(load_config(overrides=["train.curriculum_steps_per_level=0"]).train)


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
    assert source.metrics(5)["mixer/level"] == sum(source.draw_levels(4, 5)) / 4
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
    for override, message in (
        ("train.mode=random", "train.mode must be one of selfplay, curriculum, uniform, fixed"),
        ("train.fixed_source=held", "train.fixed_source must be one of corpus, fresh"),
    ):
        with pytest.raises(UserError, match=message):
            validate(load_config(overrides=[override]).train)


# ---------------------------------------------------------------------------- the same controls in every mode

COLLAPSE = [0.5] * 6 + [0.0] * 6  # procedural solve rates: steady (in band, the level stays), then a collapse


def lr_and_replay(mode, overrides, tmp_path):
    """The lr scale, replay share and collapse alarm after each iteration of COLLAPSE, observed through the task
    source `mode` draws from (its own fresh mixer, as the loop holds one)."""
    cfg = load_config(overrides=[f"train.mode={mode}", "train.steps=100", *overrides])
    mixer = Mixer(cfg.mixer, seed=0)
    source = make_source(cfg, mixer=mixer, sb=None, corpus=None, run_dir=tmp_path, log=print)
    out = []
    for p in COLLAPSE:
        source.observe(IterationStats(solve_rate=p, task_rates=[p] * 4, procedural_rates=[p] * 4, kl=0.1))
        out.append((mixer.lr_scale, mixer.shares["replay"], source.metrics(1).get("mixer/alarm/solver_collapse")))
    return out


def test_with_lr_control_every_mode_halves_its_rate_on_a_collapse_as_self_play_does(tmp_path):
    """mixer.lr_control=true (the default): the solve-rate EMA (weight 0.7) falls to 0.35, 0.245, 0.1715 after the
    drop while its slow baseline (0.95) stays near 0.48, so the solver-collapse alarm (EMA 0.25 below the baseline)
    first fires at the 9th iteration: the scale halves there and at each alarm after, 1 before. The curriculum,
    uniform and fixed sources run the same detector and get the same scale and replay share as self-play."""
    expected = [1.0] * 8 + [0.5, 0.25, 0.125, 0.1]  # lr_scale_min 0.1
    runs = {mode: lr_and_replay(mode, [], tmp_path) for mode in ("selfplay", "curriculum", "uniform", "fixed")}
    for mode, run in runs.items():
        assert [lr for lr, _, _ in run] == pytest.approx(expected), mode
        assert [alarm for _, _, alarm in run] == [0.0] * 8 + [1.0] * 4, mode
    for mode in ("curriculum", "uniform"):
        assert [r for _, r, _ in runs[mode]] == [r for _, r, _ in runs["selfplay"]], mode
    assert runs["selfplay"][-1][1] > 0.2  # the collapse raised the replay share


def test_without_lr_control_no_mode_scales_its_rate(tmp_path):
    """mixer.lr_control=false: the alarm still fires (and is logged), the scale stays 1 in every mode."""
    for mode in ("selfplay", "curriculum", "uniform", "fixed"):
        run = lr_and_replay(mode, ["mixer.lr_control=false"], tmp_path)
        assert [lr for lr, _, _ in run] == [1.0] * len(COLLAPSE), mode
        assert run[-1][2] == 1.0, mode


def test_the_replay_share_is_every_modes_or_none(world, tmp_path):
    """mixer.corpus_replay=true (the default): a curriculum or uniform batch of 4 replays as many corpus tasks as
    self-play's does with no generator task offered (share 0.2: 0.8 a batch, its rounding carried: 1, 1, 0, 1, 1),
    chosen from the pool; false: none in any mode, even after a collapse raised nothing."""
    sb, corpus, _ = world
    pool = corpus.query(split="train", order="random", seed=3, limit=1024)

    def counts(mode, overrides=()):
        cfg = load_config(overrides=[f"train.mode={mode}", "train.steps=20", *overrides])
        source = make_source(cfg, mixer=Mixer(cfg.mixer, seed=0), sb=sb, corpus=corpus, run_dir=tmp_path, log=print)
        out = []
        for step in range(1, 6):
            drawn = source.draw(4, random.Random(step), step=step, offered=[], pool=pool)
            replayed = drawn.tasks[drawn.counts["procedural"] :]
            assert len(drawn.tasks) == 4 and {x.id for x in replayed} <= {x.id for x in pool}
            assert drawn.new_ids == {x.id for x in drawn.tasks[: drawn.counts["procedural"]]}
            out.append(drawn.counts["replay"])
        return out

    assert counts("selfplay") == counts("curriculum") == counts("uniform") == [1, 1, 0, 1, 1]
    off = ["mixer.corpus_replay=false"]
    assert counts("selfplay", off) == counts("curriculum", off) == counts("uniform", off) == [0] * 5
    cfg = load_config(overrides=off)
    mixer = Mixer(cfg.mixer, seed=0)
    for p in COLLAPSE:
        mixer.observe(IterationStats(solve_rate=p, task_rates=[p] * 4, procedural_rates=[p] * 4))
    assert mixer.shares["replay"] == 0.0 and mixer.plan(8, {"generator": 0, "replay": 50}).counts["replay"] == 0
