"""`selfplay tasks generate|sample`, `selfplay export`, `selfplay import` as a user runs them (subprocesses)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def selfplay(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "selfplay", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd or ROOT,
        timeout=300,
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["tasks", "generate", "--n", "0", "--out", "{tmp}/r"], "--n: 0 must be > 0"),
        (["tasks", "generate", "--n", "5"], "required: --out"),
        (["tasks", "generate", "--n", "5", "--out", "{tmp}/r", "--level", "9"], "level '9' must be 1, 2, 3 or 4"),
        (["tasks", "generate", "--n", "5", "--out", "{tmp}/r", "--split", "test"], "invalid choice: 'test'"),
        (["tasks", "generate", "--n", "5", "--out", "{tmp}/r", "tasks.bogus=1"], "unknown config key 'tasks.bogus'"),
        (["tasks", "generate", "--n", "5", "--out", "{tmp}/r", "tasks.heldout_types=[complex]"], "held-out type"),
        (
            ["tasks", "generate", "--n", "5", "--out", "{tmp}/r", "tasks.literals=huge"],
            "tasks.literals must be one of narrow, wide, got 'huge'",
        ),
        (["warmstart", "tasks.literals=huge", "run.dir={tmp}/r"], "tasks.literals must be one of narrow, wide"),
        (["tasks", "sample", "{tmp}/nothing"], "no such run folder"),
        (["tasks", "sample", "{tmp}"], "holds no corpus.sqlite"),
        (["export", "{tmp}", "--out", "{tmp}/a.csv"], "unknown format '.csv'"),
        (["export", "{tmp}", "--out", "{tmp}/a.jsonl", "--max-difficulty", "2"], "2.0 is not in [0, 1]"),
        (["import", "{tmp}/none.jsonl", "--out", "{tmp}/r"], "no such file"),
        (["export", "{tmp}", "--out", "{tmp}/a.jsonl", "--bogus"], "unrecognized arguments: --bogus"),
        (["tasks", "shuffle"], "invalid choice: 'shuffle'"),
    ],
)
def test_bad_arguments_get_one_line_errors(tmp_path, args, message):
    result = selfplay(*[a.format(tmp=tmp_path) for a in args])
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("selfplay") and message in lines[0]
    assert not (tmp_path / "r").exists()  # nothing created on bad input


def test_generate_sample_export_import(tmp_path):
    run = tmp_path / "run"
    gen = selfplay("tasks", "generate", "--n", "12", "--level", "2", "--seed", "4", "--out", run, "sandbox.workers=2")
    assert gen.returncode == 0, gen.stderr
    assert "added 12 tasks" in gen.stdout and "valid tasks/s" in gen.stdout
    assert "12/12" in gen.stderr  # the progress bar
    again = selfplay("tasks", "generate", "--n", "4", "--split", "heldout_types", "--seed", "4", "--out", run)
    assert again.returncode == 0 and "corpus now holds 16" in again.stdout

    sample = selfplay("tasks", "sample", run, "--n", "2", "--split", "heldout_types", "--hidden")
    assert sample.returncode == 0, sample.stderr
    assert sample.stdout.count("=== t") == 2 and "split=heldout_types" in sample.stdout
    assert "def solve(" in sample.stdout and "(hidden) solve(" in sample.stdout
    assert "2 of 4 matching tasks" in sample.stdout

    out = tmp_path / "export" / "tasks.jsonl"
    exp = selfplay("export", run, "--out", out, "--level", "2")
    assert exp.returncode == 0, exp.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sum(r["split"] == "train" for r in rows) == 12 and all(r["level"] == 2 for r in rows)
    assert (out.parent / "README.md").exists()

    imp = selfplay("import", out, "--out", tmp_path / "copy", "--mark-import")
    assert imp.returncode == 0, imp.stderr
    assert f"imported {len(rows)} tasks; rejected 0" in imp.stdout
    twice = selfplay("import", out, "--out", tmp_path / "copy")
    assert f"rejected {len(rows)}" in twice.stdout and "novel" in twice.stdout
    check = selfplay("tasks", "sample", tmp_path / "copy", "--source", "import", "--n", "1")
    assert check.returncode == 0 and "source=import" in check.stdout


def test_bench_tasks_reports_rate_and_rejections(tmp_path, capsys):
    import argparse

    from selfplay.bench.tasks_bench import configure_tasks, run_bench_tasks

    parser = argparse.ArgumentParser()
    configure_tasks(parser)
    out = tmp_path / "bench.json"
    assert run_bench_tasks(parser.parse_args(["--n", "20", "--repeats", "1", "--json", str(out)])) == 0
    text = capsys.readouterr().out
    assert "valid tasks/s (median of 1" in text and "rejection reasons" in text
    figures = json.loads(out.read_text())
    assert figures["median_valid_tasks_per_s"] > 0 and 0 < figures["acceptance"][0] <= 1
