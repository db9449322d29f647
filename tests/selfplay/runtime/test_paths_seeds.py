"""The run folder's layout (selfplay/runtime/paths.py) and the seed derivations (selfplay/runtime/seeds.py)."""

from __future__ import annotations

import random

import pytest

from selfplay.data.corpus import Corpus, corpus_path
from selfplay.runtime import paths
from selfplay.runtime.checkpoint import CheckpointManager
from selfplay.runtime.paths import RunPaths
from selfplay.runtime.seeds import LEGACY, derive, stream


def test_every_path_is_under_the_run_folder_with_its_documented_name(tmp_path):
    p = RunPaths(tmp_path)
    assert {
        k: v.relative_to(tmp_path).as_posix()
        for k, v in (
            ("corpus", p.corpus),
            ("heldout", p.heldout),
            ("snapshot", p.generator_snapshot),
            ("reserved", p.reserved_tasks),
            ("fixed", p.fixed_tasks),
            ("checkpoints", p.checkpoints),
            ("tb", p.tb),
            ("models", p.models),
            ("summary", p.summary),
            ("eval", p.eval_json(40)),
        )
    } == {
        "corpus": "corpus.sqlite",
        "heldout": "heldout.jsonl",
        "snapshot": "generator_snapshot.jsonl",
        "reserved": "reserved_tasks.jsonl",
        "fixed": "fixed_tasks.jsonl",
        "checkpoints": "checkpoints",
        "tb": "tb",
        "models": "models",
        "summary": "summary.json",
        "eval": "eval/step_40.json",
    }
    for name in paths.__doc__.split("RUN_DIR/")[1].split():  # the layout drawn in the module's docstring
        if name.endswith(("/", ".sqlite", ".jsonl", ".json")) and "_N" not in name:
            top = tmp_path / name.rstrip("/").split("/")[0]
            assert top in {
                p.corpus,
                p.heldout,
                p.generator_snapshot,
                p.reserved_tasks,
                p.fixed_tasks,
                p.checkpoints,
                p.tb,
                p.summary,
                p.models,
            }, name


def test_the_modules_that_write_the_folder_ask_it(tmp_path):
    p = RunPaths(tmp_path)
    assert CheckpointManager(tmp_path).root == p.checkpoints
    assert corpus_path(tmp_path) == p.corpus
    with Corpus(tmp_path) as corpus:  # a run folder given as the corpus path
        assert corpus.path == p.corpus and p.corpus.exists()


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_the_seeds_tests_and_resumes_depend_on_are_todays(seed):
    assert derive(seed, "procedural", 5) == seed * 100_003 + 5
    assert derive(seed, "fixed-fresh") == seed * 100_003 + 99_991
    assert derive(seed, "heldout") == seed + 10_007
    assert derive(seed, "reserved-pool") == seed + 20_011
    assert derive(seed, "replay-pool", 3) == 3 + 7
    assert derive(seed, "references", 3) == 3
    assert stream(seed, 2, 1).random() == random.Random(f"{seed}:2:1").random()


def test_other_names_get_a_stable_hash_that_separates_streams():
    assert derive(0, "probe") == 531576934078542678  # the same on every machine and Python version
    values = {derive(s, name, *args) for s in (0, 1) for name in ("probe", "other") for args in ((), (1,), (2,))}
    assert len(values) == 12 and all(0 <= v < 2**63 for v in values)
    assert not set(LEGACY) & {"probe", "other"}


def test_a_run_seeds_numpys_global_generator_from_its_seed(tmp_path):
    """Libraries may draw from numpy's global generator; a run seeds it (and its checkpoints restore it), so two
    runs of one seed start it alike and runs of two seeds apart."""
    import numpy as np

    from selfplay.runtime.config import load_config
    from selfplay.train.loop import SelfPlay

    states = []
    for i, seed in enumerate((0, 0, 1)):
        np.random.random()  # whatever state came before
        loop = SelfPlay(load_config("configs/smoke.yaml", [f"run.dir={tmp_path / str(i)}", f"run.seed={seed}"]))
        try:
            states.append(np.random.get_state()[1].tobytes())
        finally:
            loop.close()
    assert states[0] == states[1] != states[2]
