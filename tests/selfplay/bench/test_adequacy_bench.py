"""`selfplay bench adequacy` end to end on a few procedural tasks and a run folder's corpus (real process sandbox)."""

import dataclasses
import json

import pytest

from generator.adequacy import AdequacySettings
from generator.schema import Task
from generator.validity import validate_many
from selfplay.bench.adequacy import summarise, wilson
from selfplay.cli import main
from selfplay.data.corpus import Corpus
from selfplay.runtime.paths import RunPaths

REFERENCE = """def solve(xs, k):
    return sum(x * 2 for x in xs if x > k and x % 2 == 0)
"""
STRONG = [[[4, 6, 3], 3], [[2, 4, 5, 8], 4], [[10, 1], 10], [[0, 2, 4], -1], [[7, 9, 12, 6], 6], [[6], 5], [[8, 3], 8]]
WEAK = [[[], 0], [[1], 5], [[10], 0]]


def generator_task(hidden: list, k: int) -> Task:
    return Task(
        id="",
        family="generator",
        source="generator",
        split="train",
        level=2,
        description=f"{k} times the sum of the even values above k.",
        entry_point="solve",
        signature="def solve(xs: list[int], k: int) -> int",
        reference_solution=REFERENCE.replace("* 2", f"* {k}"),
        visible_tests=[{"input": [[3], 1]}],
        hidden_tests=[{"input": x} for x in hidden],
    )


@pytest.fixture
def run_dir(tmp_path, task_sb):
    """A run folder whose corpus holds one generator-made task with strong tests and one with weak tests."""
    reports = validate_many([generator_task(STRONG, 2), generator_task(WEAK, 3)], task_sb)
    assert all(r.ok for r in reports), [r.reason for r in reports]
    with Corpus(RunPaths(tmp_path / "run").corpus) as corpus:
        corpus.insert_many([r.task for r in reports])
    return tmp_path / "run"


def test_the_bench_reports_procedural_and_corpus_tasks(run_dir, tmp_path, capsys):
    out = tmp_path / "adequacy.json"
    argv = ["bench", "adequacy", "--n", "6", "--levels", "1", "3", "--mutants", "4", "--workers", "2"]
    assert main([*argv, "--run", str(run_dir), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "procedural tasks (levels 1, 3, k=4)" in printed and "kill share" in printed
    record = json.loads(out.read_text())
    proc, corpus = record["procedural"], record["corpus"]
    assert proc["tasks"] == 6 and len(record["procedural_tasks"]) == 6
    assert {r["level"] for r in record["procedural_tasks"]} == {1, 3}
    assert sum(proc["kill_share"]["histogram"].values()) == proc["tasks"] - proc["no_mutant"]
    assert sum(g["tasks"] for g in proc["by_family_level"].values()) == 6
    assert all(r["mutants"] <= 4 for r in record["procedural_tasks"])
    # the corpus: the strong task passes, the weak one fails with a surviving mutant
    assert corpus["tasks"] == 2 and corpus["passed"] == 1 and corpus["pass_share"] == 0.5
    by_passed = {r["passed"]: r for r in record["corpus_tasks"]}
    assert by_passed[True]["killed"] == by_passed[True]["mutants"] == 4
    assert by_passed[False]["survivor"] and " -> " in by_passed[False]["survivor"]
    assert AdequacySettings(4, 0.8).min_kill == record["min_kill"]


def test_corpora_given_as_files_and_folders_are_pooled_once(run_dir, tmp_path, task_sb, capsys):
    """A corpus file written here holds the weak task again (the same id), a procedural task and a new strong one:
    only generator-made tasks are measured, each once."""
    reports = validate_many([generator_task(WEAK, 3), generator_task(STRONG, 5)], task_sb)
    procedural = validate_many([dataclasses.replace(generator_task(STRONG, 7), source="procedural")], task_sb)
    assert all(r.ok for r in reports + procedural)
    with Corpus(tmp_path / "other.sqlite") as corpus:
        corpus.insert_many([r.task for r in reports + procedural])
    out = tmp_path / "pooled.json"
    argv = ["bench", "adequacy", "--n", "0", "--mutants", "4", "--workers", "2", "--json", str(out)]
    assert main([*argv, "--run", str(run_dir), str(tmp_path / "other.sqlite")]) == 0
    assert "generator-made tasks of 2 corpora: 2/3 pass" in capsys.readouterr().out
    corpus = json.loads(out.read_text())["corpus"]
    assert corpus["tasks"] == 3 and corpus["passed"] == 2 and corpus["runs"][1].endswith("other.sqlite")
    assert corpus["pass_share_wilson95"] == pytest.approx(list(wilson(2, 3)))
    assert main([*argv, "--run", str(tmp_path / "other.sqlite"), "--corpus-limit", "1"]) == 0
    assert json.loads(out.read_text())["corpus"]["tasks"] == 1


def test_wilson_interval():
    lo, hi = wilson(174, 200)  # the procedural figure of docs/generator.md
    assert (round(lo, 3), round(hi, 3)) == (0.816, 0.910)
    assert wilson(0, 0) is None and wilson(0, 5)[0] == 0.0 and wilson(5, 5)[1] == 1.0
    assert wilson(7, 9)[0] < 7 / 9 < wilson(7, 9)[1]


def test_summarise_counts_bins_and_operators():
    rows = [
        {"family": "f", "level": 1, "mutants": 4, "killed": 4, "passed": True, "operators": {"constant": [4, 4]}},
        {"family": "f", "level": 1, "mutants": 4, "killed": 1, "passed": False, "operators": {"constant": [4, 1]}},
        {"family": "g", "level": 2, "mutants": 0, "killed": 0, "passed": True, "operators": {}},
    ]
    s = summarise(rows)
    assert (s["tasks"], s["passed"], s["no_mutant"], s["mutants"]) == (3, 2, 1, 8)
    assert s["kill_share"]["histogram"] == {"[0.0, 0.5)": 1, "[0.5, 0.8)": 0, "[0.8, 1.0)": 0, "1.0": 1}
    assert s["kill_share"]["mean"] == pytest.approx(0.625)
    assert s["pass_share_wilson95"] == wilson(2, 3)
    assert s["by_family_level"]["f/L1"] == {"tasks": 2, "passed": 1, "pass_share": 0.5, "mean_kill_share": 0.625}
    assert s["by_family_level"]["g/L2"]["mean_kill_share"] is None
    assert s["operators"] == {"constant": {"made": 8, "killed": 5, "kill_share": 0.625}}


@pytest.mark.parametrize(
    ("args", "named"),
    [(["--mutants", "-1"], "--mutants"), (["--min-kill", "2"], "--min-kill"), (["--timeout", "0"], "--timeout")],
)
def test_bad_arguments_are_refused_in_one_line(args, named, capsys):
    assert main(["bench", "adequacy", "--n", "0", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert named in err and "\n" not in err


def test_a_folder_without_a_corpus_is_refused(tmp_path, capsys):
    assert main(["bench", "adequacy", "--n", "0", "--run", str(tmp_path / "nothing")]) == 2
    assert "--run" in capsys.readouterr().err
