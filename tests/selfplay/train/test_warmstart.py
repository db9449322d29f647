"""The warm start's corpus: its level mix (`warmstart.level_tasks`), drawn for real in the process sandbox."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sandbox
from generator.fingerprint import ast_hash
from selfplay.runtime.config import load_config
from selfplay.data.corpus import Corpus
from selfplay.runtime.errors import UserError
from selfplay.train.warmstart import level_counts, warmstart_corpus


def test_level_counts_default_is_one_mixed_draw():
    ws = load_config(overrides=["warmstart.tasks=37"]).warmstart
    assert level_counts(ws) == {None: 37}


@settings(deadline=None)  # each example loads the config: over 200 ms on a busy 2-core machine
@given(st.lists(st.integers(0, 50), min_size=1, max_size=4).filter(any))
def test_level_counts_keep_every_nonzero_level(counts):
    ws = load_config(overrides=[f"warmstart.level_tasks={counts}"]).warmstart
    out = level_counts(ws, max_level=4)
    assert out == {i + 1: n for i, n in enumerate(counts) if n}
    assert sum(out.values()) == sum(counts)


@pytest.mark.parametrize("counts, max_level", [([0, 0], 4), ([5, -1], 4), ([1, 1, 1, 1], 3)])
def test_level_counts_reject_bad_lists_by_name(counts, max_level):
    ws = load_config(overrides=[f"warmstart.level_tasks={counts}"]).warmstart
    with pytest.raises(UserError, match="warmstart.level_tasks"):
        level_counts(ws, max_level)


def test_corpus_holds_the_asked_levels_and_no_program_twice(tmp_path):
    cfg = load_config(overrides=["warmstart.level_tasks=[60,60,3]"])
    with sandbox.open_sandbox(backend="process", timeout_s=5.0) as sb, Corpus(tmp_path / "c.sqlite") as corpus:
        tasks = warmstart_corpus(cfg, sb, corpus)
        assert corpus.counts("level", source="procedural") == {1: 60, 2: 60, 3: 3}
    assert [t.level for t in tasks] == [1] * 60 + [2] * 60 + [3] * 3
    # levels 1 and 2 draw from the same one-step programs: the second level never repeats the first
    hashes = [ast_hash(t.reference_solution) for t in tasks]
    assert len(set(hashes)) == len(hashes)
