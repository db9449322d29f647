"""The corpus store: dedup on insert, filters, difficulty history, append-only rows, concurrent readers, and a
writer killed with SIGKILL mid-stream that loses no committed row and leaves no half transaction."""

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from generator.schema import Task
from selfplay.data.corpus import Corpus, CorpusError


def make_task(i, **kw):
    base = dict(
        id=f"t{i:06d}",
        family=["list_int", "string"][i % 2],
        source=["procedural", "generator"][i % 2],
        split="train" if i % 3 else "noisy",
        level=1 + i % 4,
        description=f"Task {i}.",
        entry_point="solve",
        signature="def solve(xs: list[int]) -> int",
        reference_solution=f"def solve(xs):\n    return len(xs) + {i}\n",
        visible_tests=[{"input": [[1, 2]], "output": 2 + i}],
        hidden_tests=[{"input": [[]], "output": i}],
        checks={"parses": True},
        created_step=i,
        fingerprints={"ast": f"a{i}", "behaviour": f"b{i}"},
    )
    base.update(kw)
    return Task(**base)


def test_insert_query_and_dedup(tmp_path):
    with Corpus(tmp_path) as c:
        assert c.path == tmp_path / "corpus.sqlite"
        results = c.insert_many([make_task(i) for i in range(12)])
        assert all(r.inserted for r in results) and len(c) == 12
        assert c.insert(make_task(3)).reason == "same id"
        assert c.insert(make_task(99, fingerprints={"ast": "a4", "behaviour": "zz"})).duplicate_of == "t000004"
        same_behaviour = c.insert(make_task(98, fingerprints={"ast": "new", "behaviour": "b5"}))
        assert (same_behaviour.inserted, same_behaviour.reason) == (False, "same behaviour")
        assert c.get("t000007") == make_task(7)
        assert [t.id for t in c.query(level=2, split="train")] == ["t000001", "t000005"]
        assert c.count(source="generator", family="string") == 6
        assert c.counts("split") == {"noisy": 4, "train": 8}
        assert c.find_duplicate("x", "a2", None) == "t000002" and c.find_duplicate("x", "q", "q") is None
        first = [t.id for t in c.query(order="random", seed=1)]
        assert sorted(first) == [t.id for t in c.query()] and first == [t.id for t in c.query(order="random", seed=1)]
        with pytest.raises(CorpusError, match="order must be"):
            c.query(order="newest")


def test_difficulty_updates_keep_history_and_never_touch_the_record(tmp_path):
    with Corpus(tmp_path) as c:
        c.insert_many([make_task(i) for i in range(4)])
        c.update_difficulty("t000001", 0.25, n_samples=8, step=10)
        c.update_difficulty("t000001", 0.75, n_samples=8, step=20)
        c.update_difficulty("t000002", 1.0)
        assert c.get("t000001").difficulty == 0.25
        assert [h["solve_rate"] for h in c.difficulty_history("t000001")] == [0.25, 0.75]
        assert [t.id for t in c.query(min_difficulty=0.2, max_difficulty=0.5)] == ["t000001"]
        assert c.count(max_difficulty=0.1) == 1  # t000002, solved always
        raw = c.db.execute("SELECT record FROM tasks WHERE id='t000001'").fetchone()[0]
        assert '"difficulty": null' in raw
        with pytest.raises(CorpusError, match="no task 'nope'"):
            c.update_difficulty("nope", 0.5)
        with pytest.raises(CorpusError, match="solve_rate must be in"):
            c.update_difficulty("t000001", 1.5)
        # a record inserted with a difficulty (an import) keeps it exactly
        c.insert(make_task(50, difficulty=0.3))
        assert c.get("t000050").difficulty == 0.3


def test_rows_are_append_only(tmp_path):
    with Corpus(tmp_path) as c:
        c.insert(make_task(1))
        for sql in ("UPDATE tasks SET level=4", "DELETE FROM tasks"):
            with pytest.raises(sqlite3.DatabaseError, match="append-only"):
                c.db.execute(sql)
        assert c.get("t000001") == make_task(1)


def test_missing_corpus_is_a_clear_error(tmp_path):
    with pytest.raises(CorpusError, match="no corpus at"):
        Corpus(tmp_path / "nothing", create=False)
    (tmp_path / "bad.sqlite").write_text("this is not a database")
    with pytest.raises(CorpusError, match="cannot open corpus"):
        Corpus(tmp_path / "bad.sqlite")


WRITER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    from test_corpus import make_task
    from selfplay.data.corpus import Corpus
    batch = {batch}
    with Corpus({path!r}) as c:
        i = 0
        while True:
            c.insert_many([make_task(i + j, description="x" * 2000) for j in range(batch)])
            i += batch
            print(i, flush=True)
""")


def test_kill_9_during_writes_loses_nothing_committed(tmp_path):
    batch = 5
    script = WRITER.format(tests=os.path.dirname(__file__), batch=batch, path=str(tmp_path))
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=str(Path(__file__).resolve().parents[3])
    )
    committed, seen_by_reader = 0, []
    try:
        while committed < 300:
            line = proc.stdout.readline()
            assert line, "writer died early"
            committed = int(line)
            if committed % 50 == 0:  # readers read while the writer writes
                with Corpus(tmp_path, create=False) as reader:
                    seen_by_reader.append(len(reader))
                    assert all(t.description == "x" * 2000 for t in reader.query(limit=20, order="random"))
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    assert seen_by_reader == sorted(seen_by_reader) and seen_by_reader[-1] >= 50
    with Corpus(tmp_path, create=False) as c:
        assert c.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        n = len(c)
        assert n >= committed and n % batch == 0  # every committed batch, and no half of one
        ids = {t.id for t in c.query()}
        assert ids == {f"t{i:06d}" for i in range(n)}
        assert c.insert(make_task(n)).inserted  # and the store is writable again


def test_newer_corpus_schema_is_refused(tmp_path):
    with Corpus(tmp_path) as c:
        c.db.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    with pytest.raises(CorpusError, match="corpus schema 99, newer than this code"):
        Corpus(tmp_path)


def test_reserved_programs_are_duplicates_but_never_corpus_rows(tmp_path):
    with Corpus(tmp_path) as c:
        c.insert_many([make_task(i) for i in range(3)])
        held_out = [make_task(100 + i) for i in range(4)]
        assert c.reserve(held_out) == 4 and c.reserve(held_out[:2]) == 0  # idempotent
        assert c.reserved_count() == 4 and len(c) == 3 and c.counts("split") == {"noisy": 1, "train": 2}
        assert all(c.get(t.id) is None for t in held_out)
        for probe, reason in (
            (make_task(100), "reserved: same id"),
            (make_task(7, fingerprints={"ast": "a101", "behaviour": "x"}), "reserved: same program"),
            (make_task(8, fingerprints={"ast": "y", "behaviour": "b102"}), "reserved: same behaviour"),
        ):
            result = c.insert(probe)
            assert (result.inserted, result.reason) == (False, reason)
        assert c.find_duplicate("new", "a103", None) == "t000103"
        assert c.insert(make_task(9)).inserted  # an unrelated task still goes in


def test_reserved_index_sees_only_the_reserved_programs(tmp_path):
    with Corpus(tmp_path) as c:
        c.insert_many([make_task(i) for i in range(3)])
        c.reserve([make_task(100)])
        index = c.reserved_index()
        assert index.find_duplicate("new", "a100", None) == "t000100"  # a held-out program
        assert index.find_duplicate("new", None, "b100") == "t000100"
        assert index.find_duplicate("t000001", "a1", "b1") is None  # a training task may be drawn again
        assert c.find_duplicate("t000001", "a1", "b1") == "t000001"


def test_schema_1_corpus_is_upgraded_in_place(tmp_path):
    path = tmp_path / "corpus.sqlite"
    with Corpus(path) as c:
        c.insert_many([make_task(i) for i in range(5)])
        c.db.execute("DROP TABLE reserved")  # what a corpus written before schema 2 looks like
        c.db.execute("UPDATE meta SET value='1' WHERE key='schema_version'")
    with Corpus(path) as c:
        assert c._version() == 2 and len(c) == 5 and c.get("t000002") == make_task(2)
        assert c.reserve([make_task(50)]) == 1 and not c.insert(make_task(50)).inserted
