"""The warm start's corpus: its level mix (`warmstart.level_tasks`), drawn for real in the process sandbox; a warm
start made twice by one command is the same warm start."""

from __future__ import annotations

import json
import sqlite3

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sandbox
from generator.fingerprint import ast_hash
from selfplay.data.corpus import Corpus
from selfplay.runtime.config import load_config
from selfplay.runtime.errors import UserError
from selfplay.train.warmstart import level_counts, warmstart_corpus
from tests.conftest import SMOKE, selfplay


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


def _without_clocks(state: dict) -> dict:
    """A warm start's state.json less what the clock and the folder decide (durations, run.dir)."""
    out = {k: v for k, v in state.items() if k not in ("elapsed_s", "warmstart_s")}
    out["warmstart"] = {k: v for k, v in state["warmstart"].items() if k != "seconds" and not k.endswith("_s")}
    out["config"] = {**state["config"], "run": {k: v for k, v in state["config"]["run"].items() if k != "dir"}}
    return out


def _corpus_rows(run) -> list:
    with sqlite3.connect(run / "corpus.sqlite") as db:  # every column but inserted_at (a wall-clock time)
        return db.execute(
            "SELECT seq, id, family, source, split, level, created_step, record FROM tasks ORDER BY seq"
        ).fetchall()


@pytest.mark.slow
def test_a_warm_start_made_twice_by_one_command_is_the_same_warm_start(warm_run, tmp_path):
    """The fixture's warm start and a second one from the same command, under another PYTHONHASHSEED: the same
    held-out tasks, weights (the fingerprint `selfplay compare` records), corpus, RNG states and state, and both
    name the code that made them."""
    from selfplay.eval.compare import warm_start_id
    from selfplay.runtime.checkpoint import code_version

    again = tmp_path / "again"
    selfplay("warmstart", *SMOKE, f"run.dir={again}", env={"PYTHONHASHSEED": "7"})
    assert warm_start_id(again) == warm_start_id(warm_run)
    assert (again / "heldout.jsonl").read_text() == (warm_run / "heldout.jsonl").read_text()
    assert _corpus_rows(again) == _corpus_rows(warm_run) and _corpus_rows(again)
    first, second = (
        json.loads((run / "checkpoints" / "step_0" / "state.json").read_text()) for run in (warm_run, again)
    )
    assert second["rng"] == first["rng"]  # python's global generator too: seeded from run.seed
    assert second["code"] == first["code"] == [code_version()]
    assert _without_clocks(second) == _without_clocks(first)
