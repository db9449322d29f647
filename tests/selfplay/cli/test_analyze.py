"""`selfplay analyze paired` on a small hand-made fixture: a warm start and two seeds' runs whose per-task held-out
outcomes are known, so each printed change can be checked by hand."""

from __future__ import annotations

import json

import pytest

import sandbox
from generator.build import generate_tasks
from selfplay.cli import main
from selfplay.eval import stats
from selfplay.eval.evaluate import write_tasks


def _state(folder, step, seed, evals):
    path = folder / "checkpoints" / f"step_{step}"
    path.mkdir(parents=True)
    state = {"config": {"run": {"seed": seed}}, "evals": {str(k): v for k, v in evals.items() if k}}
    if 0 in evals:
        state["eval_before"] = evals[0]
    (path / "state.json").write_text(json.dumps(state))


def _outcomes(ids, greedy, solved_of_4):
    """per_task rows [greedy solved, n, c] of the test split."""
    return {"per_task": {"test": {i: [g, 4, c] for i, g, c in zip(ids, greedy, solved_of_4)}}}


@pytest.fixture(scope="module")
def fixture(tmp_path_factory):
    root = tmp_path_factory.mktemp("paired")
    with sandbox.open_sandbox(backend="process", timeout_s=5.0) as sb:
        tasks = [t for level in (1, 2, 3) for t in generate_tasks(2, level=level, split="train", seed=level, sb=sb)]
    ids = [t.id for t in tasks]  # levels 1, 1, 2, 2, 3, 3
    ws = root / "warmstart"
    write_tasks(ws / "heldout.jsonl", tasks)
    _state(ws, 0, 0, {0: _outcomes(ids, [0, 0, 0, 1, 0, 0], [0, 1, 0, 2, 0, 0])})
    (root / "ws_seed1.json").write_text(
        json.dumps({"options": {"seed": 1}, "heldout": _outcomes(ids, [0] * 6, [0, 0, 0, 1, 0, 0])})
    )
    runs = []
    for seed, greedy in ((0, [1, 0, 0, 1, 0, 1]), (1, [1, 1, 0, 0, 0, 0])):
        run = root / f"seed_{seed}" / "fixed"
        _state(run, 4, seed, {4: _outcomes(ids, greedy, [4, 1, 0, 2, 0, 1])})
        runs.append(run)
    return ws, runs, ids


def test_paired_changes_per_seed_and_pooled(fixture, tmp_path, capsys):
    ws, runs, _ = fixture
    out = tmp_path / "changes.json"
    assert main(["analyze", "paired", str(ws), *map(str, runs), "--step", "4", "--json", str(out)]) == 0
    rows = {(r["run"], r["subset"], r["metric"]): r for r in json.loads(out.read_text())}
    # seed 0 against the warm start's own evaluation: greedy 1/6 -> 3/6 on all tasks
    assert rows["seed 0", "all", "greedy"]["change"] == pytest.approx(2 / 6)
    # seed 1 against ws_seed1.json: greedy 0 -> 2/6; levels 1-2: 0 -> 2/4; sampled (c/n) 1/24 -> 8/24 on all
    assert rows["seed 1", "all", "greedy"]["change"] == pytest.approx(2 / 6)
    assert rows["seed 1", "levels 1-2", "greedy"]["change"] == pytest.approx(2 / 4)
    assert rows["seed 1", "all", "sampled"]["change"] == pytest.approx((8 - 1) / 24)
    assert rows["seed 1", "level 3", "any"]["change"] == pytest.approx(1 / 2)
    pooled = rows["pooled (2)", "all", "greedy"]
    assert pooled["change"] == pytest.approx(2 / 6) and pooled["ci_low"] <= pooled["change"] <= pooled["ci_high"]
    # the pooled interval resamples runs and tasks together (the runs share the warm start's tasks): by hand, the
    # greedy changes per task are seed 0 (1,0,0,0,0,1) and seed 1 (1,1,0,0,0,0)
    changes = {0: [1, 0, 0, 0, 0, 1], 1: [1, 1, 0, 0, 0, 0]}
    crossed = stats.paired_interval(
        {s: (dict.fromkeys(range(6), 0.0), dict(enumerate(map(float, c)))) for s, c in changes.items()}, float
    )
    assert crossed["design"] == "crossed" and [pooled["ci_low"], pooled["ci_high"]] == pytest.approx(crossed["ci"])
    printed = capsys.readouterr().out
    assert "pooled over 2 runs" in printed and printed.count("seed 1 @4") == 3
    assert "bootstrap over seeds and tasks together" in printed


def test_a_missing_evaluation_is_one_line_naming_the_command(fixture, tmp_path, capsys):
    ws, runs, _ = fixture
    lone = tmp_path / "seed_2" / "fixed"
    _state(lone, 4, 2, {4: {"per_task": {"test": {}}}})
    assert main(["analyze", "paired", str(ws), str(lone), "--step", "4"]) == 2
    err = capsys.readouterr().err
    assert "ws_seed2.json is missing: selfplay eval" in err and "--seed 2" in err
    assert main(["analyze", "paired", str(ws), str(runs[0]), "--step", "3"]) == 2
    assert "--step 3" in capsys.readouterr().err
