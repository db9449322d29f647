"""The held-out check of a run's corpus (selfplay.data.corpus.check_heldout over generator.splits.check_disjoint): a
training row that belongs to a held-out split, or repeats a held-out task's id, program or behaviour, stops the run
with its id, free-format proposals (no params) included; a clean corpus passes. Real tasks, sandbox and corpus."""

from __future__ import annotations

import dataclasses
import sqlite3

import pytest

import sandbox
from generator.build import generate_tasks
from generator.splits import HeldoutIndex, check_disjoint, split_of_task
from selfplay.data.corpus import Corpus, HeldoutLeak, check_heldout
from selfplay.eval.evaluate import draw_heldout, read_tasks
from selfplay.runtime.config import load_config
from selfplay.runtime.paths import RunPaths
from tests.conftest import SMOKE, copy_run, selfplay


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A run folder with its held-out suite drawn and reserved first (test split and heldout_types), then a corpus
    of procedural training tasks drawn against it, as a warm start does."""
    folder = tmp_path_factory.mktemp("heldout_check")
    cfg = load_config(overrides=["eval.tasks_per_split=3", "tasks.heldout_splits=[heldout_types]"])
    with sandbox.open_sandbox(backend="process", timeout_s=5.0) as sb, Corpus(folder) as corpus:
        heldout = draw_heldout(RunPaths(folder).heldout, cfg, sb, corpus)
        rows = generate_tasks(8, level=1, seed=11, sb=sb, corpus_index=corpus)
        corpus.insert_many(rows)
    return folder, cfg, heldout, rows


def free_format(task, **kw):
    """The task as a free-format proposal stores it: its program and fingerprints, split train, no params."""
    return dataclasses.replace(
        task,
        id=kw.pop("id", "free-" + task.id),
        source="generator",
        split="train",
        family="generator/free",
        params={},
        **kw,
    )


def test_a_clean_corpus_passes(run):
    folder, cfg, _, rows = run
    with Corpus(folder) as corpus:
        assert check_heldout(folder, corpus.iter_tasks(), cfg.tasks, "start") == len(rows)


def test_a_free_format_proposal_gets_its_split_from_its_program(run):
    """No params: the split of the held-out task it shares a program or a behaviour with, else train."""
    _, _, heldout, rows = run
    index = HeldoutIndex([t for ts in heldout.values() for t in ts])
    test_task, typed = heldout["test"][0], heldout["heldout_types"][0]
    assert split_of_task(free_format(test_task), index) == "test"
    assert split_of_task(free_format(typed), index) == "heldout_types"
    other_ast = dict(typed.fingerprints, ast="not-the-same-ast")  # the same behaviour written another way
    assert split_of_task(free_format(typed, fingerprints=other_ast), index) == "heldout_types"
    assert split_of_task(free_format(rows[0]), index) == "train"
    assert split_of_task(typed, index) == "heldout_types"  # params: split_of, as before
    # before, a task without params was never judged: check_disjoint saw nothing wrong with it
    problems = check_disjoint([free_format(typed, fingerprints=other_ast)], heldout["heldout_types"])
    assert any("belongs to heldout_types (its program: no params)" in p for p in problems)
    assert any("same behaviour" in p for p in problems)


@pytest.mark.parametrize("planted", ["free_test", "free_behaviour", "procedural_heldout"])
def test_a_planted_heldout_program_among_new_rows_stops_with_its_id(run, planted):
    folder, cfg, heldout, rows = run
    test_task, typed = heldout["test"][0], heldout["heldout_types"][0]
    bad = {
        "free_test": free_format(test_task),
        "free_behaviour": free_format(typed, fingerprints=dict(typed.fingerprints, ast="x")),
        "procedural_heldout": dataclasses.replace(
            typed, id="proc-typed", split="train", fingerprints={"ast": "y", "behaviour": "z"}
        ),
    }[planted]
    new = [*rows[:3], bad, *rows[3:5]]
    with pytest.raises(
        HeldoutLeak,
        match=rf"^the corpus rows of step 3: 1 training task\(s\) held out "
        rf"\(heldout.jsonl\): {bad.id}\b",
    ) as err:
        check_heldout(folder, new, cfg.tasks, "the corpus rows of step 3")
    assert "\n" not in str(err.value)


def test_the_loops_corpus_update_checks_the_rows_it_inserts(run, tmp_path):
    """SelfPlay._flush_corpus inserts the iteration's new rows, then checks them: a planted free-format copy of a
    held-out program stops the run naming it (it was refused by nothing before: free proposals carry no params)."""
    from selfplay.train.loop import SelfPlay

    folder, cfg, heldout, rows = run
    (tmp_path / "heldout.jsonl").write_text(RunPaths(folder).heldout.read_text())
    with Corpus(tmp_path) as corpus:
        loop = SelfPlay.__new__(SelfPlay)
        loop.run_dir, loop.corpus, loop.cfg, loop.step = tmp_path, corpus, cfg, 4
        loop.pending_tasks, loop.pending_difficulty = list(rows[:4]), []
        loop._flush_corpus()  # clean rows pass
        assert len(corpus) == 4
        bad = free_format(heldout["test"][1], id="free-leak")
        loop.pending_tasks = [rows[4], bad]
        with pytest.raises(HeldoutLeak, match=r"the corpus rows of step 4: 1 training task\(s\).*: free-leak"):
            loop._flush_corpus()


@pytest.mark.slow  # measured over 9 s: out of the fast subset
def test_a_run_starts_only_on_a_clean_corpus(warm_run, tmp_path):
    """The start of every run checks the whole corpus: a row planted in a warm start's corpus (a held-out program
    stored as a free-format proposal, past the corpus's own dedup) stops `selfplay train` with a one-line error
    naming it; the clean warm start trains."""
    clean = copy_run(warm_run, tmp_path / "clean")
    selfplay("train", *SMOKE, f"run.dir={clean}", "train.steps=1", "train.eval_every=0", "train.mode=curriculum")
    planted = copy_run(warm_run, tmp_path / "planted")
    leak = free_format(read_tasks(RunPaths(planted).heldout)[0], id="planted-free-proposal")
    with Corpus(planted) as corpus:
        assert corpus.insert(leak, dedup=False).inserted
    proc = selfplay("train", *SMOKE, f"run.dir={planted}", "train.steps=1", check=False)
    assert proc.returncode != 0
    assert "the corpus at the start of the run: 1 training task(s) held out" in proc.stderr, proc.stderr[-2000:]
    assert "planted-free-proposal" in proc.stderr
    with sqlite3.connect(RunPaths(planted).corpus) as db:  # nothing trained: no checkpoint beyond the warm start
        assert db.execute("SELECT COUNT(*) FROM tasks WHERE id='planted-free-proposal'").fetchone() == (1,)
    assert not (planted / "checkpoints" / "step_1").exists()
