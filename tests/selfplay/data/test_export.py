"""Export -> import round trips exactly (JSONL and Parquet), files load with the real `datasets` package, and
import re-validates every row, rejecting bad ones with their reasons."""

import dataclasses
import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sandbox
from generator.build import generate_tasks
from selfplay.data.corpus import Corpus
from selfplay.data.export import (
    CARD_MARKER,
    ExportError,
    export_tasks,
    import_rows,
    kind_questions,
    read_rows,
    row_to_task,
    task_to_row,
)


class Pool(list):
    def __repr__(self) -> str:
        return f"<{len(self)} tasks>"


@pytest.fixture(scope="module")
def sb():
    with sandbox.open_sandbox(backend="process", timeout_s=5.0) as box:
        yield box


@pytest.fixture(scope="module")
def pool(sb):
    tasks = generate_tasks(14, seed=7, sb=sb) + generate_tasks(4, split="heldout_types", seed=7, sb=sb)
    tasks[0].difficulty, tasks[1].difficulty = 0.3, 0.0
    tasks[2].parent_ids, tasks[2].source, tasks[2].generator_checkpoint = [tasks[0].id], "generator", "step_40"
    return Pool(tasks)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 1000), fmt=st.sampled_from([".jsonl", ".parquet"]))
def test_export_import_round_trips_identically(sb, pool, tmp_path_factory, seed, fmt):
    tasks = random.Random(seed).sample(pool, 8)
    root = tmp_path_factory.mktemp("rt")
    with Corpus(root / "a") as a:
        a.insert_many(tasks)
        first = export_tasks(a.iter_tasks(), root / f"one/tasks{fmt}")
    with Corpus(root / "b") as b:
        summary = import_rows(first.path, b, sb)
        assert summary.accepted == 8 and summary.rejected == []
        back = b.query()
        second = export_tasks(b.iter_tasks(), root / f"two/tasks{fmt}")
    assert [t.to_json() for t in back] == [t.to_json() for t in tasks]
    if fmt == ".jsonl":
        assert first.path.read_bytes() == second.path.read_bytes()
    assert first.counts == second.counts


def test_rows_decode_to_the_same_task(pool):
    for task in pool:
        row = json.loads(json.dumps(task_to_row(task)))
        assert all(not isinstance(v, dict) for v in row.values())  # flat: one Arrow type per column
        assert row_to_task(row) == task


@pytest.mark.parametrize("fmt, loader", [(".jsonl", "json"), (".parquet", "parquet")])
def test_exports_load_with_datasets(pool, tmp_path, fmt, loader):
    import datasets

    summary = export_tasks(pool, tmp_path / f"tasks{fmt}")
    ds = datasets.load_dataset(loader, data_files=str(summary.path), cache_dir=str(tmp_path / "cache"))["train"]
    assert ds.num_rows == len(pool)
    assert [row_to_task(row) for row in ds] == list(pool)
    card = summary.card.read_text()
    assert summary.card == tmp_path / "README.md" and CARD_MARKER in card
    for family, count in summary.counts["family"].items():
        assert f"| {family} | {count} |" in card
    assert "## By level" in card and "## By source" in card and "## By split" in card


CODE_IO_PROPOSAL = """```python
def f(xs, k):
    return sorted(xs)[:k]
```
input: [3, 1, 2], 2
input: [5, 4, 9, 1], 3
input: [7], 1
input: [2, 2, 1], 2
input: [], 0
input: [8, 6], 1
message: the k smallest values, in increasing order
"""


def test_card_counts_formats_and_kinds(sb, pool, tmp_path):
    from generator.code_io_format import compile_proposal, parse
    from generator.validity import validate_many

    (report,) = validate_many([compile_proposal(parse(CODE_IO_PROPOSAL), pool[:1])], sb)
    assert report.ok, report.reason
    code_io = report.task
    tasks = [*pool[:5], code_io]
    summary = export_tasks(tasks, tmp_path / "tasks.jsonl")
    card = summary.card.read_text()
    assert summary.counts["format"] == {"code_io": 1, "program": 5}
    assert "| code_io | 1 | a program `f`, the inputs" in card and "| program | 5 | a description" in card
    # the code_io task: six calls, three shown and three held back
    assert kind_questions(code_io) == {"program": 1, "deduction": 6, "abduction": 6, "induction": 1}
    pairs = sum(len(t.tests) for t in tasks)
    assert summary.counts["kind"]["deduction"] == {"tasks": 6, "questions": pairs}
    assert summary.counts["kind"]["program"] == {"tasks": 6, "questions": 6}
    for kind in ("program", "deduction", "abduction", "induction"):
        c = summary.counts["kind"][kind]
        assert f"| {kind} | {c['tasks']} | {c['questions']} |" in card
    assert f"| deduction | 6 | {pairs} |" in card
    # a task without hidden tests cannot be asked in induction
    bare = dataclasses.replace(pool[0], hidden_tests=[])
    assert kind_questions(bare)["induction"] == 0 and kind_questions(bare)["deduction"] == len(pool[0].visible_tests)


def test_card_does_not_overwrite_a_foreign_readme(pool, tmp_path):
    (tmp_path / "README.md").write_text("my notes")
    summary = export_tasks(pool[:2], tmp_path / "tasks.jsonl")
    assert summary.card.name == "tasks.jsonl.README.md" and (tmp_path / "README.md").read_text() == "my notes"


def test_import_rejects_bad_rows_with_reasons(sb, pool, tmp_path):
    good, other = task_to_row(pool[3]), task_to_row(pool[4])
    wrong = dict(other, hidden_tests=json.dumps([dict(t, output="nope") for t in pool[4].hidden_tests]))
    banned = dict(task_to_row(pool[5]), reference_solution="import socket\n" + pool[5].reference_solution)
    unknown = dict(task_to_row(pool[6]), colour="red")
    lines = [
        json.dumps(good),
        json.dumps(wrong),
        "{not json",
        json.dumps(banned),
        json.dumps(unknown),
        json.dumps(good),
        json.dumps(task_to_row(pool[7])),
    ]
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with Corpus(tmp_path / "run") as c:
        summary = import_rows(path, c, sb, mark_import=True)
        assert summary.accepted == 2
        reasons = {row: reason.split(":")[0] for row, _, reason in summary.rejected}
        assert reasons == {2: "outputs_match", 3: "schema", 4: "safe", 5: "schema", 6: "novel"}
        assert {t.source for t in c.query()} == {"import"}


def test_bad_paths_are_clear(tmp_path):
    with pytest.raises(ExportError, match="unknown format '.csv'"):
        export_tasks([], tmp_path / "x.csv")
    with pytest.raises(ExportError, match="no such file"):
        list(read_rows(tmp_path / "missing.jsonl"))
    (tmp_path / "bad.parquet").write_text("not parquet")
    with pytest.raises(ExportError, match="not a readable Parquet file"):
        list(read_rows(tmp_path / "bad.parquet"))
