"""A comparison's primary figure is declared before its runs (OUT/plan.json) and reported only as declared, with
its interval corrected for the number of arms; the committed records re-derived with the design's interval."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from selfplay.cli import main
from selfplay.eval import compare, stats
from selfplay.runtime.checkpoint import code_version

DATA = Path(__file__).resolve().parents[3] / "docs" / "data"


def _record(name: str) -> dict:
    return json.loads(gzip.decompress((DATA / f"{name}.json.gz").read_bytes()))


def test_plan_is_written_once_and_held_to(tmp_path):
    arms = ["warmstart", "curriculum", "selfplay"]
    plan = compare.declare_plan(tmp_path, "pass@1", "val", None, arms)
    assert plan == {"metric": "pass@1", "split": "val", "baseline": "warmstart", "family": ["curriculum", "selfplay"]}
    assert json.loads((tmp_path / compare.PLAN_FILE).read_text()) == plan
    assert compare.declare_plan(tmp_path, None, "val", None, arms) == plan  # nothing said: the declared plan stands
    assert compare.declare_plan(tmp_path, "pass@1", "val", "warmstart", arms) == plan
    with pytest.raises(ValueError, match="declared metric 'pass@1'"):
        compare.declare_plan(tmp_path, "pass@1_greedy", "val", None, arms)
    with pytest.raises(ValueError, match="declared split 'val'"):
        compare.declare_plan(tmp_path, "pass@1", "test", None, arms)
    with pytest.raises(ValueError, match="--primary must be one of"):
        compare.declare_plan(tmp_path / "new", "pass@9", "val", None, arms)
    with pytest.raises(ValueError, match="--baseline uniform"):
        compare.declare_plan(tmp_path / "new", "pass@1", "val", "uniform", arms)
    assert compare.declare_plan(tmp_path / "none", None, "val", None, arms) is None


def test_report_only_refuses_a_primary_not_declared_before_the_runs(tmp_path, capsys):
    code = main(["compare", "--report-only", "--primary", "pass@1", "--out", str(tmp_path / "cmp"), "--seeds", "0"])
    assert code != 0
    assert "declared no primary metric before its runs" in capsys.readouterr().err


def test_primary_figures_on_a_committed_record_are_corrected_for_the_family(tmp_path):
    # Two RL arms against the shared warm start: k = 2, each interval at 97.5 %, wider than the uncorrected one.
    results = compare.merge([_record("compare_tiny400_rloo")], n_boot=2000)
    plan = {"metric": "pass@1", "split": "test", "baseline": "warmstart", "family": ["curriculum", "curriculum_rloo"]}
    primary = compare.primary_figures(results, plan, n_boot=2000)
    assert primary["k"] == 2 and set(primary["rows"]) == {"curriculum - warmstart", "curriculum_rloo - warmstart"}
    for arm in plan["family"]:
        row = primary["rows"][f"{arm} - warmstart"]
        plain = compare.paired_arms(
            {"warmstart": results["runs"]["warmstart"], arm: results["runs"][arm]}, n_boot=2000
        )[f"{arm} - warmstart"]["pass@1"]
        assert row["delta"] == pytest.approx(plain["delta"]) and row["design"] == "crossed"
        assert row["ci95"][0] < plain["ci95"][0] and plain["ci95"][1] < row["ci95"][1]
    results["plan"] = plan
    compare.write_report(results, tmp_path)
    report = (tmp_path / "results.md").read_text()
    assert report.startswith("Primary (declared before the runs): pass@1 on the test split")
    assert "97.50 % each" in report
    with pytest.raises(ValueError, match="declared the val split"):
        compare.primary_figures(results, {**plan, "split": "val"})


def test_a_report_without_a_plan_says_its_figures_are_exploratory(tmp_path):
    results = compare.merge([_record("compare_tiny400_rloo")], n_boot=200)
    compare.write_report(results, tmp_path)
    assert "every interval below is exploratory" in (tmp_path / "results.md").read_text()
    assert "primary" not in json.loads((tmp_path / "results.json").read_text())


def test_shared_warm_start_records_are_crossed_and_lose_the_significance_they_had():
    # The self-play arm's sampled pass@1 against its shared warm start: the nested interval of the record excluded
    # zero, the crossed one does not (the task effect common to all seeds is resampled once, not four times).
    record = _record("compare_tiny_default")
    runs = {arm: record["runs"][arm] for arm in ("warmstart", "selfplay")}
    pairs = {s: (runs["warmstart"][s]["test_per_task"], run["test_per_task"]) for s, run in runs["selfplay"].items()}
    recorded = record["paired_arms"]["selfplay - warmstart"]["pass@1"]["ci95"]
    assert stats.significant(recorded)
    crossed = compare.seed_task_delta(pairs, "pass@1")
    nested = stats.paired_interval(pairs, lambda row: compare.outcome_value(row, "pass@1"), design="nested")
    assert crossed["design"] == "crossed" and crossed["seeds"] == 4 and crossed["tasks"] == 1600
    assert stats.significant(nested["ci"]) and not stats.significant(crossed["ci95"])
    assert crossed["ci95"][1] - crossed["ci95"][0] > 1.3 * (nested["ci"][1] - nested["ci"][0])


def test_a_comparison_runs_one_code_or_records_where_it_did_not(tmp_path):
    """OUT/code.json: written by the first start; a later start under another commit, or under other uncommitted
    changes, is refused naming both and how to run the first code, unless it is allowed (then recorded)."""
    first = {"version": "0.1", "commit": "a" * 40, "dirty": False}
    assert compare.hold_code(tmp_path, first) == [first]
    assert compare.hold_code(tmp_path, dict(first)) == [first]  # the same code: nothing added
    other = {"version": "0.1", "commit": "b" * 40, "dirty": True, "diff": "0123456789abcdef"}
    with pytest.raises(
        ValueError,
        match=r"ran under aaaaaaaaaaaa \(.*this start runs bbbbbbbbbbbb with uncommitted "
        r"changes 0123456789abcdef: .*git worktree add DIR aaaaaaaaaaaa",
    ):
        compare.hold_code(tmp_path, other)
    assert json.loads((tmp_path / compare.CODE_FILE).read_text()) == [first]  # a refusal writes nothing
    assert compare.hold_code(tmp_path, other, allow_change=True) == [first, other]
    edited = {**other, "diff": "fedcba9876543210"}  # the same commit, other uncommitted edits
    with pytest.raises(ValueError, match="uncommitted changes fedcba9876543210"):
        compare.hold_code(tmp_path, edited)


def test_this_checkouts_code_carries_a_digest_of_its_uncommitted_changes_only_when_it_has_some():
    code = code_version(diff=True)
    assert code["commit"] is None or len(code["commit"]) == 40
    assert ("diff" in code) == bool(code["dirty"])


def test_compare_refuses_to_go_on_under_other_code_before_any_run(tmp_path, capsys):
    out = tmp_path / "cmp"
    out.mkdir()
    (out / compare.CODE_FILE).write_text(json.dumps([{"version": "0", "commit": "c" * 40, "dirty": False}]))
    code = main(["compare", "configs/smoke.yaml", "--seeds", "0", "--arms", "warmstart", "--out", str(out)])
    assert code != 0 and "ran under cccccccccccc" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == [compare.CODE_FILE]  # no run started


def test_the_pretrained_fixed_set_record_gives_the_figure_docs_results_states():
    """docs/results.md, "RL on a fixed task set raises a pretrained model": its record re-derives the primary figure
    (greedy pass@1 on the validation split, fixed - warm start, 3 seeds sharing their tasks: crossed) and the
    interval lies above 0, the rule written before the runs."""
    results = compare.merge([_record("smol_fixed")], n_boot=4000)
    plan = {"metric": "pass@1_greedy", "split": "val", "baseline": "warmstart", "family": ["fixed"]}
    row = compare.primary_figures(results, plan)["rows"]["fixed - warmstart"]
    assert (row["design"], row["seeds"], row["tasks"]) == ("crossed", 3, 600)
    assert round(row["delta"], 3) == 0.062 and [round(x, 3) for x in row["ci95"]] == [0.025, 0.1]
    assert row["ci95"][0] > 0


def test_the_ppo_fixed_set_records_give_the_figures_docs_results_states():
    """docs/results.md, "PPO on a fixed task set" (tiny world): ptx8's record re-derives its primary figure (sampled
    pass@1 on the 800 test tasks, fixed - warm start, 4 seeds sharing their tasks: crossed), and with the no-reward
    control's record, the reward's own share (ptx8's fixed - ptx8_null's, each seed with its control, crossed)."""
    ptx8, null = _record("ptx8"), _record("ptx8_null")
    results = compare.merge([ptx8], n_boot=4000)
    plan = {"metric": "pass@1", "split": "test", "baseline": "warmstart", "family": ["fixed"]}
    row = compare.primary_figures(results, plan)["rows"]["fixed - warmstart"]
    assert (row["design"], row["seeds"], row["tasks"]) == ("crossed", 4, 3200)
    assert round(row["delta"], 3) == 0.011 and [round(x, 3) for x in row["ci95"]] == [0.004, 0.019]
    seeds = sorted(ptx8["runs"]["fixed"])
    assert seeds == sorted(null["runs"]["fixed"]) == ["0", "1", "2", "3"]
    pairs = {s: (null["runs"]["fixed"][s]["test_per_task"], ptx8["runs"]["fixed"][s]["test_per_task"]) for s in seeds}
    share = compare.seed_task_delta(pairs, "pass@1")
    assert share["design"] == "crossed"
    assert round(share["delta"], 3) == 0.005 and [round(x, 3) for x in share["ci95"]] == [-0.001, 0.011]
