"""`selfplay compare`: the aggregation (pure, property-tested) and one real run of two arms from a warm start."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from selfplay.eval.compare import (
    Job,
    analyse,
    code_line,
    copy_warm_start,
    first_label,
    later_figures,
    later_table,
    markdown_table,
    mean_sd,
    merge,
    paired_arms,
    paired_arms_table,
    paired_delta,
    paired_table,
    run_jobs,
    seed_task_delta,
    summarize,
    variant,
    warm_start_overrides,
    warm_starts,
    window_figures,
    window_table,
)
from tests.conftest import SMOKE, selfplay

rate = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


@given(st.lists(rate, min_size=1, max_size=6))
def test_mean_sd_matches_statistics(values):
    mean, sd = mean_sd(values)
    assert min(values) - 1e-12 <= mean <= max(values) + 1e-12
    assert sd == (statistics.stdev(values) if len(values) > 1 else 0.0)


@settings(max_examples=50)
@given(
    st.dictionaries(
        st.sampled_from(["warmstart", "curriculum", "selfplay"]),
        st.lists(
            st.dictionaries(st.sampled_from(["test", "deeper", "noisy"]), rate, min_size=1), min_size=1, max_size=4
        ),
        min_size=1,
    )
)
def test_summary_keeps_every_seed_value(arms):
    runs = {
        arm: {
            str(i): {"heldout": {s: {"pass@1_greedy": v} for s, v in per_split.items()}, "history": []}
            for i, per_split in enumerate(seeds)
        }
        for arm, seeds in arms.items()
    }
    summary = summarize(runs)
    for arm, seeds in arms.items():
        for split in {s for per_split in seeds for s in per_split}:
            cell = summary[arm][split]["pass@1_greedy"]
            assert sorted(cell["values"]) == sorted(p[split] for p in seeds if split in p)
            assert abs(cell["mean"] - statistics.mean(cell["values"])) < 1e-12
    table = markdown_table({"seeds": [0], "arms": list(arms), "summary": summary})
    assert len(table.splitlines()) == 2 + len(arms)


def test_paired_delta_by_hand():
    before = {"a": [1, 4, 1], "b": [0, 4, 0], "only_before": [1, 4, 4]}
    after = {"a": [1, 4, 3], "b": [1, 4, 2], "only_after": [0, 4, 0]}
    sampled = paired_delta(before, after, "pass@1")
    assert sampled["tasks"] == 2  # tasks in one evaluation only are left out
    assert (sampled["before"], sampled["after"], sampled["delta"]) == (0.125, 0.625, 0.5)
    assert sampled["ci95"] == [0.5, 0.5]  # both tasks moved by +0.5: every resample says so
    greedy = paired_delta(before, after, "pass@1_greedy")
    assert (greedy["before"], greedy["after"], greedy["delta"]) == (0.5, 1.0, 0.5)
    assert 0.0 <= greedy["ci95"][0] <= greedy["ci95"][1] <= 1.0
    with pytest.raises(ValueError, match="share no task"):
        paired_delta({"a": [1, 1, 1]}, {"b": [1, 1, 1]})
    with pytest.raises(ValueError, match="metric"):
        paired_delta(before, after, "pass@4")


outcome = st.tuples(st.integers(0, 1), st.integers(1, 8), st.integers(0, 8)).map(
    lambda t: [t[0], t[1], min(t[1], t[2])]
)  # [greedy solved, n, c <= n]


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(st.text("abcdef", min_size=1, max_size=3), st.tuples(outcome, outcome), min_size=1, max_size=30),
    st.sampled_from(["pass@1", "pass@1_greedy"]),
)
def test_paired_delta_properties(rows, metric):
    before = {k: b for k, (b, _) in rows.items()}
    after = {k: a for k, (_, a) in rows.items()}
    d = paired_delta(before, after, metric, n_boot=300)
    assert abs(d["delta"] - (d["after"] - d["before"])) < 1e-9
    value = (lambda r: r[0]) if metric == "pass@1_greedy" else (lambda r: r[2] / r[1])
    diffs = [value(after[k]) - value(before[k]) for k in rows]
    lo, hi = d["ci95"]
    assert min(diffs) - 1e-9 <= lo <= hi <= max(diffs) + 1e-9
    same = paired_delta(before, before, metric, n_boot=50)
    assert same["delta"] == 0.0 and same["ci95"] == [0.0, 0.0]


def test_seed_task_delta_by_hand():
    pairs = {
        "0": ({"a": [0, 4, 0], "b": [1, 4, 4]}, {"a": [1, 4, 2], "b": [1, 4, 4], "c": [1, 4, 4]}),
        "1": ({"a": [0, 4, 1]}, {"a": [0, 4, 3]}),
    }
    d = seed_task_delta(pairs, "pass@1")
    # seed 0: a +0.5, b 0 (c: only one arm ran it); seed 1: a +0.5; three (seed, task) pairs weighted alike
    assert (d["seeds"], d["tasks"]) == (2, 3)
    assert d["delta"] == pytest.approx(1 / 3) and d["before"] == pytest.approx((0 + 1 + 0.25) / 3)
    assert 0.0 <= d["ci95"][0] <= d["delta"] <= d["ci95"][1] <= 0.5
    # one seed: the figures of paired_delta, and its interval up to the bootstrap's own noise
    rows = {f"t{i}": ([i % 2, 4, i % 3], [i % 3 > 0, 4, i % 5 % 4]) for i in range(40)}
    one = seed_task_delta({"0": ({k: a for k, (a, _) in rows.items()}, {k: b for k, (_, b) in rows.items()})})
    alone = paired_delta({k: a for k, (a, _) in rows.items()}, {k: b for k, (_, b) in rows.items()})
    assert {k: one[k] for k in alone if k != "ci95"} == {k: v for k, v in alone.items() if k != "ci95"}
    assert one["seeds"] == 1 and one["ci95"] == pytest.approx(alone["ci95"], abs=0.03)
    with pytest.raises(ValueError, match="share no task"):
        seed_task_delta({"0": ({"a": [1, 1, 1]}, {"b": [1, 1, 1]})})
    with pytest.raises(ValueError, match="metric"):
        seed_task_delta(pairs, "pass@4")


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.dictionaries(st.text("abcd", min_size=1, max_size=2), st.tuples(outcome, outcome), min_size=1, max_size=12),
        min_size=1,
        max_size=4,
    ),
    st.sampled_from(["pass@1", "pass@1_greedy"]),
)
def test_seed_task_delta_properties(seeds, metric):
    pairs = {
        str(i): ({k: a for k, (a, _) in rows.items()}, {k: b for k, (_, b) in rows.items()})
        for i, rows in enumerate(seeds)
    }
    d = seed_task_delta(pairs, metric, n_boot=200)
    value = (lambda r: r[0]) if metric == "pass@1_greedy" else (lambda r: r[2] / r[1])
    diffs = [value(b) - value(a) for rows in seeds for a, b in rows.values()]
    assert d["tasks"] == len(diffs) and d["delta"] == pytest.approx(sum(diffs) / len(diffs))
    assert min(diffs) - 1e-9 <= d["ci95"][0] <= d["ci95"][1] <= max(diffs) + 1e-9
    swapped = seed_task_delta({s: (b, a) for s, (a, b) in pairs.items()}, metric, n_boot=200)
    assert swapped["delta"] == pytest.approx(-d["delta"])
    same = seed_task_delta({s: (a, a) for s, (a, _) in pairs.items()}, metric, n_boot=50)
    assert same["delta"] == 0.0 and same["ci95"] == [0.0, 0.0]


def test_paired_arms_names_later_minus_earlier_and_skips_arms_without_outcomes():
    def run(*rows):
        return {"test_per_task": {f"t{i}": r for i, r in enumerate(rows)}}

    runs = {
        "warmstart": {"0": run([0, 4, 0], [1, 4, 4])},
        "curriculum": {"0": run([1, 4, 4], [1, 4, 4])},
        "selfplay": {"0": {"test_per_task": {}}},
    }
    out = paired_arms(runs, n_boot=100)
    assert list(out) == ["curriculum - warmstart"]
    assert out["curriculum - warmstart"]["pass@1_greedy"]["delta"] == pytest.approx(0.5)


def test_later_figures_by_hand():
    def entry(step, alarm=0.0, **kw):
        return {
            "step": step,
            "parse_rate": 1.0,
            "validity": 0.5,
            "generator_in_band": None,
            "solver_in_band": step / 100,
            "generator_reward": float(step),
            "alarm_solver_collapse": alarm,
            "alarm_generator_validity": 1.0,
            **kw,
        }

    # a collapse alarm at 3-5 (before the window) and 12-14 (inside it); a trust alarm throughout (not counted)
    history = [entry(s, alarm=1.0 if s in (3, 4, 5, 12, 13, 14) else 0.0) for s in range(1, 31)]
    history[20]["alarm_kl_blowup"] = 1.0  # step 21, on its own
    f = later_figures(history, start=10)
    assert f["iterations"] == 21 and f["longest_collapse_alarm"] == 3
    assert f["parse_rate"] == 1.0 and f["validity"] == 0.5 and f["generator_in_band"] is None and f["level"] is None
    assert f["solver_in_band"] == pytest.approx(sum(range(10, 31)) / 21 / 100)
    assert (f["reward_first"], f["reward_last"]) == (5.5, 25.5)  # steps 1-10 and 21-30
    assert later_figures(history, start=31)["iterations"] == 0
    assert later_figures([entry(s, generator_reward=None) for s in (1, 2)])["reward_first"] is None


def test_the_later_table_shows_where_the_valid_proposals_out_of_band_fall():
    """Never solved / always solved beside the in-band share; a record written before these figures shows "-"."""
    history = [
        {
            "step": s,
            "validity": 0.9,
            "generator_in_band": 0.25,
            "generator_never_solved": 0.6,
            "generator_always_solved": 0.15,
            "generator_reward": 0.0,
        }
        for s in range(1, 21)
    ]
    old = later_figures(history)
    del old["generator_never_solved"], old["generator_always_solved"]
    results = {
        "arms": ["selfplay"],
        "runs": {"selfplay": {"0": {"from_iteration": later_figures(history)}, "1": {"from_iteration": old}}},
    }
    table = later_table(results)
    assert "| selfplay | 0 | 11 | - | 0.900 | 0.250 | 0.600 / 0.150 |" in table
    assert "| selfplay | 1 | 11 | - | 0.900 | 0.250 | - / - |" in table


def test_window_figures_cut_a_long_run_into_its_windows():
    history = [
        {"step": s, "validity": s / 100, "generator_in_band": None if s > 20 else 0.5, "generator_reward": float(s)}
        for s in range(1, 26)
    ]
    windows = window_figures(history, 10)
    assert [(w["first"], w["last"]) for w in windows] == [(1, 10), (11, 20), (21, 25)]
    assert [w["generator_reward"] for w in windows] == [5.5, 15.5, 23.0]
    assert windows[2]["generator_in_band"] is None and windows[0]["generator_in_band"] == 0.5
    assert windows[0]["level"] is None  # a figure no iteration had
    # the first and the last window of a run ten iterations long per window are the closing summary's
    f = later_figures(history[:20])
    assert (f["reward_first"], f["reward_last"]) == (windows[0]["generator_reward"], windows[1]["generator_reward"])


def test_the_report_shows_windows_only_for_runs_longer_than_two_of_them():
    def results(steps):
        run = {"history": [{"step": s, "validity": 0.5, "generator_reward": -s} for s in range(1, steps + 1)]}
        return {"arms": ["warmstart", "selfplay"], "runs": {"warmstart": {"0": {}}, "selfplay": {"0": run}}}

    assert window_table(results(20)) == ""
    table = window_table(results(30))
    assert "| selfplay | 0 | 21-30 | 0.500 |" in table and table.count("| selfplay |") == 3
    assert "-25.500" in table


def _records(seeds, draw, tasks=12, warm_id="w0"):
    """{arm: {seed: record}} shaped as `gather` makes them: a shared warm start and two RL arms paired with it."""
    import random

    def outcomes(rng):
        return {f"t{i}": [rng.randint(0, 1), 4, rng.randint(0, 4)] for i in range(tasks)}

    levels = {f"t{i}": 1 + i % 2 for i in range(tasks)}
    warm = outcomes(random.Random(draw))
    runs: dict = {"warmstart": {}, "curriculum": {}, "selfplay": {}}
    for seed in seeds:
        rng = random.Random(draw * 1000 + seed)
        for arm in runs:
            per_task = warm if arm == "warmstart" else outcomes(rng)
            rec = {
                "heldout": {
                    "test": {
                        "pass@1_greedy": statistics.fmean(r[0] for r in per_task.values()),
                        "pass@1": statistics.fmean(r[2] / r[1] for r in per_task.values()),
                    }
                },
                "history": []
                if arm == "warmstart"
                else [
                    {"step": s, "validity": rng.random(), "solver_in_band": rng.random(), "generator_reward": -s}
                    for s in range(1, 13)
                ],
                "seconds": 1.0,
                "test_by_level": {},
                "test_per_task": per_task,
                "test_curve": {},
                "per_iteration": {},
            }
            if arm == "warmstart":
                rec["warm_start"] = warm_id
            else:
                rec["paired_with"] = {"test_per_task": warm, "levels": levels, "warm_start": warm_id}
            runs[arm][str(seed)] = rec
    return runs


def _json(obj):
    return json.loads(json.dumps(obj, sort_keys=True))


@settings(max_examples=15, deadline=None)
@given(
    st.sets(st.integers(0, 9), min_size=2, max_size=5).flatmap(
        lambda seeds: st.tuples(st.just(sorted(seeds)), st.integers(1, len(seeds) - 1), st.integers(0, 10**6))
    )
)
def test_merging_seeds_run_apart_gives_the_report_of_all_of_them_together(case):
    seeds, cut, draw = case
    together = analyse(_records(seeds, draw), from_iteration=5, n_boot=50)
    parts = [_json(analyse(_records(part, draw), from_iteration=5, n_boot=50)) for part in (seeds[:cut], seeds[cut:])]
    merged = merge(parts, from_iteration=5, n_boot=50)
    assert _json(merged) == _json(together)
    assert merged["seeds"] == seeds and merged["arms"] == ["warmstart", "curriculum", "selfplay"]
    assert merged["paired_arms"]["selfplay - curriculum"]["pass@1"]["seeds"] == len(seeds)
    # the same run pooled twice is one run; a different run under the same arm and seed is refused
    assert _json(merge(parts + parts[:1], from_iteration=5, n_boot=50)) == _json(together)
    clash = _json(analyse(_records(seeds[:1], draw + 1), n_boot=50))
    with pytest.raises(ValueError, match=f"arm warmstart, seed {seeds[0]} is in results 1 and results 3"):
        merge(parts + [clash], n_boot=50)


def test_merge_names_what_it_cannot_pool():
    good = _json(analyse(_records([0], 1), n_boot=50))
    old = _json(good)
    del old["runs"]["selfplay"]["0"]["paired_with"]
    with pytest.raises(ValueError, match="old.json: arm selfplay, seed 0 does not say which warm start"):
        merge([good, old], names=["good.json", "old.json"])
    with pytest.raises(ValueError, match="x.json holds no run records"):
        merge([good, {"seeds": []}], names=["good.json", "x.json"])


def test_warm_starts_say_which_seeds_share_one():
    runs = _records([0, 1], 3)
    assert warm_starts(runs) == {"warmstart": {"w0": [0, 1]}}
    other = _records([2], 3, warm_id="w1")
    pooled = merge([_json(analyse(runs, n_boot=50)), _json(analyse(other, n_boot=50))], n_boot=50)
    assert pooled["warm_starts"] == {"warmstart": {"w0": [0, 1], "w1": [2]}}


def test_the_code_line_names_each_version_and_the_runs_that_ran_under_it():
    runs = _records([0, 1], 3)
    a = {"version": "0.1.0", "commit": "a" * 40, "dirty": False}
    b = {"version": "0.1.0", "commit": "b" * 40, "dirty": True}
    assert code_line({"runs": runs}) == ""  # records made before runs recorded their code
    for by_seed in runs.values():
        for run in by_seed.values():
            run["code"] = [a]
    assert code_line({"runs": runs}) == f"Code: {'a' * 12}, every run."
    runs["selfplay"]["1"]["code"] = [a, b]  # its warm start at a, its RL at b
    del runs["curriculum"]["0"]["code"]
    assert code_line({"runs": runs}) == (
        f"Code: {'a' * 12} (warmstart 0, warmstart 1, curriculum 1, selfplay 0, "
        f"selfplay 1); {'b' * 12} with uncommitted changes (selfplay 1); "
        "not recorded (curriculum 0)."
    )
    runs["selfplay"]["1"]["code"] = [{"version": "0.1.0", "commit": None, "dirty": None}]
    assert "version 0.1.0 (no git commit) (selfplay 1)" in code_line({"runs": runs})


@pytest.mark.slow  # measured over 9 s: out of the fast subset
def test_compare_runs_arms_from_one_warm_start_and_skips_finished_runs(warm_run, tmp_path):
    """Real runs: the warm start is the fixture's (as if `compare` had made it); curriculum and fixed train one
    iteration each, side by side (--jobs 2)."""
    out = tmp_path / "compare"
    shutil.copytree(warm_run, out / "seed_0" / "warmstart")
    args = [
        "compare",
        *SMOKE,
        "train.steps=1",
        "train.fixed_tasks=8",
        "--seeds",
        "0",
        "--arms",
        "warmstart",
        "curriculum",
        "fixed",
        "--out",
        str(out),
        "--jobs",
        "2",
    ]
    selfplay(*args)
    results = json.loads((out / "results.json").read_text())
    assert results["arms"] == ["warmstart", "curriculum", "fixed"]
    warm = results["runs"]["warmstart"]["0"]["heldout"]
    trained = results["runs"]["curriculum"]["0"]
    assert set(warm) == set(trained["heldout"]) and "test" in warm
    assert all(0.0 <= v <= 1.0 for r in (warm, trained["heldout"]) for m in r.values() for v in m.values())
    assert [h["step"] for h in trained["history"]] == [1]
    n_test = sum(
        json.loads(line)["params"].get("eval_split") == "test"
        for line in (warm_run / "heldout.jsonl").read_text().splitlines()
    )
    for by_level in (results["runs"]["warmstart"]["0"]["test_by_level"], trained["test_by_level"]):
        assert by_level and all(lv.startswith("level_") for lv in by_level)
        assert sum(m["tasks"] for m in by_level.values()) == n_test
    assert set(results["summary_test_by_level"]["curriculum"]) == set(trained["test_by_level"])
    assert trained["per_iteration"]["time/rollout_s"] > 0 and not results["runs"]["warmstart"]["0"]["per_iteration"]
    assert (out / "seed_0" / "curriculum" / "summary.json").exists()
    report = (out / "results.md").read_text()
    # 4 tables by split or level, the means from iteration 10, what each arm spent, 2 metrics x (the split + each
    # level) paired
    paired_rows = 2 * len(results["paired_test"]["curriculum"]["0"])
    assert (out / "compare.png").stat().st_size > 0 and report.count("| curriculum |") == 6 + paired_rows
    # each RL run against the warm start, paired over the test split's tasks
    levels = results["runs"]["warmstart"]["0"]["test_by_level"]
    for arm in ("curriculum", "fixed"):
        paired = results["paired_test"][arm]["0"]
        assert list(paired) == ["all", *sorted(levels)]
        for group, by_metric in paired.items():
            assert set(by_metric) == {"pass@1_greedy", "pass@1"}
            for metric, d in by_metric.items():
                whole = warm["test"] if group == "all" else levels[group]
                after = (
                    results["runs"][arm]["0"]["heldout"]["test"]
                    if group == "all"
                    else results["runs"][arm]["0"]["test_by_level"][group]
                )
                assert d["tasks"] == whole.get("tasks", n_test)
                assert d["before"] == pytest.approx(whole[metric]) and d["after"] == pytest.approx(after[metric])
        assert report.count(f"| {arm} | 0 |") == 2 * len(paired) + 1  # + its means from iteration 10
        assert list(results["runs"][arm]["0"]["test_curve"]) == ["0", "1"]
    # every two arms on the test split, later minus earlier, pooled over seeds
    assert set(results["paired_arms"]) == {"curriculum - warmstart", "fixed - warmstart", "fixed - curriculum"}
    vs_warm = results["paired_arms"]["curriculum - warmstart"]
    for metric in ("pass@1_greedy", "pass@1"):
        paired = results["paired_test"]["curriculum"]["0"]["all"][metric]
        assert vs_warm[metric]["delta"] == pytest.approx(paired["delta"])
    assert report.count("| fixed - curriculum | 1 |") == 2
    # the per-run means from iteration 10 on: one iteration ran, so none is in the window
    assert results["from_iteration"] == 10 and results["runs"]["curriculum"]["0"]["from_iteration"]["iterations"] == 0
    assert "| curriculum | 0 | 0 |" in report and not results["runs"]["warmstart"]["0"]["from_iteration"]
    # no mixer in these modes: the curriculum's level is its schedule's, the fixed set has none
    assert [h["level"] for h in trained["history"]] == [1]
    assert [h["level"] for h in results["runs"]["fixed"]["0"]["history"]] == [None]
    # the fixed arm trained on its task set: 8 warm-start tasks of levels 1-2, written once
    fixed = [json.loads(line) for line in (out / "seed_0" / "fixed" / "fixed_tasks.jsonl").read_text().splitlines()]
    assert len(fixed) == 8 and {t["level"] for t in fixed} <= {1, 2} and all(t["split"] == "train" for t in fixed)
    # the warm start row is the warm start's own step-0 evaluation
    before = json.loads((out / "seed_0" / "curriculum" / "summary.json").read_text())["heldout_before"]
    assert {s: m["pass@1_greedy"] for s, m in warm.items()} == before
    # a second call finds everything done: no new run, same results
    log = out / "logs" / "seed_0_curriculum.log"
    size = log.stat().st_size
    selfplay(*args)
    assert log.stat().st_size == size
    assert json.loads((out / "results.json").read_text())["runs"] == results["runs"]
    # each record says which warm start it is or started from: the folder's fingerprint
    from selfplay.eval.compare import warm_start_id

    ident = warm_start_id(out / "seed_0" / "warmstart")
    assert results["warm_starts"] == {"warmstart": {ident: [0]}}
    assert results["runs"]["curriculum"]["0"]["paired_with"]["warm_start"] == ident
    assert warm_start_id(out / "seed_0" / "curriculum") != ident  # trained weights
    # each record names the code its run ran under (the warm start and its RL ran from this checkout)
    from selfplay.runtime.checkpoint import code_version

    assert all(run["code"] == [code_version()] for by_seed in results["runs"].values() for run in by_seed.values())
    assert code_line(results) in report and code_line(results).endswith(", every run.")
    # --merge pools results.json files into a report of their own (here one file: the same figures)
    selfplay("compare", "--merge", str(out / "results.json"), "--out", str(tmp_path / "merged"))
    merged = json.loads((tmp_path / "merged" / "results.json").read_text())
    assert merged["summary"] == results["summary"] and merged["paired_arms"] == results["paired_arms"]
    assert (tmp_path / "merged" / "compare.png").exists()
    gz = tmp_path / "results.json.gz"  # a gzipped record (as docs/data keeps them) merges the same
    gz.write_bytes(gzip.compress((out / "results.json").read_bytes()))
    selfplay("compare", "--merge", str(gz), "--out", str(tmp_path / "merged_gz"))
    assert json.loads((tmp_path / "merged_gz" / "results.json").read_text())["summary"] == results["summary"]
    (tmp_path / "bad.json.gz").write_text("{}")
    proc = selfplay("compare", "--merge", str(tmp_path / "bad.json.gz"), "--out", str(tmp_path / "m4"), check=False)
    assert proc.returncode == 2 and "--merge:" in proc.stderr and "Traceback" not in proc.stderr
    proc = selfplay("compare", "--merge", str(tmp_path / "none.json"), "--out", str(tmp_path / "m2"), check=False)
    assert proc.returncode == 2 and "--merge: no such file" in proc.stderr
    proc = selfplay(
        "compare", "train.steps=3", "--merge", str(out / "results.json"), "--out", str(tmp_path / "m3"), check=False
    )
    assert proc.returncode == 2 and "takes no config or overrides (given: train.steps=3)" in proc.stderr
    proc = selfplay("compare", "--report-only", "--seeds", "1", "--arms", "curriculum", "--out", str(out), check=False)
    assert proc.returncode == 2 and "--report-only:" in proc.stderr and "seed_1" in proc.stderr


def test_an_arm_takes_the_warm_starts_files_and_its_reserved_pool(tmp_path):
    warm = tmp_path / "warm"
    (warm / "checkpoints" / "step_0").mkdir(parents=True)
    (warm / "models").mkdir()
    for name in ("corpus.sqlite", "corpus.sqlite-wal", "heldout.jsonl", "reserved_tasks.jsonl", "train.log"):
        (warm / name).write_text(name)
    copy_warm_start(warm, tmp_path / "arm")
    assert sorted(p.name for p in (tmp_path / "arm").iterdir()) == [
        "checkpoints",
        "corpus.sqlite",
        "corpus.sqlite-wal",
        "heldout.jsonl",
        "models",
        "reserved_tasks.jsonl",
    ]
    (warm / "reserved_tasks.jsonl").unlink()  # a warm start without a pool: nothing to copy, no error
    copy_warm_start(warm, tmp_path / "arm2")
    assert not (tmp_path / "arm2" / "reserved_tasks.jsonl").exists()


def test_the_instruction_following_arm_is_self_play_from_the_same_warm_start(tmp_path):
    from selfplay.eval.compare import ARM_SPECS, warm_folder
    from selfplay.runtime.config import load_config

    spec = ARM_SPECS["selfplay_follow"]
    assert spec.mode == "selfplay"
    assert warm_folder(tmp_path, 0, "selfplay_follow", shared=True) == tmp_path / "warmstart"
    assert load_config("configs/tiny.yaml", list(spec.overrides)).mixer.instruction_follow
    assert not load_config("configs/tiny.yaml", list(ARM_SPECS["selfplay"].overrides)).mixer.instruction_follow


def test_compare_refuses_per_run_keys(tmp_path):
    proc = selfplay("compare", "configs/smoke.yaml", "train.mode=selfplay", "--out", str(tmp_path), check=False)
    assert proc.returncode == 2 and "train.mode is set per run" in proc.stderr


def test_overrides_may_follow_the_options():
    from selfplay.cli import build_parser

    args, extra = build_parser().parse_known_args(["compare", "configs/smoke.yaml", "a.b=1", "--out", "x", "c.d=2"])
    assert (args.config, args.overrides, extra) == ("configs/smoke.yaml", ["a.b=1"], ["c.d=2"])
    proc = selfplay("compare", "configs/smoke.yaml", "--out", "/nonexistent/x", "bogus.key=1", check=False)
    assert proc.returncode == 2 and "bogus" in proc.stderr  # the late override reached the config check


@pytest.mark.slow
def test_uniform_and_free_format_arms_the_free_one_from_a_warm_start_of_its_own(warm_run, tmp_path):
    """Real runs: the uniform arm trains from the shared warm start; the free-format arm warm-starts its own
    generator on the free format (same seed) and is paired with that warm start."""
    out = tmp_path / "compare"
    shutil.copytree(warm_run, out / "seed_0" / "warmstart")
    selfplay(
        "compare", *SMOKE, "train.steps=1", "--seeds", "0", "--arms", "uniform", "selfplay_free", "--out", str(out)
    )
    from selfplay.runtime.checkpoint import CheckpointManager

    free_warm = out / "seed_0" / "warmstart_free"
    ckpt = CheckpointManager(free_warm)
    assert ckpt.load_state(ckpt.latest_checkpoint())["config"]["generator"]["format"] == "free"
    trained = CheckpointManager(out / "seed_0" / "selfplay_free")
    state = trained.load_state(trained.latest_checkpoint())
    assert state["config"]["generator"]["format"] == "free" and state["config"]["train"]["mode"] == "selfplay"
    assert state["config"]["model"]["value_model"] == "detached"  # the free format's critic
    results = json.loads((out / "results.json").read_text())
    assert results["arms"] == ["uniform", "selfplay_free"]
    free = results["runs"]["selfplay_free"]["0"]
    assert [h["step"] for h in free["history"]] == [1] and free["history"][0]["parse_rate"] is not None
    uniform = results["runs"]["uniform"]["0"]["history"]
    assert uniform[0]["level"] is not None and 1 <= uniform[0]["level"] <= 4 and uniform[0]["validity"] is None
    # each arm is paired with its own warm start's per-task outcomes
    own = ckpt.load_state(ckpt.latest_checkpoint())["eval_before"]["test"]["pass@1_greedy"]
    assert results["paired_test"]["selfplay_free"]["0"]["all"]["pass@1_greedy"]["before"] == pytest.approx(own)
    main = CheckpointManager(out / "seed_0" / "warmstart")
    shared = main.load_state(main.latest_checkpoint())["eval_before"]["test"]["pass@1_greedy"]
    assert results["paired_test"]["uniform"]["0"]["all"]["pass@1_greedy"]["before"] == pytest.approx(shared)


def test_the_figure_names_each_arm_once_whatever_the_seeds():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    for arm in ("curriculum", "selfplay"):
        for seed in range(4):
            ax.plot([0, 1], [seed, arm == "selfplay"], label=first_label(ax, arm))
    assert ax.get_legend_handles_labels()[1] == ["curriculum", "selfplay"]
    plt.close(fig)


def test_a_variant_is_its_base_arm_with_overrides_from_the_same_warm_start(tmp_path):
    from selfplay.eval.compare import ARM_SPECS, warm_folder

    v = variant("free_rloo", "selfplay_free", ["ppo.advantage=rloo"])
    assert (v.mode, v.overrides, v.warm) == (
        "selfplay",
        ("generator.format=free", "agents.generator.advantage=gae", "model.value_model=detached", "ppo.advantage=rloo"),
        "warmstart_free",
    )
    assert warm_folder(tmp_path, 0, "free_rloo", shared=True, variants={"free_rloo": v}) == tmp_path / "warmstart_free"
    assert "free_rloo" not in ARM_SPECS  # nothing registered globally
    # a value head with or without gradients into the backbone: the same parameters, so the RL phase may choose
    for kind in ("head", "detached"):
        key = f"model.value_model={kind}"
        assert variant("v", "selfplay", [key]).overrides == (key,)
    # an override its base already has is not repeated
    free = ARM_SPECS["selfplay_free"].overrides
    assert variant("v", "selfplay_free", ["model.value_model=detached"]).overrides == free
    # its warm start, if it comes to make it, is made as its base's: without the variant's RL overrides
    assert warm_start_overrides(v.warm) == (
        "generator.format=free",
        "agents.generator.advantage=gae",
        "model.value_model=detached",
    )
    assert warm_start_overrides("warmstart") == ()
    for args, message in [
        (("curriculum", "uniform", ["ppo.lr=1"]), "not an arm's"),
        (("a-b", "uniform", ["ppo.lr=1"]), "an identifier"),
        (("x", "warmstart", ["ppo.lr=1"]), "base 'warmstart' must be an RL arm"),
        (("x", "nope", ["ppo.lr=1"]), "base 'nope'"),
        (("x", "curriculum", []), "KEY=VALUE"),
        (("x", "curriculum", ["ppo.lr"]), "KEY=VALUE"),
        (("x", "curriculum", ["warmstart.solver_steps=3"]), "would change its warm start"),
        (("x", "selfplay", ["generator.format=free"]), "would change its warm start"),
        (("x", "selfplay", ["model.value_model=separate"]), "would change its warm start"),
        (("x", "selfplay", ["model.n_layer=2"]), "would change its warm start"),
        (("x", "curriculum", ["train.mode=uniform"]), "set per run"),
        (("x", "curriculum", ["ppo.lr=1", "run.seed=3"]), "set per run"),
    ]:
        with pytest.raises(ValueError, match=message):
            variant(*args)


@pytest.mark.slow  # measured over 9 s: out of the fast subset
def test_compare_runs_a_variant_and_its_records_say_what_it_is(warm_run, tmp_path):
    """Real runs: a variant of the curriculum (no critic) beside it, one iteration each, from one warm start."""
    out = tmp_path / "compare"
    shutil.copytree(warm_run, out / "seed_0" / "warmstart")
    variant_args = ["--variant", "curriculum_rloo", "curriculum", "ppo.advantage=rloo"]
    selfplay(
        "compare",
        *SMOKE,
        "train.steps=1",
        "--seeds",
        "0",
        "--arms",
        "warmstart",
        "curriculum",
        "--out",
        str(out),
        *variant_args,
    )
    results = json.loads((out / "results.json").read_text())
    assert results["arms"] == ["warmstart", "curriculum", "curriculum_rloo"]
    log = (out / "logs" / "seed_0_curriculum_rloo.log").read_text()
    assert "train.mode=curriculum" in log and "ppo.advantage=rloo" in log
    assert "ppo.advantage=rloo" not in (out / "logs" / "seed_0_curriculum.log").read_text()
    record = results["runs"]["curriculum_rloo"]["0"]
    assert record["variant"] == {"mode": "curriculum", "overrides": ["ppo.advantage=rloo"], "warm": "warmstart"}
    assert "variant" not in results["runs"]["curriculum"]["0"]
    assert set(results["paired_arms"]) == {
        "curriculum - warmstart",
        "curriculum_rloo - warmstart",
        "curriculum_rloo - curriculum",
    }
    assert list(results["warm_starts"]) == ["warmstart"]
    assert list(results["warm_starts"]["warmstart"].values()) == [[0]]  # one warm start for both arms
    report = (out / "results.md").read_text()
    assert "Variants: curriculum_rloo = train.mode=curriculum ppo.advantage=rloo, from warmstart." in report
    # the report again needs the variant to be named; a merge needs only the records
    proc = selfplay(
        "compare", "--report-only", "--seeds", "0", "--arms", "curriculum_rloo", "--out", str(out), check=False
    )
    assert proc.returncode == 2 and "unknown arm(s) curriculum_rloo" in proc.stderr
    selfplay(
        "compare",
        "--report-only",
        "--seeds",
        "0",
        "--arms",
        "warmstart",
        "curriculum",
        "--out",
        str(out),
        *variant_args,
    )
    assert json.loads((out / "results.json").read_text())["runs"] == results["runs"]
    selfplay("compare", "--merge", str(out / "results.json"), "--out", str(tmp_path / "merged"))
    merged = json.loads((tmp_path / "merged" / "results.json").read_text())
    assert merged["warm_starts"] == results["warm_starts"] and merged["paired_arms"] == results["paired_arms"]
    proc = selfplay("compare", *SMOKE, "--out", str(out), "--variant", "x", "curriculum", "ppo.nope=1", check=False)
    assert proc.returncode == 2 and "--variant x:" in proc.stderr and "ppo.nope" in proc.stderr


def test_records_of_the_validation_split_are_reported_as_such_and_never_pool_with_test():
    val = _records([0, 1], 5)
    for by_seed in val.values():
        for rec in by_seed.values():
            rec["split"] = "val"
    results = analyse(val, n_boot=50)
    assert results["split"] == "val" and analyse(_records([0], 5), n_boot=50)["split"] == "test"
    assert paired_table(results).startswith("Val split against the warm start")
    assert "Arm against arm on the val split" in paired_arms_table(results)
    test = _json(analyse(_records([2], 5), n_boot=50))
    with pytest.raises(ValueError, match=r"paired on different splits \(test, val\)"):
        merge([_json(results), test], n_boot=50)


@pytest.mark.slow
def test_compare_on_the_validation_split_from_a_warm_start_that_drew_it(tmp_path):
    """Real runs: `eval.splits=[val]` makes the warm start draw (and evaluate only) the validation split, and
    `--split val` pairs the runs on it; asking for a split the runs do not evaluate is a one-line error."""
    out = tmp_path / "compare"
    proc = selfplay("compare", *SMOKE, "--split", "val", "--out", str(out), check=False)
    assert proc.returncode == 2 and "--split val: the runs evaluate test" in proc.stderr and not out.exists()
    selfplay(
        "compare",
        *SMOKE,
        "eval.splits=[val]",
        "train.steps=1",
        "--split",
        "val",
        "--seeds",
        "0",
        "--arms",
        "warmstart",
        "curriculum",
        "--out",
        str(out),
    )
    drawn = [
        json.loads(line)["params"]["eval_split"]
        for line in (out / "seed_0" / "warmstart" / "heldout.jsonl").read_text().splitlines()
    ]
    assert drawn.count("val") == drawn.count("test") == 2  # test is drawn (and reserved) but never evaluated
    val_ids = {
        json.loads(line)["id"]
        for line in (out / "seed_0" / "warmstart" / "heldout.jsonl").read_text().splitlines()
        if json.loads(line)["params"]["eval_split"] == "val"
    }
    results = json.loads((out / "results.json").read_text())
    assert results["split"] == "val"
    for arm in ("warmstart", "curriculum"):
        record = results["runs"][arm]["0"]
        assert record["split"] == "val" and list(record["heldout"]) == ["val"]
        assert set(record["test_per_task"]) == val_ids
    assert set(results["runs"]["curriculum"]["0"]["paired_with"]["test_per_task"]) == val_ids
    assert "Val split against the warm start" in (out / "results.md").read_text()


def test_jobs_run_side_by_side_and_a_failure_stops_none_of_the_others(tmp_path):
    """run_jobs: every job runs (two at a time here), each into its own log; a failing one is reported with the
    others' count once all have ended."""
    logs = [tmp_path / f"{name}.log" for name in "abc"]
    todo = [
        Job("a", ["--help"], logs[0]),
        Job("b", ["train", str(tmp_path / "missing.yaml")], logs[1]),
        Job("c", ["--help"], logs[2]),
    ]
    said: list[str] = []
    with pytest.raises(RuntimeError, match=r"1 of 3 runs failed: selfplay train .*missing.yaml exited 2; see .*b.log"):
        run_jobs(todo, 2, said.append)
    assert sorted(m.split(" (")[0] for m in said) == ["a", "b", "c"]
    assert all("usage: selfplay" in logs[i].read_text() for i in (0, 2))
    assert "config file not found" in logs[1].read_text()


def test_the_frozen_and_random_arms_are_self_play_from_the_same_warm_start(tmp_path):
    from selfplay.eval.compare import ARM_SPECS, warm_folder
    from selfplay.runtime.config import load_config

    plain = load_config("configs/tiny.yaml", list(ARM_SPECS["selfplay"].overrides))
    frozen = load_config("configs/tiny.yaml", list(ARM_SPECS["selfplay_frozen"].overrides))
    random_edits = load_config("configs/tiny.yaml", list(ARM_SPECS["selfplay_random"].overrides))
    assert (plain.train.train_generator, plain.generator.source) == (True, "model")
    assert (frozen.train.train_generator, frozen.generator.source) == (False, "model")
    assert random_edits.generator.source == "random_edits"
    for arm in ("selfplay_frozen", "selfplay_random"):
        assert ARM_SPECS[arm].mode == "selfplay"
        assert warm_folder(tmp_path, 0, arm, shared=True) == tmp_path / "warmstart"
        assert variant("v", arm, ["ppo.lr=1e-5"]).overrides[:-1] == ARM_SPECS[arm].overrides


def test_arms_that_differ_in_a_setting_they_must_share_are_refused(tmp_path):
    from selfplay.eval.compare import check_parity, run_all

    everyone = ["warmstart", "curriculum", "uniform", "fixed", "selfplay", "selfplay_frozen", "selfplay_random"]
    check_parity("configs/smoke.yaml", ["train.steps=7"], everyone)  # overrides for every arm keep them alike
    cases = [
        (["train.steps=5"], "train.steps (curriculum 3, v 5)"),
        (
            ["train.solver_tasks=8"],
            "the solver's episodes per iteration (train.solver_tasks x train.samples_per_task) (curriculum 8, v 16)",
        ),
        (["mixer.share_replay=0.5"], "mixer.share_replay (curriculum 0.2, v 0.5)"),
    ]
    for overrides, named in cases:
        with pytest.raises(ValueError, match=re.escape(f"the arms differ in {named}")):
            check_parity(
                "configs/smoke.yaml", [], ["warmstart", "curriculum", "v"], {"v": variant("v", "selfplay", overrides)}
            )
    # how the solver learns from the same episodes is what an ablation compares (the SFT replay loss, the advantage)
    check_parity(
        "configs/smoke.yaml",
        [],
        ["curriculum", "v"],
        {"v": variant("v", "curriculum", ["ppo.replay_coef=0.5", "ppo.replay_source=sft", "ppo.advantage=rloo"])},
    )
    # as many episodes in other tasks x samples is the same solver training; the warm start trains nothing
    check_parity(
        "configs/smoke.yaml",
        [],
        ["curriculum", "v"],
        {"v": variant("v", "selfplay", ["train.solver_tasks=2", "train.samples_per_task=4"])},
    )
    with pytest.raises(ValueError, match=re.escape("train.steps (curriculum 3, v 4)")):  # the library refuses too
        run_all(
            "configs/smoke.yaml",
            [],
            [0],
            ["curriculum", "v"],
            tmp_path / "lib",
            variants={"v": variant("v", "curriculum", ["train.steps=4"])},
        )
    assert not (tmp_path / "lib").exists()
    out = tmp_path / "compare"
    proc = selfplay(
        "compare",
        "configs/smoke.yaml",
        "--seeds",
        "0",
        "--arms",
        "warmstart",
        "curriculum",
        "--out",
        str(out),
        "--variant",
        "long",
        "selfplay",
        "train.steps=5",
        check=False,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert "train.steps (curriculum 3, long 5)" in line and len(proc.stderr.strip().splitlines()) == 1
    assert not out.exists()  # refused before any run started


def test_the_report_shows_what_each_arm_spent():
    from selfplay.eval.compare import compute_table
    from selfplay.train.history import COMPUTE

    runs = _records([0, 1], 5)
    for i, run in enumerate(runs["selfplay"].values()):
        run["compute"] = {key: 10 * (i + 1) for key in COMPUTE}
    runs["curriculum"]["0"]["compute"] = {key: 3 for key in COMPUTE}
    table = compute_table({"arms": list(runs), "runs": runs})
    assert table.splitlines()[0] == (
        "| arm | runs | ppo episodes | solver episodes | solver tokens | generator "
        "proposals | generator tokens | sandbox execs |"
    )
    assert "| selfplay | 2 | 15 | 15 | 15 | 15 | 15 | 15 |" in table  # the median over its seeds
    assert "| curriculum | 1 | 3 |" in table and "| warmstart |" not in table
    assert compute_table({"arms": list(runs), "runs": _records([0], 5)}) == ""  # records made before the counters


@pytest.mark.slow
def test_compare_runs_the_frozen_and_random_arms_and_reports_what_each_spent(warm_run, tmp_path):
    """Real runs: self-play, its frozen generator and its random edits, one iteration each from one warm start."""
    import hashlib

    out = tmp_path / "compare"
    shutil.copytree(warm_run, out / "seed_0" / "warmstart")
    arms = ["selfplay", "selfplay_frozen", "selfplay_random"]
    selfplay("compare", *SMOKE, "train.steps=1", "--seeds", "0", "--arms", *arms, "--out", str(out))

    def generator(folder, step):
        files = sorted((folder / "checkpoints" / f"step_{step}" / "generator").glob("*.safetensors"))
        assert files
        return hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()

    warm = generator(out / "seed_0" / "warmstart", 0)
    assert generator(out / "seed_0" / "selfplay", 1) != warm  # the generator's PPO step
    assert generator(out / "seed_0" / "selfplay_frozen", 1) == warm
    assert generator(out / "seed_0" / "selfplay_random", 1) == warm
    results = json.loads((out / "results.json").read_text())
    spent = {arm: results["runs"][arm]["0"]["compute"] for arm in arms}
    for arm in arms:
        assert spent[arm]["ppo_episodes"] == 4 * 2  # the smoke config's solver_tasks x samples_per_task
        assert spent[arm]["solver_tokens"] > 0 and spent[arm]["sandbox_execs"] > 0
        assert spent[arm]["generator_proposals"] == 2
        assert results["runs"][arm]["0"]["history"][0]["validity"] is not None  # every arm's proposals checked
    assert spent["selfplay"]["generator_tokens"] > 0 and spent["selfplay_frozen"]["generator_tokens"] > 0
    assert spent["selfplay_random"]["generator_tokens"] == 0
    from selfplay.train.history import COMPUTE

    report = (out / "results.md").read_text()
    assert "Spent per run in all (medians over seeds):" in report
    for arm in arms:
        row = next(line for line in report.splitlines() if line.startswith(f"| {arm} | 1 |"))
        assert row == f"| {arm} | 1 | " + " | ".join(str(spent[arm][key]) for key in COMPUTE) + " |"


def test_the_code_io_arm_proposes_in_its_format_from_a_warm_start_of_its_own_at_parity(tmp_path):
    """`selfplay_code_io`: self-play whose generator writes code_io proposals under their grammar, from its own warm
    start (made with the arm's format), at parity with the mutation arm in configs/experiments/smol_code_io.yaml."""
    from selfplay.eval.compare import ARM_SPECS, check_parity, warm_folder
    from selfplay.runtime.config import load_config
    from selfplay.train.setup import validate_config

    spec = ARM_SPECS["selfplay_code_io"]
    assert (spec.mode, spec.warm) == ("selfplay", "warmstart_code_io")
    assert (
        warm_start_overrides(spec.warm) == spec.overrides == ("generator.format=code_io", "generator.constrained=true")
    )
    assert warm_folder(tmp_path, 0, "selfplay_code_io", shared=True) == tmp_path / "warmstart_code_io"
    config = "configs/experiments/smol_code_io.yaml"
    check_parity(config, [], ["warmstart", "selfplay", "selfplay_code_io"], None)
    cfg = load_config(config, list(spec.overrides))
    validate_config(cfg)
    assert (cfg.generator.format, cfg.generator.constrained, cfg.warmstart.max_len) == ("code_io", True, 768)
