"""Held-out splits are disjoint from training by construction (what is drawn) and by check_disjoint."""

import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from generator.build import BuildConfig, generate_tasks, levels_for, sample_params
from generator.families import kinds_of
from generator.families.values import TYPE_NAMES, input_etype
from generator.splits import SPLITS, SplitConfig, SplitError, check_disjoint, split_of
from generator.validity import MemoryIndex


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32), split=st.sampled_from(SPLITS), data=st.data())
def test_drawn_params_belong_to_their_split(seed, split, data):
    cfg = BuildConfig()
    level = data.draw(st.sampled_from(levels_for(split)))
    params = sample_params(random.Random(seed), level, split, cfg)
    assert split_of(params, cfg.splits) == split
    etype = TYPE_NAMES[input_etype(params["input"])]
    present = set(kinds_of(params["steps"]))
    held_pair = any(p <= present for p in cfg.splits.pairs)
    depth = len(params["steps"])
    if split == "train":
        assert etype not in cfg.splits.heldout_types and not held_pair
        assert depth <= cfg.splits.train_max_depth and not params["noise"]
    elif split == "heldout_types":
        assert etype in cfg.splits.heldout_types
    elif split == "heldout_compositions":
        assert held_pair and etype not in cfg.splits.heldout_types
    elif split == "deeper":
        assert depth > cfg.splits.train_max_depth and not held_pair
    else:
        assert params["noise"] and depth <= cfg.splits.train_max_depth


@settings(max_examples=50, deadline=None)
@given(
    types=st.lists(st.sampled_from(["int", "float", "str", "record", "tuple"]), min_size=1, max_size=3, unique=True),
    depth=st.integers(2, 5),
    seed=st.integers(0, 2**16),
)
def test_custom_split_config_is_honoured(types, depth, seed):
    cfg = BuildConfig(
        splits=SplitConfig(heldout_types=tuple(types), heldout_pairs=("sort+take",), train_max_depth=depth)
    )
    rng = random.Random(seed)
    for split in ("train", "heldout_types", "heldout_compositions", "deeper"):
        params = sample_params(rng, levels_for(split)[0], split, cfg)
        assert split_of(params, cfg.splits) == split


def test_generated_heldout_tasks_never_overlap_training(task_sb, task_pool):
    train = [t for t in task_pool if t.split == "train"]
    heldout = [t for t in task_pool if t.split != "train"]
    assert {t.split for t in heldout} == set(SPLITS) - {"train"}
    assert check_disjoint(train, heldout) == []
    # more held-out tasks drawn against the training corpus stay disjoint, program by program
    more = generate_tasks(6, split="noisy", seed=5, sb=task_sb, corpus_index=MemoryIndex(train))
    assert check_disjoint(train, more) == []


def test_check_disjoint_finds_leaks(task_pool):
    train = [t for t in task_pool if t.split == "train"]
    heldout = [t for t in task_pool if t.split == "heldout_types"]
    problems = check_disjoint(train + heldout[:1], heldout)
    assert any("belongs to heldout_types" in p for p in problems)
    assert any("in both sets" in p for p in problems)
    mislabeled = dataclasses.replace(heldout[0], split="deeper")
    assert any("claims split deeper" in p for p in check_disjoint(train, [mislabeled]))
    copy = dataclasses.replace(train[0], id="other", split="noisy", params=dict(train[0].params, noise=["vague"]))
    assert any("same program" in p for p in check_disjoint(train, [copy]))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"heldout_types": ("complex",)}, "held-out type 'complex'"),
        ({"heldout_pairs": ("sort",)}, "held-out pair 'sort'"),
        ({"heldout_pairs": ("sort+sort",)}, "held-out pair"),
        ({"heldout_types": ("int", "float", "str", "record", "tuple")}, "nothing is left to train on"),
        ({"train_max_depth": 0}, "train_max_depth"),
    ],
)
def test_bad_split_config_is_refused(kwargs, message):
    with pytest.raises(SplitError, match=message):
        SplitConfig(**kwargs)


def test_unknown_split_is_refused():
    with pytest.raises(SplitError, match="unknown split 'test'"):
        sample_params(random.Random(0), 1, "test")


def test_split_config_from_the_selfplay_config():
    from selfplay.runtime.config import load_config

    cfg = load_config(None, ["tasks.heldout_types=[str]", "tasks.train_max_depth=3"])
    splits = SplitConfig.from_config(cfg.tasks)
    assert splits.heldout_types == ("str",) and splits.train_max_depth == 3
    from selfplay.runtime.errors import UserError

    with pytest.raises(UserError, match="held-out split 'easy'"):  # load_config checks the tasks section
        load_config(None, ["tasks.heldout_splits=[easy]"])
