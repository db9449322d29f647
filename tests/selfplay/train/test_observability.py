"""The per-iteration figures of a run and its closing summary: first and last iterations, in summary.json."""

from __future__ import annotations

import json
import math
import re

import pytest

from selfplay.runtime.tb import read_scalars
from selfplay.train.history import HISTORY, SUMMARY_WINDOW, heldout_changes, history_entry, window_means
from tests.conftest import SMOKE, copy_run, selfplay  # the warm_run fixture lives there too


def metrics_at(step: int) -> dict:
    """Scalars as an iteration logs them: every figure grows with the step; the generator made no valid proposal
    at odd steps (its in-band rate is NaN, which TensorBoard skips)."""
    m = {tag: step / 100 for tag in HISTORY.values()}
    if step % 2:
        m["generator/in_band_rate"] = math.nan
    return m


def test_history_keeps_every_figure_and_none_for_what_an_iteration_lacks():
    entry = history_entry(3, metrics_at(3))
    assert entry["step"] == 3 and entry["solver_in_band"] == 0.03 and entry["generator_in_band"] is None
    assert history_entry(1, {"solver/pass_rate": 0.5})["level"] is None  # a mode without a mixer
    json.dumps(entry, allow_nan=False)  # checkpoints and summary.json hold it


def test_window_means_compare_the_first_and_last_iterations():
    history = [history_entry(step, metrics_at(step)) for step in range(1, 31)]
    means = window_means(history)
    first, last = means["first_iterations"], means["last_iterations"]
    assert first["n"] == last["n"] == SUMMARY_WINDOW
    assert first["solve_rate"] == pytest.approx(0.055) and last["solve_rate"] == pytest.approx(0.255)
    assert first["generator_in_band"] == pytest.approx(0.06)  # the even steps 2..10 only
    assert last["generator_reward"] == pytest.approx(0.255)
    short = window_means(history[:3])  # a run shorter than the windows: both are all of it
    assert short["first_iterations"] == short["last_iterations"] and short["first_iterations"]["n"] == 3
    assert window_means([{"step": 1, "solve_rate": 0.5}])["last_iterations"]["parse_rate"] is None  # older history


@pytest.mark.slow
def test_heldout_changes_are_paired_with_their_task_count_and_interval():
    # per task [greedy solved, n, c]; split "a": 4 shared tasks, one more solved after; split "b" only before
    before = {
        "per_task": {"a": {"t1": [0, 1, 0], "t2": [1, 1, 1], "t3": [0, 1, 0], "t4": [0, 1, 0]}, "b": {"t9": [1, 1, 1]}}
    }
    after = {"per_task": {"a": {"t1": [1, 1, 1], "t2": [1, 1, 1], "t3": [0, 1, 0], "t4": [0, 1, 0], "t5": [1, 1, 1]}}}
    change = heldout_changes(before, after)
    assert set(change) == {"a"}
    a = change["a"]
    assert a["tasks"] == 4 and a["before"] == 0.25 and a["after"] == 0.5 and a["delta"] == 0.25
    lo, hi = a["ci95"]
    assert 0.0 <= lo <= 0.25 <= hi <= 0.75  # one task of four changed: the interval spans 0 and 1/4 at least


@pytest.mark.slow  # measured over 9 s: out of the fast subset
def test_a_run_logs_and_sums_up_the_figures(warm_run, tmp_path):
    run = copy_run(warm_run, tmp_path)
    proc = selfplay("train", *SMOKE, f"run.dir={run}", "train.steps=2")
    tags = read_scalars(run)
    for tag in (
        "generator/parse_rate",
        "generator/validity_rate",
        "solver/in_band_rate",
        "mixer/share/generator",
        "solver/share/generator",
        "generator/reward_mean",
        "mixer/target_low",
        "mixer/target_high",
        "mixer/generator_trusted",
        "generator/cut_off_rate",
    ):
        assert [s for s, _ in tags[tag]] == [1, 2], tag
    assert all(0.0 <= v <= 1.0 for tag in ("solver/in_band_rate", "generator/cut_off_rate") for _, v in tags[tag])
    # each valid proposal measured is in band, never solved or solved by every sample: the three shares make 1
    shares = [dict(tags[f"generator/{name}"]) for name in ("in_band_rate", "never_solved_rate", "always_solved_rate")]
    assert shares[0] and all(d.keys() == shares[0].keys() for d in shares)
    assert all(sum(d[step] for d in shares) == pytest.approx(1.0) for step in shares[0])
    # the mixer measures the yield of each edit instruction it asked for (valid and in band), from its first use on
    yields = {tag: v for tag, v in tags.items() if tag.startswith("mixer/instruction_yield/")}
    assert any(s == 1 for v in yields.values() for s, _ in v)
    assert all([s for s, _ in v] in ([1, 2], [2]) for v in yields.values())
    assert all(0.0 < y < 1.0 for v in yields.values() for _, y in v)
    summary = json.loads((run / "summary.json").read_text())
    for window in ("first_iterations", "last_iterations"):
        assert summary[window]["n"] == 2
        assert summary[window]["solver_in_band"] == pytest.approx(sum(v for _, v in tags["solver/in_band_rate"]) / 2)
    assert "solver/in_band_rate" in proc.stdout and "mixer/share/generator" in proc.stdout
    # the closing summary separates the warm start's time and gives each held-out change with its tasks and interval
    assert summary["warmstart_seconds"] > 0 and summary["selfplay_seconds"] < summary["seconds"]
    took = r"\(selfplay\): warm start [\d.]+ min, 2 iterations in [\d.]+ min"
    assert re.search(took, proc.stdout), proc.stdout[-2000:]
    assert summary["heldout_change"] and all(
        c["tasks"] >= 1 and len(c["ci95"]) == 2 for c in summary["heldout_change"].values()
    )
    assert "95 % CI" in proc.stdout


def test_the_summary_says_in_words_what_the_interval_shows():
    from selfplay.train.history import run_estimate, verdict

    assert verdict({"ci95": [0.01, 0.2]}) == "the solver improved"
    assert verdict({"ci95": [-0.2, -0.01]}) == "the solver got worse"
    assert verdict({"ci95": [-0.1, 0.1]}).startswith("no measurable change")
    assert verdict({"ci95": [0.0, 0.1]}).startswith("no measurable change")  # an interval that touches 0 holds it
    line = run_estimate(90.0, 20, 5)
    assert "the 20 left take about 30 min" in line and "4 periodic evaluations" in line
    assert "periodic" not in run_estimate(90.0, 3, 0)
