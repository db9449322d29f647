"""What an iteration measured, from its stages' results (selfplay.train.metrics): pure, so checked by hand."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from generator.rewards import ProposalOutcome
from selfplay.runtime.errors import UserError
from selfplay.train.metrics import Costs, SolverRound, iteration_metrics, iteration_stats
from selfplay.train.mixer import IterationStats
from selfplay.train.proposals import ProposalRound, SharedProposal


def task(task_id: str) -> SimpleNamespace:
    return SimpleNamespace(id=task_id, parent_ids=[])


def shared(
    valid: bool, *, rejection: str | None = None, redrawn: int = 0, cut_off: bool = False, closed: bool = False
) -> SharedProposal:
    return SharedProposal(
        {"id": "p"} if valid else None, rejection, rejection != "unparsable", None, redrawn, "rename", cut_off, closed
    )


SOLVER = SolverRound(
    batch=[task("g1"), task("r1"), task("r2"), task("r3")],
    counts={"generator": 1, "replay": 3},
    rates={"g1": 0.5, "r1": 0.0, "r2": 1.0, "r3": 0.25},
    reward_mean=0.4,
    reward_terms={"correct": 0.375},
)
STATS = IterationStats(
    solve_rate=0.4375, validity_rate=0.5, diversity=1.0, task_rates=[0.5, 0.0, 1.0, 0.25], generator_in_band=0.5
)
PROPOSALS = ProposalRound(
    shared=[
        shared(True, redrawn=2),
        shared(True, cut_off=True),
        shared(False, rejection="unparsable", closed=True),
        shared(False, rejection="tests"),
    ],
    outcomes=[
        ProposalOutcome(True, True, 0.5),
        ProposalOutcome(True, True, 1.0),
        ProposalOutcome(False, False),
        ProposalOutcome(True, False),
    ],
    rewards=[0.5, 0.0, -1.0, -0.5],
    valid=[task("g1"), task("g2")],
)
COSTS = Costs(
    timing={"generator_s": 1.0, "plan_s": 0.5, "rollout_s": 2.0, "solver_update_s": 4.0, "update_s": 5.0},
    sampled_tokens=100,
    update_tokens=800,
    sandbox_runs=10,
    cache_hits=4,
    sandbox_s=3.0,
    engine={"time/weight_sync_s": 0.25},
    compute={"ppo_episodes": 16, "solver_tokens": 100},
)


def test_every_stage_gives_its_tags_in_the_order_they_are_logged():
    m = iteration_metrics({"ppo/solver/kl": 0.01}, STATS, SOLVER, PROPOSALS, {"mixer/level": 2.0}, COSTS)
    tags = list(m)
    assert tags[:3] == ["ppo/solver/kl", "solver/pass_rate", "solver/in_band_rate"]
    assert tags.index("generator/reward_mean") < tags.index("mixer/level") < tags.index("solver/batch/generator")
    assert tags[-2:] == ["compute/ppo_episodes", "compute/solver_tokens"]
    assert m["solver/pass_rate"] == 0.4375 and m["solver/in_band_rate"] == 0.5
    # by origin: the generator's one task is in band, the replayed ones are 1/3 in band
    assert m["solver/in_band_rate/generator"] == 1.0 and math.isclose(m["solver/in_band_rate/replay"], 1 / 3)
    assert m["solver/reward_mean"] == 0.4 and m["solver/reward/correct"] == 0.375
    assert m["solver/batch/generator"] == 1 and m["solver/batch/replay"] == 3


def test_the_proposals_figures():
    m = iteration_metrics({}, STATS, SOLVER, PROPOSALS, {}, COSTS)
    assert m["generator/reward_mean"] == -0.25 and m["generator/validity_rate"] == 0.5
    assert m["generator/parse_rate"] == 0.75 and m["generator/redrawn"] == 0.5
    assert m["generator/cut_off_rate"] == 0.25 and m["generator/closed_rate"] == 0.25
    assert m["generator/in_band_rate"] == 0.5 and m["solver/share/generator"] == 0.25
    assert m["generator/solve_rate_mean"] == 0.75
    assert m["generator/never_solved_rate"] == 0.0 and m["generator/always_solved_rate"] == 0.5
    assert m["generator/diversity"] == 1.0 and m["generator/valid_tasks"] == 2
    assert m["generator/rejected/unparsable"] == 1 and m["generator/rejected/tests"] == 1


def test_a_mode_without_proposals_logs_no_generator_tag_and_nan_marks_what_was_not_measured():
    stats = IterationStats(solve_rate=0.0, task_rates=[])
    m = iteration_metrics({}, stats, SOLVER, None, {}, COSTS)
    assert not [tag for tag in m if tag.startswith("generator/")] and "solver/share/generator" not in m
    assert math.isnan(m["solver/in_band_rate"])
    empty = ProposalRound(shared=[], outcomes=[], rewards=[], valid=[])
    g = iteration_metrics({}, stats, SOLVER, empty, {}, COSTS)
    assert g["generator/reward_mean"] == 0.0 and g["generator/validity_rate"] == 0.0 and g["generator/diversity"] == 0.0
    assert math.isnan(g["generator/in_band_rate"]) and math.isnan(g["generator/solve_rate_mean"])
    assert math.isnan(g["generator/never_solved_rate"])


def test_costs_become_rates_seconds_and_totals():
    m = iteration_metrics({}, STATS, SOLVER, None, {}, COSTS)
    assert m["perf/solver_gen_tokens_per_s"] == 50.0 and m["perf/solver_update_tokens_per_s"] == 200.0
    assert "perf/gpu_peak_mem_gb" not in m
    assert [t for t in m if t.startswith("time/")] == [
        "time/generator_s",
        "time/plan_s",
        "time/rollout_s",
        "time/solver_update_s",
        "time/update_s",
        "time/sandbox_s",
        "time/weight_sync_s",
    ]
    assert m["sandbox/execs_per_s"] == 2.0 and m["sandbox/cache_hit_rate"] == 0.4
    assert m["compute/ppo_episodes"] == 16.0 and isinstance(m["compute/ppo_episodes"], float)
    idle = Costs(
        timing={"rollout_s": 0.0},
        sampled_tokens=0,
        update_tokens=0,
        sandbox_runs=0,
        cache_hits=0,
        sandbox_s=0.0,
        gpu_peak_gb=1.5,
    )
    m = iteration_metrics({}, STATS, SOLVER, None, {}, idle)
    assert "perf/solver_update_tokens_per_s" not in m and m["perf/gpu_peak_mem_gb"] == 1.5
    assert m["perf/solver_gen_tokens_per_s"] == 0.0
    assert m["sandbox/execs_per_s"] == 0.0 and m["sandbox/cache_hit_rate"] == 0.0


def test_the_task_source_observes_the_served_tasks_once_and_the_proposals_it_measured():
    batch = [task("g1"), task("r1"), task("r1"), task("p1")]  # r1 served twice: observed once
    stats = iteration_stats(
        0.5, [], PROPOSALS, batch, {"p1"}, {"g1": 0.5, "r1": 0.0, "p1": 1.0, "g2": 1.0}, kl=0.02, mutation=True
    )
    assert stats.solve_rate == 0.5 and stats.kl == 0.02
    assert stats.task_rates == [0.5, 0.0, 1.0] and stats.procedural_rates == [1.0]
    assert stats.validity_rate == 0.5 and stats.generator_in_band == 0.5
    assert stats.proposal_rates == {"g1": 0.5, "g2": 1.0}
    assert stats.instructions == [("rename", True), ("rename", False), ("rename", False), ("rename", False)]
    assert iteration_stats(0.5, [], PROPOSALS, batch, set(), {}, kl=None, mutation=False).instructions is None
    none = iteration_stats(0.0, [], ProposalRound([], [], [], []), [], set(), {}, kl=None, mutation=False)
    assert none.validity_rate is None and none.diversity is None and none.generator_in_band is None


def test_a_stops_bound_is_the_longest_stage_then_the_checkpoint_and_is_warned_of_past_the_signals_lead():
    from selfplay.train.metrics import lead_warning, signal_lead_s, stop_bound_s

    timing = {"generator_s": 3.0, "plan_s": 0.5, "rollout_s": 40.0, "update_s": 120.0, "solver_update_s": 110.0}
    assert stop_bound_s(timing, 15.0) == 135.0  # the PPO updates (the solver's inside them), then the checkpoint
    assert stop_bound_s({"rollout_s": 2.0}, 0.0) == 2.0 and stop_bound_s({}, 1.5) == 1.5
    assert lead_warning(135.0, None) is None  # no SLURM signal to answer
    assert lead_warning(135.0, 195.0) is None  # 135 + 60 s of SLURM's lateness fits exactly
    warning = lead_warning(135.0, 194.0)
    assert warning and "up to 135 s" in warning and "lead of 194 s" in warning and "SELFPLAY_SIGNAL_LEAD" in warning
    assert signal_lead_s({}) is None and signal_lead_s({"SELFPLAY_SIGNAL_LEAD": " 300 "}) == 300.0
    with pytest.raises(UserError, match=r"SELFPLAY_SIGNAL_LEAD='soon': the signal's lead in seconds"):
        signal_lead_s({"SELFPLAY_SIGNAL_LEAD": "soon"})
