"""The edit-reach bench: random edits of a solver's training tasks, attempted by it (smoke config, real models and
sandbox), and the same references and edits attempted again by another run's solver (`--tasks-from`)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from selfplay.bench.edit_reach import paired
from tests.conftest import REPO, SMOKE, copy_run


def bench(run, *args):
    return subprocess.run(
        [sys.executable, "-m", "selfplay.bench.edit_reach", SMOKE[0], str(run), *args, *SMOKE[1:]],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )


def last_json(stdout: str) -> dict:
    return json.loads([line for line in stdout.splitlines() if line.startswith("{")][-1])


RATES = st.sampled_from([0.0, 0.25, 0.5, 1.0])


@given(st.lists(st.tuples(RATES, RATES), min_size=1, max_size=40))
def test_the_paired_shares_count_each_edit_once_under_each_solver(pairs):
    rows = [
        {"task": f"t{i}", "solve_rate": now, "reference": f"r{i % 3}", "reference_solve_rate": 1.0}
        for i, (now, _) in enumerate(pairs)
    ]
    earlier = [
        {"task": f"t{i}", "solve_rate": then, "reference": f"r{i % 3}", "reference_solve_rate": 0.5}
        for i, (_, then) in reversed(list(enumerate(pairs)))
    ]
    out = paired(rows, earlier)  # matched by task id, not by order
    now_in = sum(0 < now < 1 for now, _ in pairs) / len(pairs)
    then_in = sum(0 < then < 1 for _, then in pairs) / len(pairs)
    assert out["edits"] == len(pairs)
    assert out["in_band"] == round(now_in, 3) and out["earlier_in_band"] == round(then_in, 3)
    assert out["difference"] == round(now_in - then_in, 3)
    lo, hi = out["ci95"]
    assert -1.0 <= lo <= round(now_in - then_in, 3) + 1e-3 and round(now_in - then_in, 3) - 1e-3 <= hi <= 1.0
    assert out["solve_rate"] == round(sum(now for now, _ in pairs) / len(pairs), 3)
    assert out["earlier_solve_rate"] == round(sum(then for _, then in pairs) / len(pairs), 3)
    assert out["references"] == min(3, len(pairs))
    assert (out["reference_solve_rate"], out["earlier_reference_solve_rate"]) == (1.0, 0.5)


@pytest.mark.slow
def test_edits_drawn_once_are_attempted_again_from_their_file(warm_run, tmp_path):
    first = copy_run(warm_run, tmp_path / "a")
    proc = bench(first, "--refs", "3", "--max-level", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = last_json(proc.stdout)
    rows = [json.loads(line) for line in (first / "edit_reach.jsonl").read_text().splitlines()]
    assert summary["references"] == 3 and summary["valid"] == len(rows) > 0
    assert all(r["edit"]["id"] == r["task"] and r["reference_task"]["id"] == r["reference"] for r in rows)
    shares = summary["in_band"]["all"]
    assert shares["in_band"] + shares["never_solved"] + shares["always_solved"] == pytest.approx(1.0, abs=2e-3)

    again = copy_run(warm_run, tmp_path / "b")
    proc = bench(again, "--tasks-from", str(first / "edit_reach.jsonl"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    second = last_json(proc.stdout)
    rows2 = [json.loads(line) for line in (again / "edit_reach.jsonl").read_text().splitlines()]
    assert [(r["reference"], r["instruction"], r["task"]) for r in rows2] == [
        (r["reference"], r["instruction"], r["task"]) for r in rows
    ]  # the same edits, none drawn
    assert second["references"] == len({r["reference"] for r in rows}) and second["valid"] == len(rows)
    assert second["paired"]["edits"] == len(rows)
    assert second["paired"]["earlier_in_band"] == shares["in_band"]
    assert second["paired"]["in_band"] == second["in_band"]["all"]["in_band"]
    assert second["paired"]["references"] == second["references"]


def test_a_tasks_file_that_is_missing_or_lacks_its_tasks_is_refused(tmp_path):
    proc = bench(tmp_path / "run", "--tasks-from", str(tmp_path / "none.jsonl"))
    assert proc.returncode == 2 and "--tasks-from" in proc.stderr and "no such file" in proc.stderr
    old = tmp_path / "old.jsonl"
    old.write_text(json.dumps({"reference": "r", "instruction": "mutate", "task": "t", "solve_rate": 0.5}) + "\n")
    proc = bench(tmp_path / "run", "--tasks-from", str(old))
    assert proc.returncode == 2 and "without their tasks" in proc.stderr
